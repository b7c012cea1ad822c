# SPDX-License-Identifier: MIT
"""kvcache.sglang driven as SGLang's cache controller drives a HiCache
storage backend (sglang_harness.py: its controller, factory, host pools and
metrics check at 001067f, the split MLA pool at 01c0ede3, the hybrid
controller at 92389675, transcribed), on real host pools."""
import pytest

torch = pytest.importorskip("torch")

import sglang_harness as sh  # noqa: E402
from kvcache import sglang as kvs  # noqa: E402

PAGE, LAYERS, HEADS, HD = 4, 3, 2, 8


def mha(seed, size=2048, **kw):
    return sh.MHAHostPool(size, PAGE, LAYERS, HEADS, HD, seed=seed, **kw)


def pair(daemon, pool_a, pool_b, **cfg):
    a = sh.create_backend(sh.storage_config(daemon, **cfg), pool_a)
    b = sh.create_backend(sh.storage_config(daemon, **cfg), pool_b)
    return a, b


def same_pages(pa, sa, pb, sb, n):
    for i in range(n):
        for x, y in zip(pa.page(sa + i * PAGE), pb.page(sb + i * PAGE)):
            if not torch.equal(x, y):
                return False
    return True


@pytest.mark.parametrize("layout", ["page_first", "layer_first"])
def test_backup_and_prefetch_in_batches(daemon, layout):
    """300 pages: three batches of up to 128 each way; another instance
    finds and loads them; --enable-metrics gets StorageMetrics."""
    pa, pb = mha(1, layout=layout), mha(2, layout=layout)
    a, b = pair(daemon, pa, pb)
    ca, cb = sh.Controller(a, PAGE), sh.Controller(b, PAGE)
    hashes = sh.page_hashes(list(range(300 * PAGE)), PAGE, "ab" * 32 if layout == "x" else None)
    hashes = [h + layout[:2] for h in hashes]  # layouts apart
    assert cb.storage_hit_query(hashes) == []
    assert ca.page_backup(hashes, torch.arange(300 * PAGE)) == 300 * PAGE
    assert cb.storage_hit_query(hashes) == hashes
    dst = torch.arange(800, 800 + 300 * PAGE)
    assert cb.page_get(hashes, dst) == 300
    assert same_pages(pa, 0, pb, 800, 300)
    ca.check_hicache_events()
    cb.check_hicache_events()
    assert ca.logged_pages("backup") == 300 and cb.logged_pages("prefetch") == 300
    assert len(ca.logged[0].backup_bandwidth) == 3 and min(ca.logged[0].backup_bandwidth) > 0
    cb.check_hicache_events()  # drained: nothing new
    assert cb.logged_pages("prefetch") == 300
    a.clear()
    assert cb.storage_hit_query(hashes) == []
    a.close()
    b.close()


class Recorder:
    """The backend's client, with its puts' parents noted."""

    def __init__(self, client):
        self.client = client
        self.puts = []

    def __getattr__(self, name):
        return getattr(self.client, name)

    def batch_put_from_multi_buffers(self, keys, ptrs, sizes, **opts):
        self.puts.append((list(keys), opts.get("parent"), opts.get("chain")))
        return self.client.batch_put_from_multi_buffers(keys, ptrs, sizes, **opts)


@pytest.mark.parametrize("pass_prefix_keys", [False, True])
def test_parents_across_batches(daemon, pass_prefix_keys):
    """One call per batch, each page naming the one before it, the first
    page of a batch naming the last of the batch before (with or without
    hicache_storage_pass_prefix_keys)."""
    s = sh.create_backend(sh.storage_config(daemon), mha(3))
    rec = s.client = Recorder(s.client)
    c = sh.Controller(s, PAGE, pass_prefix_keys=pass_prefix_keys)
    root = sh.page_hashes(list(range(50 * PAGE)), PAGE)
    hashes = sh.page_hashes(list(range(200 * PAGE)), PAGE, root[-1])
    # a prompt under a stored prefix (root), then one at the root
    assert c.page_backup(root, torch.arange(50 * PAGE), []) == 50 * PAGE
    assert c.page_backup(hashes, torch.arange(200 * PAGE), list(root)) == 200 * PAGE
    keys = s.spec.keys(root + hashes)
    calls = rec.puts
    assert [len(k) for k, _, _ in calls] == [50, 128, 72] and all(ch for _, _, ch in calls)
    assert calls[0][1] is None  # the root's first page has no parent
    assert calls[1][1] == (keys[49] if pass_prefix_keys else None)
    assert calls[2][1] == keys[50 + 127]  # the batch before
    s.clear()
    s.close()


