# SPDX-License-Identifier: MIT
"""kvcache.compat.mooncake against Mooncake's documented return codes."""
import ctypes
import errno
import importlib
import json
import os
import sys

import pytest

np = pytest.importorskip("numpy")

from kvcache.compat import mooncake as mc  # noqa: E402
from kvcache.compat.mooncake import MooncakeDistributedStore, ReplicateConfig  # noqa: E402
from kvcache.compat.mooncake_config import MooncakeConfig  # noqa: E402


@pytest.fixture
def store(daemon):
    s = MooncakeDistributedStore()
    assert s.health_check() == 1  # not set up
    assert s.setup("localhost", "P2PHANDSHAKE", 1 << 30, 1 << 26, "tcp", "",
                   "localhost:50051", socket=daemon) == 0
    assert s.health_check() == 0
    yield s
    s.remove_all(force=True)
    assert s.close() == 0


def test_error_mapping():
    assert mc.mooncake_code(5) == 5
    assert mc.mooncake_code(-errno.ENOENT) == -704
    assert mc.mooncake_code(-errno.ENOSPC) == -200
    assert mc.mooncake_code(-errno.EEXIST) == -705
    assert mc.mooncake_code(-errno.EBUSY) == -706
    assert mc.mooncake_code(-errno.EINVAL) == -600
    assert mc.mooncake_code(-errno.EIO) == -1


def test_setup_forms(daemon):
    s = MooncakeDistributedStore()
    assert s.setup({"local_hostname": "node-a", "metadata_server": "P2PHANDSHAKE",
                    "global_segment_size": 3200 * 1024 * 1024, "protocol": "tcp",
                    "master_server_addr": "127.0.0.1:50051", "ipc_socket_path": daemon}) == 0
    assert s.get_hostname() == "node-a:0"  # host:port; not in a cluster
    init = MooncakeDistributedStore()
    assert init.init_all("tcp", "", 1 << 30, socket=daemon) == 0
    assert not init.get_hostname().startswith("tcp")
    assert init.close() == 0
    assert s.put("setup", b"v") == 0
    assert s.close() == 0
    bad = MooncakeDistributedStore()
    assert bad.setup({"ipc_socket_path": daemon + ".none"}) == -1
    assert bad.health_check() == 1
    assert bad.put("k", b"v") == -600  # not set up: Mooncake's answer, no exception
    assert init.init_all("tcp", "", 1 << 30, socket=daemon) == 0  # closed: set up again
    assert init.init_all("tcp", "", 1 << 30, socket=daemon) == -600  # already set up
    assert init.close() == 0
    d = MooncakeDistributedStore()
    assert d.setup_dummy(1 << 30, 1 << 26, daemon) == 0
    assert d.get("setup") == b"v"
    d.close()


def test_put_get_exist_remove(store):
    assert store.put("a", b"alpha") == 0
    assert store.put("a", b"again") == 0  # Mooncake: an existing key is success
    assert store.get("a") == b"alpha"
    assert store.get("missing") == b""
    assert store.is_exist("a") == 1
    assert store.is_exist("missing") == 0
    assert store.batch_is_exist(["a", "missing"]) == [1, 0]
    assert store.get_size("a") == 5
    assert store.get_size("missing") == -704
    assert store.remove("a") == -706  # the get leased it
    assert store.remove("a", force=True) == 0
    assert store.remove("a") == -704
    assert store.upsert("u", b"1") == 0
    assert store.upsert("u", b"22") == 0
    assert store.get("u") == b"22"
    assert store.put_parts("parts", b"ab", bytearray(b"cd"), memoryview(b"ef")) == 0
    assert store.get("parts") == b"abcdef"
    assert store.put_batch(["b1", "b2"], [b"x", b"yy"]) == 0
    assert store.get_batch(["b1", "b2", "nope"]) == [b"x", b"yy", b""]
    assert store.batch_remove(["b1", "nope"], force=True) == [0, -704]
    v = store.get_buffer("b2")
    assert isinstance(v, mc.BufferHandle)
    assert bytes(v) == b"yy" and len(v) == 2 and v.size() == 2 and v.ptr() != 0
    assert bytes(memoryview(v)) == b"yy" and np.frombuffer(v, dtype=np.uint8).tolist() == [121, 121]
    assert ctypes.string_at(v.ptr(), v.size()) == b"yy"
    v.release()
    assert store.get_buffer("nope") is None
    assert [x is None for x in store.batch_get_buffer(["b2", "nope"])] == [False, True]
    with pytest.raises(ValueError):
        store.is_exist("") if False else store.put("", b"v")


def test_calls_before_setup_answer_as_mooncake(daemon, caplog):
    """Before setup() (or after close()) each call answers what Mooncake's
    binding answers (store_py.cpp, real_client.cpp @3b5a594), never raises;
    where Mooncake would crash, its failure value for the call."""
    s = MooncakeDistributedStore()
    rp = mc.ReplicateConfig()
    assert s.is_exist("k") == -600 and s.batch_is_exist(["k", "l"]) == [-600, -600]
    for call in (lambda: s.put("k", b"v"), lambda: s.upsert("k", b"v", rp),
                 lambda: s.put_parts("k", b"a", b"b"), lambda: s.upsert_parts("k", b"a"),
                 lambda: s.put_batch(["k"], [b"v"]), lambda: s.upsert_batch(["k"], [b"v"]),
                 lambda: s.put_from("k", 4096, 1), lambda: s.upsert_from("k", 4096, 1),
                 lambda: s.get_into("k", 4096, 1), lambda: s.get_size("k"),
                 lambda: s.register_buffer(4096, 1), lambda: s.unregister_buffer(4096),
                 lambda: s.remove("k"), lambda: s.remove_by_regex(".*"), s.remove_all):
        assert call() == -600
    assert s.get("k") == b"" and s.get_batch(["k", "l"]) == [b""]  # one, as Mooncake's
    assert s.get_buffer("k") is None and s.batch_get_buffer(["k", "l"]) == [None, None]
    assert s.batch_put_from(["k", "l"], [1, 2], [1, 1]) == [-600, -600]
    assert s.batch_upsert_from(["k"], [1], [1]) == [-600]
    assert s.batch_get_into(["k", "l"], [1, 2], [1, 1]) == [-600, -600]
    assert s.batch_remove(["k", "l"]) == [-600, -600]
    assert s.get_into_ranges([1], [["k", "l"]], [[[0, 8], [16]]], [[[0, 8], [0]]],
                             [[[8, 8], [4]]]) == [[[-600, -600], [-600]]]
    for call in (s.batch_put_session_start, s.batch_put_session_end,
                 s.batch_put_session_revoke, s.batch_get_session_start):
        assert call(["k"], *([[1]] if call == s.batch_put_session_start else [])) == []
    assert s.batch_put_from_multi_buffer_ranges(["k"], [[1]], [[1]], [[0]]) == []
    assert s.batch_get_into_multi_buffer_ranges(["k"], [[1]], [[1]], [[0]]) == []
    assert s.batch_get_session_end(["k"]) == -1
    assert s.batch_get_tensor_with_tp_into(["k", "l"], [1, 2], [1, 1]) == [None, None]
    assert s.get_replica_desc("k") == [] and s.batch_get_replica_desc(["k"]) == {}
    assert s.mount_segment("/x", 1 << 20) == {"ret": -1, "segment_ids": []}
    assert s.allocate_and_mount_segment(1 << 20)["ret"] == -1
    assert s.unmount_segment(["x"]) == s.unmount_and_free_segment(["x"]) == -1
    assert s.unmount_local_disk_segment() == -1
    assert [r.message for r in caplog.records].count(
        "MooncakeDistributedStore.is_exist: the store is not set up "
        "(setup() was not called, failed, or close() was)") == 1  # once a store
    # set up, the same calls work; closed, they answer as before setup again
    assert s.setup({"ipc_socket_path": daemon}) == 0
    assert s.put("before-setup", b"v") == 0 and s.is_exist("before-setup") == 1
    assert s.remove("before-setup", force=True) == 0
    assert s.close() == 0
    assert s.get("before-setup") == b"" and s.is_exist("before-setup") == -600


def test_registered_pointers(store):
    src = (np.arange(1 << 20) % 251).astype(np.uint8)
    dst = np.zeros(1 << 20, np.uint8)
    assert store.register_buffer(src.ctypes.data, src.nbytes) == 0
    assert store.register_buffer(dst.ctypes.data, dst.nbytes) == 0
    assert store.put_from("pf", src.ctypes.data, 1 << 20) == 0
    assert store.get_into("pf", dst.ctypes.data, 1 << 20) == 1 << 20
    assert (dst == src).all()
    assert store.get_into("pf", dst.ctypes.data, 100) == -600  # smaller than the object
    assert store.get_into("missing", dst.ctypes.data, 100) == -704
    unreg = np.zeros(4096, np.uint8)
    assert store.get_into("pf", unreg.ctypes.data, 4096) == -600
    assert store.put_from("bad", 4096, 16) == -600
    assert store.register_buffer(8, 16) != 0
    keys = ["bp%d" % i for i in range(4)]
    ptrs = [src.ctypes.data + i * 1000 for i in range(4)]
    assert store.batch_put_from(keys, ptrs, [1000] * 4) == [0] * 4
    dptrs = [dst.ctypes.data + i * 1000 for i in range(4)]
    dst[:] = 0
    assert store.batch_get_into(keys + ["nope"], dptrs + [dst.ctypes.data], [1000] * 5) == \
        [1000] * 4 + [-704]
    assert (dst[:4000] == src[:4000]).all()
    # one object from (or into) several pieces
    res = store.batch_put_from_multi_buffers(
        ["mb"], [[src.ctypes.data, src.ctypes.data + 8192]], [[100, 200]])
    assert res == [0]
    res = store.batch_get_into_multi_buffers(
        ["mb", "nope"], [[dst.ctypes.data, dst.ctypes.data + 500], [dst.ctypes.data]],
        [[150, 150], [10]])
    assert res == [300, -704]
    assert (dst[:100] == src[:100]).all() and (dst[100:150] == src[8192:8242]).all()
    assert (dst[500:650] == src[8242:8392]).all()
    assert store.batch_put_from_multi_buffers(["x"], [[1], [2]], [[1]]) == [-600]
    assert store.unregister_buffer(src.ctypes.data) == 0
    assert store.put_from("after", src.ctypes.data, 16) == -600


