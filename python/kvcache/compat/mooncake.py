# SPDX-License-Identifier: MIT
"""Mooncake's store API on kvcache, so code written for it runs unchanged.

``MooncakeDistributedStore`` has the signatures and return conventions of
``mooncake.store.MooncakeDistributedStore`` (ints, ``b""`` on a miss, 1/0/-1
from ``is_exist``, per-key lists from batch calls) and talks to the node's
kvcached.  ``setup()`` connects to the daemon; the master, metadata server,
protocol and segment sizes it is given belong to the daemon's own
configuration (``kvcached --config mooncake.json``), so here they are
accepted and unused.

Error codes are Mooncake's, because engines branch on them:

==========================  ======  ===================================
kvcache                     here    Mooncake name
==========================  ======  ===================================
``-ENOENT``                 -704    OBJECT_NOT_FOUND
``-ENOSPC``                 -200    NO_AVAILABLE_HANDLE (store pressure)
``-EEXIST``                 -705    OBJECT_ALREADY_EXISTS
``-EBUSY``                  -706    OBJECT_HAS_LEASE
``-EINVAL``, ``-ENOBUFS``,  -600    INVALID_PARAMS
``-EFAULT``, ``-E2BIG``
anything else               -1
==========================  ======  ===================================

A put of a key that is already stored answers 0, as Mooncake's does.

``setup(..., tenant_id=...)`` is a key namespace: a store set up with a
tenant other than ``"default"`` reads, writes, lists and removes only its
own keys (stored as ``"\x1ftenant\x1f<id>\x1f<key>"``), and the default
tenant never sees theirs, so two tenants' keys never meet.  The default
tenant's keys are stored as given, shared with every other kvcache client
of the daemon (a default-tenant key that begins with the reserved prefix
is stored escaped, out of every tenant's way).
Pointers passed as ints must lie inside memory given to
``register_buffer()`` (or handed out by ``MooncakeHostMemAllocator``);
others are refused with -600, never dereferenced.  GPU memory given to
``register_buffer()`` is copied by the CUDA runtime the process has loaded
(``cudaMemcpy``) into reservations and out of views of the daemon's memory.
"""

from __future__ import annotations

import ctypes
import enum
import errno
import functools
import logging
import os
import re
import socket as _socket
import threading
import weakref
from typing import Any, Dict, List, Optional, Sequence

from .. import _kvcache

OK = 0
NO_AVAILABLE_HANDLE = -200
INVALID_PARAMS = -600
OBJECT_NOT_FOUND = -704
OBJECT_ALREADY_EXISTS = -705
OBJECT_HAS_LEASE = -706
INTERNAL_ERROR = -1
UNAVAILABLE_IN_CURRENT_MODE = -1011  # Mooncake's "not in this mode": not supported here
FILE_NOT_FOUND = -1100

_CODES = {
    errno.ENOENT: OBJECT_NOT_FOUND,
    errno.ENOSPC: NO_AVAILABLE_HANDLE,
    errno.EEXIST: OBJECT_ALREADY_EXISTS,
    errno.EBUSY: OBJECT_HAS_LEASE,
    errno.EINVAL: INVALID_PARAMS,
    errno.ENOBUFS: INVALID_PARAMS,
    errno.EFAULT: INVALID_PARAMS,
    errno.E2BIG: INVALID_PARAMS,
}


def mooncake_code(r: int) -> int:
    """Mooncake's error code for a kvcache result (non-negative passes)."""
    if r >= 0:
        return r
    return _CODES.get(-r, INTERNAL_ERROR)


def _put_code(r: int) -> int:
    return 0 if r == -errno.EEXIST else mooncake_code(r)


_TENANT = "\x1ftenant\x1f"  # the reserved prefix of the tenants' namespaces
_ESCAPED = _TENANT + "\x1f"   # the default tenant's keys that begin with it


from .mooncake_tensor import (  # noqa: E402  (Mooncake's module-level names too)
    _TENSOR_META_SIZE,
    ParallelAxis,
    ReadTarget,
    TensorParallelIO,
    TensorParallelism,
    _deserialize_tensor,
    _parse_meta,
    _serialize_tensor,
    _tensor_from,
    _tensor_metadata_size,
    _tensor_parts,
    _tp_key,
    _AXIS_TP,
)


def _namespace(tenant: Any) -> str:
    t = "" if tenant is None else str(tenant)
    return "" if t in ("", "default") else _TENANT + t + "\x1f"


class SoftPinAction(enum.IntEnum):
    PRESERVE = 0
    ENABLE = 1
    DISABLE = 2


class ReplicateConfig:
    """Mooncake's replica settings.  Pins map onto kvcache pins; replica
    counts and placement belong to the cluster and are ignored here."""

    def __init__(self, **kw: Any) -> None:
        self.replica_num = 1
        self.nof_replica_num = 0
        self.dfs_replica_num = 0
        self.with_soft_pin = False
        self.soft_pin_action = SoftPinAction.PRESERVE
        self.soft_pin_ttl_ms = 0
        self.with_hard_pin = False
        self.preferred_segments: List[str] = []
        self.preferred_nof_segments: List[str] = []
        self.preferred_segment = ""
        self.prefer_alloc_in_same_node = False
        self.data_type = ObjectDataType.UNKNOWN  # what the object holds: a hint
        self.group_ids: List[str] = []
        for k, v in kw.items():
            setattr(self, k, v)

    def __repr__(self) -> str:
        return "ReplicateConfig(replica_num=%d, with_hard_pin=%s)" % (self.replica_num,
                                                                    self.with_hard_pin)


def _put_opts(config: Optional[ReplicateConfig], replace: bool = False) -> Dict[str, Any]:
    opts: Dict[str, Any] = {}
    if replace:
        opts["replace"] = True
    if config is None:
        return opts
    if getattr(config, "with_hard_pin", False):
        opts["pin"] = "hard"
    elif (getattr(config, "with_soft_pin", False) or
          getattr(config, "soft_pin_action", SoftPinAction.PRESERVE) == SoftPinAction.ENABLE):
        opts["pin"] = "soft"
        opts["pin_ttl_ms"] = int(getattr(config, "soft_pin_ttl_ms", 0) or 0)
    return opts


def _config_ok(config: Optional[ReplicateConfig]) -> bool:
    """Mooncake's check: preferred segments, when named, one per replica."""
    if config is None:
        return True
    segs = list(getattr(config, "preferred_segments", []) or [])
    return not segs or len(segs) == int(getattr(config, "replica_num", 1))


# One Client per daemon socket and process, shared by the stores and
# allocators of that process (so memory one of them registers is known to
# all).  A forked child connects afresh.
_lock = threading.Lock()
_shared: Dict[Any, List[Any]] = {}


class BufferHandle:
    """An object's bytes in place, as Mooncake's ``get_buffer`` hands them
    out: ``ptr()`` and ``size()``, the buffer protocol (``memoryview``,
    ``numpy.frombuffer``), and ``len()``.  The object stays pinned while the
    handle lives; ``release()`` (or ``with``) lets it go at once."""

    __slots__ = ()

    def ptr(self) -> int:
        return ctypes.addressof(self)

    def size(self) -> int:
        return ctypes.sizeof(self)

    def release(self) -> None:
        view = self.__dict__.pop("_view", None)
        if view is not None:
            view.release()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.release()


@functools.lru_cache(maxsize=256)
def _handle_type(size: int):
    """A BufferHandle of size bytes: a ctypes array over the view's bytes
    (one type per size, kept for the sizes used lately)."""
    return type("BufferHandle", (BufferHandle, ctypes.c_ubyte * size), {})


def _handle(view) -> BufferHandle:
    h = _handle_type(view.size).from_address(view.ptr)
    h._view = view  # the view pins the object while the handle lives
    return h


class ReplicaStatus(enum.IntEnum):
    UNDEFINED = 0
    INITIALIZED = 1
    PROCESSING = 2
    COMPLETE = 3
    REMOVED = 4
    FAILED = 5


class BufferDescriptor:
    """Where a memory copy is (Mooncake's ``Descriptor``): its size, and the
    node that serves it (kvcache does not hand out addresses in another
    process: buffer_address is 0).  The fields answer to both of Mooncake's
    spellings (``size`` and the older ``size_``)."""

    def __init__(self, size: int = 0, endpoint: str = ""):
        self.size = size
        self.buffer_address = 0
        self.transport_endpoint = endpoint

    size_ = property(lambda self: self.size)
    buffer_address_ = property(lambda self: self.buffer_address)
    transport_endpoint_ = property(lambda self: self.transport_endpoint)

    def __repr__(self) -> str:
        return "<Descriptor size=%d buffer_address=%d transport_endpoint=%s>" % (
            self.size, self.buffer_address, self.transport_endpoint)


Descriptor = BufferDescriptor


class ObjectDataType(enum.IntEnum):
    UNKNOWN = 0
    KVCACHE = 1
    TENSOR = 2
    WEIGHT = 3
    SAMPLE = 4
    ACTIVATION = 5
    GRADIENT = 6
    OPTIMIZER_STATE = 7
    METADATA = 8
    GENERAL = 9


class TaskType(enum.IntEnum):
    REPLICA_COPY = 0
    REPLICA_MOVE = 1


class TaskStatus(enum.IntEnum):
    PENDING = 0
    PROCESSING = 1
    FAILED = 2
    SUCCESS = 3


class QueryTaskResponse:
    """What Mooncake's query_task answers (kvcache runs no tasks: never
    made by it, here for code that names the type)."""

    def __init__(self):
        self.id = (0, 0)
        self.type = TaskType.REPLICA_COPY
        self.status = TaskStatus.PENDING
        self.created_at_ms_epoch = 0
        self.last_updated_at_ms_epoch = 0
        self.assigned_client = (0, 0)
        self.message = ""


