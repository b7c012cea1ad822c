# SPDX-License-Identifier: MIT
"""kvcache.Client: every call round-trips, zero-copy memory has owners."""
import ctypes
import errno
import gc
import mmap
import os
import threading
import warnings

import pytest

import kvcache

np = pytest.importorskip("numpy")


def pattern(n, seed):
    return (np.arange(n, dtype=np.uint64) * 2654435761 + seed).astype(np.uint8)


def test_put_get_exists_remove(client):
    assert client.put("k1", b"hello") == 0
    assert client.get("k1") == b"hello"
    assert client.exists("k1") is True
    assert client.exists("nope") is False
    assert client.get("nope") is None
    assert client.put("k1", b"other") == -errno.EEXIST
    # a hit leases the object for a while: it cannot be replaced meanwhile
    assert client.put("k1", b"other", replace=True) == -errno.EBUSY
    assert client.put("k5", b"first") == 0
    assert client.put("k5", b"second", replace=True) == 0
    assert client.get("k5") == b"second"
    # any C-contiguous buffer is a value
    assert client.put("k2", bytearray(b"ba")) == 0
    assert client.put("k3", memoryview(b"xmvx")[1:3]) == 0
    a = pattern(100000, 3)
    assert client.put("k4", a) == 0
    assert client.get("k2") == b"ba" and client.get("k3") == b"mv"
    assert client.get("k4") == a.tobytes()
    assert client.remove("k2", force=True) == 0
    assert client.remove("k2") == -errno.ENOENT
    assert client.exists(b"k1") is True  # bytes keys are keys too


def test_list_one_key(client):
    assert client.put("lk", b"abc") == 0 and client.put("lk2", b"d") == 0
    got = client.list("lk", exact=True)
    assert [(i["key"], i["size"]) for i in got] == [("lk", 3)]
    assert client.list("nope", exact=True) == []
    assert sorted(i["key"] for i in client.list("lk")) == ["lk", "lk2"]
    with pytest.raises(ValueError):
        client.list(exact=True)


def test_peek_looks_without_leasing(client):
    assert client.put("peek1", b"v") == 0
    assert client.set_get_flags(kvcache.PEEK) == 0
    assert client.exists("peek1") is True
    assert client.set_get_flags(0) == kvcache.PEEK
    assert client.remove("peek1") == 0  # nothing leased it
    assert client.put("peek2", b"v") == 0
    assert client.exists("peek2") is True
    assert client.remove("peek2") == -errno.EBUSY  # a plain look leases


def test_bad_keys(client):
    for bad in ["", "x" * 512, "a\0b"]:
        with pytest.raises(ValueError):
            client.put(bad, b"v")
    with pytest.raises(TypeError):
        client.exists(5)
    with pytest.raises(TypeError):
        client.put("k", 5)
    with pytest.raises(ValueError):
        client.put("k", b"v", pin="sometimes")
    with pytest.raises(TypeError):
        client.put("k", b"v", colour="red")
    assert client.put("x" * 511, b"v") == 0


def test_batch_exists_and_prefix(client):
    keys = ["p%d" % i for i in range(10)]
    for k in keys[:6]:
        assert client.put(k, k.encode()) == 0
    assert client.remove("p3", force=True) == 0
    assert client.batch_exists(keys) == [True, True, True, False, True, True] + [False] * 4
    assert client.prefix_lookup(keys) == 3
    assert client.prefix_lookup([]) == 0
    assert client.batch_exists([]) == []
    assert client.prefix_lookup(iter(keys[:2])) == 2


def test_put_options(client):
    assert client.put("child", b"c", parent="root", pin="soft", pin_ttl_ms=1000) == 0
    assert client.put("hard", b"h", pin="hard", tier=kvcache.TIER_DRAM) == 0
    info = {i["key"]: i for i in client.list("")}
    assert info["hard"]["size"] == 1 and info["hard"]["state"] == "committed"
    with pytest.raises(ValueError):
        client.put("x", b"v", tier=9)


