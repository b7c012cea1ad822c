# SPDX-License-Identifier: MIT
"""kvcache.vllm driven the way vLLM drives a v1 connector, with objects of
vLLM's shape (vLLM itself is not installed here) and real tensors."""
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from kvcache import vllm as kv  # noqa: E402
from kvcache.engine import block_hashes_of  # noqa: E402

BS, LAYERS, BLOCKS = 4, 2, 32


def config(sock, role="kv_both", tp=1, rank=0, **extra):
    extra.setdefault("load_async", False)
    extra["socket"] = sock
    return SimpleNamespace(
        kv_transfer_config=SimpleNamespace(kv_role=role, kv_connector_extra_config=extra),
        model_config=SimpleNamespace(model="test/tiny-llama/", dtype=torch.float32,
                                     use_mla=False),
        cache_config=SimpleNamespace(block_size=BS, cache_dtype="auto"),
        parallel_config=SimpleNamespace(tensor_parallel_size=tp, pipeline_parallel_size=1,
                                        rank=rank))


def caches(seed):
    g = torch.Generator().manual_seed(seed)
    return {"model.layers.%d.self_attn.attn" % i: torch.randn(2, BLOCKS, BS, 2, 8, generator=g)
            for i in range(LAYERS)}


def request(rid, tokens, salt=b""):
    return SimpleNamespace(request_id=rid, block_hashes=block_hashes_of(tokens, BS, salt),
                           num_tokens=len(tokens), num_computed_tokens=len(tokens))


def engine(sock, seed, **kw):
    cfg = config(sock, **kw)
    s = kv.KvcacheConnector(cfg, kv.KVConnectorRole.SCHEDULER)
    w = kv.KvcacheConnector(cfg, kv.KVConnectorRole.WORKER)
    kc = caches(seed)
    w.register_kv_caches(kc)
    return s, w, kc


def step(s, w, layers=None):
    """One engine step: scheduler metadata to the worker, loads, stores."""
    meta = s.build_connector_meta(None)
    w.bind_connector_metadata(meta)
    w.start_load_kv(None)
    for name in layers or []:
        w.wait_for_layer_load(name)
    w.wait_for_save()
    w.wait_idle()
    done = w.get_finished(set())
    s.update_connector_output(SimpleNamespace(finished_sending=done[0] or set()))
    w.clear_connector_metadata()
    return done


def store_request(s, w, req, block_ids):
    assert s.get_num_new_matched_tokens(req, 0) == (0, False)
    assert s.request_finished(req, block_ids) == (True, None)  # keep the blocks until stored
    assert s.has_pending_saves()
    sending, _ = step(s, w)
    assert sending == {req.request_id}
    assert not s.has_pending_saves()


def test_store_on_one_engine_load_on_another(daemon):
    sa, wa, ka = engine(daemon, 1)
    tokens = list(range(1000, 1042))  # 10 full blocks and 2 tokens
    ids_a = list(range(3, 14))
    store_request(sa, wa, request("a1", tokens), ids_a)
    sb, wb, kb = engine(daemon, 2)
    req = request("b1", tokens)
    assert sb.get_num_new_matched_tokens(req, 0) == (40, False)
    assert sb.get_num_new_matched_tokens(req, 8) == (32, False)  # side-effect free
    ids_b = list(range(20, 31))
    sb.update_state_after_alloc(req, SimpleNamespace(get_block_ids=lambda: (ids_b,)), 32)
    step(sb, wb)
    for name in ka:
        assert torch.equal(ka[name][:, 5:13], kb[name][:, 22:30])  # blocks 2..9
        assert not torch.equal(ka[name][:, 3:5], kb[name][:, 20:22])  # computed locally
    assert wb.get_block_ids_with_load_errors() == set()
    # a full hit leaves the last token to compute
    full = request("b2", tokens[:40])
    assert sb.get_num_new_matched_tokens(full, 0) == (39, False)
    for c in (sa, wa, sb, wb):
        c.shutdown()


def test_async_and_load_errors(daemon):
    sa, wa, _ = engine(daemon, 3)
    tokens = list(range(2000, 2032))
    store_request(sa, wa, request("a", tokens, b"async"), list(range(8)))
    sb, wb, _ = engine(daemon, 4, load_async=True)
    req = request("b", tokens, b"async")
    assert sb.get_num_new_matched_tokens(req, 0) == (31, True)
    ids = list(range(10, 18))
    sb.update_state_after_alloc(req, ids, 31)
    # the object of block 5 goes away between lookup and load
    wb.client.remove(wb.store.keys(req.block_hashes)[5], force=True)
    _, recving = step(sb, wb)
    assert recving == {"b"}
    assert wb.get_block_ids_with_load_errors() == {15}
    assert wb.get_block_ids_with_load_errors() == set()  # reported once
    for c in (sa, wa, sb, wb):
        c.shutdown()


