# SPDX-License-Identifier: MIT
"""kvcache.lmcache driven as LMCache drives it (lmcache_harness.py: its
connector manager, wrapper, remote backend and storage manager), and its
multiprocess server's native-plugin contract."""
import asyncio
import select
from types import SimpleNamespace

import pytest

np = pytest.importorskip("numpy")

from kvcache.lmcache import NativeClient, socket_from_url  # noqa: E402

import lmcache_harness as lh  # noqa: E402
from kvcache import lmcache as kvl  # noqa: E402

torch = pytest.importorskip("torch")


def chunk(backend, seed, tokens=None):
    """A chunk LMCache's engine holds in its local CPU cache (reference 1)."""
    o = backend.local_cpu_backend.allocate(backend.local_cpu_backend.metadata.get_shapes(),
                                           backend.local_cpu_backend.metadata.get_dtypes())
    g = torch.Generator().manual_seed(seed)
    o.raw_data.copy_(torch.randn(o.raw_data.shape, generator=g).to(o.raw_data.dtype))
    if tokens is not None:
        o.reshaped(tokens)
    return o


def test_url():
    assert socket_from_url("kvcache://localhost:0/?socket=/run/k.sock") == "/run/k.sock"
    assert socket_from_url("kvcache://localhost:0/") is None


def test_remote_backend_as_lmcache_drives_it(daemon):
    meta = lh.Metadata()
    rb = lh.RemoteBackend(lh.config(daemon), meta)
    chunks = [chunk(rb, i) for i in range(3)] + [chunk(rb, 3, tokens=5)]  # a partial last one
    keys = [lh.CacheEngineKey(meta, 0x1000 + i) for i in range(4)]
    rb.submit_put_task(keys[0], chunks[0])
    rb.batched_submit_put_task(keys[1:], chunks[1:])
    # LMCache's wrapper dropped the references it took: the engine's own stays
    assert [o.ref_count for o in chunks] == [1] * 4 and not any(o.freed for o in chunks)
    # StorageManager adds up leading hits and slices its keys with them
    missing = lh.CacheEngineKey(meta, 0xdead)
    hits, mapping = lh.storage_manager_batched_contains({"RemoteBackend": rb},
                                                        keys + [missing, keys[0]])
    assert hits == 4 and [k.to_string() for k in mapping["RemoteBackend"]] == \
        [k.to_string() for k in keys]
    live = rb.local_cpu_backend.live
    got = rb.batched_get_blocking(keys + [missing])
    assert got[4] is None and rb.local_cpu_backend.live == live + 4  # the miss gave its chunk back
    for g, src in zip(got, chunks):
        assert g.get_shape() == src.get_shape() and torch.equal(g.raw_data, src.raw_data)
    assert got[3].get_shape()[2] == 5  # the partial chunk has its 5 tokens
    one = rb.get_blocking(keys[1])
    assert torch.equal(one.raw_data, chunks[1].raw_data)
    rb.close()


@pytest.mark.parametrize("plugin", ["kvcache", "kvcache.primary"])
def test_per_plugin_backends(daemon, plugin):
    """The newest LMCache makes a backend of each remote plugin, whose URL is
    plugin://<name>: configured as it documents (no remote_url), the one
    backend has its connector, stores, and finds and loads what it stored."""
    meta = lh.Metadata(model="org/plugin-" + plugin)
    backends = lh.create_storage_backends(lh.config(daemon, [plugin], url=False), meta)
    assert list(backends) == ["RemoteBackend-" + plugin]
    rb = backends["RemoteBackend-" + plugin]
    assert rb.error is None and rb.connection is not None
    chunks = [chunk(rb, i) for i in range(2)]
    keys = [lh.CacheEngineKey(meta, 0x2000 + i) for i in range(2)]
    rb.batched_submit_put_task(keys, chunks)
    hits, _ = lh.storage_manager_batched_contains(backends, keys)
    assert hits == 2
    got = rb.batched_get_blocking(keys)
    assert all(torch.equal(g.raw_data, c.raw_data) for g, c in zip(got, chunks))
    # the prefetch: one batch, the leading hits; what follows a miss is
    # handed back to LMCache's allocator
    live = rb.local_cpu_backend.live
    missing = lh.CacheEngineKey(meta, 0xbad)
    pre = rb.batched_get_non_blocking("lookup-1", [keys[0], missing, keys[1]])
    assert len(pre) == 1 and torch.equal(pre[0].raw_data, chunks[0].raw_data)
    assert rb.local_cpu_backend.live == live + 1
    rb.close()


