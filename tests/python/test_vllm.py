# SPDX-License-Identifier: MIT
"""kvcache.vllm driven as vLLM drives a v1 KV connector (vllm_harness.py:
its scheduler and model runner at 003df29 and after 2aac565c, transcribed), on real tensors
laid out as vLLM lays them out, against a private kvcached.

Each engine is a fresh connector pair with its own KV cache; "engine B
finds what engine A stored" is the pool's whole point, and every byte of KV
a request ends up with is checked against what it would have computed."""
import logging
import os

import pytest

torch = pytest.importorskip("torch")

import vllm_harness as vh  # noqa: E402
from kvcache import vllm as kv  # noqa: E402

PROMPT = [101 + (i * 13) % 500 for i in range(70)]  # 4 blocks of 16 and 6 tokens


def prompt(salt):
    return [t + salt for t in PROMPT]


@pytest.mark.parametrize("after", [True, False], ids=["loads-after-forward", "before"])
@pytest.mark.parametrize("load_async", [True, False])
def test_stores_with_the_engines_own_requests(daemon, after, load_async):
    """Current vLLM leaves num_publishable_block_hashes at 0 (no EAGLE
    prefix-cache hashing): the blocks are stored all the same, and a second
    engine loads them; whether its worker starts loads before the forward
    (every step, as before 2aac565c; or a step with a synchronous load) or
    after it (asynchronous loads only)."""
    salt = 1 + 1000 * (2 * after + load_async)  # prompts of their own
    a = vh.Engine(vh.config(daemon), loads_after_forward=after)
    a.run_one("a1", prompt(salt))
    # 70 prompt tokens + 3 generated, 72 computed: 4 full blocks stored
    assert a.stat("save_blocks") == 4 and a.stat("save_errors") == 0
    b = vh.Engine(vh.config(daemon, load_async=load_async), loads_after_forward=after)
    b.run_one("b1", prompt(salt))
    assert b.stat("hit_tokens") == 64 and b.stat("load_blocks") == 4
    assert b.stat("load_errors") == 0
    a.shutdown()
    b.shutdown()


def test_a_base_without_eagle_hashing(daemon, monkeypatch):
    """vLLM's base class at 00f4240 sets no use_eagle_prefix_cache_hashing:
    a request still finishes, and its blocks are stored and found."""
    def init(self, vllm_config, role, kv_cache_config=None):
        self._connector_metadata = None
        self._vllm_config = vllm_config
        self._kv_transfer_config = vllm_config.kv_transfer_config
        self._kv_cache_config = kv_cache_config
        self._kv_cache_manager = None
        self._role = role
    monkeypatch.setattr(kv.KVConnectorBase_V1, "__init__", init)
    monkeypatch.delattr(kv.KVConnectorBase_V1, "set_eagle_prefix_cache_hashing")
    a = vh.Engine(vh.config(daemon))
    assert "use_eagle_prefix_cache_hashing" not in vars(a.connector)
    a.run_one("a1", prompt(5))
    assert a.stat("save_blocks") == 4 and a.stat("save_errors") == 0
    b = vh.Engine(vh.config(daemon))
    b.run_one("b1", prompt(5))
    assert b.stat("load_blocks") == 4 and b.stat("load_errors") == 0
    a.shutdown()
    b.shutdown()


def test_eagle_fence_applies_only_when_on(daemon):
    cfg = vh.config(daemon)
    a = vh.Engine(cfg)
    a.connector.set_eagle_prefix_cache_hashing(True)
    a.add_request("e1", prompt(2), 3)

    def publish_one(engine, so):
        for r in engine.requests.values():
            r.num_publishable_block_hashes = min(1, len(r.block_hashes))
    a.step_hook = publish_one
    a.run()
    assert a.stat("save_blocks") == 1  # only the published hash
    a.shutdown()