def test_sessions(store):
    src = (np.arange(8192) % 253).astype(np.uint8)
    dst = np.zeros(8192, np.uint8)
    store.register_buffer(src.ctypes.data, src.nbytes)
    store.register_buffer(dst.ctypes.data, dst.nbytes)
    assert store.batch_put_session_start(["s1", "s2"], [8192, 100]) == [0, 0]
    assert store.batch_put_session_start(["s1"], [8192]) == [-600]  # open already
    assert store.is_exist("s1") == 0
    # layer by layer: two halves at their offsets; the bytes written
    assert store.batch_put_from_multi_buffer_ranges(
        ["s1"], [[src.ctypes.data, src.ctypes.data + 4096]], [[4096, 4096]], [[0, 4096]]) == [8192]
    assert store.batch_put_from_multi_buffer_ranges(["s1"], [[1234]], [[8]], [[0]]) == [-600]
    assert store.batch_put_session_end(["s1"]) == [0]
    assert store.batch_put_session_revoke(["s2", "s3"]) == [0, -704]
    assert store.is_exist("s1") == 1 and store.is_exist("s2") == 0
    assert store.batch_get_session_start(["s1", "nope"]) == [0, -704]
    assert store.get_size("s1") == 8192
    assert store.batch_get_into_multi_buffer_ranges(
        ["s1"], [[dst.ctypes.data, dst.ctypes.data + 4096]], [[4096, 4096]], [[4096, 0]]) == [8192]
    assert (dst[:4096] == src[4096:]).all() and (dst[4096:] == src[:4096]).all()
    assert store.remove("s1") == -706  # the session holds it
    assert store.batch_get_session_end(["s1"]) == 0
    assert store.batch_get_session_end(["s1"]) == 0  # no session: nothing to end


def test_pins_and_pressure(store):
    hard = ReplicateConfig(with_hard_pin=True)
    blob = bytes(16 << 20)
    n = 0
    codes = set()
    while n < 40:  # 256 MiB of dram: hard pins fill it and then refuse
        r = store.put("pin%d" % n, blob, hard)
        codes.add(r)
        if r != 0:
            break
        n += 1
    assert -200 in codes, codes  # NO_AVAILABLE_HANDLE: the engines' store-pressure code
    assert store.put("huge", bytes(300 << 20)) == -600  # larger than the pool
    soft = ReplicateConfig(soft_pin_action=mc.SoftPinAction.ENABLE, soft_pin_ttl_ms=1000)
    assert mc._put_opts(soft) == {"pin": "soft", "pin_ttl_ms": 1000}
    assert mc._put_opts(ReplicateConfig(replica_num=2)) == {}
    assert store.remove_all(force=True) >= n


def test_remove_by_regex(store):
    for k in ["layer0_tp0", "layer1_tp0", "layer0_tp1", "other"]:
        assert store.put(k, b"v") == 0
    assert store.remove_by_regex(r"^layer\d_tp0$") == 2
    assert store.batch_is_exist(["layer0_tp0", "layer1_tp0", "layer0_tp1", "other"]) == [0, 0, 1, 1]
    assert store.remove_by_regex("(") == -600
    assert store.remove_all() == 0  # is_exist leased both survivors
    assert store.remove_all(force=True) == 2


def test_host_allocator(store, daemon):
    alloc = mc.MooncakeHostMemAllocator(daemon)
    p = alloc.alloc(1 << 20)
    assert p
    assert store.register_buffer(p, 1 << 20) == 0
    import ctypes
    ctypes.memmove(p, b"from-allocator", 14)
    assert store.put_from("alloc", p, 14) == 0
    assert store.get("alloc") == b"from-allocator"
    assert store.get_into("alloc", p + 4096, 1000) == 14
    assert ctypes.string_at(p + 4096, 14) == b"from-allocator"
    # SGLang's Mooncake backend (mooncake_store.py @7bfc299a) keeps its
    # host KV pool in such memory and moves pages with the batch calls
    ctypes.memmove(p + 8192, bytes(range(256)) * 32, 8192)
    assert store.batch_put_from(["al-0", "al-1"], [p + 8192, p + 12288], [4096, 4096]) == [0, 0]
    assert store.batch_put_from_multi_buffers(["al-2"], [[p + 8192, p + 9000]],
                                              [[50, 60]]) == [0]
    assert store.get("al-1") == ctypes.string_at(p + 12288, 4096)
    assert store.batch_is_exist(["al-0", "al-1", "al-2"]) == [1, 1, 1]
    assert store.batch_get_into(["al-0", "al-1", "al-none"], [p + 65536, p + 69632, p + 73728],
                                [4096, 4096, 64]) == [4096, 4096, -704]
    assert ctypes.string_at(p + 65536, 8192) == ctypes.string_at(p + 8192, 8192)
    assert store.batch_get_into_multi_buffers(["al-2", "al-0"], [[p + 98304, p + 98354],
                                                                 [p + 102400]],
                                              [[50, 60], [100]]) == [110, -600]
    assert ctypes.string_at(p + 98304, 110) == \
        ctypes.string_at(p + 8192, 50) + ctypes.string_at(p + 9000, 60)
    assert store.batch_put_from(["al-past"], [p + (1 << 20) - 10], [100]) == [-600]
    assert alloc.free(p) == 0
    assert alloc.free(p) == -600
    alloc.close()


def test_dummy_client_memory_pool(store, daemon, caplog):
    """LMCache's dummy-client mode (mooncakestore_connector.py @a9222b33):
    setup_dummy, its CPU cache from alloc_from_mem_pool, registered, puts
    from and gets into it.  A real client's answer is 0, as Mooncake's; a
    setup that finds no daemon says why (engines ignore its answer)."""
    import ctypes
    d = MooncakeDistributedStore()
    assert d.alloc_from_mem_pool(4096) == 0  # not set up
    assert d.setup_dummy(1 << 30, 1 << 26, daemon) == 0
    p = d.alloc_from_mem_pool(1 << 20)
    assert p and d.register_buffer(p, 1 << 20) == 0
    ctypes.memmove(p, bytes(range(256)) * 16, 4096)
    assert d.put_from("dummy-0", p, 4096, mc.ReplicateConfig()) == 0
    assert d.batch_put_from(["dummy-1"], [p + 1024], [2048], mc.ReplicateConfig()) == [0]
    assert d.batch_get_into(["dummy-0", "dummy-1"], [p + 8192, p + 16384], [4096, 2048]) == \
        [4096, 2048]
    assert ctypes.string_at(p + 8192, 4096) == ctypes.string_at(p, 4096)
    assert ctypes.string_at(p + 16384, 2048) == ctypes.string_at(p + 1024, 2048)
    assert store.alloc_from_mem_pool(4096) == 0  # a real client's answer
    assert d.remove("dummy-0", force=True) == 0 and d.remove("dummy-1", force=True) == 0
    assert d.close() == 0
    assert d.put_from("dummy-2", p, 16) == -600  # its memory went with it
    lost = MooncakeDistributedStore()
    assert lost.setup({"ipc_socket_path": daemon + ".none"}) == -1
    assert "no kvcached answers at %s.none" % daemon in caplog.text


def test_shim_import(daemon):
    shim = os.environ.get("KVCACHE_SHIM_DIR")
    if not shim:
        pytest.skip("KVCACHE_SHIM_DIR is not set")
    sys.path.insert(0, shim)
    try:
        store_mod = importlib.import_module("mooncake.store")
        s = store_mod.MooncakeDistributedStore()
        assert s.setup({"ipc_socket_path": daemon}) == 0
        assert s.put("shim", b"ok") == 0 and s.get("shim") == b"ok"
        assert isinstance(store_mod.ReplicateConfig(), ReplicateConfig)
        for name in ("EngramStore", "EngramStoreConfig", "MooncakeDistributedNoFRegister",
                     "ParallelAxis", "TensorParallelism", "ReadTarget",
                     "_get_pyclient_from_wrapper", "_serialize_tensor"):
            assert getattr(store_mod, name) is getattr(mc, name), name
        s.remove("shim", force=True)
        s.close()
        config_mod = importlib.import_module("mooncake.mooncake_config")
        assert config_mod.MooncakeConfig is MooncakeConfig
        from kvcache.compat.async_store import MooncakeDistributedStoreAsync
        async_mod = importlib.import_module("mooncake.async_store")
        assert async_mod.MooncakeDistributedStoreAsync is MooncakeDistributedStoreAsync
    finally:
        sys.path.remove(shim)
        for m in ["mooncake.store", "mooncake.mooncake_config", "mooncake.async_store",
                  "mooncake"]:
            sys.modules.pop(m, None)


def test_mooncake_config(tmp_path, monkeypatch):
    path = tmp_path / "mooncake.json"
    path.write_text(json.dumps({
        "local_hostname": "node1", "metadata_server": "P2PHANDSHAKE",
        "master_server_address": "m:50051", "global_segment_size": "4gb",
        "local_buffer_size": "512 MB", "protocol": "rdma", "device_name": "mlx5_0",
        "enable_ssd_offload": "yes", "ssd_offload_path": "/nvme/x", "tenant_id": 7}))
    c = MooncakeConfig.from_file(str(path))
    assert (c.local_hostname, c.metadata_server, c.master_server_address) == \
        ("node1", "P2PHANDSHAKE", "m:50051")
    assert c.global_segment_size == 4 << 30 and c.local_buffer_size == 512 << 20
    assert (c.protocol, c.device_name) == ("rdma", "mlx5_0")
    assert c.enable_ssd_offload is True and c.ssd_offload_path == "/nvme/x"
    assert c.tenant_id == "7"
    assert (c.enable_client_http_server, c.client_http_port) == (False, 9300)
    # Mooncake's words and checks: enable/disable, a protocol in any case,
    # the client HTTP fields; an empty required field is an error
    path.write_text(json.dumps({
        "local_hostname": "n", "metadata_server": "P2PHANDSHAKE",
        "master_server_address": "m:1", "protocol": " RDMA ", "enable_ssd_offload": "Enable",
        "enable_client_http_server": "enable", "client_http_port": 9400}))
    c = MooncakeConfig.from_file(str(path))
    assert (c.protocol, c.enable_ssd_offload) == ("rdma", True)
    assert (c.enable_client_http_server, c.client_http_port) == (True, 9400)
    path.write_text(json.dumps({"local_hostname": "", "metadata_server": "P2PHANDSHAKE",
                                "master_server_address": "m:1"}))
    with pytest.raises(ValueError, match="local_hostname"):
        MooncakeConfig.from_file(str(path))
    path.write_text(json.dumps({"local_hostname": "n", "metadata_server": "P2PHANDSHAKE",
                                "master_server_address": "m:1", "global_segment_size": -1}))
    with pytest.raises(ValueError, match="non-negative"):
        MooncakeConfig.from_file(str(path))
    # the defaults, and a field that must be there
    path.write_text(json.dumps({"local_hostname": "h", "metadata_server": "P2PHANDSHAKE",
                                "master_server_address": "m:1"}))
    c = MooncakeConfig.from_file(str(path))
    assert c.global_segment_size == 3355443200 and c.local_buffer_size == 1 << 30
    assert (c.protocol, c.device_name, c.tenant_id) == ("tcp", "", "default")
    assert c.enable_ssd_offload is False
    path.write_text(json.dumps({"local_hostname": "h", "metadata_server": "x"}))
    with pytest.raises(ValueError, match="master_server_address"):
        MooncakeConfig.from_file(str(path))
    path.write_text(json.dumps({"local_hostname": "h", "metadata_server": "x",
                                "master_server_address": "m:1", "enable_ssd_offload": "maybe"}))
    with pytest.raises(ValueError):
        MooncakeConfig.from_file(str(path))
    # from the environment: the file it names, else the MOONCAKE_* variables
    for v in ("MOONCAKE_CONFIG_PATH", "MOONCAKE_MASTER", "MOONCAKE_PROTOCOL",
              "MOONCAKE_GLOBAL_SEGMENT_SIZE", "MOONCAKE_TENANT_ID"):
        monkeypatch.delenv(v, raising=False)
    with pytest.raises(ValueError, match="MOONCAKE_MASTER"):
        MooncakeConfig.load_from_env()
    monkeypatch.setenv("MOONCAKE_MASTER", "10.0.0.1:50051")
    monkeypatch.setenv("MOONCAKE_GLOBAL_SEGMENT_SIZE", "1.5g")
    monkeypatch.setenv("MOONCAKE_TENANT_ID", "team-a")
    c = MooncakeConfig.load_from_env()
    assert c.master_server_address == "10.0.0.1:50051"
    assert c.global_segment_size == 3 << 29 and c.metadata_server == "P2PHANDSHAKE"
    assert (c.local_hostname, c.protocol, c.tenant_id) == ("localhost", "tcp", "team-a")
    path.write_text(json.dumps({"local_hostname": "f", "metadata_server": "P2PHANDSHAKE",
                                "master_server_address": "file:1"}))
    monkeypatch.setenv("MOONCAKE_CONFIG_PATH", str(path))
    assert MooncakeConfig.load_from_env().master_server_address == "file:1"


