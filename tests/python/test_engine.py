# SPDX-License-Identifier: MIT
"""kvcache.engine on real tensors: blocks round-trip through kvcached."""
import errno

import pytest

torch = pytest.importorskip("torch")

from kvcache.engine import BlockStore, KVLayout, block_hashes_of  # noqa: E402
from kvcache.keys import KeySpec  # noqa: E402

LAYERS, BLOCKS, BT, HEADS, HD = 3, 16, 4, 2, 8


def flash_caches(seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(2, BLOCKS, BT, HEADS, HD, generator=g).to(dtype) for _ in range(LAYERS)]


def spec(**kw):
    return KeySpec("test/model", "float32", "vllm-NHD", BT, **kw)


def test_layout_from_tensors():
    caches = flash_caches()
    lay = KVLayout.from_tensors(caches)
    assert len(lay.segments) == 2 * LAYERS  # K and V per layer
    assert lay.block_bytes == 2 * LAYERS * BT * HEADS * HD * 4
    ptrs, sizes = lay.pieces(3)
    assert ptrs[0] == caches[0][0][3].data_ptr() and ptrs[1] == caches[0][1][3].data_ptr()
    assert sizes == [BT * HEADS * HD * 4] * (2 * LAYERS)
    assert lay.pieces(3, layer=1)[0] == [caches[1][0][3].data_ptr(), caches[1][1][3].data_ptr()]
    mla = [torch.zeros(BLOCKS, BT, 40) for _ in range(2)]
    assert len(KVLayout.from_tensors(mla).segments) == 2  # one per layer
    with pytest.raises(IndexError):
        lay.pieces(BLOCKS)
    # blocks that are not one run of memory (HND, or worse): torch copies them
    odd = KVLayout.from_tensors([torch.zeros(4, 4, BLOCKS).permute(2, 1, 0)])
    assert not odd.direct and odd.block_bytes == 4 * 4 * 4
    with pytest.raises(ValueError):
        odd.pieces(0)
    # Ascend's (k_cache, v_cache) tuples, and a layer registered twice
    k = torch.zeros(BLOCKS, BT, HEADS, HD)
    v = torch.zeros(BLOCKS, BT, HEADS, HD)
    asc = KVLayout.from_tensors([(k, v), (k, v)])
    assert len(asc.segments) == 2 and asc.direct
    # kernel blocks: 2 rows of a (2 * BLOCKS)-row tensor make a block
    kern = KVLayout.from_tensors([torch.zeros(2 * BLOCKS, BT // 2, HEADS, HD)], BLOCKS)
    assert kern.num_blocks == BLOCKS and kern.block_bytes == BT * HEADS * HD * 4
    with pytest.raises(ValueError, match="whole number"):
        KVLayout.from_tensors([torch.zeros(BLOCKS + 1, BT, HEADS, HD)], BLOCKS)


def test_hnd_round_trip_through_torch(client):
    """An HND view (vLLM's permuted allocation) stores the bytes of the NHD
    logical order, so an NHD cache loads them."""
    g = torch.Generator().manual_seed(7)
    phys = [torch.randn(2, BLOCKS, HEADS, BT, HD, generator=g) for _ in range(LAYERS)]
    hnd = [t.permute(0, 1, 3, 2, 4) for t in phys]  # logical (2, blocks, bt, heads, hd)
    store = BlockStore(client, spec(), KVLayout.from_tensors(hnd))
    assert store.transfer == "torch"
    hashes = block_hashes_of(list(range(4 * BT)), BT, b"hnd")
    assert store.save(hashes, [1, 2, 3, 4]) == [0] * 4
    nhd = [torch.zeros(2, BLOCKS, BT, HEADS, HD) for _ in range(LAYERS)]
    loader = BlockStore(client, spec(), KVLayout.from_tensors(nhd))
    assert loader.transfer == "pointers"
    assert loader.load(hashes, [5, 6, 7, 8]) == [store.layout.block_bytes] * 4
    for a, b in zip(hnd, nhd):
        assert torch.equal(a[:, 1:5], b[:, 5:9])


@pytest.mark.parametrize("transfer", ["pointers", "torch"])
def test_save_load_round_trip(client, transfer):
    src = flash_caches(1)
    store = BlockStore(client, spec(), KVLayout.from_tensors(src), transfer)
    tokens = list(range(10 * BT + 3))
    hashes = block_hashes_of(tokens, BT)
    assert len(hashes) == 10
    ids = list(range(2, 12))
    assert store.lookup(hashes) == 0
    assert store.save(hashes[:6], ids[:6]) == [0] * 6
    assert store.lookup(hashes) == 6
    assert store.save(hashes, ids) == [0] * 10  # the first six are skipped
    assert store.stats["skipped"] == 6 and store.stats["saved"] == 10
    dst = [torch.zeros_like(t) for t in src]
    loader = BlockStore(client, spec(), KVLayout.from_tensors(dst), transfer)
    # into other block ids, as another engine instance would
    other = [15 - i for i in range(10)]
    res = loader.load(hashes, other)
    assert res == [store.layout.block_bytes] * 10
    for t_src, t_dst in zip(src, dst):
        for a, b in zip(ids, other):
            assert torch.equal(t_src[:, a], t_dst[:, b])
    assert loader.load([b"\x00" * 32], [0]) == [-errno.ENOENT]
    # the chain: each block names its parent
    keys = store.keys(hashes)
    assert client.exists(keys[9])


def test_layerwise(client):
    src = flash_caches(2)
    store = BlockStore(client, spec(), KVLayout.from_tensors(src))
    hashes = block_hashes_of(list(range(4 * BT)), BT, salt=b"layerwise")
    save = store.begin_save(hashes, [0, 1, 2, 3])
    for layer in range(LAYERS):
        assert not client.exists(store.keys(hashes)[0])  # nothing visible before finish
        save.save_layer(layer)
    assert save.finish() == [0, 0, 0, 0]
    dst = flash_caches(99)
    loader = BlockStore(client, spec(), KVLayout.from_tensors(dst), "torch")
    load = loader.begin_load(hashes + [b"\x01" * 32], [4, 5, 6, 7, 8])
    assert load.results[:4] == [store.layout.block_bytes] * 4 and load.results[4] == -errno.ENOENT
    load.load_layer(0)
    assert torch.equal(dst[0][:, 4:8], src[0][:, 0:4])
    assert not torch.equal(dst[1][:, 4:8], src[1][:, 0:4])  # layer 1 not yet
    for layer in range(1, LAYERS):
        load.load_layer(layer)
    load.finish()
    for t_src, t_dst in zip(src, dst):
        assert torch.equal(t_src[:, 0:4], t_dst[:, 4:8])
    # an aborted layerwise save leaves nothing
    h2 = block_hashes_of(list(range(BT)), BT, salt=b"aborted")
    s2 = store.begin_save(h2, [9])
    s2.save_layer(0)
    s2.finish(ok=False)
    assert store.lookup(h2) == 0


def test_lookup_is_the_minimum_over_ranks(client):
    hashes = block_hashes_of(list(range(8 * BT)), BT, salt=b"ranks")
    r0 = BlockStore(client, spec(tp_rank=0, tp_size=2), KVLayout.from_tensors(flash_caches(3)))
    r1 = BlockStore(client, spec(tp_rank=1, tp_size=2), KVLayout.from_tensors(flash_caches(4)))
    assert r0.save(hashes, list(range(8))) == [0] * 8
    assert r1.save(hashes[:5], list(range(5))) == [0] * 5
    assert r0.lookup(hashes) == 5 and r1.lookup(hashes) == 5
    assert r0.lookup(hashes, all_ranks=False) == 8
    # rank 1's bytes are not rank 0's
    assert r0.keys(hashes)[0] != r1.keys(hashes)[0]


def test_other_layout_under_the_same_spec_is_refused(client):
    hashes = block_hashes_of(list(range(BT)), BT, salt=b"layout")
    a = BlockStore(client, spec(), KVLayout.from_tensors(flash_caches(5)))
    assert a.save(hashes, [0]) == [0]
    small = [torch.zeros(2, BLOCKS, BT, 1, HD) for _ in range(LAYERS)]
    b = BlockStore(client, spec(), KVLayout.from_tensors(small))
    assert b.load(hashes, [0]) == [-errno.ENOBUFS]
    bigger = [torch.zeros(2, BLOCKS, BT, 4, HD) for _ in range(LAYERS)]
    c = BlockStore(client, spec(), KVLayout.from_tensors(bigger))
    assert c.load(hashes, [0]) == [-errno.EBADMSG]


def test_store_pressure(daemon):
    import kvcache
    c = kvcache.Client(daemon)
    big = [torch.zeros(2, 64, 256, 8, 64) for _ in range(2)]  # 2 MiB blocks... per layer
    store = BlockStore(c, KeySpec("m", "float32", "l", 256), KVLayout.from_tensors(big))
    assert store.layout.block_bytes == 4 * 256 * 8 * 64 * 4
    # hard-pin a filler so that the pool is full
    filler = []
    while True:
        r = c.put("filler%d" % len(filler), bytes(16 << 20), pin="hard")
        if r != 0:
            break
        filler.append(r)
    hashes = block_hashes_of(list(range(40 * 256)), 256, salt=b"pressure")
    res = store.save(hashes, list(range(40)))
    # one batch for the prompt: what fit is stored, the rest is ENOSPC
    assert -errno.ENOSPC in res and store.stats["pressure"] == 1
    assert set(res) <= {0, -errno.ENOSPC}
    assert store.stats["saved"] == res.count(0)
    c.remove_prefix(None, force=True)
    for i in range(len(filler)):
        c.unpin("filler%d" % i)
    c.remove_prefix(None, force=True)
    del store
    c.close()


def test_block_hashes_chain():
    a = block_hashes_of([1, 2, 3, 4, 5, 6, 7, 8, 9], 4)
    b = block_hashes_of([1, 2, 3, 4, 5, 6, 7, 0], 4)
    assert len(a) == 2 and a[0] == b[0] and a[1] != b[1]
    assert block_hashes_of([1, 2, 3], 4) == []


def test_device_copies_synchronised_by_their_own_device(monkeypatch):
    """A copy out of device memory must be finished before its object is
    committed or let go: through the tensor's own device's stream API
    (torch.npu under vLLM-Ascend, not torch.cuda); CPU tensors need none."""
    from types import SimpleNamespace

    from kvcache import engine as eng
    torch = pytest.importorskip("torch")
    synced = []

    class Stream:
        def __init__(self, dev):
            self.dev = dev

        def synchronize(self):
            synced.append(self.dev)

    npu = SimpleNamespace(current_stream=lambda dev: Stream(dev))
    monkeypatch.setattr(torch, "npu", npu, raising=False)
    dev = SimpleNamespace(type="npu", index=3)
    layout = SimpleNamespace(segments=[SimpleNamespace(tensor=SimpleNamespace(device=dev))])
    eng._sync(layout)
    assert synced == [dev]
    cpu = SimpleNamespace(segments=[SimpleNamespace(tensor=torch.zeros(1))])
    eng._sync(cpu)
    assert synced == [dev]