def bind_to_numa_node(node: int) -> None:
    """Run this process on NUMA node's CPUs (as Mooncake's, a failure is
    only a warning)."""
    import logging
    try:
        with open("/sys/devices/system/node/node%d/cpulist" % int(node)) as f:
            spec = f.read().strip()
        cpus = set()
        for part in spec.split(","):
            lo, _, hi = part.partition("-")
            cpus.update(range(int(lo), int(hi or lo) + 1))
        os.sched_setaffinity(0, cpus)
    except (OSError, ValueError) as e:
        logging.getLogger("kvcache").warning("bind_to_numa_node(%s): %s", node, e)


def _libc_func_addr(name: str) -> int:
    libc = ctypes.CDLL(None)
    return ctypes.cast(getattr(libc, name), ctypes.c_void_p).value or 0


def get_alloc_func_addr() -> int:
    """The address of a C function void *(size_t) that allocates memory
    (Mooncake's hugepage allocator; here the C library's malloc)."""
    return _libc_func_addr("malloc")


def get_free_func_addr() -> int:
    """The address of the matching void (void *)."""
    return _libc_func_addr("free")


class MemoryDescriptor:
    def __init__(self, buffer_descriptor: BufferDescriptor):
        self.buffer_descriptor = buffer_descriptor


class DiskDescriptor:
    def __init__(self, file_path: str = "", object_size: int = 0):
        self.file_path = file_path
        self.object_size = object_size


class ReplicaDescriptor:
    """One copy of a key, as Mooncake's ``get_replica_desc`` describes it:
    in memory (of this node or another) or on this node's disk tier."""

    def __init__(self, memory: Optional[MemoryDescriptor] = None,
                 disk: Optional[DiskDescriptor] = None):
        self.status = ReplicaStatus.COMPLETE
        self._memory = memory
        self._disk = disk

    def is_memory_replica(self) -> bool:
        return self._memory is not None

    def is_disk_replica(self) -> bool:
        return self._disk is not None

    def is_local_disk_replica(self) -> bool:
        """Mooncake's client-local SSD copies, described apart from the
        disk replicas: this node's disk tier is described as a disk
        replica (with its file), so never."""
        return False

    def get_memory_descriptor(self) -> MemoryDescriptor:
        if self._memory is None:
            raise RuntimeError("not a memory replica")
        return self._memory

    def get_disk_descriptor(self) -> DiskDescriptor:
        if self._disk is None:
            raise RuntimeError("not a disk replica")
        return self._disk


def _unset(answer: Any):
    """A method's answer when the store is not set up (never, or closed),
    as Mooncake's binding gives it: a value, or ``answer(*args, **kw)`` for
    one shaped by the request (one code per key).  Where Mooncake's binding
    has no such check and would crash, the answer is its own failure value
    for the call.  Mooncake logs each such call; here the first is logged."""
    def wrap(f):
        @functools.wraps(f)
        def method(self, *args: Any, **kw: Any) -> Any:
            if self._client is None:
                if not self._told_unset:
                    self._told_unset = True
                    logging.getLogger("kvcache").error(
                        "MooncakeDistributedStore.%s: the store is not set up "
                        "(setup() was not called, failed, or close() was)", f.__name__)
                return answer(*args, **kw) if callable(answer) else answer
            return f(self, *args, **kw)
        return method
    return wrap


def _per_key(code: Any):
    """``code`` for each key of a batch (its first argument)."""
    return lambda keys, *a, **kw: [code] * len(keys)


class _CudaCopies:
    """Device memory, through the CUDA runtime the process has loaded (a
    CUDA build of torch loads it; nothing is loaded here for it): whether
    an address is device memory, and copies between it and host memory
    (``cudaMemcpy``, ``cudaMemcpyDefault``).  Without a CUDA runtime no
    address is device memory."""

    class _Attributes(ctypes.Structure):  # cudaPointerAttributes (CUDA >= 11)
        _fields_ = [("type", ctypes.c_int), ("device", ctypes.c_int),
                    ("devicePointer", ctypes.c_void_p), ("hostPointer", ctypes.c_void_p)]

    def __init__(self) -> None:
        self._lib: Any = None
        self._tried = False

    def _cudart(self) -> Any:
        if not self._tried:
            self._tried = True
            path = None
            try:
                with open("/proc/self/maps") as maps:
                    for line in maps:
                        if "libcudart" in line:
                            path = line.split()[-1]
                            break
            except OSError:
                pass
            if path:
                try:
                    lib = ctypes.CDLL(path)
                    lib.cudaMemcpy.argtypes = [ctypes.c_void_p, ctypes.c_void_p,
                                               ctypes.c_size_t, ctypes.c_int]
                    lib.cudaPointerGetAttributes.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
                    self._lib = lib
                except (OSError, AttributeError):
                    self._lib = None
        return self._lib

    def is_device(self, ptr: int) -> bool:
        lib = self._cudart()
        if lib is None:
            return False
        attr = self._Attributes()
        if lib.cudaPointerGetAttributes(ctypes.byref(attr), ctypes.c_void_p(ptr)) != 0:
            lib.cudaGetLastError()  # (an address CUDA does not know)
            return False
        return attr.type in (2, 3)  # cudaMemoryTypeDevice, cudaMemoryTypeManaged

    def copy(self, dst: int, src: int, size: int) -> bool:
        lib = self._cudart()
        return lib is not None and lib.cudaMemcpy(ctypes.c_void_p(dst), ctypes.c_void_p(src),
                                                  size, 4) == 0


_device = _CudaCopies()


def _acquire_client(sock: Optional[str]) -> "_kvcache.Client":
    key = (os.getpid(), _kvcache.socket_path(sock))
    with _lock:
        ent = _shared.get(key)
        if ent is None:
            ent = _shared[key] = [_kvcache.Client(sock), 0, {}]
        ent[1] += 1
        return ent[0]


def _allocations(client: "_kvcache.Client") -> Dict[int, "_kvcache.Buffer"]:
    for ent in _shared.values():
        if ent[0] is client:
            return ent[2]
    return {}


def _release_client(client: "_kvcache.Client") -> None:
    with _lock:
        for key, ent in list(_shared.items()):
            if ent[0] is client:
                ent[1] -= 1
                if ent[1] == 0 and not ent[2]:
                    del _shared[key]
                    client.close()
                return


def _free_allocation(client, ptr: int) -> bool:
    """Give back the allocator memory at ptr: False when there is none."""
    with _lock:
        buf = _allocations(client).pop(ptr, None)
    if buf is None:
        return False
    buf.free()
    return True


def _find_allocation(client, ptr: int, size: int):
    """The allocator Buffer holding [ptr, ptr + size), and the offset."""
    for base, buf in list(_allocations(client).items()):
        if base <= ptr and ptr + size <= base + buf.size:
            return buf, ptr - base
    return None, 0


def _ranges(sessions, keys, all_ptrs, all_sizes, all_offsets, copy) -> List[int]:
    """Copy each key's pieces to or from its session object at their offsets:
    the bytes copied per key, or a Mooncake error code."""
    out = []
    for k, ptrs, sizes, offs in zip(keys, all_ptrs, all_sizes, all_offsets):
        obj = sessions.get(k)
        if obj is None:
            out.append(OBJECT_NOT_FOUND)
            continue
        total = 0
        for p, s, o in zip(ptrs, sizes, offs):
            try:
                n = copy(obj, o, p, s)
            except ValueError:
                n = -errno.EINVAL
            if n < 0:
                total = mooncake_code(n)
                break
            total += n
        out.append(total)
    return out


def _ranges_unset(buffer_ptrs, all_keys, all_dst_offsets, all_src_offsets, all_sizes):
    """get_into_ranges' answer before setup: INVALID_PARAMS for each range."""
    return [[[INVALID_PARAMS] * len(r) for r in key_sizes] for key_sizes in all_sizes]