def test_tenants_are_key_namespaces(daemon):
    """setup(..., tenant_id=...) as Mooncake's: a tenant's keys are its own.
    The same key in two tenants and the default one holds three values;
    exists, batch calls, sessions, regex and remove_all stay inside their
    tenant; the default tenant's keys are the daemon's own names."""
    import kvcache

    args = ("localhost", "P2PHANDSHAKE", 1 << 30, 1 << 26, "tcp", "", "localhost:50051")
    a, b, d = MooncakeDistributedStore(), MooncakeDistributedStore(), MooncakeDistributedStore()
    assert a.setup(*args, socket=daemon, tenant_id="team-a") == 0
    assert b.setup(*args, None, False, "", "team-b", socket=daemon) == 0  # positional
    assert d.setup(*args, socket=daemon) == 0  # tenant "default"
    raw = kvcache.Client(daemon)
    try:
        assert a.put("k", b"from a") == 0
        assert b.put("k", b"from b") == 0
        assert d.put("k", b"from default") == 0
        assert (a.get("k"), b.get("k"), d.get("k")) == (b"from a", b"from b", b"from default")
        assert raw.get("k") == b"from default"  # the default tenant's names are the daemon's
        assert a.put("only-a", b"x") == 0
        assert (a.is_exist("only-a"), b.is_exist("only-a"), d.is_exist("only-a")) == (1, 0, 0)
        assert b.batch_is_exist(["k", "only-a"]) == [1, 0]
        assert b.get_size("only-a") == -704
        # a default-tenant key that looks like a tenant's name stays out of it
        forged = "\x1ftenant\x1fteam-a\x1fonly-a"
        assert d.is_exist(forged) == 0
        assert d.put(forged, b"forged") == 0
        assert a.get("only-a") == b"x"
        assert d.get(forged) == b"forged"
        # batch and zero-copy calls
        assert a.put_batch(["p1", "p2"], [b"1" * 10, b"2" * 20]) == 0
        assert a.batch_is_exist(["p1", "p2"]) == [1, 1] and d.batch_is_exist(["p1", "p2"]) == [0, 0]
        with a.get_buffer("p2") as v:
            assert bytes(v) == b"2" * 20
        assert b.get_buffer("p2") is None
        # sessions
        assert b.batch_put_session_start(["s"], [4]) == [0]
        src = np.frombuffer(b"sess", dtype=np.uint8).copy()
        assert b.register_buffer(src.ctypes.data, 4) == 0
        assert b.batch_put_from_multi_buffer_ranges(["s"], [[src.ctypes.data]], [[4]],
                                                    [[0]]) == [4]
        assert b.batch_put_session_end(["s"]) == [0]
        assert b.get("s") == b"sess" and a.get("s") == b"" and d.get("s") == b""
        assert b.unregister_buffer(src.ctypes.data) == 0
        # removal stays inside the tenant
        assert d.remove_by_regex("^(k|only-a|p1)$", force=True) == 1  # the default's "k" alone
        assert a.get("k") == b"from a" and b.get("k") == b"from b"
        assert a.remove_all(force=True) == 4  # k, only-a, p1, p2
        assert a.get("k") == b"" and b.get("k") == b"from b" and d.get(forged) == b"forged"
        assert d.remove_all(force=True) == 1  # the forged key; b's are not the default's
        assert b.get("k") == b"from b" and b.get("s") == b"sess"
        assert b.remove_all(force=True) == 2
        assert raw.list(None, 100) == []
    finally:
        for s in (a, b, d):
            s.close()
        raw.close()


def _meta(dtype, shape, nbytes, global_shape=None, axes=()):
    """Mooncake's TensorMetadata (integration_utils.h at 3b5a594), built
    here field by field from its definition, not from kvcache's code."""
    import struct
    pad = [-1] * (8 - len(shape))
    g = list(global_shape or shape)
    out = struct.pack("<IHHiiIIQQ", 0x4D4F4F4E, 1, 304, dtype, len(shape), 1 if axes else 0,
                      0, 304, nbytes)
    out += struct.pack("<8q", *(g + pad)) + struct.pack("<8q", *(list(shape) + pad))
    out += struct.pack("<II", len(axes), 0)
    for kind, rank, count, sd, extent in axes:
        out += struct.pack("<iiiiiiq", kind, 0, rank, count, sd, 0, extent)
    return out + bytes(304 - len(out))


def test_tensors_as_mooncake_stores_them(store):
    """put_tensor/get_tensor and their batch, into, pub and *_with_tp forms.
    The value is Mooncake's: a 304-byte TensorMetadata (magic, version,
    dtype, ndim, layout, data offset and length, global and local shapes of
    8 dimensions, up to 4 parallel axes) and the bytes, so a tensor written
    by either store reads in the other."""
    import struct
    torch = pytest.importorskip("torch")

    t = torch.arange(24, dtype=torch.float32).reshape(2, 3, 4)
    assert store.put_tensor("t", t) == 0
    raw = store.get("t")
    assert len(raw) == 304 + 96
    assert raw[:304] == _meta(0, [2, 3, 4], 96)
    assert raw[304:] == t.numpy().tobytes()
    assert torch.equal(store.get_tensor("t"), t)
    assert mc._tensor_metadata_size() == 304
    # every dtype this torch has, 0-d and 4-d shapes
    cases = [torch.tensor(2.5, dtype=torch.bfloat16),
             torch.ones(1, 2, 3, 4, dtype=torch.float16),
             torch.tensor([True, False, True]),
             torch.arange(5, dtype=torch.int64) - 2,
             torch.arange(6, dtype=torch.uint8)]
    keys = ["c%d" % i for i in range(len(cases))]
    assert store.batch_put_tensor(keys, cases) == [0] * len(cases)
    for a, b in zip(cases, store.batch_get_tensor(keys)):
        assert b.dtype == a.dtype and b.shape == a.shape and torch.equal(a, b)
    # 8 dimensions and no elements are stored; what Mooncake refuses: not a
    # tensor, 9 dimensions; a length mismatch
    assert store.put_tensor("d8", torch.ones([1] * 7 + [3])) == 0
    assert store.get_tensor("d8").shape == (1,) * 7 + (3,)
    assert store.put_tensor("empty", torch.zeros(0, 4)) == 0
    assert store.get_tensor("empty").shape == (0, 4)
    assert store.put_tensor("bad", b"bytes") == -600
    assert store.put_tensor("bad", torch.zeros([1] * 9)) == -600
    assert store.batch_put_tensor(["x", "y"], [t]) == [-600, -600]
    assert store.get_tensor("absent") is None
    store.put("not-a-tensor", b"abc")
    assert store.get_tensor("not-a-tensor") is None
    # a value written by hand as Mooncake writes it reads back as its tensor
    store.put("by-hand", _meta(6, [2, 2], 16) + struct.pack("<4i", 1, 2, 3, 4))
    assert torch.equal(store.get_tensor("by-hand"),
                       torch.tensor([[1, 2], [3, 4]], dtype=torch.int32))
    # and what breaks Mooncake's rules does not: a wrong magic, a length
    # that is not the shape's, a dimension past ndim that is not -1
    bad = bytearray(_meta(6, [2, 2], 16) + bytes(16))
    bad[0] ^= 1
    store.put("bad-magic", bytes(bad))
    store.put("bad-len", _meta(6, [2, 2], 16) + bytes(12))
    wrong = bytearray(_meta(6, [2, 2], 16) + bytes(16))
    struct.pack_into("<q", wrong, 104 + 8 * 3, 7)
    store.put("bad-dims", bytes(wrong))
    assert [store.get_tensor(k) for k in ("bad-magic", "bad-len", "bad-dims")] == [None] * 3
    # what kvcache stored before it followed Mooncake's current layout
    store.put("older", struct.pack("<ii4q", 6, 2, 2, 2, -1, -1) + struct.pack("<4i", 1, 2, 3, 4))
    assert torch.equal(store.get_tensor("older"),
                       torch.tensor([[1, 2], [3, 4]], dtype=torch.int32))
    # the module's serialization helpers agree with the store
    meta, ptr, nbytes, owner = mc._serialize_tensor(t)
    assert meta == raw[:304] and nbytes == 96 and ptr == owner.data_ptr()
    assert torch.equal(mc._deserialize_tensor(raw), t)
    with pytest.raises(ValueError):
        mc._serialize_tensor(b"bytes")
    with pytest.raises(ValueError):
        mc._deserialize_tensor(b"x" * 400)
    # into registered memory: a tensor over that memory
    dst = np.zeros(4096, dtype=np.uint8)
    assert store.register_buffer(dst.ctypes.data, dst.nbytes) == 0
    got = store.get_tensor_into("t", dst.ctypes.data, dst.nbytes)
    assert torch.equal(got, t)
    dst[304:308] = 0  # the tensor is that memory
    assert got.flatten()[0].item() == 0.0
    half = dst.ctypes.data + 2048
    res = store.batch_get_tensor_into(["c1", "absent"], [dst.ctypes.data, half], [2048, 2048])
    assert torch.equal(res[0], cases[1]) and res[1] is None
    # tensor parallelism: chunks along split_dim as key_tp_<rank>
    w = torch.arange(32, dtype=torch.float32).reshape(4, 8)
    assert store.put_tensor_with_tp("w", w, tp_rank=0, tp_size=4, split_dim=1) == 0
    for r in range(4):
        assert torch.equal(store.get_tensor_with_tp("w", tp_rank=r, tp_size=4),
                           w[:, 2 * r:2 * r + 2])
    assert store.get_tensor("w") is None  # only the shards are stored
    # each shard: SHARD metadata, the whole shape, one TP axis
    raw1 = store.get("w_tp_1")
    assert raw1[:304] == _meta(0, [4, 2], 32, [4, 8], [(1, 1, 4, 1, 2)])
    assert store.put_tensor_with_tp("uneven", w, tp_size=3, split_dim=1) == -600
    assert store.batch_put_tensor_with_tp(["u", "v"], [w, w], tp_size=2) == [0, 0]
    shards = store.batch_get_tensor_with_tp(["u", "v"], tp_rank=1, tp_size=2)
    assert all(torch.equal(s, w[2:]) for s in shards)
    got = store.get_tensor_with_tp_into("w", dst.ctypes.data, 2048, tp_rank=3, tp_size=4)
    assert torch.equal(got, w[:, 6:])
    assert store.put_tensor_with_tp("z", w, tp_size=3, split_dim=5) == -600
    # pub_tensor: Mooncake's check of the replica settings
    cfg = ReplicateConfig()
    cfg.replica_num = 2
    cfg.preferred_segments = ["only-one"]
    assert store.pub_tensor("p", t, cfg) == -600
    cfg.preferred_segments = []
    assert store.pub_tensor("p", t, cfg) == 0
    assert store.batch_pub_tensor_with_tp(["q"], [w], cfg, tp_size=2) == [0]
    assert torch.equal(store.get_tensor_with_tp("q", 0, 2), w[:2])
    assert store.unregister_buffer(dst.ctypes.data) == 0