def test_ranks_context_parallel_and_mla(daemon):
    ks = sh.page_hashes(list(range(2 * PAGE)), PAGE, "cd" * 32)
    r0 = sh.create_backend(sh.storage_config(daemon, 0, 2), mha(4, 64))
    r1 = sh.create_backend(sh.storage_config(daemon, 1, 2), mha(5, 64))
    assert r0.batch_set_v1(ks, torch.arange(8)) == [True, True]
    assert r1.batch_exists(ks) == 0  # rank 1's pages are its own
    mla = [sh.create_backend(sh.storage_config(daemon, t, 2, mla=True, cp_rank=c, cp_size=2),
                             sh.MLAHostPool(64, PAGE, LAYERS, 16, seed=10 + 2 * t + c))
           for t in range(2) for c in range(2)]  # (tp, cp): (0,0) (0,1) (1,0) (1,1)
    assert mla[0].batch_set_v1(ks, torch.arange(8)) == [True, True]
    assert mla[2].batch_exists(ks) == 2  # MLA pages are shared by every TP rank
    assert mla[1].batch_exists(ks) == 0  # but each context-parallel rank holds its own
    assert mla[2].batch_get_v1(ks, torch.arange(8, 16)) == [True, True]
    assert torch.equal(mla[0].pool.kv_buffer[0:8], mla[2].pool.kv_buffer[8:16])
    assert "@all-cp1of2@" in mla[1].spec.key(ks[0])
    for s in [r0, r1] + mla:
        s.clear()
        s.close()


def test_reuse_domains(daemon):
    """extra_backend_tag and tenant_id (as Mooncake's backend takes them):
    deployments under the same served name with other tags or tenants never
    find each other's pages; the same tag and tenant do."""
    ks = sh.page_hashes(list(range(2 * PAGE)), PAGE, "9d" * 32)

    def backend(seed, **extra):
        return sh.create_backend(sh.storage_config(daemon, **extra), mha(seed, 64))
    a = backend(30, extra_backend_tag="m-weights1")
    assert a.batch_set_v1(ks, torch.arange(2 * PAGE)) == [True, True]
    assert "m-weights1_" in a.spec.key(ks[0])
    same = backend(31, extra_backend_tag="m-weights1")
    assert same.batch_exists(ks) == 2
    for other in (backend(32), backend(33, extra_backend_tag="m-weights2"),
                  backend(34, extra_backend_tag="m-weights1", tenant_id="team-b")):
        assert other.batch_exists(ks) == 0
        other.close()
    a.clear()
    a.close()
    same.close()


def test_tuple_and_logical_pools(daemon):
    """Asymmetric K/V (a tuple kv_buffer) and a logical anchor (None) are
    registered, not crashed on."""
    pa, pb = mha(6, 256, asymmetric=True), mha(7, 256, asymmetric=True)
    a, b = pair(daemon, pa, pb)
    ks = sh.page_hashes(list(range(5 * PAGE)), PAGE, "ef" * 32)
    assert a.batch_set_v1(ks, torch.arange(5 * PAGE)) == [True] * 5
    assert b.batch_get_v1(ks, torch.arange(40, 40 + 5 * PAGE)) == [True] * 5
    assert same_pages(pa, 0, pb, 40, 5)
    anchor = sh.create_backend(sh.storage_config(daemon, mla=True),
                               sh.MLAHostPool(64, PAGE, LAYERS, 16, dummy=True))
    assert anchor.batch_exists(ks) == 5 and anchor.batch_get_v1(ks, torch.arange(20)) == [True] * 5
    for s in (a, b, anchor):
        s.clear()
        s.close()