def test_reservation_commit_and_exports(client):
    r = client.reserve("res", 1 << 20)
    assert r.size == 1 << 20 and len(r) == 1 << 20
    a = np.frombuffer(r, dtype=np.uint8)
    a[:] = pattern(1 << 20, 7)
    assert client.exists("res") is False  # not visible before commit
    with pytest.raises(BufferError):
        r.commit()
    del a
    assert r.commit() == 0
    assert r.released
    with pytest.raises(BufferError):
        memoryview(r)
    with pytest.raises(ValueError):
        r.commit()
    assert client.get("res") == pattern(1 << 20, 7).tobytes()


def test_reservation_with_block(client):
    with client.reserve("ctx", 4) as r:
        r.memoryview()[:] = b"abcd"
    assert client.get("ctx") == b"abcd"
    with pytest.raises(RuntimeError):
        with client.reserve("ctx2", 4) as r:
            raise RuntimeError("engine failed")
    assert client.exists("ctx2") is False
    # a reservation dropped without commit is aborted
    r = client.reserve("dropped", 4096)
    del r
    gc.collect()
    assert client.exists("dropped") is False
    assert client.reserve("dropped", 4096).commit() == 0
    # commit fails when another client committed the key meanwhile
    r = client.reserve("race", 8)
    assert client.put("race", b"winner") == 0
    assert r.commit() == -errno.EEXIST


def test_view_lifetime(client):
    data = pattern(65536, 11)
    assert client.put("view", data) == 0
    v = client.acquire("view")
    assert v.size == 65536 and bytes(v.memoryview()) == data.tobytes()
    m = memoryview(v)
    assert m.readonly
    with pytest.raises(TypeError):
        m[0] = 1
    with pytest.raises(BufferError):
        v.release()
    s = m[10:20]
    del m
    with pytest.raises(BufferError):
        v.release()  # a slice keeps the export
    del s
    a = np.frombuffer(v, dtype=np.uint8)
    with pytest.raises(BufferError):
        v.release()
    assert (a == data).all()
    del a
    # the view pins the object
    assert client.remove("view") == -errno.EBUSY
    v.release()
    v.release()  # twice is fine
    with pytest.raises(BufferError):
        memoryview(v)
    with pytest.raises(ValueError):
        v.ptr
    assert client.acquire("missing") is None
    with client.acquire("view") as v2:
        assert v2.tobytes() == data.tobytes()
    assert v2.released


def test_view_read_into_and_reservation_write_from(client):
    src = pattern(4096, 5)
    dst = np.zeros(4096, np.uint8)
    assert client.register_memory(src.ctypes.data, src.nbytes) == 0
    assert client.register_memory(dst.ctypes.data, dst.nbytes) == 0
    with client.reserve("ranges", 8192) as r:
        assert r.write_from(0, src.ctypes.data, 4096) == 4096
        assert r.write_from(4096, src, 4096) == 4096
        assert r.write_from(0, 12345, 16) == -errno.EFAULT
        assert r.write_from(0, -1, 16) == -errno.EFAULT
        with pytest.raises(ValueError):
            r.write_from(8000, src, 4096)
    with client.acquire("ranges") as v:
        assert v.read_into(4096, dst.ctypes.data, 4096) == 4096
        assert (dst == src).all()
        assert v.read_into(0, 99, 4) == -errno.EFAULT
        with pytest.raises(BufferError):
            v.read_into(0, b"readonly", 4)


def test_torch_views(client):
    torch = pytest.importorskip("torch")
    t = torch.arange(1024, dtype=torch.float32)
    assert client.put("tensor", t.numpy()) == 0
    v = client.acquire("tensor")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch has no read-only tensors
        x = torch.frombuffer(v.memoryview(), dtype=torch.float32)
    assert torch.equal(x, t)
    with pytest.raises(BufferError):
        v.release()  # the tensor holds the memoryview
    del x
    gc.collect()
    v.release()
    r = client.reserve("tensor2", 4096)
    y = torch.frombuffer(r.memoryview(), dtype=torch.float32)
    y.copy_(t)
    del y
    gc.collect()
    assert r.commit() == 0
    assert client.get("tensor2") == t.numpy().tobytes()