@pytest.mark.parametrize("after", [True, False], ids=["loads-after-forward", "before"])
@pytest.mark.parametrize("load_async", [True, False])
def test_abort_while_loading(daemon, load_async, after):
    """An abort that arrives while a request's blocks load: vLLM calls
    request_finished at once and frees the blocks when the load is reported;
    storing them too would report the id twice (and they hold no KV yet)."""
    a = vh.Engine(vh.config(daemon))
    a.run_one("a", prompt(3))
    b = vh.Engine(vh.config(daemon, load_async=load_async), loads_after_forward=after)
    free0 = len(b.free)
    b.add_request("b", prompt(3), 3)
    b.abort("b")  # during the first step, as EngineCore applies it
    b.run()
    assert b.finished["b"] == vh.RequestStatus.FINISHED_ABORTED
    # the engine goes on with other requests: nothing more is reported for b
    b.run_one("b2", prompt(4))
    assert not b.requests and len(b.free) == free0
    assert b.stat("save_errors") == 0 and b.stat("load_errors") == 0
    a.shutdown()
    b.shutdown()


LAYOUTS = [
    dict(backend="flash_attn", layout="NHD"),
    dict(backend="flash_attn", layout="HND"),
    dict(backend="flashinfer", layout="HND"),
    dict(backend="flashinfer", layout="NHD", kernel_block_size=8),
    dict(backend="flash_attn", layout="HND", kernel_block_size=4),
    dict(backend="hybrid_flash_attn", layout="NHD"),
]


@pytest.mark.parametrize("i", range(len(LAYOUTS)))
def test_layouts_share_objects(daemon, i):
    """An HND cache (FlashInfer on Blackwell), one whose kernels split a
    block into rows, and FlashAttention's and FlashInfer's shapes all store
    the same object for the same block: each engine loads what the one
    before it stored, whatever its layout."""
    w = LAYOUTS[i]
    nxt = LAYOUTS[(i + 1) % len(LAYOUTS)]
    tokens = prompt(10 + i)
    a = vh.Engine(vh.config(daemon), **w)
    a.run_one("a", tokens)
    assert a.stat("save_blocks") == 4
    b = vh.Engine(vh.config(daemon), **nxt)
    b.run_one("b", tokens)
    assert b.stat("load_blocks") == 4 and b.stat("load_errors") == 0
    a.shutdown()
    b.shutdown()


@pytest.mark.parametrize("policy", ["recompute", "fail"])
def test_block_gone_between_lookup_and_load(daemon, policy):
    a = vh.Engine(vh.config(daemon))
    a.run_one("a", prompt(20 + len(policy)))
    b = vh.Engine(vh.config(daemon, policy=policy, load_async=False))
    keys = b.connector.store.keys(b.add_request("b", prompt(20 + len(policy)), 3).block_hashes)
    orig_lookup = b.connector.store.lookup

    def lookup_then_evict(hashes, all_ranks=True):
        n = orig_lookup(hashes, all_ranks)
        b.connector.client.remove(keys[2], force=True)  # gone before the load
        return n
    b.connector.store.lookup = lookup_then_evict
    b.run()
    if policy == "recompute":
        assert b.finished["b"] == vh.RequestStatus.FINISHED_LENGTH_CAPPED
        assert b.kv_at_finish["b"] == []  # block 2 and after computed again
    else:
        assert b.finished["b"] == vh.RequestStatus.FINISHED_ERROR
    assert b.stat("load_errors") == 1
    assert not b.requests
    a.shutdown()
    b.shutdown()


def test_hit_outlives_pressure_until_its_load(daemon):
    """The scheduler's lookup leases what it finds: a pool filled twice over
    between that lookup and the workers' load evicts every other block
    (a prompt stored after it, never looked up, is gone) but not these."""
    import kvcache
    a = vh.Engine(vh.config(daemon))
    a.run_one("a", prompt(130))
    a.run_one("a2", prompt(131))  # newer than "a": evicted first if nothing is leased
    b = vh.Engine(vh.config(daemon, load_async=False))
    other = b.connector.store.keys(
        vh.Request("c", prompt(131), 3, vh.block_hasher(b.hash_block_size)).block_hashes)
    orig_lookup = b.connector.store.lookup
    filler = kvcache.Client(daemon)
    chunk = bytes(2 << 20)

    def lookup_then_fill(hashes, all_ranks=True):
        n = orig_lookup(hashes, all_ranks)
        for i in range(256):  # 512 MiB through a 256 MiB dram tier
            assert filler.put("fill/%d" % i, chunk) == 0
        return n
    b.connector.store.lookup = lookup_then_fill
    b.run_one("b", prompt(130))
    assert b.stat("hit_tokens") == 64 and b.stat("load_blocks") == 4
    assert b.stat("load_errors") == 0
    assert not any(filler.batch_exists(other))
    filler.remove_prefix("fill/", force=True)
    filler.close()
    a.shutdown()
    b.shutdown()