@pytest.mark.parametrize("pieces", [dict(), dict(index_dim=8, scales=True, index_layers=2),
                                    dict(index_dim=8, fp8_dsa=True)],
                         ids=["k+v", "indexer", "fp8-dsa"])
def test_ascend_mla_split_pages(daemon, pieces):
    """page_first_kv_split (SGLang on Ascend picks it for MLA models): every
    piece of a page, from buffers of their own, stored by one instance and
    loaded by another into other pages, byte for byte; a pool with other
    pieces does not take these pages for its own."""
    def pool(seed):
        return sh.MLASplitHostPool(64, PAGE, LAYERS, 16, 4, seed=seed, **pieces)
    pa, pb = pool(20), pool(21)
    a, b = pair(daemon, pa, pb, mla=True)
    ks = sh.page_hashes(list(range(6 * PAGE)), PAGE, "5a" * 32)
    ca, cb = sh.Controller(a, PAGE), sh.Controller(b, PAGE)
    assert ca.page_backup(ks, torch.arange(PAGE, 7 * PAGE)) == 6 * PAGE
    assert cb.storage_hit_query(ks) == ks
    assert cb.page_get(ks, torch.arange(8 * PAGE, 14 * PAGE)) == 6
    assert same_pages(pa, PAGE, pb, 8 * PAGE, 6)
    assert not same_pages(pa, 0, pb, 0, 1)  # (the pools differ elsewhere)
    other = sh.create_backend(sh.storage_config(daemon, mla=True),
                              sh.MLASplitHostPool(64, PAGE, LAYERS, 16, 4, seed=22))
    assert pieces == {} or other.batch_exists(ks) == 0
    for s in (a, b, other):
        s.clear()
        s.close()


def _hybrid(daemon, seed):
    """A DeepSeek-V4-like backend: a logical KV anchor and side pools, an
    indexer (a page's worth a page) and two states (one slot a page)."""
    s = sh.create_backend(sh.storage_config(daemon, mla=True, model="dsv4"),
                          sh.MLAHostPool(256, PAGE, LAYERS, 16, dummy=True))
    pools = {"indexer": sh.MLAHostPool(256, PAGE, 1, 8, seed=seed),
             "mamba": sh.MLAHostPool(64, 1, 1, 32, seed=seed + 1),
             "swa": sh.MLAHostPool(64, 1, 1, 32, seed=seed + 2)}
    for name, pool in pools.items():
        s.register_mem_host_pool_v2(pool, name)
    return s, pools["indexer"], pools["mamba"]


def test_hybrid_v2(daemon):
    """An indexer needed for every page and a state needed for the last page
    only."""
    a, a_idx, a_state = _hybrid(daemon, 20)
    b, b_idx, b_state = _hybrid(daemon, 30)
    ks = sh.page_hashes(list(range(6 * PAGE)), PAGE, "12" * 32)
    sets = a.batch_set_v2([sh.PoolTransfer("indexer", torch.arange(6 * PAGE), keys=ks),
                           sh.PoolTransfer("mamba", torch.tensor([3]), keys=ks[5:])])
    assert sets == {"indexer": [True] * 6, "mamba": [True]}
    policies = [sh.PoolTransfer("indexer", keys=ks),
                sh.PoolTransfer("mamba", keys=ks[-1:], hit_policy="trailing_pages")]
    r = b.batch_exists_v2(ks, policies)
    assert r.kv_hit_pages == 6 and r.extra_pool_hit_pages == {"kv": 6, "indexer": 6, "mamba": 6}
    assert r.restorable_prefix_pages == [6]  # the state is the last page's only
    # the state of page 5 is not there: a shorter prefix has none either
    r = b.batch_exists_v2(ks[:5], policies)
    assert r.kv_hit_pages == 0 and "mamba" not in r.extra_pool_hit_pages
    assert r.restorable_prefix_pages == []
    got = b.batch_get_v2([sh.PoolTransfer("indexer", torch.arange(8, 8 + 6 * PAGE), keys=ks),
                          sh.PoolTransfer("mamba", torch.tensor([9]), keys=ks[5:])])
    assert got == {"indexer": [True] * 6, "mamba": [True]}
    assert torch.equal(a_idx.kv_buffer[0:24], b_idx.kv_buffer[8:32])
    assert torch.equal(a_state.kv_buffer[3], b_state.kv_buffer[9])
    for s in (a, b):
        s.clear()
        s.close()