def test_replica_descriptors(store):
    assert store.put("r1", b"x" * 5000) == 0
    reps = store.get_replica_desc("r1")
    assert len(reps) == 1 and reps[0].is_memory_replica() and not reps[0].is_disk_replica()
    assert reps[0].status == mc.ReplicaStatus.COMPLETE
    bd = reps[0].get_memory_descriptor().buffer_descriptor
    assert bd.size_ == 5000 and bd.transport_endpoint_
    assert bd.size == 5000 and bd.transport_endpoint == bd.transport_endpoint_
    with pytest.raises(RuntimeError):
        reps[0].get_disk_descriptor()
    assert store.get_replica_desc("nowhere") == []
    reps = store.batch_get_replica_desc(["r1", "nowhere"])
    assert set(reps) == {"r1", "nowhere"} and reps["nowhere"] == []
    assert len(reps["r1"]) == 1
    # what kvcache has no use for answers Mooncake's "not in this mode"
    assert store.create_copy_task("r1", ["other"]) == ((0, 0), -1011)
    assert store.create_move_task("r1", "a", "b") == ((0, 0), -1011)
    assert store.query_task(None) == (None, -1011)
    # Mooncake's shapes: a dict for the mounts, an int for the rest
    assert store.mount_segment("/dev/shm/seg", 1 << 20) == {"ret": -1011, "segment_ids": []}
    assert store.unmount_segment(["seg-1"]) == -1011
    assert store.allocate_and_mount_segment(1 << 20, "tcp") == {
        "ret": -1011, "segment_ids": [], "allocated_size": 0}
    assert store.unmount_and_free_segment(["seg-1"], grace_period_seconds=1) == -1011
    assert store.unmount_local_disk_segment(0) == -1011
    assert store.batch_replica_clear(["r1"]) == []


def test_replica_descriptors_on_disk(tmp_path):
    from conftest import start_daemon, stop_daemon
    proc, d, sock, log = start_daemon("--disk-dir", str(tmp_path))
    try:
        s = MooncakeDistributedStore()
        assert s.setup({"ipc_socket_path": sock}) == 0
        assert s.put("r1", b"x" * 5000) == 0
        import kvcache
        c = kvcache.Client(sock)
        assert c.flush() == 0  # a copy on the disk tier too
        c.close()
        reps = s.get_replica_desc("r1")
        kinds = sorted((r.is_memory_replica(), r.is_disk_replica()) for r in reps)
        assert kinds == [(False, True), (True, False)]
        disk = [r for r in reps if r.is_disk_replica()][0].get_disk_descriptor()
        assert disk.object_size == 5000
        s.remove("r1", force=True)
        s.close()
    finally:
        stop_daemon(proc, d, log)


def test_replica_descriptors_of_another_node(two_nodes):
    import time
    a, b = (MooncakeDistributedStore() for _ in range(2))
    assert a.setup({"ipc_socket_path": two_nodes[0]}) == 0
    assert b.setup({"ipc_socket_path": two_nodes[1]}) == 0
    assert a.put("far", b"y" * 3000) == 0
    for _ in range(400):  # the directory hears of commits in batches
        reps = b.get_replica_desc("far")
        if reps:
            break
        time.sleep(0.025)
    assert len(reps) == 1 and reps[0].is_memory_replica()
    bd = reps[0].get_memory_descriptor().buffer_descriptor
    assert bd.transport_endpoint_ == "A"
    assert b.get("far") == b"y" * 3000  # now B holds a copy too
    ends = sorted(r.get_memory_descriptor().buffer_descriptor.transport_endpoint_
                  for r in b.get_replica_desc("far"))
    assert ends == ["A", "B"]
    a.close()
    b.close()



def test_async_store(daemon):
    import asyncio
    from kvcache.compat.async_store import MooncakeDistributedStoreAsync

    s = MooncakeDistributedStoreAsync()
    assert s.setup({"ipc_socket_path": daemon}) == 0

    async def run():
        assert await s.async_put("as1", b"one") == 0
        got = await asyncio.gather(*(s.async_put("as%d" % i, b"v%d" % i) for i in range(2, 10)))
        assert got == [0] * 8
        vals = await asyncio.gather(*(s.async_get("as%d" % i) for i in range(2, 10)))
        assert vals == [b"v%d" % i for i in range(2, 10)]
        assert await s.async_is_exist("as1") == 1
        assert await s.async_remove("as1", force=True) == 0
        assert await s.async_get("as1") in (b"", None)

    asyncio.run(run())
    with pytest.raises(AttributeError):
        s.async_no_such_method
    with pytest.raises(AttributeError):
        s.no_such_method
    for i in range(2, 10):
        s.remove("as%d" % i, force=True)
    s.close()


def test_get_into_ranges(store):
    assert store.put("gr1", bytes(range(100))) == 0
    assert store.put("gr2", b"abcdefgh") == 0
    a = np.zeros(64, dtype=np.uint8)
    b = np.zeros(16, dtype=np.uint8)
    # memory not registered is never written to
    res = store.get_into_ranges([a.ctypes.data], [["gr1"]], [[[0]]], [[[0]]], [[[4]]])
    assert res == [[[-600]]] and a[0] == 0
    assert store.get_into_ranges([0x1000], [["gr1"]], [[[0]]], [[[0]]], [[[4]]]) == [[[-600]]]
    assert store.register_buffer(a.ctypes.data, a.nbytes) == 0
    assert store.register_buffer(b.ctypes.data, b.nbytes) == 0
    res = store.get_into_ranges(
        [a.ctypes.data, b.ctypes.data],
        [["gr1", "gr2"], ["gr2", "missing"]],
        [[[0, 10], [20]], [[0], [4, 8]]],
        [[[5, 90], [2]], [[6], [0, 1]]],
        [[[4, 10], [3]], [[2], [1, 1]]])
    assert res == [[[4, 10], [3]], [[2], [-704, -704]]]
    assert a[0:4].tolist() == [5, 6, 7, 8]
    assert a[10:20].tolist() == list(range(90, 100))
    assert bytes(a[20:23]) == b"cde"
    assert bytes(b[0:2]) == b"gh"
    assert b[4:10].tolist() == [0] * 6
    # a range past the object's end is refused, the others copied
    res = store.get_into_ranges([b.ctypes.data], [["gr2"]], [[[0, 8]]], [[[6, 0]]], [[[3, 2]]])
    assert res == [[[-600, 2]]] and bytes(b[8:10]) == b"ab"
    with pytest.raises(ValueError):
        store.get_into_ranges([a.ctypes.data], [["gr1"], ["gr2"]], [[[0]]], [[[0]]], [[[1]]])


class FakeDevice:
    """A GPU's memory as the store meets it: addresses no mapping of the
    process holds (CUDA's unified addressing), reached only by the copies
    the CUDA runtime makes.  The store's device path runs on this stand-in
    here (there is no GPU)."""
    BASE = 0x7e00_0000_0000

    def __init__(self, size):
        self.mem = bytearray(size)
        self.copies = 0

    def _dev(self, p, n):
        return self.BASE <= p and p + n <= self.BASE + len(self.mem)

    def is_device(self, ptr):
        return self._dev(ptr, 1)

    def copy(self, dst, src, n):
        self.copies += 1
        if self._dev(dst, n) and not self._dev(src, 1):
            self.mem[dst - self.BASE:dst - self.BASE + n] = ctypes.string_at(src, n)
        elif self._dev(src, n) and not self._dev(dst, 1):
            ctypes.memmove(dst, bytes(self.mem[src - self.BASE:src - self.BASE + n]), n)
        else:
            return False
        return True