@pytest.mark.parametrize("prefix_caching", [False, True])
def test_preemption(daemon, prefix_caching):
    """A cache too small for two requests: vLLM preempts one, frees its
    blocks, and looks it up again when it resumes (with the prefix cache,
    finding some of its own blocks still cached)."""
    cfg = vh.config(daemon, num_blocks=7)
    e = vh.Engine(cfg, prefix_caching=prefix_caching)
    e.add_request("p1", prompt(30)[:40], 40)
    e.add_request("p2", prompt(31)[:40], 40)
    e.run()
    assert e.finished == {"p1": vh.RequestStatus.FINISHED_LENGTH_CAPPED,
                          "p2": vh.RequestStatus.FINISHED_LENGTH_CAPPED}
    assert any(m.preempted for m in e.workers[0].preemptions_seen)
    assert e.kv_at_finish["p1"] == [] and e.kv_at_finish["p2"] == []
    assert (e.local_hit_tokens > 0) == prefix_caching
    assert len(e.free) == 7
    e.shutdown()


@pytest.mark.parametrize("load_async", [True, False])
def test_local_prefix_hits(daemon, load_async):
    """With vLLM's prefix cache: engine B has the first two blocks of a
    prompt cached from another request and asks the connector with that
    local hit; only the two blocks after it are loaded from the pool (into
    blocks of their own), the cached ones are kept, and every byte of KV
    is right. A third time the whole prompt is cached: nothing is loaded."""
    p = prompt(40 + load_async)  # prompts of their own
    a = vh.Engine(vh.config(daemon))
    a.run_one("a", p)
    b = vh.Engine(vh.config(daemon, load_async=load_async), prefix_caching=True)
    seen = []
    ask = b.connector.get_num_new_matched_tokens

    def asked(request, num_computed_tokens):
        seen.append((request.request_id, num_computed_tokens))
        return ask(request, num_computed_tokens)
    b.connector.get_num_new_matched_tokens = asked
    b.run_one("q", p[:32] + [7 + 100 * load_async + i for i in range(30)])
    loaded = b.stat("load_blocks")
    assert loaded == 2  # the shared prefix, from the pool
    b.run_one("p", p)
    assert seen[-1] == ("p", 32)
    assert b.stat("load_blocks") - loaded == 2 and b.stat("load_errors") == 0
    b.run_one("p2", p)
    assert seen[-1] == ("p2", 64)  # whole blocks, short of the last token
    assert b.stat("load_blocks") - loaded == 2
    a.shutdown()
    b.shutdown()


def test_cache_prefix_is_a_reuse_domain(daemon, caplog):
    """cache_prefix (as vLLM's Mooncake store connector takes it): engines
    with another prefix, or none, never find each other's blocks."""
    p = prompt(50)
    a = vh.Engine(vh.config(daemon, cache_prefix="m-weights1"))
    with caplog.at_level(logging.WARNING, logger="kvcache.vllm"):
        a.run_one("a", p)
    assert not [r for r in caplog.records if "cache_prefix" in r.getMessage()]
    assert a.stat("save_blocks") == 4
    for other in (vh.Engine(vh.config(daemon)),
                  vh.Engine(vh.config(daemon, cache_prefix="m-weights2"))):
        other.run_one("o", p)
        assert other.stat("hit_tokens") == 0
        other.shutdown()
    same = vh.Engine(vh.config(daemon, cache_prefix="m-weights1"))
    same.run_one("s", p)
    assert same.stat("hit_tokens") == 64
    a.shutdown()
    same.shutdown()


def test_tensor_parallel_every_rank(daemon):
    a = vh.Engine(vh.config(daemon, tp=2))
    a.run_one("a", prompt(40))
    assert a.stat("save_blocks") == 8  # 4 blocks x 2 ranks
    b = vh.Engine(vh.config(daemon, tp=2))
    b.run_one("b", prompt(40))
    assert b.stat("load_blocks") == 8
    # one rank missing a block: the lookup stops there
    c = vh.Engine(vh.config(daemon, tp=2))
    k = c.workers[1].connector.store.keys(vh.block_hasher(16)(
        vh.Request("x", prompt(40), 1)))[1]
    assert "@tp1of2@" in k
    c.connector.client.remove(k, force=True)
    c.run_one("c", prompt(40))
    assert c.stat("hit_tokens") == 16
    for e in (a, b, c):
        e.shutdown()