class MooncakeDistributedStore(TensorParallelIO):
    """Drop-in for ``mooncake.store.MooncakeDistributedStore`` over kvcached."""

    def __init__(self) -> None:
        self._client: Optional[_kvcache.Client] = None
        self._hostname = _socket.gethostname()
        self._put_sessions: Dict[str, _kvcache.Reservation] = {}
        self._get_sessions: Dict[str, _kvcache.View] = {}
        self._registered: Dict[int, int] = {}  # pointer: size
        self._device: Dict[int, int] = {}  # device memory registered: pointer: size
        self._ns = ""  # the tenant's key prefix ("" for the default tenant)
        self._told_unset = False  # a call before setup() was logged
        self._dummy = False  # set up with setup_dummy()
        self._pool: List[int] = []  # alloc_from_mem_pool()'s memory

    def _k(self, key: str) -> str:
        """The daemon's name of key, in this store's tenant."""
        if self._ns:
            return self._ns + key
        return _ESCAPED + key if key.startswith(_TENANT) else key

    def _ks(self, keys: Sequence[str]) -> List[str]:
        return [self._k(k) for k in keys]

    def _mine(self, name: str) -> Optional[str]:
        """The key this store knows by the daemon's name, or None when
        the name is another tenant's."""
        if self._ns:
            return name[len(self._ns):] if name.startswith(self._ns) else None
        if name.startswith(_ESCAPED):
            return name[len(_ESCAPED):]
        return None if name.startswith(_TENANT) else name

    # ---- set-up ----
    def setup(self, *args: Any, **kw: Any) -> int:
        """``setup(local_hostname, metadata_server, global_segment_size,
        local_buffer_size, protocol, rdma_devices, master_server_addr,
        engine, enable_ssd_offload, ssd_offload_path, tenant_id, ...)`` or
        ``setup(config_dict)``: connects to the node's kvcached (the socket
        from the ``ipc_socket_path``/``socket`` key, else ``$KVCACHE_SOCKET``
        and the defaults), in the key namespace of ``tenant_id``.  0, or -1
        when no daemon answers."""
        sock = kw.pop("socket", None)
        if args and isinstance(args[0], dict):
            cfg = {k: str(v) for k, v in args[0].items()}
            sock = sock or cfg.get("ipc_socket_path") or cfg.get("socket") or None
            host = cfg.get("local_hostname")
            tenant = cfg.get("tenant_id", kw.get("tenant_id"))
        else:
            host = args[0] if args else kw.get("local_hostname")
            tenant = args[10] if len(args) > 10 else kw.get("tenant_id")
        self._ns = _namespace(tenant)
        if host:
            self._hostname = str(host)
        if self._client is not None:
            return 0
        try:
            self._client = _acquire_client(sock)
        except OSError as e:
            # engines often ignore setup()'s answer: say why, once, here
            logging.getLogger("kvcache").error(
                "MooncakeDistributedStore.setup: no kvcached answers at %s (%s); start it "
                "(kvcached --config mooncake.json) or set $KVCACHE_SOCKET",
                _kvcache.socket_path(sock), e.strerror or e)
            return -1
        return 0

    def setup_dummy(self, mem_pool_size: int = 0, local_buffer_size: int = 0,
                    server_address: str = "") -> int:
        """Mooncake's dummy client talks to a local real client; here that is
        kvcached, at ``server_address`` when it names a socket file."""
        sock = server_address if server_address.startswith("/") else None
        r = self.setup({"socket": sock} if sock else {})
        self._dummy = self._dummy or r == 0
        return r

    def init_all(self, protocol: str = "tcp", device_name: str = "",
                 mount_segment_size: int = 0, **kw: Any) -> int:
        """Mooncake's ``init_all(protocol, device_name, mount_segment_size)``:
        a client of the node's kvcached (the transport and the segment are
        the daemon's); the host name is left alone.  A store already set up
        answers -600, as Mooncake's ("Client is already initialized")."""
        if self._client is not None:
            return INVALID_PARAMS
        return self.setup({"socket": kw["socket"]} if kw.get("socket") else {})

    def _c(self) -> _kvcache.Client:
        if self._client is None:
            raise RuntimeError("MooncakeDistributedStore.setup() was not called")
        return self._client

    def close(self) -> int:
        if self._client is None:
            return 0
        for v in self._get_sessions.values():
            v.release()
        for r in self._put_sessions.values():
            r.abort()
        self._get_sessions.clear()
        self._put_sessions.clear()
        for p in self._registered:
            self._client.unregister_memory(p)
        self._registered.clear()
        self._device.clear()
        for p in self._pool:
            _free_allocation(self._client, p)
        self._pool.clear()
        self._dummy = False
        client, self._client = self._client, None
        _release_client(client)
        return 0

    def tearDownAll(self) -> int:  # noqa: N802 (Mooncake's name)
        return self.close()

    def get_hostname(self) -> str:
        """``host:port`` as Mooncake's: this node's id in the cluster (its
        peer address by default), else the host set up with and port 0."""
        if ":" in self._hostname:
            return self._hostname
        if self._client is not None:
            me = self._cluster_self(self._client)
            if me:
                return me
        return "%s:0" % self._hostname

    def _cluster_self(self, c) -> str:
        """c's node id in the cluster ("" outside one), asked once per
        client: a cluster request waits for the masters' answers (their
        members' loads), up to the daemon's --remote-timeout-ms when one
        hangs, and the id does not change while c is connected."""
        seen = getattr(self, "_self_seen", None)
        if seen is not None and seen[0] is c:
            return seen[1]
        try:
            me = str(c.cluster().get("self") or "")
        except (OSError, ValueError, AttributeError):
            return ""
        self._self_seen = (c, me)
        return me

    def health_check(self) -> int:
        """0 healthy, 1 not set up, 2 the daemon does not answer."""
        if self._client is None:
            return 1
        try:
            self._client.status()
        except (OSError, ValueError):
            return 2
        return 0

    # ---- copying ----
    @_unset(INVALID_PARAMS)
    def put(self, key: str, value: Any, config: Optional[ReplicateConfig] = None) -> int:
        return _put_code(self._c().put(self._k(key), value, **_put_opts(config)))

    @_unset(INVALID_PARAMS)
    def upsert(self, key: str, value: Any, config: Optional[ReplicateConfig] = None) -> int:
        return mooncake_code(self._c().put(self._k(key), value,
                                           **_put_opts(config, replace=True)))

    @_unset(INVALID_PARAMS)
    def put_parts(self, key: str, *parts: Any, config: Optional[ReplicateConfig] = None) -> int:
        return self._parts(key, parts, config, False)

    @_unset(INVALID_PARAMS)
    def upsert_parts(self, key: str, *parts: Any,
                     config: Optional[ReplicateConfig] = None) -> int:
        return self._parts(key, parts, config, True)

    def _parts(self, key, parts, config, replace) -> int:
        views = [memoryview(p).cast("B") for p in parts]
        r = self._c().batch_put_from_multi_buffers([self._k(key)], [views],
                                                   [[v.nbytes for v in views]],
                                                   **_put_opts(config, replace))[0]
        return mooncake_code(r) if replace else _put_code(r)

    @_unset(INVALID_PARAMS)
    def put_batch(self, keys: Sequence[str], values: Sequence[Any],
                  config: Optional[ReplicateConfig] = None) -> int:
        return self._batch(keys, values, config, False)

    @_unset(INVALID_PARAMS)
    def upsert_batch(self, keys: Sequence[str], values: Sequence[Any],
                     config: Optional[ReplicateConfig] = None) -> int:
        return self._batch(keys, values, config, True)

    def _batch(self, keys, values, config, replace) -> int:
        if len(keys) != len(values):
            return INVALID_PARAMS
        views = [memoryview(v).cast("B") for v in values]
        res = self._c().batch_put_from_multi_buffers(self._ks(keys), [[v] for v in views],
                                                     [[v.nbytes] for v in views],
                                                     **_put_opts(config, replace))
        for r in res:
            code = mooncake_code(r) if replace else _put_code(r)
            if code < 0:
                return code
        return 0

    @_unset(b"")
    def get(self, key: str) -> bytes:
        try:
            v = self._c().get(self._k(key))
        except OSError:
            return b""
        return b"" if v is None else v

    @_unset([b""])
    def get_batch(self, keys: Sequence[str]) -> List[bytes]:
        return [self.get(k) for k in keys]

    @_unset(None)
    def get_buffer(self, key: str) -> Optional[BufferHandle]:
        """A BufferHandle (``ptr()``, ``size()``, the buffer protocol) of
        the object's bytes in place, pinning it until the handle is
        released or collected; None when it is not stored."""
        try:
            view = self._c().acquire(self._k(key))
        except OSError:
            return None
        return None if view is None else _handle(view)

    @_unset(_per_key(None))
    def batch_get_buffer(self, keys: Sequence[str]) -> List[Optional[BufferHandle]]:
        return [self.get_buffer(k) for k in keys]

    @_unset(INVALID_PARAMS)
    def get_size(self, key: str) -> int:
        try:
            view = self._c().acquire(self._k(key))
        except OSError:
            return OBJECT_NOT_FOUND
        if view is None:
            return OBJECT_NOT_FOUND
        with view:
            return view.size

    # ---- registered memory ----
    @_unset(INVALID_PARAMS)
    def register_buffer(self, buffer_ptr: int, size: int) -> int:
        c = self._c()
        buf, _ = _find_allocation(c, buffer_ptr, size)
        if buf is not None:
            return 0  # allocator memory is the daemon's: nothing to do
        r = c.register_memory(buffer_ptr, size)
        if r == 0:
            self._registered[buffer_ptr] = size
        elif r == -errno.EFAULT and size > 0 and _device.is_device(buffer_ptr) and \
                _device.is_device(buffer_ptr + size - 1):
            # a GPU's memory (vLLM's KV cache): copied by the CUDA runtime
            # into and out of the daemon's memory
            self._device[buffer_ptr] = size
            return 0
        return mooncake_code(r)

    def _get_pyclient_capsule(self) -> Any:
        """A capsule for EngramStore (named as Mooncake's), or None before
        setup."""
        return _capsule_of(self, _CAPSULE_NAME)

    def _on_device(self, ptrs: Sequence[Any], sizes: Sequence[Any]) -> bool:
        """Every piece lies in device memory given to register_buffer()."""
        return bool(self._device) and len(ptrs) == len(sizes) and all(
            isinstance(p, int) and isinstance(n, int) and n >= 0 and
            any(b <= p and p + n <= b + m for b, m in self._device.items())
            for p, n in zip(ptrs, sizes))

    def _kinds(self, all_ptrs, all_sizes) -> List[Any]:
        """Per key, where its pieces are: "device" (device memory registered
        here), the (Buffer, offset, length) pieces when every one lies in
        memory the allocator handed out (the daemon copies), or None (host
        memory the library copies, registered or refused)."""
        c = self._c()
        out: List[Any] = []
        for ptrs, sizes in zip(all_ptrs, all_sizes):
            if self._on_device(ptrs, sizes):
                out.append("device")
                continue
            iov = []
            if len(ptrs) == len(sizes) and _allocations(c):
                for p, n in zip(ptrs, sizes):
                    if not (isinstance(p, int) and isinstance(n, int) and n >= 0):
                        break
                    buf, off = _find_allocation(c, p, n)
                    if buf is None:
                        break
                    iov.append((buf, off, n))
            out.append(iov if iov and len(iov) == len(ptrs) else None)
        return out

    def _pieces(self, keys: Sequence[str], all_ptrs, all_sizes, library, daemon,
                device) -> List[int]:
        """Each key by where its pieces are (``_kinds``): one
        ``library(keys, ptrs, sizes)`` for host memory, one ``daemon(keys,
        iovs)`` for allocator memory, ``device(key, ptrs, sizes)`` for each
        key in device memory; a result per key."""
        kinds = self._kinds(all_ptrs, all_sizes)
        out = [0] * len(keys)
        lib = [i for i, k in enumerate(kinds) if k is None]
        if lib:
            res = library([self._k(keys[i]) for i in lib], [all_ptrs[i] for i in lib],
                          [all_sizes[i] for i in lib])
            for i, r in zip(lib, res):
                out[i] = r
        shared = [i for i, k in enumerate(kinds) if isinstance(k, list)]
        if shared:
            res = daemon([self._k(keys[i]) for i in shared], [kinds[i] for i in shared])
            for i, r in zip(shared, res):
                out[i] = r
        for i in (i for i, k in enumerate(kinds) if k == "device"):
            out[i] = device(self._k(keys[i]), all_ptrs[i], all_sizes[i])
        return out

    def _put_pieces(self, keys: Sequence[str], all_ptrs, all_sizes,
                    opts: Dict[str, Any]) -> List[int]:
        """Put each key from its pieces: 0 or -errno each.  Allocator
        memory is copied by the daemon; device memory is reserved, copied
        into by the CUDA runtime and committed; the rest is copied by the
        library."""
        c = self._c()
        return self._pieces(
            keys, all_ptrs, all_sizes,
            lambda k, p, n: c.batch_put_from_multi_buffers(k, p, n, **opts),
            lambda k, iov: c.batch_put_from(k, iov, **opts),
            lambda k, p, n: self._device_put(c, k, p, n, opts))

    @staticmethod
    def _device_put(c, key: str, ptrs, sizes, opts: Dict[str, Any]) -> int:
        try:
            res = c.reserve(key, sum(sizes), **opts)
        except OSError as e:
            return -(e.errno or errno.EIO)
        off = 0
        for p, n in zip(ptrs, sizes):
            if not _device.copy(res.ptr + off, p, n):
                res.abort()
                return -errno.EIO
            off += n
        return res.commit()

    def _get_pieces(self, keys: Sequence[str], all_ptrs, all_sizes) -> List[int]:
        """Each key into its pieces: its length or -errno each (allocator
        memory: the daemon copies; device memory: acquired, copied out by
        the CUDA runtime, released)."""
        c = self._c()
        return self._pieces(keys, all_ptrs, all_sizes, c.batch_get_into_multi_buffers,
                            c.batch_get_into, lambda k, p, n: self._device_get(c, k, p, n))

    @staticmethod
    def _device_get(c, key: str, ptrs, sizes) -> int:
        try:
            view = c.acquire(key)
        except OSError as e:
            return -(e.errno or errno.EIO)
        if view is None:
            return -errno.ENOENT
        with view:
            if view.size > sum(sizes):
                return -errno.ENOBUFS
            off = 0
            for p, n in zip(ptrs, sizes):
                n = min(n, view.size - off)
                if n <= 0:
                    break
                if not _device.copy(p, view.ptr + off, n):
                    return -errno.EIO
                off += n
            return view.size

    def _copy_to(self, obj: Any, offset: int, ptr: int, size: int) -> int:
        """A session's write_from, or the CUDA runtime's copy from device
        memory registered here."""
        if self._on_device([ptr], [size]):
            if offset < 0 or offset + size > obj.size:
                raise ValueError("outside the object")
            return size if _device.copy(obj.ptr + offset, ptr, size) else -errno.EIO
        return obj.write_from(offset, ptr, size)

    def _copy_from(self, obj: Any, offset: int, ptr: int, size: int) -> int:
        """A session's read_into, or the CUDA runtime's copy to device
        memory registered here."""
        if self._on_device([ptr], [size]):
            if offset < 0 or offset + size > obj.size:
                raise ValueError("outside the object")
            return size if _device.copy(ptr, obj.ptr + offset, size) else -errno.EIO
        return obj.read_into(offset, ptr, size)

    def _find_registered(self, ptr: int, size: int) -> bool:
        """[ptr, ptr + size) lies in memory registered or allocated here."""
        if _find_allocation(self._c(), ptr, size)[0] is not None:
            return True
        return any(b <= ptr and ptr + size <= b + n for b, n in self._registered.items())

    @_unset(INVALID_PARAMS)
    def unregister_buffer(self, buffer_ptr: int) -> int:
        if self._device.pop(buffer_ptr, None) is not None:
            return 0
        if buffer_ptr in self._registered:
            del self._registered[buffer_ptr]
            return mooncake_code(self._c().unregister_memory(buffer_ptr))
        return 0 if _find_allocation(self._c(), buffer_ptr, 1)[0] is not None else INVALID_PARAMS

    def _put_from(self, key, ptr, size, config, replace) -> int:
        r = self._put_pieces([key], [[ptr]], [[size]], _put_opts(config, replace))[0]
        return mooncake_code(r) if replace else _put_code(r)

    @_unset(INVALID_PARAMS)
    def put_from(self, key: str, buffer_ptr: int, size: int,
                 config: Optional[ReplicateConfig] = None) -> int:
        return self._put_from(key, buffer_ptr, size, config, False)

    @_unset(INVALID_PARAMS)
    def upsert_from(self, key: str, buffer_ptr: int, size: int,
                    config: Optional[ReplicateConfig] = None) -> int:
        return self._put_from(key, buffer_ptr, size, config, True)

    def put_from_with_metadata(self, key: str, buffer_ptr: int, metadata_buffer_ptr: int,
                               size: int, metadata_size: int,
                               config: Optional[ReplicateConfig] = None) -> int:
        """One object: metadata_size bytes at metadata_buffer_ptr, then size
        bytes at buffer_ptr (as Mooncake stores a header before its data)."""
        if self._client is None or min(buffer_ptr, metadata_buffer_ptr, size,
                                       metadata_size) < 0 or not buffer_ptr or \
                (metadata_size and not metadata_buffer_ptr):
            return INVALID_PARAMS
        ptrs, sizes = [buffer_ptr], [size]
        if metadata_size:
            ptrs.insert(0, metadata_buffer_ptr)
            sizes.insert(0, metadata_size)
        # the library copies from registered memory only, device memory
        # registered here goes through the CUDA runtime, others are refused
        return _put_code(self._put_pieces([key], [ptrs], [sizes], _put_opts(config))[0])

    @_unset(INVALID_PARAMS)
    def get_into(self, key: str, buffer_ptr: int, size: int) -> int:
        """Bytes read, or <0 (-704 miss, -600 when size is smaller than the
        object or the memory is not registered)."""
        return mooncake_code(self._get_pieces([key], [[buffer_ptr]], [[size]])[0])

    @_unset(_per_key(INVALID_PARAMS))
    def batch_put_from(self, keys: Sequence[str], buffer_ptrs: Sequence[int],
                       sizes: Sequence[int],
                       config: Optional[ReplicateConfig] = None) -> List[int]:
        return self.batch_put_from_multi_buffers(keys, [[p] for p in buffer_ptrs],
                                                 [[s] for s in sizes], config)

    @_unset(_per_key(INVALID_PARAMS))
    def batch_upsert_from(self, keys: Sequence[str], buffer_ptrs: Sequence[int],
                          sizes: Sequence[int],
                          config: Optional[ReplicateConfig] = None) -> List[int]:
        res = self._put_pieces(keys, [[p] for p in buffer_ptrs], [[s] for s in sizes],
                               _put_opts(config, replace=True))
        return [mooncake_code(r) for r in res]

    @_unset(_per_key(INVALID_PARAMS))
    def batch_get_into(self, keys: Sequence[str], buffer_ptrs: Sequence[int],
                       sizes: Sequence[int]) -> List[int]:
        return self.batch_get_into_multi_buffers(keys, [[p] for p in buffer_ptrs],
                                                 [[s] for s in sizes])

    @_unset(_ranges_unset)
    def get_into_ranges(self, buffer_ptrs: Sequence[int], all_keys: Sequence[Sequence[str]],
                        all_dst_offsets: Sequence[Sequence[Sequence[int]]],
                        all_src_offsets: Sequence[Sequence[Sequence[int]]],
                        all_sizes: Sequence[Sequence[Sequence[int]]]) -> List[List[List[int]]]:
        """Pieces of objects into buffers: for buffer i, key j and range k,
        ``all_sizes[i][j][k]`` bytes from offset ``all_src_offsets[i][j][k]``
        of the object to ``buffer_ptrs[i] + all_dst_offsets[i][j][k]``.
        ``results[i][j][k]``: the bytes copied, or Mooncake's code (a key
        not stored: OBJECT_NOT_FOUND; a range past the object's end:
        INVALID_PARAMS).  Each object is read in place, copied from its
        mapping, and let go."""
        if not (len(buffer_ptrs) == len(all_keys) == len(all_dst_offsets) ==
                len(all_src_offsets) == len(all_sizes)):
            raise ValueError("get_into_ranges: the lists differ in length")
        c = self._c()
        out: List[List[List[int]]] = []
        for ptr, keys, dsts, srcs, sizes in zip(buffer_ptrs, all_keys, all_dst_offsets,
                                                all_src_offsets, all_sizes):
            if not (len(keys) == len(dsts) == len(srcs) == len(sizes)):
                raise ValueError("get_into_ranges: a buffer's lists differ in length")
            per_key: List[List[int]] = []
            for key, dst, src, size in zip(keys, dsts, srcs, sizes):
                if not (len(dst) == len(src) == len(size)):
                    raise ValueError("get_into_ranges: a key's ranges differ in length")
                try:
                    view = c.acquire(self._k(key))
                except OSError as e:
                    per_key.append([mooncake_code(-(e.errno or errno.EIO))] * len(size))
                    continue
                if view is None:
                    per_key.append([OBJECT_NOT_FOUND] * len(size))
                    continue
                with view:
                    res = []
                    for d, o, n in zip(dst, src, size):
                        if d < 0 or o < 0 or n < 0 or o + n > view.size:
                            res.append(INVALID_PARAMS)
                        elif self._on_device([ptr + d], [n]):
                            res.append(n if _device.copy(ptr + d, view.ptr + o, n)
                                       else mooncake_code(-errno.EIO))
                        elif not self._find_registered(ptr + d, n):
                            res.append(INVALID_PARAMS)  # never written to
                        else:
                            ctypes.memmove(ptr + d, view.ptr + o, n)
                            res.append(n)
                    per_key.append(res)
            out.append(per_key)
        return out

    def batch_put_from_multi_buffers(self, keys: Sequence[str],
                                     all_buffer_ptrs: Sequence[Sequence[int]],
                                     all_sizes: Sequence[Sequence[int]],
                                     config: Optional[ReplicateConfig] = None) -> List[int]:
        if self._client is None:
            return []
        if not (len(keys) == len(all_buffer_ptrs) == len(all_sizes)):
            return [INVALID_PARAMS] * len(keys)
        res = self._put_pieces(keys, all_buffer_ptrs, all_sizes, _put_opts(config))
        return [_put_code(r) for r in res]

    def batch_get_into_multi_buffers(self, keys: Sequence[str],
                                     all_buffer_ptrs: Sequence[Sequence[int]],
                                     all_sizes: Sequence[Sequence[int]],
                                     prefer_alloc_in_same_node: bool = False) -> List[int]:
        if self._client is None:
            return []
        if not (len(keys) == len(all_buffer_ptrs) == len(all_sizes)):
            return [INVALID_PARAMS] * len(keys)
        res = self._get_pieces(keys, all_buffer_ptrs, all_sizes)
        return [mooncake_code(r) for r in res]

    # ---- sessions: reserve ... commit, acquire ... release ----
    @_unset([])
    def batch_put_session_start(self, keys: Sequence[str], sizes: Sequence[int],
                                config: Optional[ReplicateConfig] = None) -> List[int]:
        c, out = self._c(), []
        for k, s in zip(keys, sizes):
            if k in self._put_sessions:
                out.append(INVALID_PARAMS)  # Mooncake: a session of that key is open
                continue
            try:
                self._put_sessions[k] = c.reserve(self._k(k), s, **_put_opts(config))
                out.append(0)
            except OSError as e:
                out.append(mooncake_code(-e.errno))
        return out

    @_unset([])
    def batch_put_from_multi_buffer_ranges(self, keys: Sequence[str],
                                           all_buffer_ptrs: Sequence[Sequence[int]],
                                           all_sizes: Sequence[Sequence[int]],
                                           all_dst_offsets: Sequence[Sequence[int]]) -> List[int]:
        """The bytes written per key (as Mooncake), or an error code."""
        return _ranges(self._put_sessions, keys, all_buffer_ptrs, all_sizes, all_dst_offsets,
                       self._copy_to)

    @_unset([])
    def batch_put_session_end(self, keys: Sequence[str]) -> List[int]:
        out = []
        for k in keys:
            r = self._put_sessions.pop(k, None)
            out.append(OBJECT_NOT_FOUND if r is None else _put_code(r.commit()))
        return out

    @_unset([])
    def batch_put_session_revoke(self, keys: Sequence[str]) -> List[int]:
        out = []
        for k in keys:
            r = self._put_sessions.pop(k, None)
            out.append(OBJECT_NOT_FOUND if r is None else mooncake_code(r.abort()))
        return out

    @_unset([])
    def batch_get_session_start(self, keys: Sequence[str]) -> List[int]:
        c, out = self._c(), []
        for k in keys:
            v = self._get_sessions.get(k)
            if v is None:
                try:
                    v = c.acquire(self._k(k))
                except OSError as e:
                    out.append(mooncake_code(-e.errno))
                    continue
                if v is None:
                    out.append(OBJECT_NOT_FOUND)
                    continue
                self._get_sessions[k] = v
            out.append(0)  # Mooncake: 0, the size is get_size()'s
        return out

    @_unset([])
    def batch_get_into_multi_buffer_ranges(self, keys: Sequence[str],
                                           all_buffer_ptrs: Sequence[Sequence[int]],
                                           all_sizes: Sequence[Sequence[int]],
                                           all_src_offsets: Sequence[Sequence[int]]) -> List[int]:
        return _ranges(self._get_sessions, keys, all_buffer_ptrs, all_sizes, all_src_offsets,
                       self._copy_from)

    @_unset(-1)
    def batch_get_session_end(self, keys: Sequence[str]) -> int:
        """0, as Mooncake's (a key with no session is nothing to end)."""
        for k in keys:
            v = self._get_sessions.pop(k, None)
            if v is not None:
                v.release()
        return 0

    # ---- tensors (Mooncake's serialization: TensorMetadata, then the bytes) ----
    def _put_tensors(self, keys: Sequence[str], tensors: Sequence[Any],
                     config: Optional[ReplicateConfig], replace: bool = False,
                     layouts: Optional[Sequence[tuple]] = None) -> List[int]:
        """layouts[i]: (global shape, axes) of a shard, or None."""
        out, ks, bufs, sizes, at = [], [], [], [], []
        for i, (k, t) in enumerate(zip(keys, tensors)):
            lay = layouts[i] if layouts else None
            parts = _tensor_parts(t, *lay) if lay else _tensor_parts(t)
            if parts is None:
                out.append(INVALID_PARAMS)
                continue
            out.append(0)
            at.append(len(out) - 1)
            ks.append(self._k(k))
            bufs.append([parts[0], parts[1]])
            sizes.append([len(parts[0]), parts[1].nbytes])
        if ks:
            res = self._c().batch_put_from_multi_buffers(ks, bufs, sizes,
                                                         **_put_opts(config, replace))
            for i, r in zip(at, res):
                out[i] = mooncake_code(r) if replace else _put_code(r)
        return out

    def upsert_tensor(self, key: str, tensor: Any) -> int:
        """As put_tensor, replacing what key holds (copies elsewhere go)."""
        if self._client is None:
            return INVALID_PARAMS
        return self._put_tensors([key], [tensor], None, replace=True)[0]

    def batch_upsert_tensor(self, keys: Sequence[str], tensors_list: Sequence[Any]) -> List[int]:
        if self._client is None or len(keys) != len(tensors_list) or not keys:
            return [INVALID_PARAMS] * len(keys)
        return self._put_tensors(keys, tensors_list, None, replace=True)

    def put_tensor(self, key: str, tensor: Any) -> int:
        """0, or a Mooncake error code (-600: not a tensor Mooncake takes)."""
        if self._client is None:
            return INVALID_PARAMS
        return self._put_tensors([key], [tensor], None)[0]

    def pub_tensor(self, key: str, tensor: Any,
                   config: Optional[ReplicateConfig] = None) -> int:
        if self._client is None or not _config_ok(config):
            return INVALID_PARAMS
        return self._put_tensors([key], [tensor], config)[0]

    def batch_put_tensor(self, keys: Sequence[str], tensors_list: Sequence[Any]) -> List[int]:
        return self.batch_pub_tensor(keys, tensors_list)

    def batch_pub_tensor(self, keys: Sequence[str], tensors_list: Sequence[Any],
                         config: Optional[ReplicateConfig] = None) -> List[int]:
        if (self._client is None or len(keys) != len(tensors_list) or not keys or
                not _config_ok(config)):
            return [INVALID_PARAMS] * len(keys)
        return self._put_tensors(keys, tensors_list, config)

    def get_tensor(self, key: str) -> Any:
        """The tensor (on the CPU, its own memory), or None."""
        if self._client is None:
            return None
        v = self.get(key)
        return _tensor_from(bytearray(v), len(v)) if v else None

    def batch_get_tensor(self, keys: Sequence[str]) -> List[Any]:
        return [self.get_tensor(k) for k in keys]

    def get_tensor_into(self, key: str, buffer_ptr: int, size: int) -> Any:
        """Reads the value into registered memory at buffer_ptr and answers
        a tensor over that memory (no copy), or None."""
        if self._client is None:
            return None
        n = self.get_into(key, buffer_ptr, size)
        if n <= 0 or self._on_device([buffer_ptr], [n]):
            return None  # (a tensor over device memory: get_tensor_into_cuda)
        import ctypes
        return _tensor_from((ctypes.c_char * n).from_address(buffer_ptr), n)

    def batch_get_tensor_into(self, keys: Sequence[str], buffer_ptrs: Sequence[int],
                              sizes: Sequence[int]) -> List[Any]:
        if self._client is None or not (len(keys) == len(buffer_ptrs) == len(sizes)):
            return [INVALID_PARAMS] * len(keys)
        import ctypes
        res = self.batch_get_into(keys, buffer_ptrs, sizes)
        return [_tensor_from((ctypes.c_char * n).from_address(p), n)
                if n > 0 and not self._on_device([p], [n]) else None
                for p, n in zip(buffer_ptrs, res)]

    def _tp_put(self, keys, tensors, config, tp_size, split_dim, replace=False) -> List[int]:
        """Every rank's shard of each tensor as ``key_tp_<rank>``, SHARD
        metadata (the whole shape, one TP axis); Mooncake shards evenly
        only (-600 otherwise)."""
        out = [0] * len(keys)
        ks, ts, lays, owner = [], [], [], []
        for i, (k, t) in enumerate(zip(keys, tensors)):
            dim = getattr(t, "dim", None)
            ok = callable(dim) and tp_size > 0 and -dim() <= split_dim < dim()
            if ok:
                sd = split_dim % dim()
                ok = t.shape[sd] % tp_size == 0
            if not ok:
                out[i] = INVALID_PARAMS
                continue
            step = t.shape[sd] // tp_size
            for rank in range(tp_size):
                ks.append(_tp_key(k, rank))
                ts.append(t.narrow(sd, rank * step, step).contiguous())
                lays.append((list(t.shape), [(_AXIS_TP, rank, tp_size, sd, step)]))
                owner.append(i)
        res = self._put_tensors(ks, ts, config, replace, lays) if ks else []
        for i, r in zip(owner, res):
            if r != 0 and out[i] == 0:
                out[i] = r  # the first error wins, as Mooncake's
        return out

    def put_tensor_with_tp(self, key: str, tensor: Any, tp_rank: int = 0, tp_size: int = 1,
                           split_dim: int = 0) -> int:
        """Chunks tensor along split_dim into tp_size shards stored as
        ``key_tp_<rank>`` (every rank's, as Mooncake's)."""
        return self.pub_tensor_with_tp(key, tensor, None, tp_rank, tp_size, split_dim)

    def pub_tensor_with_tp(self, key: str, tensor: Any,
                           config: Optional[ReplicateConfig] = None, tp_rank: int = 0,
                           tp_size: int = 1, split_dim: int = 0) -> int:
        if tp_size <= 1:
            return self.pub_tensor(key, tensor, config)
        if self._client is None or not _config_ok(config):
            return INVALID_PARAMS
        return self._tp_put([key], [tensor], config, tp_size, split_dim)[0]

    def batch_put_tensor_with_tp(self, base_keys: Sequence[str], tensors_list: Sequence[Any],
                                 tp_rank: int = 0, tp_size: int = 1,
                                 split_dim: int = 0) -> List[int]:
        return self.batch_pub_tensor_with_tp(base_keys, tensors_list, None, tp_rank, tp_size,
                                             split_dim)

    def batch_pub_tensor_with_tp(self, base_keys: Sequence[str], tensors_list: Sequence[Any],
                                 config: Optional[ReplicateConfig] = None, tp_rank: int = 0,
                                 tp_size: int = 1, split_dim: int = 0) -> List[int]:
        if tp_size <= 1:
            return self.batch_pub_tensor(base_keys, tensors_list, config)
        if (self._client is None or len(base_keys) != len(tensors_list) or not base_keys or
                not _config_ok(config)):
            return [INVALID_PARAMS] * len(base_keys)
        return self._tp_put(base_keys, tensors_list, config, tp_size, split_dim)

    def get_tensor_with_tp(self, key: str, tp_rank: int = 0, tp_size: int = 1,
                           split_dim: int = 0) -> Any:
        """This rank's shard (``key_tp_<rank>``), or the whole tensor
        when tp_size is 1."""
        return self.get_tensor(key if tp_size <= 1 else _tp_key(key, tp_rank))

    def batch_get_tensor_with_tp(self, base_keys: Sequence[str], tp_rank: int = 0,
                                 tp_size: int = 1) -> List[Any]:
        return [self.get_tensor_with_tp(k, tp_rank, tp_size) for k in base_keys]

    def get_tensor_with_tp_into(self, key: str, buffer_ptr: int, size: int, tp_rank: int = 0,
                                tp_size: int = 1, split_dim: int = 0) -> Any:
        return self.get_tensor_into(key if tp_size <= 1 else _tp_key(key, tp_rank),
                                    buffer_ptr, size)

    @_unset(_per_key(None))
    def batch_get_tensor_with_tp_into(self, base_keys: Sequence[str],
                                      buffer_ptrs: Sequence[int], sizes: Sequence[int],
                                      tp_rank: int = 0, tp_size: int = 1) -> List[Any]:
        keys = list(base_keys) if tp_size <= 1 else [_tp_key(k, tp_rank) for k in base_keys]
        return self.batch_get_tensor_into(keys, buffer_ptrs, sizes)

    # ---- tensors already laid out as Mooncake stores them ----
    def _tensor_buffer_ok(self, buffer_ptr: int, size: int) -> bool:
        """A tensor as Mooncake stores it, in host memory registered here
        (its header is read; other memory is never touched)."""
        if not buffer_ptr or size < _TENSOR_META_SIZE or \
                not self._find_registered(buffer_ptr, size):
            return False
        import ctypes
        return _parse_meta((ctypes.c_char * size).from_address(buffer_ptr), size) is not None

    def _tensor_from_buffer(self, put, key: str, buffer_ptr: int, size: int) -> int:
        if self._client is None or not self._tensor_buffer_ok(buffer_ptr, size):
            return INVALID_PARAMS
        return put(key, buffer_ptr, size)

    def _tensors_from_buffers(self, put, keys, buffer_ptrs, sizes) -> List[int]:
        """As Mooncake's: one buffer that is not a tensor fails them all."""
        if not keys:
            return []
        if (self._client is None or not (len(keys) == len(buffer_ptrs) == len(sizes)) or
                not all(self._tensor_buffer_ok(p, n) for p, n in zip(buffer_ptrs, sizes))):
            return [INVALID_PARAMS] * len(keys)
        return put(keys, buffer_ptrs, sizes)

    def put_tensor_from(self, key: str, buffer_ptr: int, size: int) -> int:
        """buffer_ptr holds [TensorMetadata][bytes] (in registered memory):
        stored as it is, 0; -600 when it is not a tensor Mooncake reads."""
        return self._tensor_from_buffer(self.put_from, key, buffer_ptr, size)

    def batch_put_tensor_from(self, keys: Sequence[str], buffer_ptrs: Sequence[int],
                              sizes: Sequence[int]) -> List[int]:
        return self._tensors_from_buffers(self.batch_put_from, keys, buffer_ptrs, sizes)

    def upsert_tensor_from(self, key: str, buffer_ptr: int, size: int) -> int:
        return self._tensor_from_buffer(self.upsert_from, key, buffer_ptr, size)

    def batch_upsert_tensor_from(self, keys: Sequence[str], buffer_ptrs: Sequence[int],
                                 sizes: Sequence[int]) -> List[int]:
        return self._tensors_from_buffers(self.batch_upsert_from, keys, buffer_ptrs, sizes)

    def _tensor_at(self, buffer_ptr: int, size: int) -> Any:
        if not buffer_ptr or size <= 0 or not self._find_registered(buffer_ptr, size):
            return None
        import ctypes
        return _tensor_from((ctypes.c_char * size).from_address(buffer_ptr), size)

    def put_tensor_with_tp_from(self, key: str, buffer_ptr: int, size: int, tp_rank: int = 0,
                                tp_size: int = 1, split_dim: int = 0) -> int:
        """The whole tensor at buffer_ptr, stored as every rank's shard."""
        if tp_size <= 1:
            return self.put_tensor_from(key, buffer_ptr, size)
        t = self._tensor_at(buffer_ptr, size) if self._client is not None else None
        if t is None:
            return INVALID_PARAMS
        return self._tp_put([key], [t], None, tp_size, split_dim)[0]

    def batch_put_tensor_with_tp_from(self, base_keys: Sequence[str],
                                      buffer_ptrs: Sequence[int], sizes: Sequence[int],
                                      tp_rank: int = 0, tp_size: int = 1,
                                      split_dim: int = 0) -> List[int]:
        if tp_size <= 1:
            return self.batch_put_tensor_from(base_keys, buffer_ptrs, sizes)
        if self._client is None or not (len(base_keys) == len(buffer_ptrs) == len(sizes)):
            return [INVALID_PARAMS] * len(base_keys)
        out = [INVALID_PARAMS] * len(base_keys)
        ks, ts, at = [], [], []
        for i, (k, p, n) in enumerate(zip(base_keys, buffer_ptrs, sizes)):
            t = self._tensor_at(p, n)
            if t is not None:
                ks.append(k)
                ts.append(t)
                at.append(i)
        for i, r in zip(at, self._tp_put(ks, ts, None, tp_size, split_dim) if ks else []):
            out[i] = r
        return out

    def upsert_pub_tensor(self, key: str, tensor: Any,
                          config: Optional[ReplicateConfig] = None) -> int:
        if self._client is None or not _config_ok(config):
            return INVALID_PARAMS
        return self._put_tensors([key], [tensor], config, replace=True)[0]

    def batch_upsert_pub_tensor(self, keys: Sequence[str], tensors_list: Sequence[Any],
                                config: Optional[ReplicateConfig] = None) -> List[int]:
        if (self._client is None or len(keys) != len(tensors_list) or not keys or
                not _config_ok(config)):
            return [INVALID_PARAMS] * len(keys)
        return self._put_tensors(keys, tensors_list, config, replace=True)

    def get_tensor_into_cuda(self, key: str, tensor: Any) -> int:
        """Mooncake reads into CUDA memory through a dummy client's CUDA
        IPC only; kvcache has no GPU path: -600, as Mooncake answers a
        client that cannot."""
        return INVALID_PARAMS

    def batch_get_tensor_into_cuda(self, keys: Sequence[str],
                                   tensors_list: Sequence[Any]) -> List[int]:
        return [INVALID_PARAMS] * len(keys)

    def alloc_from_mem_pool(self, size: int) -> int:
        """Set up with ``setup_dummy()``: memory shared with the daemon, as
        a dummy client's comes from its real client's pool (LMCache's dummy
        mode stages its CPU cache there), freed at ``close()``; the daemon
        copies puts from and gets into it.  Otherwise 0, as Mooncake's real
        client answers."""
        if self._client is None or not self._dummy or size <= 0:
            return 0
        try:
            buf = self._client.buffer_alloc(size)
        except OSError as e:
            logging.getLogger("kvcache").error(
                "MooncakeDistributedStore.alloc_from_mem_pool(%d): %s", size, e)
            return 0
        with _lock:
            _allocations(self._client)[buf.ptr] = buf
        self._pool.append(buf.ptr)
        return buf.ptr

    def get_offload_rpc_read_count(self) -> int:
        return 0

    def save_tensor_to_safetensor(self, key: str, file_name: Optional[str] = None) -> int:
        """The tensor key holds, saved with safetensors as {key: tensor} to
        file_name (the key when not given): 0; -1100 when key holds no
        tensor; -600 when it cannot be saved (or safetensors is missing)."""
        if self._client is None:
            return INVALID_PARAMS
        t = self.get_tensor(key)
        if t is None:
            return FILE_NOT_FOUND
        try:
            from safetensors.torch import save_file
            save_file({key: t.contiguous()}, file_name or key)
        except Exception:  # noqa: BLE001 -- Mooncake's answer to any failure
            return INVALID_PARAMS
        return 0

    def load_tensor_from_safetensor(self, key: Optional[str] = None,
                                    file_name: Optional[str] = None) -> Any:
        """The tensor named key in file_name (the first one when key is not
        there), stored under key (file_name when None): the tensor, or None."""
        if self._client is None or not file_name:
            return None
        try:
            from safetensors.torch import load_file
            loaded = load_file(file_name)
        except Exception:  # noqa: BLE001
            return None
        if not loaded:
            return None
        name = key if key in loaded else next(iter(loaded))
        t = loaded[name]
        return t if self.put_tensor(key if key is not None else file_name, t) == 0 else None

    # ---- replicas, tasks and segments ----
    def _self_id(self, c) -> str:
        """This node's id in the cluster (the name ``where`` gives it)."""
        return self._cluster_self(c) or self.get_hostname()

    def _replicas(self, c, me: str, key: str) -> List[ReplicaDescriptor]:
        k = self._k(key)
        out: List[ReplicaDescriptor] = []
        try:
            here = [i for i in c.list(k, exact=True) if i["state"] == "committed"]
            others = [n for n in c.where(k) if n not in (me, "(this node)")]
        except (OSError, ValueError):
            return out
        size = here[0]["size"] if here else 0
        if here and here[0]["tier"] != _kvcache.TIER_DISK:
            out.append(ReplicaDescriptor(memory=MemoryDescriptor(BufferDescriptor(size, me))))
        if here and (here[0]["on_disk"] or here[0]["tier"] == _kvcache.TIER_DISK):
            out.append(ReplicaDescriptor(disk=DiskDescriptor("", size)))
        for node in others:
            out.append(ReplicaDescriptor(memory=MemoryDescriptor(BufferDescriptor(size, node))))
        return out

    @_unset([])
    def get_replica_desc(self, key: str) -> List[ReplicaDescriptor]:
        """The copies of key: this node's (in memory, and on its disk tier
        when there is a copy there), then one memory copy for each other
        node holding it.  Empty when it is held nowhere (or on error)."""
        c = self._c()
        return self._replicas(c, self._self_id(c), key)

    @_unset({})
    def batch_get_replica_desc(self, keys: Sequence[str]) -> Dict[str, List[ReplicaDescriptor]]:
        c = self._c()
        me = self._self_id(c)  # asked once for the batch
        return {key: self._replicas(c, me, key) for key in keys}

    def batch_replica_clear(self, keys: Sequence[str], segment_name: str = "") -> List[str]:
        """Mooncake drops the copies on a segment; kvcache keeps one copy
        set per key: nothing is cleared (the keys cleared: none)."""
        return []

    def create_copy_task(self, key: str, targets: Sequence[str]):
        """(task id, code): kvcache copies with push_to; tasks are not
        supported: ((0, 0), UNAVAILABLE_IN_CURRENT_MODE), Mooncake's form
        of a failure."""
        return ((0, 0), UNAVAILABLE_IN_CURRENT_MODE)

    def create_move_task(self, key: str, source: str, target: str):
        return ((0, 0), UNAVAILABLE_IN_CURRENT_MODE)

    def query_task(self, task_id):
        return (None, UNAVAILABLE_IN_CURRENT_MODE)

    # Segments: kvcached's tiers are its own memory and disk, sized by its
    # configuration; a client mounts none (Mooncake's answers, with its
    # "not in this mode" code).
    @_unset({"ret": -1, "segment_ids": []})
    def mount_segment(self, path: str, size: int, offset: int = 0, protocol: str = "tcp",
                      location: str = "") -> Dict[str, Any]:
        return {"ret": UNAVAILABLE_IN_CURRENT_MODE, "segment_ids": []}

    @_unset(-1)
    def unmount_segment(self, segment_ids: Sequence[str], grace_period_seconds: int = 0) -> int:
        return UNAVAILABLE_IN_CURRENT_MODE

    @_unset({"ret": -1, "segment_ids": [], "allocated_size": 0})
    def allocate_and_mount_segment(self, size: int, protocol: str = "tcp",
                                   location: str = "") -> Dict[str, Any]:
        return {"ret": UNAVAILABLE_IN_CURRENT_MODE, "segment_ids": [], "allocated_size": 0}

    @_unset(-1)
    def unmount_and_free_segment(self, segment_ids: Sequence[str],
                                 grace_period_seconds: int = 0) -> int:
        return UNAVAILABLE_IN_CURRENT_MODE

    @_unset(-1)
    def unmount_local_disk_segment(self, grace_period_seconds: int = 0) -> int:
        return UNAVAILABLE_IN_CURRENT_MODE

    # ---- presence and removal ----
    @_unset(INVALID_PARAMS)
    def is_exist(self, key: str) -> int:
        """1 present, 0 absent, -1 when the daemon cannot answer (-600 before
        setup, as Mooncake's)."""
        try:
            return 1 if self._c().exists(self._k(key)) else 0
        except (OSError, ValueError, RuntimeError):
            return -1

    @_unset(_per_key(INVALID_PARAMS))
    def batch_is_exist(self, keys: Sequence[str]) -> List[int]:
        try:
            return [1 if p else 0 for p in self._c().batch_exists(self._ks(keys))]
        except (OSError, ValueError, RuntimeError):
            return [-1] * len(keys)

    @_unset(INVALID_PARAMS)
    def remove(self, key: str, force: bool = False) -> int:
        return mooncake_code(self._c().remove(self._k(key), force=force))

    @_unset(_per_key(INVALID_PARAMS))
    def batch_remove(self, keys: Sequence[str], force: bool = False) -> List[int]:
        return [self.remove(k, force) for k in keys]

    @_unset(INVALID_PARAMS)
    def remove_by_regex(self, regex_pattern: str, force: bool = False) -> int:
        """How many objects were removed, or <0."""
        try:
            pattern = re.compile(regex_pattern)
        except re.error:
            return INVALID_PARAMS
        c, removed = self._c(), 0
        for info in c.list(self._ns or None, 1 << 30):
            mine = self._mine(info["key"])
            if mine is not None and info["state"] == "committed" and pattern.search(mine):
                if c.remove(info["key"], force=force) == 0:
                    removed += 1
        return removed

    @_unset(INVALID_PARAMS)
    def remove_all(self, force: bool = False) -> int:
        """Every object of this store's tenant: how many, or <0."""
        c = self._c()
        try:
            if self._ns or not c.list(_TENANT, 1):
                removed, _ = c.remove_prefix(self._ns or None, force=force)
                return removed
            # the default tenant beside others: its own keys one by one
            removed = 0
            for info in c.list(None, 1 << 30):
                if self._mine(info["key"]) is not None and \
                        c.remove(info["key"], force=force) == 0:
                    removed += 1
            return removed
        except OSError as e:
            return mooncake_code(-e.errno)