def test_close_refused_while_exports_live(daemon):
    c = kvcache.Client(daemon)
    assert c.put("close", b"x") == 0
    v = c.acquire("close")
    with pytest.raises(BufferError):
        c.close()
    v.release()
    b = c.buffer_alloc(4096)
    with pytest.raises(BufferError):
        c.close()
    b.free()
    c.close()
    c.close()
    assert c.closed
    with pytest.raises(ValueError):
        c.get("close")
    with pytest.raises(ConnectionError):
        kvcache.Client(daemon + ".missing")


def test_scatter_gather(client):
    pieces = [pattern(1000 * (i + 1), i) for i in range(3)]
    for p in pieces:
        assert client.register_memory(p.ctypes.data, p.nbytes) == 0
    ptrs = [[p.ctypes.data for p in pieces], [pieces[0].ctypes.data], [-5], [pieces[0].ctypes.data + 999]]
    sizes = [[p.nbytes for p in pieces], [1000], [10], [2]]
    res = client.batch_put_from_multi_buffers(["sg1", "sg2", "sg3", "sg4"], ptrs, sizes)
    assert res == [0, 0, -errno.EFAULT, -errno.EFAULT]
    assert client.get("sg1") == b"".join(p.tobytes() for p in pieces)
    assert client.exists("sg3") is False
    # buffer objects instead of addresses, mixed with addresses
    out = [np.zeros(p.nbytes, np.uint8) for p in pieces]
    assert client.register_memory(out[0].ctypes.data, out[0].nbytes) == 0
    res = client.batch_get_into_multi_buffers(
        ["sg1", "sg2", "missing", "sg1"],
        [[out[0].ctypes.data, out[1], out[2]], [bytearray(1000)], [bytearray(8)], [bytearray(10)]],
        [[1000, 2000, 3000], [1000], [8], [10]])
    assert res == [6000, 1000, -errno.ENOENT, -errno.ENOBUFS]
    for o, p in zip(out, pieces):
        assert (o == p).all()
    with pytest.raises(ValueError):
        client.batch_get_into_multi_buffers(["a"], [[1], [2]], [[1]])
    with pytest.raises(ValueError):
        client.batch_put_from_multi_buffers(["a"], [[b"xy"]], [[3]])  # piece longer than buffer
    with pytest.raises(BufferError):
        client.batch_get_into_multi_buffers(["sg1"], [[b"immutable"]], [[9]])


def _mapped(addr, length):
    """Whether every byte of [addr, addr + length) is in a mapping now."""
    spans = []
    with open("/proc/self/maps") as f:
        for line in f:
            lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
            spans.append((lo, hi))
    pos = addr
    for lo, hi in sorted(spans):
        if lo <= pos < hi:
            pos = hi
    return pos >= addr + length


def _refuses_unmapped(client, make):
    """make() maps a range with unmapped pages in it: (address, length, a
    function that unmaps what is left of it).  register_memory refuses it
    -EFAULT.  Another thread may map something into the hole before the
    call (the sanitizers' allocator did): a range it answers 0 for must be
    whole by then, and another range is tried."""
    for _ in range(20):
        addr, length, release = make()
        r = client.register_memory(addr, length)
        if r == 0:
            assert _mapped(addr, length), "a range with a hole was registered"
            assert client.unregister_memory(addr) == 0
        release()
        if r == -errno.EFAULT:
            return True
        assert r == 0
    return False


def test_register_memory(client):
    a = np.zeros(8192, np.uint8)
    assert client.register_memory(a.ctypes.data, 8192) == 0
    assert client.register_memory(a.ctypes.data, 8192) == 0  # the same range again
    assert client.register_memory(a.ctypes.data + 4096, 8192) == -errno.EEXIST
    assert client.register_memory(16, 4096) == -errno.EFAULT
    assert client.register_memory(a.ctypes.data, 0) == -errno.EINVAL
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
    ro = libc.mmap(None, 1 << 16, mmap.PROT_READ, flags, -1, 0)
    assert client.register_memory(ro, 4096) == -errno.EFAULT  # not writable
    rw = libc.mmap(None, 8192, mmap.PROT_READ | mmap.PROT_WRITE, flags, -1, 0)
    assert client.register_memory(rw, 8192) == 0
    assert client.unregister_memory(rw) == 0
    libc.munmap(ro, 1 << 16)
    libc.munmap(rw, 8192)

    def holed():
        p = libc.mmap(None, 8192, mmap.PROT_READ | mmap.PROT_WRITE, flags, -1, 0)
        libc.munmap(p + 4096, 4096)
        return p, 8192, lambda: libc.munmap(p, 4096)

    def unmapped():
        p = libc.mmap(None, 4096, mmap.PROT_READ | mmap.PROT_WRITE, flags, -1, 0)
        libc.munmap(p, 4096)
        return p, 4096, lambda: None

    assert _refuses_unmapped(client, holed)  # a hole
    assert _refuses_unmapped(client, unmapped)
    assert client.unregister_memory(a.ctypes.data) == 0
    assert client.unregister_memory(a.ctypes.data) == -errno.ENOENT
    assert client.batch_put_from_multi_buffers(["unreg"], [[a.ctypes.data]], [[16]]) == [-errno.EFAULT]
    assert client.register_memory(-4096, 10) == -errno.EFAULT