def test_decode_context_parallel_hashes(daemon):
    """DCP 2: vLLM hashes 32-token blocks (block_size * dcp) and a scheduler
    block covers 32 tokens, 16 on each rank."""
    a = vh.Engine(vh.config(daemon, tp=2, dcp=2))
    assert a.connector.block_size == 32
    a.run_one("a", prompt(50))
    assert a.stat("save_blocks") == 4  # 2 blocks of 32 x 2 ranks
    b = vh.Engine(vh.config(daemon, tp=2, dcp=2))
    b.run_one("b", prompt(50))
    assert b.stat("hit_tokens") == 64 and b.stat("load_blocks") == 4
    a.shutdown()
    b.shutdown()


def test_roles(daemon):
    """A prefill (kv_producer) stores, and loads what the pool has of its
    prompts (as vLLM-Ascend's pool connector: a prefill gains from a prefix
    another instance computed); a decode (kv_consumer) loads and stores
    nothing."""
    p = vh.Engine(vh.config(daemon, role="kv_producer"))
    p.run_one("p", prompt(60))
    assert p.stat("save_blocks") == 4 and p.stat("load_blocks") == 0
    c = vh.Engine(vh.config(daemon, role="kv_consumer"))
    c.run_one("c", prompt(60))
    assert c.stat("load_blocks") == 4 and c.stat("save_blocks") == 0
    assert c.connector.requires_kv_delivery is False
    p2 = vh.Engine(vh.config(daemon, role="kv_producer"))
    p2.run_one("p2", prompt(60))
    assert p2.stat("load_blocks") == 4 and p2.stat("load_errors") == 0
    for e in (p, c, p2):
        e.shutdown()


def test_stats_and_events(daemon):
    a = vh.Engine(vh.config(daemon, events=True, tp=2))
    req = a.add_request("a", prompt(70), 3)
    a.run()
    # one event per step in which ranks ended their stores (vLLM publishes
    # what every rank reporting in a step reported): the same blocks
    stored = {e for e in a.events if isinstance(e, kv.BlockStored)}
    assert len(stored) == 1
    ev = stored.pop()
    assert ev.block_hashes == req.block_hashes[:4] and ev.block_size == 16
    assert ev.token_ids == prompt(70)[:64]
    total = kv.KvcacheConnectorStats()
    for d in a.stats:  # what vLLM's logger adds up, from each step's data
        s = kv.KvcacheConnector.build_kv_connector_stats(d)
        assert isinstance(s, kv.KvcacheConnectorStats)
        total.aggregate(s)
    assert total.reduce()["Blocks stored"] == 8
    a.shutdown()


def test_save_decode_cache(daemon):
    e = vh.Engine(vh.config(daemon, save_decode_cache=False))
    e.run_one("d", prompt(80)[:30], max_tokens=40)  # 69 computed, 30 of them prompt
    assert e.stat("save_blocks") == 1
    e.shutdown()


def test_extra_config_keys(daemon, caplog):
    caplog.set_level(logging.INFO, "kvcache.vllm")
    cfg = vh.config(daemon, register_buffer=True, mooncake_rpc_port="0", lookup_rpc_port=1,
                    load_async="false", use_layerwise="0", backend="mooncake",
                    layerwise_prefetch_layers=2, brand_new_key=1)
    c = vh.create_connector(cfg, "scheduler")
    assert c.load_async is False and c.use_layerwise is False
    text = caplog.text
    assert "lookup_rpc_port: not needed" in text and "register_buffer: not needed" in text
    assert "layerwise_prefetch_layers: not needed" in text
    assert "brand_new_key: not a key kvcache.vllm knows" in text
    c.shutdown()
    for bad, msg in (({"backend": "memcache"}, "backend"),
                     ({"decode_tp_size": 3, "tp": 2}, "decode_tp_size=3"),
                     ({"transfer": "carrier"}, "transfer")):
        with pytest.raises(ValueError, match=msg):
            vh.create_connector(vh.config(daemon, **bad), "scheduler")
    # a prefill and a decode of different TP sizes share an MLA model's KV
    # (and another model's: test_vllm_ascend.py)
    c = vh.create_connector(vh.config(daemon, decode_tp_size=4, tp=2, use_mla=True), "scheduler")
    c.shutdown()
    with pytest.raises(ConnectionError):
        vh.create_connector(vh.config(daemon + ".none"), "scheduler")