class MooncakeHostMemAllocator:
    """Memory shared with the daemon (kvcache registered buffers): a store
    of the same process puts from and gets into it with the daemon doing
    the copy.  ``alloc(size) -> address`` (0 on failure), ``free(address)``."""

    def __init__(self, socket: Optional[str] = None) -> None:
        self._client = _acquire_client(socket)

    def alloc(self, size: int) -> int:
        try:
            buf = self._client.buffer_alloc(size)
        except OSError:
            return 0
        with _lock:
            _allocations(self._client)[buf.ptr] = buf
        return buf.ptr

    def free(self, ptr: int) -> int:
        return 0 if _free_allocation(self._client, ptr) else INVALID_PARAMS

    def close(self) -> None:
        with _lock:
            bufs = _allocations(self._client)
            for b in bufs.values():
                b.free()
            bufs.clear()
        _release_client(self._client)


class BufferLeaseView:
    """A lease's bytes (the buffer protocol); its ``buffer`` is a memoryview
    of them.  While one lives, the lease cannot be released."""

    __slots__ = ()

    @property
    def buffer(self) -> memoryview:
        return memoryview(self).cast("B")


@functools.lru_cache(maxsize=256)
def _view_type(size: int):
    return type("BufferLeaseView", (BufferLeaseView, ctypes.c_ubyte * size), {})