def test_device_memory(store, monkeypatch):
    """vLLM's own Mooncake store connector (vllm/distributed/kv_transfer/
    kv_connector/v1/mooncake/store/worker.py @055e47c) registers its KV
    cache, GPU memory, with register_buffer and moves blocks with
    batch_put_from_multi_buffers / batch_get_into_multi_buffers of pointers
    into it.  Such memory is copied through the CUDA runtime (a stand-in
    here); it was refused with -600, so that connector stored nothing."""
    dev = FakeDevice(1 << 20)
    base, out = dev.BASE, dev.BASE + 65536
    assert mc._CudaCopies().is_device(base) is False  # no CUDA runtime in this process
    assert store.register_buffer(base, 1 << 20) == -600  # so: not memory it can use
    monkeypatch.setattr(mc, "_device", dev)
    assert store.register_buffer(base, 1 << 20) == 0
    dev.mem[0:4096] = bytes(range(256)) * 16
    dev.mem[8192:8292] = b"v" * 100
    # a block's pieces (its K and V), as the connector's per-layer addresses
    assert store.batch_put_from_multi_buffers(["blk-0", "blk-1"], [[base, base + 8192],
                                              [base + 1024]], [[4096, 100], [512]]) == [0, 0]
    assert store.get("blk-0") == bytes(dev.mem[0:4096]) + b"v" * 100
    assert store.batch_is_exist(["blk-0", "blk-1", "blk-2"]) == [1, 1, 0]
    copies = dev.copies
    assert store.batch_put_from_multi_buffers(["blk-0"], [[base]], [[8]]) == [0]  # stored
    assert dev.copies == copies  # refused before any byte was copied
    assert store.batch_get_into_multi_buffers(
        ["blk-0", "blk-1", "blk-2"], [[out, out + 4096], [out + 8192], [out + 9000]],
        [[4096, 100], [512], [64]]) == [4196, 512, -704]
    assert bytes(dev.mem[65536:65536 + 4196]) == store.get("blk-0")
    assert dev.mem[65536 + 8192:65536 + 8704] == dev.mem[1024:1536]
    # too small, past the registered memory, half host half device: -600
    assert store.batch_get_into_multi_buffers(["blk-0"], [[out]], [[100]]) == [-600]
    assert store.batch_put_from_multi_buffers(["far"], [[base + (1 << 20) - 10]], [[100]]) == \
        [-600]
    host = np.zeros(64, dtype=np.uint8)
    assert store.register_buffer(host.ctypes.data, 64) == 0
    assert store.batch_put_from_multi_buffers(["mixed"], [[base, host.ctypes.data]],
                                              [[8, 8]]) == [-600]
    assert store.batch_put_from_multi_buffers(["host"], [[host.ctypes.data]], [[64]]) == [0]
    # the single and upsert calls, sessions and ranges
    assert store.put_from("one", base, 256) == 0 and store.get_into("one", out, 256) == 256
    assert dev.mem[65536:65536 + 256] == dev.mem[0:256]
    assert store.upsert_from("up", base + 256, 256) == 0
    assert store.upsert_from("up", base, 256) == 0  # (a get would lease it)
    assert store.get("up") == bytes(dev.mem[0:256])
    assert store.batch_upsert_from(["up2"], [base + 256], [256]) == [0]
    assert store.get("up2") == bytes(dev.mem[256:512])
    assert store.batch_put_from(["two"], [base + 512], [16]) == [0]
    assert store.batch_get_into(["two"], [out + 1024], [16]) == [16]
    assert dev.mem[65536 + 1024:65536 + 1040] == dev.mem[512:528]
    assert store.get_into_ranges([out], [["two"]], [[[100]]], [[[4]]], [[[8]]]) == [[[8]]]
    assert dev.mem[65536 + 100:65536 + 108] == dev.mem[516:524]
    assert store.batch_put_session_start(["sess"], [32]) == [0]
    assert store.batch_put_from_multi_buffer_ranges(["sess"], [[base, base + 100]], [[16, 16]],
                                                    [[0, 16]]) == [32]
    assert store.batch_put_session_end(["sess"]) == [0]
    assert store.get("sess") == bytes(dev.mem[0:16]) + bytes(dev.mem[100:116])
    assert store.batch_get_session_start(["sess"]) == [0]
    assert store.batch_get_into_multi_buffer_ranges(["sess"], [[out + 2048]], [[8]],
                                                    [[20]]) == [8]
    assert store.batch_get_session_end(["sess"]) == 0
    assert dev.mem[65536 + 2048:65536 + 2056] == dev.mem[104:112]
    assert store.get_tensor_into("one", out, 256) is None  # not a tensor over host memory
    assert store.put_tensor_from("one-t", base, 256) == -600  # its header is not read
    # a copy the runtime fails: nothing is stored
    monkeypatch.setattr(dev, "copy", lambda d, s, n: False)
    assert store.put_from("broken", base, 64) == -1 and store.is_exist("broken") == 0
    assert store.get_into("one", out, 256) == -1
    assert store.unregister_buffer(base) == 0
    assert store.put_from("after", base, 64) == -600


def test_upsert_tensor_and_put_with_metadata(store):
    torch = pytest.importorskip("torch")
    t1 = torch.arange(6, dtype=torch.float32)
    t2 = torch.arange(8, dtype=torch.int64).reshape(2, 4)
    assert store.put_tensor("ut", t1) == 0
    assert store.put_tensor("ut", t2) == 0  # a put keeps what is there
    assert store.upsert_tensor("ut", t2) == 0  # an upsert replaces it
    assert torch.equal(store.get_tensor("ut"), t2)
    # (the get leased it: a replacement waits for the lease, as a removal)
    assert store.upsert_tensor("ut", t1) == -706
    assert store.put_tensor("ut2", t1) == 0
    assert store.batch_upsert_tensor(["ut2", "ut3"], [t2, t1]) == [0, 0]
    assert torch.equal(store.get_tensor("ut2"), t2) and torch.equal(store.get_tensor("ut3"), t1)
    assert store.batch_upsert_tensor(["ut"], []) == [-600]
    assert store.upsert_tensor("ut4", "not a tensor") == -600
    # a header and data in two buffers, stored as one object
    meta = np.frombuffer(b"HEAD", dtype=np.uint8).copy()
    data = np.arange(16, dtype=np.uint8)
    # memory not registered is never read
    assert store.put_from_with_metadata("pm", data.ctypes.data, meta.ctypes.data, 16, 4) == -600
    assert store.put_from_with_metadata("pm", 0x1000, 0x2000, 16, 4) == -600
    assert store.register_buffer(meta.ctypes.data, meta.nbytes) == 0
    assert store.register_buffer(data.ctypes.data, data.nbytes) == 0
    assert store.put_from_with_metadata("pm", data.ctypes.data, meta.ctypes.data, 16, 4) == 0
    assert store.get("pm") == b"HEAD" + bytes(range(16))
    assert store.put_from_with_metadata("pm", data.ctypes.data, meta.ctypes.data, 16, 4) == 0
    assert store.put_from_with_metadata("pm0", data.ctypes.data, 0, 16, 0) == 0
    assert store.get("pm0") == bytes(range(16))
    assert store.put_from_with_metadata("pm1", 0, meta.ctypes.data, 16, 4) == -600


def test_tensor_buffers_and_helpers(store):
    """put_tensor_from and its upsert, batch and *_with_tp forms take a
    buffer already laid out as Mooncake stores a tensor; upsert_pub_tensor;
    the calls that have no meaning here answer as Mooncake's client that
    cannot (-600, 0); the module's names are there."""
    torch = pytest.importorskip("torch")

    t = torch.arange(16, dtype=torch.int64).reshape(4, 4)
    meta, _, nbytes, owner = mc._serialize_tensor(t)
    buf = np.zeros(8192, dtype=np.uint8)
    assert store.register_buffer(buf.ctypes.data, buf.nbytes) == 0
    obj = np.frombuffer(meta + owner.numpy().tobytes(), dtype=np.uint8)
    buf[:obj.size] = obj
    second = buf.ctypes.data + 4096
    buf[4096:4096 + obj.size] = obj
    assert store.put_tensor_from("tf", buf.ctypes.data, obj.size) == 0
    assert torch.equal(store.get_tensor("tf"), t)
    assert store.put_tensor_from("tf", buf.ctypes.data, obj.size) == 0  # (there: kept)
    assert store.put_tensor_from("short", buf.ctypes.data, obj.size - 1) == -600
    assert store.put_tensor_from("none", 0, 0) == -600
    assert store.batch_put_tensor_from([], [], []) == []
    assert store.batch_put_tensor_from(["b1", "b2"], [buf.ctypes.data, second],
                                       [obj.size, obj.size]) == [0, 0]
    # one buffer that is not a tensor fails the whole batch, as Mooncake's
    assert store.batch_put_tensor_from(["b3", "b4"], [buf.ctypes.data, second],
                                       [obj.size, 10]) == [-600, -600]
    assert store.get_tensor("b3") is None
    # upsert: replaced (keys no one has read: a read leases the object,
    # and a leased object is not replaced, -706, as Mooncake's)
    assert store.put_tensor_from("u1", buf.ctypes.data, obj.size) == 0
    t2 = t * 10
    meta2, _, _, owner2 = mc._serialize_tensor(t2)
    buf[4096:4096 + obj.size] = np.frombuffer(meta2 + owner2.numpy().tobytes(), dtype=np.uint8)
    assert store.upsert_tensor_from("u1", second, obj.size) == 0
    assert torch.equal(store.get_tensor("u1"), t2)
    assert store.upsert_tensor_from("u1", buf.ctypes.data, obj.size) == -706
    assert store.batch_upsert_tensor_from(["b1", "b2"], [second, second],
                                          [obj.size, obj.size]) == [0, 0]
    assert torch.equal(store.get_tensor("b2"), t2)
    # the whole tensor in a buffer, stored as every rank's shard
    assert store.put_tensor_with_tp_from("tpf", buf.ctypes.data, obj.size, tp_size=2,
                                         split_dim=0) == 0
    assert torch.equal(store.get_tensor_with_tp("tpf", 1, 2), t[2:])
    assert store.batch_put_tensor_with_tp_from(["tpa", "tpb"], [buf.ctypes.data, 0],
                                               [obj.size, 0], tp_size=4, split_dim=1) == [0, -600]
    assert torch.equal(store.get_tensor_with_tp("tpa", 3, 4), t[:, 3:])
    # upsert_pub_tensor
    cfg = ReplicateConfig()
    assert store.upsert_pub_tensor("up", t, cfg) == 0
    assert store.batch_upsert_pub_tensor(["up", "new"], [t2, t2], cfg) == [0, 0]
    assert torch.equal(store.get_tensor("up"), t2) and torch.equal(store.get_tensor("new"), t2)
    # no GPU path, no dummy client's pool, no offload reads
    assert store.get_tensor_into_cuda("tf", t) == -600
    assert store.batch_get_tensor_into_cuda(["tf", "new"], [t, t]) == [-600, -600]
    assert store.alloc_from_mem_pool(4096) == 0
    assert store.get_offload_rpc_read_count() == 0
    # safetensors: a key with no tensor is -1100; without the package, -600
    assert store.save_tensor_to_safetensor("absent") == -1100
    try:
        import safetensors  # noqa: F401
        have = True
    except ImportError:
        have = False
    if not have:
        assert store.save_tensor_to_safetensor("tf", "/nonexistent/x") == -600
        assert store.load_tensor_from_safetensor(file_name="/nonexistent/x") is None
    assert store.unregister_buffer(buf.ctypes.data) == 0
    # the module's names, as Mooncake's binding defines them
    assert mc.TaskStatus.SUCCESS == 3 and mc.TaskStatus.FAILED == 2
    assert mc.PROCESSING == mc.TaskStatus.PROCESSING and mc.COMPLETE == mc.ReplicaStatus.COMPLETE
    assert mc.ObjectDataType.TENSOR == 2 and mc.TENSOR == 2
    assert mc.REPLICA_MOVE == mc.TaskType.REPLICA_MOVE == 1
    target = mc.ReadTarget()
    target.mode = "FULL"
    assert target.mode == "full"
    with pytest.raises(RuntimeError):
        target.mode = "sideways"
    axis = mc.ParallelAxis()
    axis.kind, axis.rank, axis.size, axis.split_dim = "tp", 1, 2, 0
    par = mc.TensorParallelism()
    par.axes = [axis]
    assert par.axes[0].split_dim == 0
    assert mc.QueryTaskResponse().status == mc.TaskStatus.PENDING
    assert mc.get_alloc_func_addr() and mc.get_free_func_addr()
    mc.bind_to_numa_node(0)
    assert repr(mc.Descriptor(7, "n")).startswith("<Descriptor size=7")