def test_hybrid_v2_ends_every_pool_can_serve(daemon, monkeypatch):
    """The prefix found is one every pool can end (SGLang's
    PoolTransferResult.restorable_prefix_pages, as Mooncake's backend answers
    at sglang 7bfc299a): a trailing pool's ends have holes, so the least of
    the pools' longest ends is not always one of them."""
    s, _, _ = _hybrid(daemon, 40)
    slot = iter(range(64))

    def pages(seed, held):
        """Four pages; each pool holds the pages (1-based) it is given."""
        ks = sh.page_hashes(list(range(4 * PAGE)), PAGE, seed * 32)
        for pool, at in held.items():
            width = PAGE if pool == "indexer" else 1
            idx = torch.cat([torch.arange(width) + next(slot) * width for _ in at])
            assert s.batch_set_v2([sh.PoolTransfer(pool, idx, keys=[ks[p - 1] for p in at])]) \
                == {pool: [True] * len(at)}
        return ks

    def trailing(pool, window=1):
        return sh.PoolTransfer(pool, keys=["w"] * window, hit_policy="trailing_pages")

    # each state ends a different prefix: none is usable
    ks = pages("a1", {"swa": [3], "mamba": [2]})
    r = s.batch_exists_v2(ks, [trailing("swa"), trailing("mamba")])
    assert (r.kv_hit_pages, r.restorable_prefix_pages) == (0, [])
    assert r.extra_pool_hit_pages == {"kv": 4, "swa": 3, "mamba": 2}
    # both can end one page; only the state can end three
    ks = pages("b2", {"mamba": [1, 3], "swa": [1, 2]})
    r = s.batch_exists_v2(ks, [trailing("mamba"), trailing("swa")])
    assert (r.kv_hit_pages, r.restorable_prefix_pages) == (1, [1])
    # a two-page window (pages 2 and 3) beside an indexer of every page
    ks = pages("c3", {"indexer": [1, 2, 3, 4], "mamba": [2, 3]})
    r = s.batch_exists_v2(ks, [sh.PoolTransfer("indexer", keys=ks), trailing("mamba", 2)])
    assert (r.kv_hit_pages, r.restorable_prefix_pages) == (3, [3])
    assert r.extra_pool_hit_pages == {"kv": 4, "indexer": 4, "mamba": 3}
    # the order of the pools does not matter
    ks = pages("d4", {"indexer": [1, 2], "swa": [3]})
    for order in ([sh.PoolTransfer("indexer", keys=ks), trailing("swa")],
                  [trailing("swa"), sh.PoolTransfer("indexer", keys=ks)]):
        r = s.batch_exists_v2(ks, order)
        assert (r.kv_hit_pages, r.restorable_prefix_pages) == (0, [])
    # an SGLang whose result has two fields still gets the longest end
    class TwoFields:
        def __init__(self, kv_hit_pages, extra_pool_hit_pages):
            self.kv_hit_pages, self.extra_pool_hit_pages = kv_hit_pages, extra_pool_hit_pages

    monkeypatch.setattr(kvs, "PoolTransferResult", TwoFields)
    ks = pages("e5", {"mamba": [1, 3], "swa": [1, 2]})
    r = s.batch_exists_v2(ks, [trailing("mamba"), trailing("swa")])
    assert r.kv_hit_pages == 1 and not hasattr(r, "restorable_prefix_pages")
    s.clear()
    s.close()