class BufferLease:
    """size bytes of a BufferPool's registered memory, until ``release()``
    (or the end of a ``with``): put from them and get into them with the
    store (the daemon copies)."""

    def __init__(self, pool: "BufferPool", ptr: int, size: int, cls: int):
        self._pool = pool
        self._ptr = ptr
        self._size = size
        self._cls = cls
        self._views: List[Any] = []

    @property
    def ptr(self) -> int:
        return self._ptr

    @property
    def size(self) -> int:
        return self._size

    @property
    def buffer(self) -> memoryview:
        if self._pool is None:
            raise RuntimeError("the lease was released")
        v = _view_type(self._size).from_address(self._ptr)
        self._views.append(weakref.ref(v))
        return memoryview(v).cast("B")

    def release(self) -> None:
        if self._pool is None:
            return
        if any(r() is not None for r in self._views):
            raise RuntimeError("the lease's buffer is still in use (a view of it is alive)")
        pool, self._pool = self._pool, None
        pool._give_back(self._ptr, self._cls)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.release()


class BufferPool:
    """Registered memory handed out in leases, as Mooncake's BufferPool:
    sizes are rounded up to a power of two from ``min_size_class``; a class
    takes memory from the daemon (a registered buffer, so puts and gets are
    the daemon's copies) ``alignment`` bytes at a time, up to ``max_bytes``
    in all (0: twice the daemon's dram, at most 1 GiB) and ``max_regions``
    regions; a request larger than ``max_size_class`` gets a region of its
    own.  When the pool is exhausted ``acquire`` waits (``block``, up to
    ``timeout`` seconds) for a lease to come back, or raises RuntimeError."""

    def __init__(self, store: "MooncakeDistributedStore", max_bytes: int = 0,
                 min_size_class: int = 64 * 1024, max_size_class: Optional[int] = None,
                 alignment: int = 8 * 1024 * 1024, block_on_exhaustion: bool = True,
                 default_timeout: Optional[float] = None, max_regions: Optional[int] = None,
                 prewarm_size: Optional[int] = None, prewarm_count: int = 0):
        if store is None or store._client is None:
            raise RuntimeError("BufferPool needs a store that is set up")
        if min_size_class <= 0 or alignment <= 0:
            raise RuntimeError("min_size_class and alignment must be positive")
        self._client = store._c()
        if not max_bytes:
            dram = 0
            try:
                dram = next(int(t["capacity"]) for t in self._client.status()["tiers"]
                            if t["name"] == "dram")
            except (OSError, KeyError, StopIteration, TypeError, ValueError):
                pass
            max_bytes = min(2 * dram, 1 << 30) if dram else 1 << 30
        self._max_bytes = max_bytes
        self._min = 1 << (min_size_class - 1).bit_length()
        self._max_cls = max_size_class or alignment
        self._align = alignment
        self._block = block_on_exhaustion
        self._timeout = default_timeout
        self._max_regions = max_regions
        self._cond = threading.Condition()
        self._free: Dict[int, List[int]] = {}
        self._regions: List[Any] = []
        self._bytes = 0
        self._out = 0
        self._closed = False

    def _class_of(self, size: int) -> int:
        cls = max(self._min, 1 << (size - 1).bit_length())
        return cls if cls <= self._max_cls else size

    def _grow(self, cls: int) -> bool:
        """A new region for class cls (under the lock); False when the
        pool may not grow."""
        region = max(cls, self._align) if cls <= self._max_cls else cls
        region = (region + self._align - 1) // self._align * self._align
        if self._bytes + region > self._max_bytes:
            return False
        if self._max_regions is not None and len(self._regions) >= self._max_regions:
            return False
        try:
            buf = self._client.buffer_alloc(region)
        except OSError:
            return False
        with _lock:
            _allocations(self._client)[buf.ptr] = buf
        self._regions.append(buf)
        self._bytes += region
        step = cls if cls <= self._max_cls else region
        self._free.setdefault(cls, []).extend(
            buf.ptr + off for off in range(0, region - step + 1, step))
        return True

    def acquire(self, size: int, block: Optional[bool] = None,
                timeout: Optional[float] = None) -> BufferLease:
        if size <= 0:
            raise RuntimeError("a lease of %d bytes" % size)
        cls = self._class_of(size)
        block = self._block if block is None else block
        timeout = self._timeout if timeout is None else timeout
        with self._cond:
            ok = self._cond.wait_for(
                lambda: self._closed or self._free.get(cls) or self._grow(cls),
                timeout=timeout if block else 0)
            if self._closed:
                raise RuntimeError("the pool is closed")
            if not ok:
                raise RuntimeError("the pool is exhausted (%d bytes in %d regions)" %
                                   (self._bytes, len(self._regions)))
            ptr = self._free[cls].pop()
            self._out += 1
        return BufferLease(self, ptr, size, cls)

    buffer = acquire

    def _give_back(self, ptr: int, cls: int) -> None:
        with self._cond:
            self._out -= 1
            if not self._closed:
                self._free.setdefault(cls, []).append(ptr)
            self._cond.notify_all()

    def prewarm(self, size: int, count: int) -> None:
        """As Mooncake's: nothing (the daemon's memory is warm already)."""

    def close(self) -> None:
        with self._cond:
            self._closed = True
            regions, self._regions = self._regions, []
            self._free.clear()
            self._cond.notify_all()
        with _lock:
            allocs = _allocations(self._client)
            for buf in regions:
                allocs.pop(buf.ptr, None)
        for buf in regions:
            buf.free()