def test_buffer_pool(store):
    """BufferPool hands out leases of registered memory (rounded to size
    classes) that the store puts from and gets into; a pool at max_bytes
    waits for a lease to come back or raises; a lease whose buffer is still
    viewed cannot be released; closed, it hands out nothing."""
    import threading
    pool = mc.BufferPool(store, max_bytes=12 << 20, min_size_class=64 << 10,
                         alignment=4 << 20)
    with pool.acquire(100_000) as a, pool.buffer(100_000) as b:
        assert a.size == 100_000 and a.ptr and b.ptr and a.ptr != b.ptr
        src = a.buffer
        src[:] = bytes(range(256)) * 390 + bytes(160)
        assert store.put_from("pooled", a.ptr, a.size) == 0
        assert store.get_into("pooled", b.ptr, b.size) == 100_000
        dst = b.buffer
        assert bytes(dst) == bytes(src)
        with pytest.raises(RuntimeError):
            a.release()  # src views it
        del src, dst
    # 12 MiB in all, 4 MiB regions: the small leases' class took one, two
    # leases of 3 MiB (a 4 MiB class) take the rest
    x = pool.acquire(3 << 20)
    y = pool.acquire(3 << 20)
    with pytest.raises(RuntimeError):
        pool.acquire(3 << 20, block=False)
    with pytest.raises(RuntimeError):
        pool.acquire(3 << 20, timeout=0.05)
    got = []
    waiter = threading.Thread(target=lambda: got.append(pool.acquire(3 << 20, timeout=10)))
    waiter.start()
    x.release()
    waiter.join()
    assert got and got[0].ptr == x.ptr
    got[0].release()
    y.release()
    with pytest.raises(RuntimeError):
        pool.acquire(0)
    pool.prewarm(4096, 4)
    pool.close()
    with pytest.raises(RuntimeError):
        pool.acquire(4096)
    assert mc.RegisteredBufferPool is mc.BufferPool
    assert mc.RegisteredBufferLease is mc.BufferLease


def _axis(kind, rank, size, split_dim=None, expert_id=None, stage_id=None):
    a = mc.ParallelAxis()
    a.kind, a.rank, a.size = kind, rank, size
    a.split_dim, a.expert_id, a.stage_id = split_dim, expert_id, stage_id
    return a


def _par(*axes):
    p = mc.TensorParallelism()
    p.axes = list(axes)
    return p


def _target(mode, par=None):
    t = mc.ReadTarget()
    t.mode = mode
    t.parallelism = par
    return t


class _Writer:
    def __init__(self, rank, size, split_dim):
        self.rank, self.size, self.split_dim = rank, size, split_dim


def _layout(raw):
    """(layout kind, global, local, axes) of a stored tensor object."""
    import struct
    kind = struct.unpack_from("<I", raw, 16)[0]
    ndim = struct.unpack_from("<i", raw, 12)[0]
    g = list(struct.unpack_from("<8q", raw, 40))
    loc = list(struct.unpack_from("<8q", raw, 104))
    n = struct.unpack_from("<I", raw, 168)[0]
    axes = [struct.unpack_from("<iiiiiiq", raw, 176 + 32 * i) for i in range(4)]
    assert g[ndim:] == [-1] * (8 - ndim) and loc[ndim:] == [-1] * (8 - ndim)
    assert all(a == (0,) * 7 for a in axes[n:])  # unused axes are zero
    return kind, g[:ndim], loc[:ndim], axes[:n]


def _manifest_of(raw):
    import struct
    assert len(raw) == 96
    magic, ver, hsize, dtype, ndim, sd, count, res = struct.unpack_from("<IHHiiiii", raw, 0)
    assert (magic, ver, hsize, res) == (0x574D414E, 1, 96, 0)
    return dtype, list(struct.unpack_from("<8q", raw, 32)[:ndim]), sd, count


def test_tensor_parallelism_writes(store):
    """The *_with_parallelism writes store what Mooncake's do, under its
    keys: a single TP axis takes this rank's shard and writes the
    parallelism manifest; TP with other axes takes the whole tensor and
    stores this rank's shard under the canonical key (DP, TP, EP, PP order,
    whatever order was given), axes recorded as given; DP/EP/PP alone store
    the tensor as it is; a writer partition stores its part and the writer
    manifest; refusals are -600."""
    torch = pytest.importorskip("torch")
    full = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    # one TP axis: the input is the shard; the global shape is inferred
    shard = full[:, 3:].contiguous()
    assert store.put_tensor_with_parallelism("w", shard, _par(_axis("TP", 1, 2, 1))) == 0
    raw = store.get("w_tp_1")
    assert len(raw) == 304 + 48
    assert raw[:4] == b"NOOM"
    # Mooncake's worked example: SHARD, global [4,6], local [4,3], TP 1 of 2 on dim 1
    assert _layout(raw) == (1, [4, 6], [4, 3], [(1, 0, 1, 2, 1, 0, 3)])
    assert _manifest_of(store.get("w__parallelism_manifest")) == (0, [4, 6], 1, 2)
    # TP + DP, given TP first: the whole tensor in, rank 1's rows out
    par = _par(_axis("tp", 1, 2, 0), _axis("dp", 0, 2))
    assert store.put_tensor_with_parallelism("m", full, par) == 0
    raw = store.get("m__dp_0of2__tp_1of2_sd0")
    assert _layout(raw) == (1, [4, 6], [2, 6], [(1, 0, 1, 2, 0, 0, 2), (0, 1, 0, 2, -1, 0, 0)])
    assert torch.equal(mc._deserialize_tensor(raw), full[2:])
    assert _manifest_of(store.get("m__parallelism_manifest")) == (0, [4, 6], 0, 2)
    # EP and PP alone: stored as they are, their ids in the key and the header
    assert store.put_tensor_with_parallelism("e", full, _par(_axis("pp", 1, 2, stage_id=7),
                                                             _axis("ep", 1, 4, expert_id=3))) == 0
    raw = store.get("e__ep_1of4_eid3__pp_1of2_sid7")
    assert _layout(raw) == (1, [4, 6], [4, 6], [(3, 0, 1, 2, -1, 7, 0), (2, 1, 1, 4, -1, 3, 0)])
    assert store.get("e__parallelism_manifest") == b""
    # a writer's partition of the whole tensor
    assert store.put_tensor_with_parallelism("wp", full, writer_partition=_Writer(1, 3, 1)) == 0
    raw = store.get("wp__writer_1of3_sd1")
    assert _layout(raw) == (1, [4, 6], [4, 2], [(1, 0, 1, 3, 1, 0, 2)])
    assert torch.equal(mc._deserialize_tensor(raw), full[:, 2:4])
    assert _manifest_of(store.get("wp__writer_manifest")) == (0, [4, 6], 1, 3)
    # no parallelism: the whole tensor under key
    assert store.put_tensor_with_parallelism("plain", full) == 0
    assert torch.equal(store.get_tensor("plain"), full)
    # refused as Mooncake refuses them
    bad = [
        (full, _par(_axis("tp", 0, 4, 1), _axis("dp", 0, 1))),  # 6 columns in 4: uneven
        (full, _par(_axis("tp", 0, 2))),                    # TP without a split dim
        (full, _par(_axis("dp", 0, 2, 0))),                 # DP with one
        (full, _par(_axis("ep", 0, 2))),                    # EP without an expert
        (full, _par(_axis("pp", 0, 2))),                    # PP without a stage
        (full, _par(_axis("tp", 2, 2, 0))),                 # rank out of range
        (full, _par(_axis("tp", 0, 2, 0), _axis("TP", 1, 2, 0))),  # a kind twice
        (full, _par(_axis("xp", 0, 2))),                    # no such kind
        (full, _par()),                                     # no axes
        (full, _par(_axis("tp", 0, 2, 5))),                 # split dim past the last
        (b"bytes", _par(_axis("dp", 0, 2))),                # not a tensor
    ]
    for i, (t, p) in enumerate(bad):
        assert store.put_tensor_with_parallelism("bad%d" % i, t, p) == -600, i
    assert store.put_tensor_with_parallelism("bad", full, _par(_axis("dp", 0, 2)),
                                             writer_partition=_Writer(0, 2, 0)) == -600
    assert store.put_tensor_with_parallelism("bad", full, writer_partition=_Writer(0, 4, 1)) == -600
    assert store.put_tensor_with_parallelism("bad", full, writer_partition=(0, 2, 0)) == -600
    assert store._c().list("bad") == []  # nothing of them stored
    # put keeps what is there (0), upsert replaces it
    assert store.put_tensor_with_parallelism("plain", full * 2) == 0
    assert torch.equal(store.get_tensor("plain"), full)
    assert store.upsert_tensor_with_parallelism("plain2", full) == 0
    assert store.upsert_tensor_with_parallelism("plain2", full * 2) == 0
    assert torch.equal(store.get_tensor("plain2"), full * 2)
    # batches: one answer per key, each element as the single call
    res = store.batch_put_tensor_with_parallelism(
        ["b0", "b1", "b2"], [full, full, full],
        [_par(_axis("dp", 1, 2)), None, _par(_axis("tp", 0, 4, 1), _axis("dp", 0, 1))])
    assert res == [0, 0, -600]
    assert store.get_tensor("b0__dp_1of2") is not None and store.get_tensor("b1") is not None
    assert store.batch_put_tensor_with_parallelism(["x", "y"], [full]) == [-600, -600]
    assert store.batch_put_tensor_with_parallelism(["x"], [full], (None,)) == [-600]
    assert store.batch_put_tensor_with_parallelism(["x"], [full], [None], None,
                                                   [None]) == [-600]
    assert store.batch_upsert_tensor_with_parallelism(
        ["bw", "bw"], [full, full], writer_partitions=[_Writer(0, 2, 0),
                                                       _Writer(1, 2, 0)]) == [0, 0]
    assert torch.equal(store.get_tensor_with_parallelism("bw", _target("full")), full)