def test_registered_buffers(client):
    b = client.buffer_alloc(1 << 20)
    assert b.size == 1 << 20 and b.ptr
    src = pattern(1 << 20, 9)
    memoryview(b)[:] = src.tobytes()
    assert client.put_from("buf1", b, 0, 4096) == 0
    assert client.put_from("buf2", b, 4096) == 0  # to the end
    assert client.get("buf1") == src[:4096].tobytes()
    assert client.get_into("buf1", b, 8192) == 4096
    assert client.get_into("buf1", b, 0, 100) == -errno.ENOBUFS
    assert client.get_into("missing", b) == -errno.ENOENT
    with pytest.raises(ValueError):
        client.get_into("buf1", b, 1 << 21)
    # plain writable buffers work with get_into/put_from too
    plain = bytearray(4096)
    assert client.get_into("buf1", plain) == 4096 and bytes(plain) == src[:4096].tobytes()
    assert client.put_from("plain", plain, 100, 50) == 0
    assert client.get("plain") == src[100:150].tobytes()
    # batches of (Buffer, offset, len) pieces
    res = client.batch_put_from(["bp1", "bp2"], [[(b, 0, 100), (b, 200, 100)], [(b, 0, 10)]])
    assert res == [0, 0]
    out = client.buffer_alloc(4096)
    res = client.batch_get_into(["bp1", "missing", "bp2"],
                                [[(out, 0, 150), (out, 150, 50)], [(out, 0, 10)], [(out, 1000, 10)]])
    assert res == [200, -errno.ENOENT, 10]
    got = bytes(memoryview(out)[:200])
    assert got == src[:100].tobytes() + src[200:300].tobytes()
    with pytest.raises(TypeError):
        client.batch_get_into(["bp1"], [[(bytearray(10), 0, 10)]])
    # a list of plain buffers, or of pieces that are not tuples, is refused
    with pytest.raises(TypeError):
        client.batch_get_into(["bp1"], [bytearray(10)])
    with pytest.raises(TypeError):
        client.batch_put_from(["bp1"], [[[out, 0, 10]]])
    m = memoryview(b)
    with pytest.raises(BufferError):
        b.free()
    del m
    b.free()
    with pytest.raises(ValueError):
        client.get_into("buf1", b)
    out.free()


