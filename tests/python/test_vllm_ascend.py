# SPDX-License-Identifier: MIT
"""kvcache.vllm under vLLM-Ascend's names and runner: a user's
``AscendStoreConnector`` / ``MooncakeConnectorStoreV1`` config with
``kv_connector_module_path`` set to kvcache.vllm, Ascend's
``register_kv_caches`` tuples (vllm_ascend/worker/model_runner_v1.py at
182b75e: ``(k_cache, v_cache)`` from separate allocations, kernel blocks
scaled by ``tensor_num_blocks // num_blocks``), driven by vLLM's scheduler
(vllm_harness.py)."""
import pytest

torch = pytest.importorskip("torch")

import vllm_harness as vh  # noqa: E402
from kvcache import vllm as kv  # noqa: E402

PROMPT = [7 + (i * 29) % 900 for i in range(50)]  # 3 blocks of 16 and 2 tokens


def tokens(salt):
    return [t + salt for t in PROMPT]


@pytest.mark.parametrize("name", ["AscendStoreConnector", "MooncakeConnectorStoreV1"])
def test_ascend_names_and_tuples(daemon, name):
    cfg = vh.config(daemon, connector=name, backend="mooncake", lookup_rpc_port="0",
                    register_buffer=True, use_layerwise=False, dtype=torch.bfloat16)
    a = vh.Engine(cfg, ascend=True, kernel_block_size=8)
    assert isinstance(a.connector, kv.AscendStoreConnector)
    assert a.connector.load_async is False  # Ascend's default: loads in the step
    salt = 1 if name == "AscendStoreConnector" else 11
    a.run_one("a", tokens(salt))
    # the prompt's 3 full blocks (save_decode_cache is off by default)
    assert a.stat("save_blocks") == 3
    # a vLLM engine with FlashAttention's layout reads Ascend's objects
    b = vh.Engine(vh.config(daemon, dtype=torch.bfloat16))
    b.run_one("b", tokens(salt))
    assert b.stat("load_blocks") == 3
    a.shutdown()
    b.shutdown()


def test_ascend_retention_interval_skips_short_prompts(daemon, monkeypatch):
    """vLLM-Ascend's pool scheduler (ascend_store/pool_scheduler.py at
    182b75e) looks nothing up for a prompt shorter than twice vLLM's
    VLLM_PREFIX_CACHE_RETENTION_INTERVAL, except layerwise; kvcache's own
    connector name does not."""
    monkeypatch.setenv("VLLM_PREFIX_CACHE_RETENTION_INTERVAL", "32")
    assert kv.retention_interval() == 32
    a = vh.Engine(vh.config(daemon, connector="AscendStoreConnector"), ascend=True)
    long_prompt = tokens(40) + tokens(41)[:14]  # 64 tokens: 4 blocks
    a.run_one("a0", tokens(40))  # 50 tokens: stored, never looked up
    a.run_one("a1", long_prompt)
    assert a.stat("lookups") == 1 and a.stat("lookups_skipped") == 1
    assert a.stat("save_blocks") == 4  # the long one's first 3 are the short one's
    b = vh.Engine(vh.config(daemon, connector="AscendStoreConnector"), ascend=True,
                  prefix_caching=False)
    b.run_one("b0", tokens(40))
    assert b.stat("lookups") == 0 and b.stat("load_blocks") == 0
    b.run_one("b1", long_prompt)
    assert b.stat("lookups_skipped") == 1 and b.stat("load_blocks") == 4
    layerwise = vh.Engine(vh.config(daemon, connector="AscendStoreConnector",
                                    use_layerwise=True), ascend=True)
    layerwise.run_one("l0", tokens(40))
    assert layerwise.stat("lookups") == 1 and layerwise.stat("load_blocks") == 3
    plain = vh.Engine(vh.config(daemon))
    plain.run_one("p0", tokens(40))
    assert plain.stat("lookups") == 1 and plain.stat("load_blocks") == 3
    monkeypatch.setenv("VLLM_PREFIX_CACHE_RETENTION_INTERVAL", "x")
    assert kv.retention_interval() is None
    for e in (a, b, layerwise, plain):
        e.shutdown()


def test_ascend_consumer_roles(daemon):
    """vLLM-Ascend's kv_consumer neither loads nor stores unless
    consumer_is_to_load / consumer_is_to_put say so."""
    p = vh.Engine(vh.config(daemon, connector="AscendStoreConnector", role="kv_producer"),
                  ascend=True)
    p.run_one("p", tokens(2))
    assert p.stat("save_blocks") == 3
    plain = vh.Engine(vh.config(daemon, connector="AscendStoreConnector", role="kv_consumer"),
                      ascend=True)
    plain.run_one("c0", tokens(2))
    assert plain.stat("lookups") == 0 and plain.stat("save_blocks") == 0
    both = vh.Engine(vh.config(daemon, connector="AscendStoreConnector", role="kv_consumer",
                               consumer_is_to_load=True, consumer_is_to_put=True,
                               save_decode_cache=True), ascend=True)
    both.run_one("c1", tokens(3), max_tokens=20)  # 69 computed: 4 blocks
    assert both.stat("save_blocks") == 4
    both.run_one("c2", tokens(2))
    assert both.stat("load_blocks") == 3
    for e in (p, plain, both):
        e.shutdown()