def test_hybrid_models_refused(daemon):
    cfg = vh.config(daemon)
    cfg.kv_cache.kv_cache_groups.append(cfg.kv_cache.kv_cache_groups[0])
    with pytest.raises(ValueError, match="one KV cache group"):
        vh.create_connector(cfg, "scheduler")


def test_lookup_waits_for_a_store_in_flight(daemon):
    """PD through the pool: the decode engine looks up the prompt while the
    prefill's store of it is still copying; the lookup waits for the commit
    (kvcached --lookup-wait-ms) instead of missing."""
    import threading
    import time

    import kvcache
    b = vh.Engine(vh.config(daemon))
    req = vh.Request("pd", prompt(90), 2, vh.block_hasher(16))
    keys = b.connector.store.keys(req.block_hashes)
    size = b.workers[0].connector.store.layout.block_bytes
    prefill = kvcache.Client(daemon)
    held = [prefill.reserve(k, size) for k in keys]  # the prefill's store, under way
    answer = []
    t = threading.Thread(target=lambda: answer.append(
        b.connector.get_num_new_matched_tokens(req, 0)))
    t.start()
    time.sleep(0.2)
    assert not answer  # waiting, not missing
    for r in reversed(held):  # the first block lands last
        r.commit()
    t.join(10)
    assert answer == [(64, True)]
    prefill.close()
    b.shutdown()


def prefill_then_decode_lookup(prefill_sock, decode_sock):
    """PD as vLLM's proxy runs it: the prefill engine answers its request
    (request_finished; the store is only queued), the decode engine looks
    the prompt up at once, and its lookup is still waiting when the
    prefill's next step stores the blocks; then it finds all four.  The
    two engines, to go on with."""
    import threading
    import time

    a = vh.Engine(vh.config(prefill_sock))
    a.add_request("p", prompt(95), 1)
    while "p" not in a.finished:
        a.step()
    assert a.stat("save_blocks") == 0
    b = vh.Engine(vh.config(decode_sock))
    req = vh.Request("d", prompt(95), 2, vh.block_hasher(16))
    answer = []
    t = threading.Thread(target=lambda: answer.append(
        b.connector.get_num_new_matched_tokens(req, 0)))
    t.start()
    time.sleep(0.3)
    assert not answer
    a.run()  # the next step stores the blocks
    t.join(10)
    assert answer == [(64, True)]
    return a, b


def test_decode_lookup_before_the_prefill_stores(daemon):
    """PD through the pool, as vLLM's proxy runs it: the prefill answers
    (request_finished), the proxy sends the prompt to the decode at once,
    and the decode's lookup comes before the prefill's workers have even
    begun storing.  The prefill's connector announced the blocks when the
    request finished: the lookup waits for them and finds all four."""
    a, b = prefill_then_decode_lookup(daemon, daemon)
    assert a.stat("save_blocks") == 4
    a.shutdown()
    b.shutdown()


def test_decode_on_another_node_waits_for_the_prefill(two_nodes):
    """PD across nodes: the prefill runs against node A, the decode against
    node B.  The decode's lookup comes before the prefill's workers have
    stored anything; A told the directory of the announced blocks, so B's
    lookup waits for them (instead of a miss and a recompute), and the
    decode's load fetches them from A, byte for byte."""
    a, b = prefill_then_decode_lookup(*two_nodes)
    b.run_one("d2", prompt(95), 2)  # every byte of its KV as computed
    assert b.stat("load_blocks") == 4
    a.shutdown()
    b.shutdown()