def test_async(client):
    b = client.buffer_alloc(1 << 16)
    memoryview(b)[:5] = b"async"
    ops = [(kvcache.OP_PUT_FROM, "a%d" % i, b, 0, 5, 100 + i) for i in range(10)]
    assert client.submit(ops) == 10
    with pytest.raises(BufferError):
        b.free()  # operations name it until they are reaped
    done = []
    while len(done) < 10:
        done += client.wait(1, 64, 5000)
    assert sorted(done) == [(100 + i, 0) for i in range(10)]
    assert client.in_flight == 0
    ops = [(kvcache.OP_EXISTS, "a3", 1), (kvcache.OP_EXISTS, "zz", 2),
           (kvcache.OP_GET_INTO, "a4", b, 100, 50, 3), (kvcache.OP_REMOVE, "a5", 4),
           (kvcache.OP_GET_INTO, "missing", b, 0, 10, 5)]
    assert client.submit(ops) == 5
    got = {}
    while len(got) < 5:
        got.update(client.wait(1, 64, 5000))
    assert got == {1: 1, 2: 0, 3: 5, 4: 0, 5: -errno.ENOENT}
    assert bytes(memoryview(b)[100:105]) == b"async"
    assert client.poll() == []
    assert client.wait(1, 4, 10) == []  # times out, empty
    with pytest.raises(ValueError):
        client.submit([(99, "k", 1)])
    with pytest.raises(TypeError):
        client.submit([(kvcache.OP_GET_INTO, "k", bytearray(4), 0, 4, 1)])
    # more than fit: some are queued, the rest are refused
    many = [(kvcache.OP_EXISTS, "a1", i) for i in range(400)]
    n = client.submit(many)
    assert 0 < n <= kvcache.ASYNC_MAX
    second = client.submit(many)
    assert second == -errno.EAGAIN or 0 < second <= kvcache.ASYNC_MAX - n
    assert client.in_flight <= kvcache.ASYNC_MAX
    left = client.in_flight
    reaped = 0
    while reaped < left:
        reaped += len(client.wait(1, 256, 5000))
    assert client.in_flight == 0
    b.free()


def test_threads_share_a_client(client):
    errors = []

    def worker(t):
        try:
            for i in range(200):
                k = "t%d-%d" % (t, i)
                v = pattern(1000 + i, t * 1000 + i).tobytes()
                assert client.put(k, v) == 0
                assert client.get(k) == v
                assert client.exists(k)
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert client.prefix_lookup(["t0-%d" % i for i in range(200)]) == 200


def test_calls_release_the_gil(client):
    # a thread blocked in wait() must not stop this one
    order = []

    def waiter():
        client.wait(1, 1, 1500)
        order.append("wait")

    t = threading.Thread(target=waiter)
    t.start()
    for i in range(100):
        assert client.put("gil%d" % i, b"x") == 0
    order.append("puts")
    t.join()
    assert order == ["puts", "wait"]


def test_fork(client, daemon):
    assert client.put("fork", b"parent") == 0
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            try:
                client.get("fork")
                code = 1
            except RuntimeError:
                pass
            c2 = kvcache.Client(daemon)
            if c2.get("fork") != b"parent":
                code = 2
            c2.close()
        except BaseException:  # noqa: BLE001
            code = 3
        os._exit(code)
    _, st = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(st) == 0
    assert client.get("fork") == b"parent"  # the parent's connection is intact


def test_admin(client):
    st = client.status()
    assert st["objects"] >= 0 and st["tiers"][0]["name"] in ("device", "dram")
    assert st["protocol"][0] >= 1
    stats = client.stats()
    before = stats["puts"]
    assert client.put("adm", b"abc") == 0
    assert client.stats()["puts"] == before + 1
    lst = client.list("adm")
    assert [(i["key"], i["size"], i["state"]) for i in lst] == [("adm", 3, "committed")]
    assert client.pin("adm", hard=True) == 0
    assert client.evict(all=True)[1] >= 0
    assert client.exists("adm")  # hard-pinned objects are never evicted
    assert client.unpin("adm") == 0
    assert client.pin("missing") == -errno.ENOENT
    assert client.flush(100) == -errno.EOPNOTSUPP  # no disk tier
    cl = client.cluster()
    assert cl["self"] == "" and cl["nodes"] == []
    assert client.push("adm", "other") == -errno.ENOTCONN
    assert client.where("missing") == []
    assert client.prefetch(["adm", "missing"]) >= 0
    removed, skipped = client.remove_prefix("adm", force=True)
    assert (removed, skipped) == (1, 0)
    segs = client.segments()
    assert segs and all(length > 0 for _, length in segs)
    assert client.put("seg", b"s" * 100) == 0
    with client.acquire("seg") as v:
        assert any(base <= v.ptr < base + length for base, length in segs)
    assert client.set_get_flags(kvcache.LOCAL_ONLY) == 0
    assert client.exists("seg") is True  # local objects are local
    assert client.set_get_flags(0) == kvcache.LOCAL_ONLY
    assert kvcache.strerror(-errno.ENOENT)
    assert kvcache.parse_size("1GiB") == 1 << 30
    assert kvcache.socket_path(client.socket) == client.socket