# ---- the client capsule, EngramStore, NVMe-oF registration ----

_CAPSULE_NAME = b"mooncake.PyClient.shared_ptr"
_capsule_stores: "weakref.WeakValueDictionary[int, MooncakeDistributedStore]" = \
    weakref.WeakValueDictionary()
_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_capsule_valid = ctypes.pythonapi.PyCapsule_IsValid
_capsule_valid.restype = ctypes.c_int
_capsule_valid.argtypes = [ctypes.py_object, ctypes.c_char_p]
_capsule_ptr = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_ptr.restype = ctypes.c_void_p
_capsule_ptr.argtypes = [ctypes.py_object, ctypes.c_char_p]


def _capsule_of(store: "MooncakeDistributedStore", name: Optional[bytes]) -> Any:
    """A capsule naming the store (its pointer is a handle, never
    dereferenced), or None before setup."""
    if store._client is None:
        return None
    _capsule_stores[id(store)] = store
    return _capsule_new(id(store), name, None)


def _get_pyclient_from_wrapper(wrapper: "MooncakeDistributedStore") -> Any:
    return _capsule_of(wrapper, None)


def _store_of_capsule(cap: Any) -> "MooncakeDistributedStore":
    if not _capsule_valid(cap, _CAPSULE_NAME):
        raise RuntimeError("EngramStore: not a mooncake.PyClient.shared_ptr capsule")
    store = _capsule_stores.get(_capsule_ptr(cap, _CAPSULE_NAME) or 0)
    if store is None:
        raise RuntimeError("EngramStore: the store of this capsule is gone")
    return store