def _hybrid_ranks(daemon, seed, tp=1, side=("mamba",)):
    """Qwen3-Next-like ranks: MHA KV, a Mamba state pool (a slot a page)
    and an SWA pool (a page's worth a page)."""
    ranks = []
    for r in range(tp):
        kv = mha(seed + 10 * r, size=256)
        backend = sh.create_backend(sh.storage_config(daemon, tp_rank=r, tp_size=tp,
                                                      model="Qwen/Qwen3-Next"), kv)
        pools = {"kv": kv}
        for i, name in enumerate(side):
            pools[name] = sh.MLAHostPool(64, 1 if name == "mamba" else PAGE, 1, 24,
                                         seed=seed + 10 * r + 1 + i)
        ranks.append((backend, pools))
    return ranks


def _close(*controllers):
    for c in controllers:
        for backend, _ in c.ranks:
            backend.clear()
            backend.close()


def test_hybrid_controller_mamba(daemon):
    """SGLang's hybrid controller over Qwen3-Next-like pools: a radix node's
    Mamba state is stored under its last page only, so a prompt that ends
    inside a node is found up to the last node boundary before it, and what
    is loaded is that boundary's state with the KV before it."""
    specs = [sh.SideSpec("mamba", sh.TRAILING)]
    a = sh.HybridController(_hybrid_ranks(daemon, 100), PAGE, specs)
    b = sh.HybridController(_hybrid_ranks(daemon, 200), PAGE, specs)
    hashes = sh.page_hashes(list(range(10 * PAGE)), PAGE, "5a" * 32)
    # two radix nodes of 4 pages each, their states in slots 5 and 6
    assert a.backup(hashes[:4], [{"kv": torch.arange(0, 4 * PAGE),
                                  "mamba": torch.tensor([5])}]) == [4 * PAGE]
    assert a.backup(hashes[4:8], [{"kv": torch.arange(4 * PAGE, 8 * PAGE),
                                   "mamba": torch.tensor([6])}], hashes[:4]) == [4 * PAGE]
    pa, pb = a.ranks[0][1], b.ranks[0][1]
    dest = [{"kv": torch.arange(64, 64 + 10 * PAGE), "mamba": torch.tensor([40])}]
    tokens, hits, kept = b.prefetch(hashes, dest)
    assert (tokens, kept) == (8 * PAGE, True) and hits["mamba"] == 1
    assert same_pages(pa["kv"], 0, pb["kv"], 64, 8)
    assert torch.equal(pb["mamba"].kv_buffer[40], pa["mamba"].kv_buffer[6])
    # six pages of the same prompt: the state at page 4 is the one there is
    dest = [{"kv": torch.arange(128, 128 + 6 * PAGE), "mamba": torch.tensor([41])}]
    tokens, hits, kept = b.prefetch(hashes[:6], dest)
    assert (tokens, kept) == (4 * PAGE, True)
    assert same_pages(pa["kv"], 0, pb["kv"], 128, 4)
    assert torch.equal(pb["mamba"].kv_buffer[41], pa["mamba"].kv_buffer[5])
    # three pages: no state ends there, nothing is loaded
    assert b.prefetch(hashes[:3], dest) == (0, {}, False)
    _close(a, b)