def test_older_manager_calls_init_chunk_meta(daemon, monkeypatch):
    """LMCache before PR #2314: the base takes no arguments, the manager
    calls init_chunk_meta (which set nothing up unless the config said
    save_chunk_meta: false) and batched_contains answered a list."""
    monkeypatch.setattr(kvl, "_BASE_TAKES_METADATA", False)
    monkeypatch.setattr(kvl, "_CONTAINS_AS_LIST", True)
    if not kvl.HAVE_LMCACHE:  # the stand-in base as that version's was
        monkeypatch.setattr(kvl.RemoteConnector, "__init__", lambda self: None)
        for name in ("meta_shapes", "meta_dtypes", "full_chunk_size_bytes",
                     "single_token_size"):
            monkeypatch.delattr(kvl.RemoteConnector, name)
    meta = lh.Metadata(layers=3, chunk=8)
    rb = lh.RemoteBackend(lh.config(daemon), meta, era=2)
    c = rb.connection._connector
    assert c.meta_shape == torch.Size([2, 3, 8, 16]) and c.meta_dtype == torch.bfloat16
    assert c.single_token_size == 2 * 3 * 16 * 2
    src = chunk(rb, 9)
    key = lh.CacheEngineKey(meta, 0x99)
    rb.submit_put_task(key, src)
    assert src.ref_count == 1
    assert c.batched_contains([key, lh.CacheEngineKey(meta, 1)]) == [True, False]
    assert torch.equal(rb.get_blocking(key).raw_data, src.raw_data)
    rb.close()


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
    # a store that failed for some keys is not ok: LMCache would count every
    # key of an ok store as stored
    big = bytearray(300 << 20)  # more than the daemon's whole dram tier
    part = n.submit_batch_set(["native-ok", "native-too-big", "native-ok2"],
                              [memoryview(bytearray(8)), memoryview(big),
                               memoryview(bytearray(8))])
    drain_until({part})
    ok, err, bools = results[part]
    assert ok is False and bools == [True, False, True]
    assert "1 of 3 keys not stored (first: native-too-big: " in err
    n.close()
    with pytest.raises(RuntimeError):
        n.submit_batch_exists(["a"])


def test_contains_misses_while_the_daemon_restarts():
    """LMCache's lookups of a backend whose daemon stopped see misses
    (an exception would fail the engine's lookup), and the same backend
    finds what it stores once a daemon serves the socket again."""
    import signal
    import subprocess
    import time
    from conftest import start_daemon, stop_daemon, ready

    proc, d, sock, log = start_daemon()
    meta = lh.Metadata()
    rb = lh.RemoteBackend(lh.config(sock), meta)
    keys = [lh.CacheEngineKey(meta, 0x2000 + i) for i in range(2)]
    rb.batched_submit_put_task(keys, [chunk(rb, i) for i in range(2)])
    hits, _ = lh.storage_manager_batched_contains({"RemoteBackend": rb}, keys)
    assert hits == 2
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0
    hits, _ = lh.storage_manager_batched_contains({"RemoteBackend": rb}, keys)
    assert hits == 0
    proc = subprocess.Popen(proc.args, stdout=log, stderr=subprocess.STDOUT)
    for _ in range(1000):
        if ready(sock):
            break
        time.sleep(0.01)
    lh.storage_manager_batched_contains({"RemoteBackend": rb}, keys)  # finds it gone
    rb.batched_submit_put_task(keys, [chunk(rb, i) for i in range(2)])
    for _ in range(200):  # stores are asynchronous
        hits, _ = lh.storage_manager_batched_contains({"RemoteBackend": rb}, keys)
        if hits == 2:
            break
        time.sleep(0.01)
    assert hits == 2
    rb.close()
    stop_daemon(proc, d, log)