def test_layerwise_load(daemon):
    sa, wa, ka = engine(daemon, 5)
    tokens = list(range(3000, 3016))
    store_request(sa, wa, request("a", tokens, b"lw"), [0, 1, 2, 3])
    sb, wb, kb = engine(daemon, 6, use_layerwise=True)
    assert kv.KvcacheConnector.requires_piecewise_for_cudagraph({"use_layerwise": True})
    req = request("b", tokens, b"lw")
    assert sb.get_num_new_matched_tokens(req, 0) == (15, False)
    sb.update_state_after_alloc(req, [7, 8, 9, 10], 15)
    meta = sb.build_connector_meta(None)
    wb.bind_connector_metadata(meta)
    wb.start_load_kv(None)
    names = list(kb)
    wb.wait_for_layer_load(names[0])
    assert torch.equal(ka[names[0]][:, 0:4], kb[names[0]][:, 7:11])
    assert not torch.equal(ka[names[1]][:, 0:4], kb[names[1]][:, 7:11])
    wb.wait_for_layer_load(names[1])
    assert torch.equal(ka[names[1]][:, 0:4], kb[names[1]][:, 7:11])
    for c in (sa, wa, sb, wb):
        c.shutdown()


def test_roles(daemon):
    tokens = list(range(4000, 4016))
    sp, wp, _ = engine(daemon, 7, role="kv_producer")
    store_request(sp, wp, request("p", tokens, b"roles"), [0, 1, 2, 3])
    assert sp.get_num_new_matched_tokens(request("p2", tokens, b"roles"), 0) == (0, False)
    sc, wc, _ = engine(daemon, 8, role="kv_consumer")
    assert sc.request_finished(request("c", tokens, b"roles"), [0, 1, 2, 3]) == (False, None)
    assert sc.get_num_new_matched_tokens(request("c2", tokens, b"roles"), 0) == (15, False)
    assert sc.requires_kv_delivery is False
    for c in (sp, wp, sc, wc):
        c.shutdown()


def test_tensor_parallel_lookup_needs_every_rank(daemon):
    tokens = list(range(5000, 5020))
    ranks = []
    for r in range(2):
        cfg = config(daemon, tp=2, rank=r)
        w = kv.KvcacheConnector(cfg, kv.KVConnectorRole.WORKER)
        w.register_kv_caches(caches(10 + r))
        ranks.append(w)
    s = kv.KvcacheConnector(config(daemon, tp=2, rank=0), kv.KVConnectorRole.SCHEDULER)
    req = request("tp", tokens, b"tp")
    assert s.request_finished(req, [0, 1, 2, 3, 4]) == (True, None)
    meta = s.build_connector_meta(None)
    ranks[0].bind_connector_metadata(meta)
    ranks[0].start_load_kv(None)
    ranks[0].wait_idle()
    assert s.get_num_new_matched_tokens(request("q", tokens, b"tp"), 0) == (0, False)
    ranks[1].bind_connector_metadata(meta)
    ranks[1].start_load_kv(None)
    ranks[1].wait_idle()
    assert s.get_num_new_matched_tokens(request("q", tokens, b"tp"), 0) == (19, False)
    keys0 = ranks[0].store.keys(req.block_hashes[:1])[0]
    assert "@tp0of2@" in keys0 and keys0.startswith("kv1@test/tiny-llama@float32@vllm-NHD@b4@")
    for c in ranks + [s]:
        c.shutdown()


def test_extra_config_keys_users_already_write(daemon):
    cfg = config(daemon, register_buffer=True, mooncake_rpc_port=0, lookup_rpc_port=1,
                 load_async="false", use_layerwise="0")
    c = kv.KvcacheConnector(cfg, kv.KVConnectorRole.SCHEDULER)
    assert c.load_async is False and c.use_layerwise is False
    c.shutdown()
    with pytest.raises(ConnectionError):
        kv.KvcacheConnector(config(daemon + ".none"), kv.KVConnectorRole.SCHEDULER)