def test_hybrid_controller_two_states(daemon):
    """A Mamba state and SWA windows: the prefix loaded is one both can end.
    With two-page windows; then with one-page windows whose longest ends
    differ, where the least of the pools' longest ends (what the backend
    answered before) has no state, and that prefetch was thrown away whole."""
    def controllers(seed, window):
        specs = [sh.SideSpec("mamba", sh.TRAILING),
                 sh.SideSpec("swa", sh.TRAILING, window=window)]
        return [sh.HybridController(_hybrid_ranks(daemon, s, side=("mamba", "swa")), PAGE,
                                    specs) for s in (seed, seed + 100)]

    a, b = controllers(300, 2)
    hashes = sh.page_hashes(list(range(6 * PAGE)), PAGE, "6b" * 32)
    # nodes of pages 1-2 and 3-4 (1-based): states at 2 and 4, SWA windows
    # of pages 1-2 and 3-4
    for n, (lo, hi) in enumerate(((0, 2), (2, 4))):
        assert a.backup(hashes[lo:hi], [{
            "kv": torch.arange(lo * PAGE, hi * PAGE), "mamba": torch.tensor([n]),
            "swa": torch.arange(lo * PAGE, hi * PAGE)}], hashes[:lo]) == [2 * PAGE]
    pa, pb = a.ranks[0][1], b.ranks[0][1]
    backend = a.ranks[0][0]
    # page 4's window loses page 3 (SWA ends: 2 only); a state for page 3
    # alone appears (Mamba ends: 2, 3, 4)
    assert backend.client.remove(backend._keys([hashes[2]], "swa")[0], force=True) == 0
    assert a.ranks[0][0].batch_set_v2([sh.PoolTransfer("mamba", torch.tensor([7]),
                                                       keys=[hashes[2]])]) == {"mamba": [True]}
    dest = [{"kv": torch.arange(64, 64 + 6 * PAGE), "mamba": torch.tensor([30]),
             "swa": torch.arange(32, 32 + 2 * PAGE)}]
    tokens, hits, kept = b.prefetch(hashes, dest)
    assert (tokens, kept) == (2 * PAGE, True)
    assert hits == {"mamba": 1, "swa": 2}
    assert same_pages(pa["kv"], 0, pb["kv"], 64, 2)
    assert torch.equal(pb["mamba"].kv_buffer[30], pa["mamba"].kv_buffer[0])
    assert same_pages(pa["swa"], 0, pb["swa"], 32, 2)
    _close(a, b)
    # one-page windows: states end pages 1 and 3, SWA windows pages 1 and 2;
    # the least of the longest ends, 2, has no state
    a, b = controllers(700, 1)
    hashes = sh.page_hashes(list(range(3 * PAGE)), PAGE, "8d" * 32)
    for n, (lo, hi) in enumerate(((0, 1), (1, 3))):
        assert a.backup(hashes[lo:hi], [{
            "kv": torch.arange(lo * PAGE, hi * PAGE), "mamba": torch.tensor([n]),
            "swa": torch.arange((hi - 1) * PAGE, hi * PAGE)}], hashes[:lo]) == [(hi - lo) * PAGE]
    backend = a.ranks[0][0]
    assert backend.client.remove(backend._keys([hashes[2]], "swa")[0], force=True) == 0
    assert backend.batch_set_v2([sh.PoolTransfer("swa", torch.arange(PAGE, 2 * PAGE),
                                                 keys=[hashes[1]])]) == {"swa": [True]}
    pa, pb = a.ranks[0][1], b.ranks[0][1]
    dest = [{"kv": torch.arange(64, 64 + 3 * PAGE), "mamba": torch.tensor([30]),
             "swa": torch.arange(32, 32 + PAGE)}]
    tokens, hits, kept = b.prefetch(hashes, dest)
    assert (tokens, kept) == (PAGE, True) and hits == {"mamba": 1, "swa": 1}
    assert same_pages(pa["kv"], 0, pb["kv"], 64, 1)
    assert torch.equal(pb["mamba"].kv_buffer[30], pa["mamba"].kv_buffer[0])
    assert same_pages(pa["swa"], 0, pb["swa"], 32, 1)
    _close(a, b)