def test_tensor_parallelism_reads(store):
    """Reads as Mooncake's: as stored; a shard stored as asked, or cut from
    the shards of another TP size; the whole tensor rebuilt from its shards
    (by the manifest, or the shards alone), from a writer's partitions, into
    registered memory; None whenever a shard is missing or the request does
    not fit."""
    torch = pytest.importorskip("torch")
    full = torch.arange(48, dtype=torch.int32).reshape(8, 6)
    for r in range(2):  # two TP ranks, each putting its shard
        shard = full[r * 4:(r + 1) * 4].contiguous()
        assert store.put_tensor_with_parallelism("r", shard, _par(_axis("tp", r, 2, 0))) == 0
    tp2 = _par(_axis("tp", 1, 2, 0))
    assert torch.equal(store.get_tensor_with_parallelism("r", _target("shard", tp2)), full[4:])
    assert torch.equal(store.get_tensor_with_parallelism("r", _target("full", tp2)), full)
    # another TP size: rank 3 of 4 and rank 0 of 1, cut from the two shards
    tp4 = _par(_axis("tp", 3, 4, 0))
    assert torch.equal(store.get_tensor_with_parallelism("r", _target("shard", tp4)), full[6:])
    assert torch.equal(store.get_tensor_with_parallelism("r", _target("full", tp4)), full)
    # a parallelism only goes with shard or full; a split that does not fit
    assert store.get_tensor_with_parallelism("r", _target("as_stored", tp2)) is None
    # 8 rows in 3 do not split: as Mooncake's, the shard read falls back to
    # <key>_tp_<rank> as it is stored (the into form gives nothing)
    tp3 = _target("shard", _par(_axis("tp", 0, 3, 0)))
    assert torch.equal(store.get_tensor_with_parallelism("r", tp3), full[:4])
    assert store.get_tensor_with_parallelism("r", _target("full", _par(
        _axis("tp", 0, 2, 1)))) is None  # stored split on dim 0
    assert store.get_tensor_with_parallelism("absent", _target("full", tp2)) is None
    # target None or as_stored: the object as it is
    assert torch.equal(store.get_tensor_with_parallelism("r_tp_0"), full[:4])
    assert torch.equal(store.get_tensor_with_parallelism("r_tp_0", _target("as_stored")),
                       full[:4])
    # a shard missing: no whole tensor
    assert store.remove("r_tp_1", force=True) == 0  # (read: leased)
    assert store.get_tensor_with_parallelism("r", _target("full", tp2)) is None
    # the whole tensor from a buffer: every rank's shard, no manifest; read
    # back from the shards alone, with DP and EP coordinates too
    meta, _, _, owner = mc._serialize_tensor(full)
    obj = np.frombuffer(meta + owner.numpy().tobytes(), dtype=np.uint8)
    buf = np.zeros(1 << 16, dtype=np.uint8)
    assert store.register_buffer(buf.ctypes.data, buf.nbytes) == 0
    buf[:obj.size] = obj
    par = _par(_axis("ep", 0, 2, expert_id=5), _axis("tp", 0, 3, 1))
    assert store.put_tensor_with_parallelism_from("f", buf.ctypes.data, obj.size, par) == 0
    for r in range(3):
        raw = store.get("f__tp_%dof3_sd1__ep_0of2_eid5" % r)
        assert _layout(raw)[3] == [(2, 0, 0, 2, -1, 5, 0), (1, 1, r, 3, 1, 0, 2)]
    assert store.get("f__parallelism_manifest") == b""
    assert torch.equal(store.get_tensor_with_parallelism("f", _target("full", par)), full)
    assert torch.equal(store.get_tensor_with_parallelism("f", _target("shard", _par(
        _axis("tp", 2, 3, 1), _axis("ep", 0, 2, expert_id=5)))), full[:, 4:])
    other_expert = _par(_axis("ep", 0, 2, expert_id=6), _axis("tp", 0, 3, 1))
    assert store.get_tensor_with_parallelism("f", _target("full", other_expert)) is None
    assert store.put_tensor_with_parallelism_from("g", buf.ctypes.data, obj.size,
                                                  _par(_axis("tp", 0, 4, 1))) == -600
    assert store.put_tensor_with_parallelism_from("g", 0, 0, _par(_axis("dp", 0, 2))) == -600
    # a writer's partitions, put from the whole tensor in the buffer
    for r in range(2):
        assert store.put_tensor_with_parallelism_from("wr", buf.ctypes.data, obj.size,
                                                      writer_partition=_Writer(r, 2, 1)) == 0
    assert torch.equal(store.get_tensor_with_parallelism("wr", _target("full")), full)
    assert torch.equal(store.get_tensor_with_parallelism("wr", _target("shard", _par(
        _axis("tp", 1, 2, 1)))), full[:, 3:])
    # full with no writer manifest: the key as stored, or nothing
    assert store.put_tensor("whole", full) == 0
    assert torch.equal(store.get_tensor_with_parallelism("whole", _target("full")), full)
    assert store.get_tensor_with_parallelism("none", _target("full")) is None
    # into registered memory: [TensorMetadata][bytes], a tensor over it
    out = buf.ctypes.data + 8192
    t = store.get_tensor_with_parallelism_into("f", out, 4096, _target("full", par))
    assert torch.equal(t, full)
    raw = bytes(buf[8192:8192 + 304 + full.numel() * 4])
    assert _layout(raw) == (0, [8, 6], [8, 6], [])
    t[0, 0] = 99  # a view of the buffer, not a copy
    assert buf[8192 + 304:8192 + 308].view(np.int32)[0] == 99
    t = store.get_tensor_with_parallelism_into("r_tp_0", out, 4096)
    assert torch.equal(t, full[:4])
    assert store.get_tensor_with_parallelism_into("f", out, 100, _target("full", par)) is None
    assert store.get_tensor_with_parallelism_into("r", out, 4096, tp3) is None
    private = np.zeros(4096, dtype=np.uint8)  # not registered
    assert store.get_tensor_with_parallelism_into("f", private.ctypes.data, 4096,
                                                  _target("full", par)) is None
    # batches
    got = store.batch_get_tensor_with_parallelism(
        ["f", "wr", "r"], [_target("full", par), _target("full"), _target("full", tp2)])
    assert torch.equal(got[0], full) and torch.equal(got[1], full) and got[2] is None
    assert store.batch_get_tensor_with_parallelism(["f"], [None, None]) == [None]
    assert torch.equal(store.batch_get_tensor_with_parallelism(["whole"])[0], full)
    got = store.batch_get_tensor_with_parallelism_into(
        ["f", "r_tp_0"], [out, out + 2048], [2048, 2048], [_target("full", par), None])
    assert torch.equal(got[0], full) and torch.equal(got[1], full[:4])
    assert store.batch_get_tensor_with_parallelism_into(["f"], [out], []) == [None]
    assert store.unregister_buffer(buf.ctypes.data) == 0


def test_engram_store_and_capsule(store, daemon):
    """EngramStore keeps a layer's tables a head per key and looks rows up
    across heads; it takes the store, or anything whose
    _get_pyclient_capsule() gives the store's capsule; NVMe-oF registration
    answers Mooncake's OPERATION_FAILED."""
    cfg = mc.EngramStoreConfig()
    assert cfg.table_vocab_sizes == [1024] and cfg.embedding_dim == 64
    cfg.table_vocab_sizes, cfg.embedding_dim = [5, 3], 4
    assert MooncakeDistributedStore()._get_pyclient_capsule() is None  # not set up

    class Wrapper:
        def _get_pyclient_capsule(self):
            return store._get_pyclient_capsule()
    es = mc.EngramStore(2, cfg, Wrapper())
    assert es.get_store_keys() == ["engram:l2:h0", "engram:l2:h1"]
    assert es.get_num_heads() == 2 and es.get_embedding_dim() == 4
    assert es.get_table_vocab_sizes() == [5, 3]
    tables = [np.arange(20, dtype=np.float32).reshape(5, 4),
              -np.arange(12, dtype=np.float64).reshape(3, 4)]  # cast to float32
    es.populate(tables)
    assert store.get("engram:l2:h0") == tables[0].tobytes()
    ids = np.array([[[4, 2], [0, 0]]], dtype=np.int64)  # [B=1, L=2, H=2]
    out = es.lookup(ids)
    assert out.shape == (1, 2, 2, 4) and out.dtype == np.float32
    assert (out[0, 0, 0] == tables[0][4]).all() and (out[0, 0, 1] == tables[1][2]).all()
    assert (out[0, 1, 1] == tables[1][0]).all()
    with pytest.raises(RuntimeError):
        es.lookup(np.array([[[5, 0]]]))  # past head 0's vocabulary
    with pytest.raises(RuntimeError):
        es.populate(tables)  # stored already
    with pytest.raises(RuntimeError):
        mc.EngramStore(2, cfg, store).populate(tables[:1])
    assert mc.EngramStore(2, cfg, store).remove_from_store(force=True) == 2
    assert es.remove_from_store() == 0
    with pytest.raises(RuntimeError):
        es.lookup(ids)  # gone
    bad = mc.EngramStoreConfig()
    bad.table_vocab_sizes = []
    with pytest.raises(ValueError):
        mc.EngramStore(0, bad)
    with pytest.raises(RuntimeError):
        mc.EngramStore(0, cfg, object())

    class Forged:
        def _get_pyclient_capsule(self):
            return mc._get_pyclient_from_wrapper(store)  # unnamed
    with pytest.raises(RuntimeError):
        mc.EngramStore(0, cfg, Forged())
    nof = mc.MooncakeDistributedNoFRegister()
    assert nof.real_register("nqn", 1, "10.0.0.1", 4420, 0, 1024, "127.0.0.1:50051") == -1
    assert nof.real_unregister_by_endpoint("nqn", 1, "10.0.0.1", 4420, "127.0.0.1:50051") == -1