class EngramStoreConfig:
    """Embedding tables of one Engram layer: a vocabulary size per head and
    the embedding width."""

    def __init__(self) -> None:
        self.table_vocab_sizes: List[int] = [1024]
        self.embedding_dim = 64


class EngramStore:
    """One layer's embedding tables in the store, a head per key
    (``engram:l<layer>:h<head>``, float32 rows of embedding_dim), as
    Mooncake's EngramStore keeps them."""

    def __init__(self, layer_id: int, config: EngramStoreConfig, store: Any = None) -> None:
        vocab = [int(v) for v in config.table_vocab_sizes]
        dim = int(config.embedding_dim)
        if not vocab or dim <= 0 or any(v <= 0 for v in vocab):
            raise ValueError("EngramStoreConfig: table_vocab_sizes must be non-empty and "
                             "positive, embedding_dim positive")
        if store is not None and not isinstance(store, MooncakeDistributedStore):
            get = getattr(store, "_get_pyclient_capsule", None)
            if get is None:
                raise RuntimeError("EngramStore: store must be a MooncakeDistributedStore")
            store = _store_of_capsule(get())
        self._layer, self._vocab, self._dim, self._store = int(layer_id), vocab, dim, store
        self._keys = ["engram:l%d:h%d" % (self._layer, h) for h in range(len(vocab))]

    def get_table_vocab_sizes(self) -> List[int]:
        return list(self._vocab)

    def get_store_keys(self) -> List[str]:
        return list(self._keys)

    def get_num_heads(self) -> int:
        return len(self._vocab)

    def get_embedding_dim(self) -> int:
        return self._dim

    def remove_from_store(self, force: bool = False) -> int:
        """How many heads were removed (those not there are skipped)."""
        removed = 0
        for k in self._keys:
            rc = self._store.remove(k, force) if self._store is not None else INVALID_PARAMS
            if rc == OBJECT_NOT_FOUND:
                continue
            if rc != 0:
                raise RuntimeError("remove_from_store failed, rc=%d" % rc)
            removed += 1
        return removed

    def populate(self, embedding_buffers: Sequence[Any]) -> None:
        """Stores each head's table (float32 [vocab, dim]); the keys must
        not exist; on a failure what was stored is removed again."""
        import numpy as np
        if self._store is None:
            raise RuntimeError("EngramStore.populate: no store")
        if len(embedding_buffers) != len(self._keys):
            raise RuntimeError("EngramStore.populate: %d tables for %d heads" %
                               (len(embedding_buffers), len(self._keys)))
        tables = []
        for h, b in enumerate(embedding_buffers):
            a = np.ascontiguousarray(np.asarray(b, dtype=np.float32))
            if a.shape != (self._vocab[h], self._dim):
                raise RuntimeError("EngramStore.populate: head %d is %s, not [%d, %d]" %
                                   (h, a.shape, self._vocab[h], self._dim))
            tables.append(a)
        if any(r == 1 for r in self._store.batch_is_exist(self._keys)):
            raise RuntimeError("EngramStore.populate: the layer's tables are stored already")
        done = []
        for k, a in zip(self._keys, tables):
            rc = self._store.put(k, memoryview(a).cast("B"))
            if rc != 0:
                for d in done:
                    self._store.remove(d, True)
                raise RuntimeError("EngramStore.populate: put %s failed, rc=%d" % (k, rc))
            done.append(k)

    def lookup(self, row_ids: Any) -> Any:
        """float32 [B, L, H, D]: the rows row_ids ([B, L, H]) name, per head."""
        import numpy as np
        ids = np.asarray(row_ids, dtype=np.int64)
        heads = len(self._keys)
        if self._store is None or ids.ndim != 3 or ids.shape[2] != heads:
            raise RuntimeError("EngramStore lookup failed")
        out = np.zeros(ids.shape + (self._dim,), dtype=np.float32)
        for h, k in enumerate(self._keys):
            col = ids[:, :, h]
            if col.size and (col.min() < 0 or col.max() >= self._vocab[h]):
                raise RuntimeError("EngramStore lookup failed")
            view = self._store.get_buffer(k)
            if view is None or view.size() != self._vocab[h] * self._dim * 4:
                raise RuntimeError("EngramStore lookup failed")
            with view:
                table = np.frombuffer((ctypes.c_char * view.size()).from_address(view.ptr()),
                                      dtype=np.float32).reshape(self._vocab[h], self._dim)
                out[:, :, h, :] = table[col]
        return out


