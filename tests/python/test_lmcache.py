# SPDX-License-Identifier: MIT
"""kvcache.lmcache with LMCache-shaped memory objects and contexts."""
import asyncio
import select
from types import SimpleNamespace

import pytest

np = pytest.importorskip("numpy")

from kvcache.lmcache import (  # noqa: E402
    KvcacheConnectorAdapter,
    NativeClient,
    socket_from_url,
)

CHUNK = 4096


class MemoryObj:
    """The part of LMCache's MemoryObj the connector uses."""

    def __init__(self, data=None):
        self.arr = np.zeros(CHUNK, np.uint8) if data is None else data
        self.refs = 1
        self.used = None

    @property
    def byte_array(self):
        return memoryview(self.arr)

    def get_size(self):
        return self.arr.nbytes

    def ref_count_down(self):
        self.refs -= 1


class CpuBackend:
    def __init__(self):
        self.allocated = []

    def allocate(self, shape, dtype, fmt):
        o = MemoryObj()
        self.allocated.append(o)
        return o


class Key:
    def __init__(self, s):
        self.s = s

    def to_string(self):
        return self.s


def connector(daemon):
    url = "kvcache://localhost:0/?socket=" + daemon
    adapter = KvcacheConnectorAdapter()
    assert adapter.can_parse(url) and not adapter.can_parse("redis://x:1")
    ctx = SimpleNamespace(url=url, loop=None, local_cpu_backend=CpuBackend(), config=None)
    c = adapter.create_connector(ctx)
    c.meta_shape, c.meta_dtype, c.meta_fmt = (CHUNK,), "uint8", None
    return c


def test_url():
    assert socket_from_url("kvcache://localhost:0/?socket=/run/k.sock") == "/run/k.sock"
    assert socket_from_url("kvcache://localhost:0/") is None


def test_remote_connector(daemon):
    c = connector(daemon)
    assert c.save_chunk_meta is False

    async def run():
        chunks = [MemoryObj((np.arange(CHUNK) * (i + 3)).astype(np.uint8)) for i in range(3)]
        keys = [Key("model@1@0@%064x@bfloat16" % i) for i in range(3)]
        assert await c.batched_put(keys[:2], chunks[:2]) == [0, 0]
        assert [o.refs for o in chunks[:2]] == [0, 0]  # handed back after the send
        await c.put(keys[2], chunks[2])
        assert await c.exists(keys[0]) and c.exists_sync(keys[2])
        assert not c.exists_sync(Key("absent"))
        assert c.batched_contains(keys + [Key("absent"), keys[0]]) == [True] * 3 + [False] * 2
        assert c.batched_contains(keys + [Key("absent"), keys[0]], False) == \
            [True, True, True, False, True]
        assert await c.batched_async_contains("lookup-1", keys + [Key("absent")]) == 3
        got = await c.batched_get(keys + [Key("absent")])
        assert got[3] is None
        assert c.local_cpu_backend.allocated[3].refs == 0  # a miss gives its buffer back
        for g, src in zip(got[:3], chunks):
            assert bytes(g.arr) == bytes(src.arr)
        one = await c.get(keys[1])
        assert bytes(one.arr) == bytes(chunks[1].arr)
        assert sorted(await c.list()) == sorted(k.s for k in keys)
        assert await c.ping() == 0
        assert c.remove_sync(keys[0]) and not c.remove_sync(keys[0])
        await c.close()

    asyncio.run(run())


def test_native_client(daemon):
    n = NativeClient(socket=daemon, num_workers=2)
    fd = n.event_fd()
    bufs = [bytearray(b"%d" % i * 100) for i in range(4)]
    keys = ["native-%d" % i for i in range(4)]
    pending = {n.submit_batch_set(keys, [memoryview(b) for b in bufs]): "set"}
    results = {}

    def drain_until(ids):
        while not ids <= set(results):
            select.select([fd], [], [], 10)
            for fid, ok, err, bools in n.drain_completions():
                results[fid] = (ok, err, bools)

    drain_until(set(pending))
    (sid,) = pending
    assert results[sid] == (True, "", [True] * 4)
    outs = [bytearray(len(b)) for b in bufs] + [bytearray(10)]
    gid = n.submit_batch_get(keys + ["native-missing"], [memoryview(o) for o in outs])
    eid = n.submit_batch_exists(keys[:2] + ["native-missing"])
    drain_until({gid, eid})
    assert results[gid] == (True, "", [True] * 4 + [False])  # a batch is ok though a key missed
    assert outs[:4] == bufs
    assert results[eid][2] == [True, True, False]
    did = n.submit_batch_delete(keys[:2] + ["native-missing"])
    bad = n.submit_batch_get(["x" * 600], [memoryview(bytearray(1))])
    drain_until({did, bad})
    assert results[did][2] == [True, True, False]
    assert results[bad][0] is False and "ValueError" in results[bad][1]
    with pytest.raises(ValueError):
        n.submit_batch_set(["a", "b"], [memoryview(bytearray(1))])
    n.close()
    with pytest.raises(RuntimeError):
        n.submit_batch_exists(["a"])