# Mooncake's binding (store_py.cpp at 3b5a594): the class's methods and the
# module's names, every one of which a program may use
_MOONCAKE_METHODS = [
    "_get_pyclient_capsule", "alloc_from_mem_pool", "allocate_and_mount_segment",
    "batch_get_buffer", "batch_get_into", "batch_get_into_multi_buffer_ranges",
    "batch_get_into_multi_buffers", "batch_get_replica_desc", "batch_get_session_end",
    "batch_get_session_start", "batch_get_tensor", "batch_get_tensor_into",
    "batch_get_tensor_into_cuda", "batch_get_tensor_with_parallelism",
    "batch_get_tensor_with_parallelism_into", "batch_get_tensor_with_tp",
    "batch_get_tensor_with_tp_into", "batch_is_exist", "batch_pub_tensor",
    "batch_pub_tensor_with_tp", "batch_put_from", "batch_put_from_multi_buffer_ranges",
    "batch_put_from_multi_buffers", "batch_put_session_end", "batch_put_session_revoke",
    "batch_put_session_start", "batch_put_tensor", "batch_put_tensor_from",
    "batch_put_tensor_with_parallelism", "batch_put_tensor_with_parallelism_from",
    "batch_put_tensor_with_tp", "batch_put_tensor_with_tp_from", "batch_remove",
    "batch_replica_clear", "batch_upsert_from", "batch_upsert_pub_tensor",
    "batch_upsert_tensor", "batch_upsert_tensor_from", "batch_upsert_tensor_with_parallelism",
    "batch_upsert_tensor_with_parallelism_from", "close", "create_copy_task",
    "create_move_task", "get", "get_batch", "get_buffer", "get_hostname", "get_into",
    "get_into_ranges", "get_offload_rpc_read_count", "get_replica_desc", "get_size",
    "get_tensor", "get_tensor_into", "get_tensor_into_cuda", "get_tensor_with_parallelism",
    "get_tensor_with_parallelism_into", "get_tensor_with_tp", "get_tensor_with_tp_into",
    "health_check", "init_all", "is_exist", "load_tensor_from_safetensor", "mount_segment",
    "pub_tensor", "pub_tensor_with_tp", "put", "put_batch", "put_from",
    "put_from_with_metadata", "put_parts", "put_tensor", "put_tensor_from",
    "put_tensor_with_parallelism", "put_tensor_with_parallelism_from", "put_tensor_with_tp",
    "put_tensor_with_tp_from", "query_task", "register_buffer", "remove", "remove_all", "remove_by_regex",
    "save_tensor_to_safetensor", "setup", "setup_dummy", "unmount_and_free_segment",
    "unmount_local_disk_segment", "unmount_segment", "unregister_buffer", "upsert",
    "upsert_batch", "upsert_from", "upsert_parts", "upsert_pub_tensor", "upsert_tensor",
    "upsert_tensor_from", "upsert_tensor_with_parallelism",
    "upsert_tensor_with_parallelism_from",
]
_MOONCAKE_MODULE = [
    "_serialize_tensor", "_tensor_metadata_size", "_deserialize_tensor",
    "_get_pyclient_from_wrapper", "bind_to_numa_node", "get_alloc_func_addr",
    "get_free_func_addr", "ObjectDataType", "SoftPinAction", "ReplicaStatus", "TaskType",
    "TaskStatus", "ReplicateConfig", "MemoryDescriptor", "DiskDescriptor", "ReplicaDescriptor",
    "Descriptor", "QueryTaskResponse", "BufferHandle", "BufferLeaseView", "BufferLease",
    "BufferPool", "MooncakeHostMemAllocator", "ParallelAxis", "TensorParallelism",
    "ReadTarget", "MooncakeDistributedNoFRegister", "MooncakeDistributedStore",
    "EngramStoreConfig", "EngramStore", "RegisteredBufferPool", "RegisteredBufferLease",
    "RegisteredBufferLeaseView",
]


def test_every_mooncake_name(daemon):
    """Nothing Mooncake's binding defines is an AttributeError here."""
    missing = [n for n in _MOONCAKE_METHODS if not callable(getattr(MooncakeDistributedStore,
                                                                    n, None))]
    assert missing == []
    assert len(_MOONCAKE_METHODS) == 98 and len(_MOONCAKE_MODULE) == 33
    # the helper classes' fields and methods as Mooncake's
    assert mc.ReplicateConfig().data_type == mc.ObjectDataType.UNKNOWN
    assert mc.ReplicateConfig(data_type=mc.ObjectDataType.KVCACHE).data_type == 1
    assert mc.ReplicaDescriptor(disk=mc.DiskDescriptor("/x", 4)).is_local_disk_replica() is False
    assert [n for n in _MOONCAKE_MODULE if not hasattr(mc, n)] == []
    shim = os.environ.get("KVCACHE_SHIM_DIR")
    if shim:
        sys.path.insert(0, shim)
        try:
            store_mod = importlib.import_module("mooncake.store")
            assert [n for n in _MOONCAKE_MODULE if not hasattr(store_mod, n)] == []
        finally:
            sys.path.remove(shim)
            for m in ["mooncake.store", "mooncake"]:
                sys.modules.pop(m, None)


def test_upserts_and_published_tensors(store):
    """The upsert forms replace what a key holds (a put keeps it); the pub
    forms take a ReplicateConfig; the TP batch reads go into registered
    memory; the batch _from forms of the parallelism family answer per key."""
    torch = pytest.importorskip("torch")
    buf = np.zeros(1 << 16, dtype=np.uint8)
    assert store.register_buffer(buf.ctypes.data, buf.nbytes) == 0
    p = buf.ctypes.data
    buf[:4] = np.frombuffer(b"AAAA", dtype=np.uint8)
    buf[4:8] = np.frombuffer(b"BBBB", dtype=np.uint8)
    # (a read leases the object, and a leased object is not replaced: -706)
    assert store.upsert_from("uf", p, 4) == 0
    assert store.upsert_from("uf", p + 4, 4) == 0 and store.get("uf") == b"BBBB"
    assert store.batch_upsert_from(["ua", "ub"], [p, p + 4], [4, 4]) == [0, 0]
    assert store.batch_upsert_from(["ua", "ub"], [p + 4, p], [4, 4]) == [0, 0]
    assert store.get("ua") == b"BBBB" and store.get("ub") == b"AAAA"
    assert store.put_from("ua", p, 4) == 0 and store.get("ua") == b"BBBB"  # kept
    assert store.upsert_parts("up", b"ab", b"cd") == 0
    assert store.upsert_parts("up", b"xy") == 0 and store.get("up") == b"xy"
    assert store.upsert_batch(["ub1", "ub2"], [b"1", b"2"]) == 0
    assert store.upsert_batch(["ub1"], [b"one"]) == 0 and store.get("ub1") == b"one"
    t = torch.arange(12, dtype=torch.int16).reshape(3, 4)
    cfg = ReplicateConfig()
    assert store.batch_pub_tensor(["pt1", "pt2"], [t, b"no"], cfg) == [0, -600]
    assert torch.equal(store.get_tensor("pt1"), t) and store.get_tensor("pt2") is None
    cfg.preferred_segments = ["a", "b"]  # not one per replica: Mooncake refuses
    assert store.batch_pub_tensor(["pt3"], [t], cfg) == [-600]
    assert store.pub_tensor_with_tp("ptp", t, ReplicateConfig(), 0, 2, 1) == 0
    assert store.pub_tensor_with_tp("ptp3", t, ReplicateConfig(), 0, 3, 1) == -600
    got = store.batch_get_tensor_with_tp_into(["ptp", "absent"], [p + 1024, p + 2048],
                                              [1024, 1024], 1, 2)
    assert torch.equal(got[0], t[:, 2:]) and got[1] is None
    # the whole tensor in registered memory, split into shards from there
    meta, _, _, owner = mc._serialize_tensor(t)
    obj = meta + owner.numpy().tobytes()
    buf[8192:8192 + len(obj)] = np.frombuffer(obj, dtype=np.uint8)
    whole = p + 8192
    tp = _par(_axis("tp", 0, 2, 1))
    assert store.batch_put_tensor_with_parallelism_from(
        ["bf1", "bf2", "bf3"], [whole, whole, 0], [len(obj)] * 3, [tp, None, tp]) == [0, 0, -600]
    assert torch.equal(store.get_tensor("bf1_tp_1"), t[:, 2:])
    assert torch.equal(store.get_tensor("bf2"), t)
    assert store.batch_put_tensor_with_parallelism_from(["bf4"], [whole], []) == [-600]
    t2 = t * 3
    meta2, _, _, owner2 = mc._serialize_tensor(t2)
    obj2 = meta2 + owner2.numpy().tobytes()
    buf[12288:12288 + len(obj2)] = np.frombuffer(obj2, dtype=np.uint8)
    assert store.upsert_tensor_with_parallelism_from("bf5", whole, len(obj), tp) == 0
    assert store.upsert_tensor_with_parallelism_from("bf5", p + 12288, len(obj2), tp) == 0
    assert torch.equal(store.get_tensor("bf5_tp_0"), t2[:, :2])
    assert store.batch_upsert_tensor_with_parallelism_from(
        ["bf6", "bf7"], [whole, p + 12288], [len(obj), len(obj2)],
        writer_partitions=[_Writer(0, 1, 0), _Writer(0, 1, 0)]) == [0, 0]
    assert torch.equal(store.get_tensor_with_parallelism("bf7", _target("full")), t2)
    assert store.unregister_buffer(p) == 0


def test_one_store_many_threads(store):
    """Engines call one store from several threads at once (a connector's
    load and save threads, asyncio's executor): every answer is each
    thread's own."""
    import threading
    torch = pytest.importorskip("torch")
    errors = []

    def worker(n):
        try:
            t = torch.full((4, 8), n, dtype=torch.float16)
            for i in range(60):
                k = "thr%d/%d" % (n, i)
                assert store.put(k, b"%d:%d" % (n, i)) == 0
                assert store.get(k) == b"%d:%d" % (n, i)
                assert store.batch_is_exist([k, k + "x"]) == [1, 0]
                if i % 10 == 0:
                    assert store.put_tensor_with_parallelism(
                        k + "t", t, _par(_axis("dp", n % 2, 2))) == 0
                    got = store.get_tensor_with_parallelism(
                        k + "t", _target("shard", _par(_axis("dp", n % 2, 2))))
                    assert torch.equal(got, t)
            assert store.remove_by_regex("^thr%d/" % n, force=True) == 66
        except AssertionError as e:  # report, do not lose it in the thread
            errors.append((n, repr(e)))

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    assert errors == []
    assert store.batch_is_exist(["thr0/0", "thr3/59"]) == [0, 0]