def test_ascend_pd_keys(daemon):
    """Prefill and decode of different shapes: the same shape is fine, TP
    sizes neither of which divides the other and a different PP size are
    refused with the reason (kvcache keys blocks per rank); an MLA model
    shares KV across TP sizes."""
    ok = vh.create_connector(vh.config(daemon, connector="AscendStoreConnector",
                                       role="kv_consumer", prefill_tp_size=2, tp=2,
                                       consumer_is_to_put=True, prefill_pp_size=1,
                                       prefill_pp_layer_partition="3"), "scheduler")
    ok.shutdown()
    with pytest.raises(ValueError, match="prefill_tp_size=3"):
        vh.create_connector(vh.config(daemon, connector="AscendStoreConnector",
                                      role="kv_consumer", prefill_tp_size=3, tp=2), "scheduler")
    with pytest.raises(ValueError, match="prefill_pp_size=2"):
        vh.create_connector(vh.config(daemon, connector="AscendStoreConnector",
                                      role="kv_consumer", consumer_is_to_put=True,
                                      prefill_pp_size=2), "scheduler")
    mla = vh.create_connector(vh.config(daemon, connector="AscendStoreConnector",
                                        role="kv_consumer", prefill_tp_size=4, tp=2,
                                        use_mla=True), "scheduler")
    mla.shutdown()
    with pytest.raises(ValueError, match="backend"):
        vh.create_connector(vh.config(daemon, connector="AscendStoreConnector",
                                      backend="yuanrong"), "scheduler")


@pytest.mark.parametrize("prefill_tp,decode_tp,layerwise,ascend", [
    (4, 2, False, True), (2, 4, False, True), (1, 4, True, False), (4, 1, False, False),
    (4, 1, True, False)])
def test_prefill_and_decode_of_other_tp_sizes(daemon, prefill_tp, decode_tp, layerwise, ascend):
    """A prefill and a decode of different TP sizes (vLLM-Ascend's
    prefill_tp_size / decode_tp_size): the keys go by the larger TP, and a
    rank of the smaller holds each block as one object per head group of the
    larger's; every KV byte the decode loads is checked, head by head."""
    name = "AscendStoreConnector" if ascend else "KvcacheConnector"
    prefill = vh.Engine(vh.config(daemon, connector=name, role="kv_producer", tp=prefill_tp,
                                  decode_tp_size=decode_tp, use_layerwise=layerwise),
                        ascend=ascend)
    salt = 60 + prefill_tp * 5 + decode_tp + 40 * layerwise
    prefill.run_one("p", tokens(salt))
    assert prefill.stat("save_blocks") == 3 * prefill_tp  # the workers' stats add up
    decode = vh.Engine(vh.config(daemon, connector=name, role="kv_consumer", tp=decode_tp,
                                 prefill_tp_size=prefill_tp, consumer_is_to_load=True,
                                 use_layerwise=layerwise), ascend=ascend)
    decode.run_one("d", tokens(salt))  # every byte of every head checked
    assert decode.stat("load_blocks") == 3 * decode_tp and decode.stat("load_errors") == 0
    # the larger side's objects are those of an instance of its own TP size
    larger = max(prefill_tp, decode_tp)
    same = vh.Engine(vh.config(daemon, connector=name, role="kv_consumer", tp=larger,
                               consumer_is_to_load=True), ascend=ascend)
    same.run_one("s", tokens(salt))
    assert same.stat("load_blocks") == 3 * larger
    for e in (prefill, decode, same):
        e.shutdown()


def test_other_tp_sizes_need_whole_heads(daemon):
    """A decode of TP 2 beside a prefill of TP 8 would split its 2 KV heads
    into 4 groups: refused when its caches are registered, with the reason."""
    with pytest.raises(ValueError, match="KV head groups"):
        vh.Engine(vh.config(daemon, connector="AscendStoreConnector", role="kv_consumer",
                            tp=2, prefill_tp_size=8, consumer_is_to_load=True), ascend=True)


@pytest.mark.parametrize("layerwise", [False, True])
def test_sparse_attention_indexer_caches(daemon, layerwise):
    """A sparse-attention model on Ascend registers each layer's indexer
    cache beside its attention cache, under a name the forward never
    passes to wait_for_layer_load: a block's object holds both, and a load
    layer by layer brings each indexer cache with its layer."""
    cfg = vh.config(daemon, connector="AscendStoreConnector", use_layerwise=layerwise,
                    dtype=torch.bfloat16)
    a = vh.Engine(cfg, ascend=True, indexer=True)
    salt = 40 + layerwise
    a.run_one("a", tokens(salt))
    assert a.stat("save_blocks") == 3
    b = vh.Engine(vh.config(daemon, connector="AscendStoreConnector", use_layerwise=layerwise,
                            dtype=torch.bfloat16), ascend=True, indexer=True)
    b.run_one("b", tokens(salt))  # every byte checked, the indexer caches' too
    assert b.stat("load_blocks") == 3 and b.stat("load_errors") == 0
    a.shutdown()
    b.shutdown()