def test_fileno_is_readable_while_completions_wait(client):
    import select
    fd = client.fileno()
    assert fd == client.fileno() and fd > 2
    assert select.select([fd], [], [], 0)[0] == []  # nothing in flight
    b = client.buffer_alloc(4096)
    assert client.put("fd-key", b"x" * 100) == 0
    assert client.submit([(kvcache.OP_GET_INTO, "fd-key", b, 0, 4096, 1),
                          (kvcache.OP_EXISTS, "fd-key", 2)]) == 2
    assert select.select([fd], [], [], 10)[0] == [fd]
    got = []
    while len(got) < 2:
        got += client.poll()
        if len(got) < 2:
            select.select([fd], [], [], 10)
    assert sorted(got) == [(1, 100), (2, 1)]
    # reaped: not readable until the next completion
    for _ in range(100):
        if select.select([fd], [], [], 0.01)[0] == []:
            break
    assert select.select([fd], [], [], 0)[0] == []
    assert client.submit([(kvcache.OP_EXISTS, "nope", 3)]) == 1
    assert select.select([fd], [], [], 10)[0] == [fd]
    assert client.wait(1, 4, 1000) == [(3, 0)]
    b.free()


def test_fileno_with_asyncio(client):
    import asyncio

    async def run():
        loop = asyncio.get_running_loop()
        done = asyncio.Event()
        results = []

        def ready():
            results.extend(client.poll())
            if len(results) >= 20:
                done.set()

        loop.add_reader(client.fileno(), ready)
        try:
            n = client.submit([(kvcache.OP_EXISTS, "aio-%d" % i, i) for i in range(20)])
            assert n == 20
            await asyncio.wait_for(done.wait(), 10)
        finally:
            loop.remove_reader(client.fileno())
        return sorted(results)

    assert asyncio.run(run()) == [(i, 0) for i in range(20)]


def test_get_of_another_nodes_value_copies_behind_its_transfer(two_nodes):
    """Client.get() of a value another node holds gets its bytes object as
    the transfer starts and fills it as the bytes land (gets_streamed);
    held locally after, the same bytes without a stream."""
    import time
    a, b = kvcache.Client(two_nodes[0]), kvcache.Client(two_nodes[1])
    value = bytes(range(256)) * (32 * 1024) + b"tail"  # 8 MiB and 4 bytes
    a.put("py-far", value)
    for _ in range(400):  # the directory hears of commits in batches
        if b.exists("py-far"):
            break
        time.sleep(0.025)
    before = b.stats()["gets_streamed"]
    got = b.get("py-far")
    assert type(got) is bytes and got == value
    assert b.stats()["gets_streamed"] == before + 1
    assert b.get("py-far") == value  # a local hit now
    assert b.stats()["gets_streamed"] == before + 1
    assert b.get("py-far-none") is None
    a.close()
    b.close()


def test_a_remote_fetchs_time_is_told_phase_by_phase(two_nodes):
    """Each value fetched from another node is timed phase by phase
    (remote_fetch_*_us): one at a time, the phases of all of them add up to
    no more than the wall time of the gets, and the holder's answer and
    the bytes each took some of it."""
    import time
    a, b = kvcache.Client(two_nodes[0]), kvcache.Client(two_nodes[1])
    n, size = 40, 256 * 1024
    for i in range(n):
        a.put("phase-%d" % i, bytes([i]) * size)
    for _ in range(400):  # the directory hears of commits in batches
        if b.exists("phase-%d" % (n - 1)):
            break
        time.sleep(0.025)
    phases = ("locate", "queue", "answer", "bytes", "end")
    before = b.stats()
    t0 = time.monotonic()
    for i in range(n):
        assert b.get("phase-%d" % i) == bytes([i]) * size
    wall_us = (time.monotonic() - t0) * 1e6
    after = b.stats()
    assert after["remote_fetches_timed"] - before["remote_fetches_timed"] == n
    spent = {p: after["remote_fetch_%s_us" % p] - before["remote_fetch_%s_us" % p]
             for p in phases}
    assert all(v >= 0 for v in spent.values()), spent
    assert spent["answer"] > 0 and spent["bytes"] > 0, spent
    assert sum(spent.values()) <= wall_us, (spent, wall_us)
    a.close()
    b.close()