def test_hybrid_controller_ranks(daemon):
    """Two TP ranks: the least hit over the ranks is loaded on both; a
    state that goes between the lookup and the load makes that rank's side
    pool miss, and the whole prefetch is thrown away."""
    specs = [sh.SideSpec("mamba", sh.TRAILING)]
    a = sh.HybridController(_hybrid_ranks(daemon, 500, tp=2), PAGE, specs)
    b = sh.HybridController(_hybrid_ranks(daemon, 600, tp=2), PAGE, specs)
    hashes = sh.page_hashes(list(range(8 * PAGE)), PAGE, "7c" * 32)
    for lo, slot in ((0, 3), (4, 4)):
        assert a.backup(hashes[lo:lo + 4], [
            {"kv": torch.arange(lo * PAGE, (lo + 4) * PAGE), "mamba": torch.tensor([slot])}
            for _ in range(2)], hashes[:lo]) == [4 * PAGE, 4 * PAGE]
    rank1 = a.ranks[1][0]
    assert rank1.client.remove(rank1._keys([hashes[7]], "mamba")[0], force=True) == 0
    dest = [{"kv": torch.arange(64, 64 + 8 * PAGE), "mamba": torch.tensor([20])}
            for _ in range(2)]
    tokens, hits, kept = b.prefetch(hashes, dest)
    assert (tokens, kept) == (4 * PAGE, True) and hits == {"mamba": 1}
    for r in range(2):
        pa, pb = a.ranks[r][1], b.ranks[r][1]
        assert same_pages(pa["kv"], 0, pb["kv"], 64, 4)
        assert torch.equal(pb["mamba"].kv_buffer[20], pa["mamba"].kv_buffer[3])
    # rank 0's state of page 4 goes after the lookup: rank 0 misses it
    class StateGoesFirst:
        """B's rank-0 client, whose Mamba state loads find it removed."""

        def __init__(self, client):
            self.client = client

        def __getattr__(self, name):
            return getattr(self.client, name)

        def batch_get_into_multi_buffers(self, keys, *args, **kw):
            if any("mamba" in k for k in keys):
                assert self.client.remove(keys[0], force=True) == 0
            return self.client.batch_get_into_multi_buffers(keys, *args, **kw)

    b.ranks[0][0].client = StateGoesFirst(b.ranks[0][0].client)
    tokens, hits, kept = b.prefetch(hashes, dest)
    assert (tokens, kept) == (0, False) and hits == {"mamba": 0}
    _close(a, b)


def test_generic_path_and_errors(daemon):
    s = sh.create_backend(sh.storage_config(daemon), mha(8, 64))
    t = torch.arange(64, dtype=torch.float32)
    assert s.set("page-a", t)
    out = torch.zeros(64)
    assert s.get("page-a", out) is out and torch.equal(out, t)
    assert s.get("missing", torch.zeros(4)) is None
    assert s.get("missing") is None
    assert torch.equal(s.get("page-a").view(torch.float32), t)
    assert s.batch_set(["p1", "p2"], [t[:4], t[4:8]])
    assert [x is None for x in s.batch_get(["p1", "zz"])] == [False, True]
    with pytest.raises(ValueError):
        s.get("page-a", torch.zeros(8, 8).t())
    assert isinstance(s.get_stats(), kvs.StorageMetrics)
    pool = mha(9, 64)
    pool.layout = "page_sideways"
    with pytest.raises(ValueError, match="page_sideways"):
        sh.create_backend(sh.storage_config(daemon), pool)
    with pytest.raises(ValueError, match="split pages by heads"):
        cfg = sh.storage_config(daemon)
        cfg.should_split_heads = True
        sh.create_backend(cfg, mha(10, 64))
    with pytest.raises(ValueError):
        s.batch_get_v1(["a", "b"], torch.arange(4))  # 2 keys, 1 page
    s.clear()
    s.close()
    s.close()  # SGLang may close on detach and again at exit


def test_lookups_miss_while_the_daemon_restarts():
    """A daemon that stopped answers nothing: SGLang's lookups see misses
    (its controller would die of an exception) and, once a daemon serves
    the socket again, the same backend finds what it stores there."""
    import signal
    import subprocess
    import time
    from conftest import start_daemon, stop_daemon, ready

    proc, d, sock, log = start_daemon()
    pool = mha(61)
    s = sh.create_backend(sh.storage_config(sock), pool)
    hashes = sh.page_hashes(list(range(4 * PAGE)), PAGE)
    assert all(s.batch_set_v1(hashes, torch.arange(4 * PAGE)))
    assert s.batch_exists(hashes) == 4
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0
    assert s.batch_exists(hashes) == 0
    assert s.exists(hashes[0]) is False
    assert s.get(hashes[0]) is None
    proc = subprocess.Popen(proc.args, stdout=log, stderr=subprocess.STDOUT)
    for _ in range(1000):
        if ready(sock):
            break
        time.sleep(0.01)
    assert s.batch_exists(hashes) in (0, 4)  # the call that finds the old connection gone
    assert all(s.batch_set_v1(hashes, torch.arange(4 * PAGE)))
    assert s.batch_exists(hashes) == 4
    stop_daemon(proc, d, log)