def test_repins_after_the_daemon_restarts(monkeypatch):
    """Segments registered with CUDA follow a restart of the daemon
    (kvcachectl upgrade): the client maps the memory again, and the
    connector's next job lets the old registrations go and pins the new
    mapping; requests go on, and what was stored before is loaded after.
    (No GPU here: cudart is a fake that records the calls.)"""
    import subprocess
    from conftest import start_daemon, stop_pid

    calls = []

    class FakeCudart:
        def cudaHostRegister(self, base, length, flags):
            calls.append(("register", base))
            return 0

        def cudaHostUnregister(self, base):
            calls.append(("unregister", base))
            return 0

    monkeypatch.setattr(torch.cuda, "cudart", lambda: FakeCudart())
    proc, d, sock, log = start_daemon()
    a = vh.Engine(vh.config(sock))
    conn = a.workers[0].connector
    conn._pin_segments()
    first = [base for kind, base in calls if kind == "register"]
    assert first
    a.run_one("before", prompt(40))
    up = subprocess.run([os.environ["KVCACHECTL"], "-s", sock, "--json", "upgrade"],
                        capture_output=True, text=True, timeout=120)
    assert up.returncode == 0, up.stderr
    assert proc.wait(60) == 0
    a.run_one("after-1", prompt(41))  # the first calls find the connection gone
    a.run_one("after-2", prompt(42))
    assert conn.client.reconnects == 1
    assert [base for kind, base in calls if kind == "unregister"] == first, calls
    assert len([1 for kind, _ in calls if kind == "register"]) == 2 * len(first)
    b = vh.Engine(vh.config(sock))
    b.run_one("b", prompt(40))  # kept over the restart, loaded by a new engine
    assert b.stat("load_blocks") == 4 and b.stat("load_errors") == 0
    a.shutdown()
    b.shutdown()
    pid = int(up.stdout.split('"pid": ')[1].split(",")[0])
    stop_pid(pid)
    log.close()


_FAKE_BASE = '''
class KVConnectorRole:
    SCHEDULER, WORKER = 0, 1
class KVConnectorMetadata:
    pass
class KVConnectorBase_V1:
    def __init__(self, vllm_config, role, kv_cache_config):
        self._vllm_config = vllm_config
class SupportsHMA:
    pass
'''


def _import_with(tmp_path, files):
    """kvcache.vllm imported in a fresh interpreter beside a vLLM of these
    modules: what it took, or its error."""
    import subprocess
    import sys
    import kvcache
    for path, text in files.items():
        f = tmp_path / path
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text)
    for d in [p for p in tmp_path.rglob("*") if p.is_dir()]:
        (d / "__init__.py").touch()
    code = ("import kvcache.vllm as v; print(v.HAVE_VLLM, v.KVConnectorBase_V1.__module__, "
            "v.KVConnectorStats.__module__, v.MEDIUM_CPU)")
    env = dict(os.environ, PYTHONPATH="%s:%s" % (
        tmp_path, os.path.dirname(os.path.dirname(kvcache.__file__))))
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    return r.stdout.strip() if r.returncode == 0 else "error: " + r.stderr.strip().splitlines()[-1]


def test_vllm_layouts(tmp_path):
    """vLLM's newest layout keeps its KV connector classes under
    vllm/backends/distributed (055e47c2; the old modules re-export them):
    the adapter takes them from there, or from the old place; a vLLM with
    neither is an error at import, not a stand-in base class vLLM's
    workers would refuse."""
    new = "vllm/backends/distributed/kv_transfer/kv_connector/v1/"
    got = _import_with(tmp_path / "new", {
        new + "base.py": _FAKE_BASE,
        new + "metrics.py": "class KVConnectorStats:\n    pass\n",
        "vllm/backends/distributed/kv_events.py": "MEDIUM_CPU = 'CPU'\n"})
    assert got == ("True vllm.backends.distributed.kv_transfer.kv_connector.v1.base "
                   "vllm.backends.distributed.kv_transfer.kv_connector.v1.metrics CPU")
    old = "vllm/distributed/kv_transfer/kv_connector/v1/"
    got = _import_with(tmp_path / "old", {old + "base.py": _FAKE_BASE})
    assert got.startswith("True vllm.distributed.kv_transfer.kv_connector.v1.base ")
    got = _import_with(tmp_path / "none", {"vllm/other.py": ""})
    assert got.startswith("error: ImportError: kvcache.vllm: vLLM is installed, but its KV "
                          "connector base class is in neither")
