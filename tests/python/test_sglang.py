# SPDX-License-Identifier: MIT
"""kvcache.sglang driven as SGLang's cache controller drives a HiCache
storage backend, over a host pool shaped like SGLang's page_first pool."""
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from kvcache.engine import block_hashes_of  # noqa: E402
from kvcache.sglang import KvcacheStore  # noqa: E402

PAGE, LAYERS, HEADS, HD = 4, 3, 2, 8


class HostPool:
    """SGLang's MHATokenToKVPoolHost, page_first: (2, size, layers, heads, dim)."""

    def __init__(self, size, seed, mla=False):
        g = torch.Generator().manual_seed(seed)
        self.mla = mla
        shape = (1 if mla else 2, size, LAYERS, HEADS, HD)
        self.kv_buffer = torch.randn(*shape, generator=g).to(torch.bfloat16)
        self.size, self.page_size, self.layout, self.dtype = size, PAGE, "page_first", torch.bfloat16

    def get_page_buffer_meta(self, indices):
        base, item = self.kv_buffer.data_ptr(), self.kv_buffer.element_size()
        tok = LAYERS * HEADS * HD * item
        ptrs = []
        for i in range(0, len(indices), PAGE):
            k = base + int(indices[i]) * tok
            ptrs.append(k)
            if not self.mla:
                ptrs.append(k + self.size * tok)
        return ptrs, [PAGE * tok] * len(ptrs)

    def page(self, start):
        return self.kv_buffer[:, start:start + PAGE]


def store(daemon, pool, tp_rank=0, tp_size=1, mla=False):
    cfg = SimpleNamespace(tp_rank=tp_rank, tp_size=tp_size, pp_rank=0, pp_size=1,
                          is_mla_model=mla, model_name="Qwen/Qwen2-0.5B",
                          is_page_first_layout=True,
                          extra_config={"backend_name": "kvcache", "interface_v1": 1,
                                        "socket": daemon})
    s = KvcacheStore(cfg, {})
    s.register_mem_pool_host(pool)
    return s


def keys(n, salt):
    return [h.hex() for h in block_hashes_of(list(range(n * PAGE)), PAGE, salt)]


def test_pages_round_trip(daemon):
    a_pool, b_pool = HostPool(64, 1), HostPool(64, 2)
    a, b = store(daemon, a_pool), store(daemon, b_pool)
    ks = keys(6, b"sgl")
    assert a.batch_exists(ks) == 0
    src = torch.arange(0, 6 * PAGE)  # pages at token slots 0, 4, 8, ...
    assert a.batch_set_v1(ks[:4], src[:4 * PAGE]) == [True] * 4
    assert a.batch_exists(ks) == 4 and b.batch_exists(ks) == 4
    assert a.batch_set_v1(ks, src) == [True] * 6  # stored ones answer True
    dst = torch.arange(32, 32 + 6 * PAGE)
    assert b.batch_get_v1(ks + [keys(1, b"none")[0]],
                          torch.cat([dst, torch.arange(0, PAGE)])) == [True] * 6 + [False]
    for i in range(6):
        assert torch.equal(a_pool.page(i * PAGE), b_pool.page(32 + i * PAGE))
    assert a.exists(ks[0]) and not a.exists(keys(1, b"none")[0])
    key = a.spec.key(ks[0])
    assert key.startswith("kv1@Qwen/Qwen2-0.5B@bfloat16@sglang-page_first@b4@tp0of1@")
    a.clear()
    assert b.batch_exists(ks) == 0
    a.close()
    b.close()


def test_ranks_and_mla(daemon):
    pool = HostPool(16, 3)
    r0, r1 = store(daemon, pool, 0, 2), store(daemon, HostPool(16, 4), 1, 2)
    ks = keys(2, b"tp")
    assert r0.batch_set_v1(ks, torch.arange(8)) == [True, True]
    assert r1.batch_exists(ks) == 0  # rank 1's pages are its own
    m0 = store(daemon, HostPool(16, 5, mla=True), 0, 2, mla=True)
    m1 = store(daemon, HostPool(16, 6, mla=True), 1, 2, mla=True)
    assert m0.batch_set_v1(ks, torch.arange(8)) == [True, True]
    assert m1.batch_exists(ks) == 2  # MLA pages are shared by every rank
    assert m1.batch_get_v1(ks, torch.arange(8, 16)) == [True, True]
    assert torch.equal(m0.pool.kv_buffer[:, 0:8], m1.pool.kv_buffer[:, 8:16])
    for s in (r0, r1, m0, m1):
        s.clear()
        s.close()


def test_generic_path_and_errors(daemon):
    s = store(daemon, HostPool(8, 7))
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
    assert isinstance(s.get_stats(), dict)
    pool = HostPool(8, 8)
    pool.layout = "layer_first"
    with pytest.raises(ValueError):
        store(daemon, pool)
    with pytest.raises(ValueError):
        s.batch_get_v1(["a", "b"], torch.arange(4))  # 2 keys, 1 page
    s.clear()
    s.close()