class MooncakeDistributedNoFRegister:
    """Mooncake's NVMe-oF segment registration.  kvcache drives no NVMe-oF
    targets: both calls answer -1 (Mooncake's OPERATION_FAILED) and say
    why once."""

    def _refuse(self, what: str) -> int:
        logging.getLogger("kvcache").warning("%s: kvcache does not drive NVMe-oF segments", what)
        return -1

    def real_register(self, nqn: str, nsid: int, traddr: str, trsvcid: int, base: int,
                      size: int, master_server_addr: str) -> int:
        return self._refuse("MooncakeDistributedNoFRegister.real_register")

    def real_unregister_by_endpoint(self, nqn: str, nsid: int, traddr: str, trsvcid: int,
                                    master_server_addr: str) -> int:
        return self._refuse("MooncakeDistributedNoFRegister.real_unregister_by_endpoint")


RegisteredBufferPool = BufferPool
RegisteredBufferLease = BufferLease
RegisteredBufferLeaseView = BufferLeaseView

# the enums' values at module level, as pybind11's export_values() leaves
# them (TaskStatus's PROCESSING and FAILED are exported last and win)
for _e in (ObjectDataType, ReplicaStatus, TaskType, TaskStatus):
    globals().update({_m.name: _m for _m in _e})
del _e

__all__ = ["MooncakeDistributedStore", "ReplicateConfig", "SoftPinAction",
           "MooncakeHostMemAllocator", "mooncake_code", "ParallelAxis", "ReadTarget",
           "TensorParallelism", "_deserialize_tensor", "_serialize_tensor",
           "_tensor_metadata_size", "EngramStore", "EngramStoreConfig",
           "MooncakeDistributedNoFRegister", "_get_pyclient_from_wrapper"]
