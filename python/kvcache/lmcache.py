# SPDX-License-Identifier: MIT
"""LMCache on kvcached: a ``kvcache://`` remote connector and the native
client of LMCache's multiprocess server.

Remote connector (LMCache in the engine process)::

    remote_serde: "naive"
    remote_storage_plugins: ["kvcache"]
    extra_config:
      remote_storage_plugin.kvcache.module_path: kvcache.lmcache
      remote_storage_plugin.kvcache.class_name: KvcacheConnectorAdapter
      remote_storage_plugin.kvcache.socket: /run/kvcached.sock
      save_chunk_meta: false

LMCache makes a remote backend of each plugin, whose URL is
``plugin://kvcache`` (or ``plugin://kvcache.<instance>``, each instance with
its own ``remote_storage_plugin.kvcache.<instance>.socket``).  LMCache
before per-plugin backends needs the URL as well, and takes the socket from
it: ``remote_url: "kvcache://localhost:0/?socket=/run/kvcached.sock"``
(where both exist, give one: each would be a backend of its own).

The value of a key is the chunk's raw KV bytes (``save_chunk_meta`` false:
LMCache keeps the shape and dtype locally), stored and loaded with the
GIL released on a worker thread (``asyncio.to_thread``).

Native client (``lmcache server``, MP mode)::

    --l2-adapter '{"type": "native_plugin", "module_path": "kvcache.lmcache",
                   "class_name": "NativeClient",
                   "adapter_params": {"socket": "/run/kvcached.sock", "num_workers": 2}}'

It runs batches on its own threads and signals completions on an eventfd,
holding each batch's memoryviews until its completion is drained.

LMCache's keys already carry the model and the rank (the connector's
``model@world_size@worker_id@chunk_hash@dtype``, the multiprocess server's
``model@rank@group@chunk_hash[@salt]``); they are stored as they are.
LMCache is not installed where the test suite runs: the suite drives these
classes with LMCache-shaped memory objects and contexts.
"""

from __future__ import annotations

import asyncio
import errno
import inspect
import os
import queue
import threading
from typing import Any, List, Optional, Sequence, Tuple
from urllib.parse import parse_qs, urlparse

from . import _kvcache
from .engine import unanswered

try:
    from lmcache.v1.storage_backend.connector import ConnectorAdapter  # type: ignore
    from lmcache.v1.storage_backend.connector.base_connector import (  # type: ignore
        RemoteConnector,
    )
    HAVE_LMCACHE = True
except ImportError:
    HAVE_LMCACHE = False

    class ConnectorAdapter:  # type: ignore[no-redef]
        def __init__(self, schema: str = "") -> None:
            self.schema = schema

        def can_parse(self, url: str) -> bool:
            return self.schema != "" and url.startswith(self.schema)

    class RemoteConnector:  # type: ignore[no-redef]
        """The newest base's shape (LMCache's PR #2314): built with (config,
        metadata); chunk shapes read from the metadata when used."""

        def __init__(self, config: Any, metadata: Any):
            assert metadata is not None
            extra = getattr(config, "extra_config", None)
            self.save_chunk_meta = (extra is None or extra.get("save_chunk_meta", True)
                                    or bool(getattr(config, "use_layerwise", False)))
            self._lmc_metadata = metadata
            self.meta_fmt = "KV_MLA_FMT" if metadata.use_mla else "KV_2LTD"

        @property
        def meta_shapes(self) -> list:
            return self._lmc_metadata.get_shapes()

        @property
        def meta_dtypes(self) -> list:
            return self._lmc_metadata.get_dtypes()

        @property
        def full_chunk_size_bytes(self) -> int:
            total = 0
            for shape, dtype in zip(self.meta_shapes, self.meta_dtypes):
                n = 1
                for d in shape:
                    n *= int(d)
                total += n * _itemsize(dtype)
            return total

        @property
        def single_token_size(self) -> int:
            return self.full_chunk_size_bytes // self._lmc_metadata.chunk_size

        def reshape_partial_chunk(self, memory_obj: Any, bytes_read: int) -> Any:
            if bytes_read <= 0 or bytes_read % self.single_token_size or \
                    bytes_read > self.full_chunk_size_bytes:
                raise ValueError("bytes_read %d is not a whole number of tokens" % bytes_read)
            return memory_obj.reshaped(bytes_read // self.single_token_size)


def _itemsize(dtype: Any) -> int:
    size = getattr(dtype, "itemsize", None)
    if size is None:
        import torch
        size = torch.empty((), dtype=dtype).element_size()
    return int(size)


def _params(fn: Any) -> List[str]:
    try:
        return list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return []


# Which base this is: the newest takes (config, metadata) and answers
# batched_contains with a count of leading hits; the one before (Oct-Nov
# 2025) took no arguments and answered it with a list of bools.
_BASE_TAKES_METADATA = "metadata" in _params(RemoteConnector.__init__)
_CONTAINS_AS_LIST = "stop_after_first_not_exits" in _params(
    getattr(RemoteConnector, "batched_contains", None))


def socket_from_url(url: str) -> Optional[str]:
    """``kvcache://host:port/?socket=PATH`` -> PATH (None: the default)."""
    q = parse_qs(urlparse(url).query)
    return q.get("socket", [None])[0]


def _key(k: Any) -> str:
    return k if isinstance(k, str) else k.to_string()


class KvcacheRemoteConnector(RemoteConnector):
    """LMCache's RemoteConnector over kvcached."""

    def __init__(self, socket: Optional[str], loop: Any, local_cpu_backend: Any,
                 config: Any = None, metadata: Any = None):
        if config is None:
            config = getattr(local_cpu_backend, "config", None)
        if metadata is None:
            metadata = getattr(local_cpu_backend, "metadata", None)
        if _BASE_TAKES_METADATA:
            super().__init__(config, metadata)
        else:
            try:
                super().__init__()
            except TypeError:
                pass
            # older managers call this only when save_chunk_meta is false in
            # the config; the chunk's shape is needed either way
            self.init_chunk_meta(config, metadata)
        # values are the chunk's raw KV bytes; LMCache knows their shape
        self.save_chunk_meta = False
        self.loop = loop
        self.local_cpu_backend = local_cpu_backend
        self.config = config
        self.client = _kvcache.Client(socket)

    def init_chunk_meta(self, config: Any, metadata: Any) -> None:
        """The chunk's shape for allocations, as LMCache's older base sets it
        up (but whatever ``save_chunk_meta`` says: the values carry no
        header)."""
        if _BASE_TAKES_METADATA or metadata is None:
            return
        kv = metadata.kv_shape  # (layers, 2, chunk tokens, heads, head size)
        self.meta_shape = _shape((kv[1], kv[0], kv[2], kv[3] * kv[4]))
        self.meta_dtype = metadata.kv_dtype
        self.meta_fmt = _memory_format(bool(getattr(metadata, "use_mla", False)))
        n = 1
        for d in self.meta_shape:
            n *= int(d)
        self.full_chunk_size = n * _itemsize(self.meta_dtype)
        self.single_token_size = self.full_chunk_size // int(kv[2])
        self.save_chunk_meta = False

    def _allocate(self) -> Any:
        if _BASE_TAKES_METADATA:
            return self.local_cpu_backend.allocate(self.meta_shapes, self.meta_dtypes,
                                                   self.meta_fmt)
        return self.local_cpu_backend.allocate(self.meta_shape, self.meta_dtype, self.meta_fmt)

    # presence
    async def exists(self, key: Any) -> bool:
        return await asyncio.to_thread(self.exists_sync, key)

    def exists_sync(self, key: Any) -> bool:
        try:
            return self.client.exists(_key(key))
        except OSError as e:
            return unanswered("exists", e, False)

    def support_batched_contains(self) -> bool:
        return True

    def batched_contains(self, keys: List[Any], stop_after_first_not_exits: bool = True) -> Any:
        """How many leading keys are stored (LMCache sums it over its
        backends and slices its keys with it); a list of bools for the
        LMCache versions whose base said so."""
        ks = [_key(k) for k in keys]
        try:
            if not _CONTAINS_AS_LIST:
                return self.client.prefix_lookup(ks)
            if stop_after_first_not_exits:
                n = self.client.prefix_lookup(ks)
                return [True] * n + [False] * (len(ks) - n)
            return self.client.batch_exists(ks)
        except OSError as e:
            return unanswered("contains", e, [False] * len(ks) if _CONTAINS_AS_LIST else 0)

    def support_batched_async_contains(self) -> bool:
        return True

    async def batched_async_contains(self, lookup_id: str, keys: List[Any],
                                     pin: bool = False) -> int:
        try:
            return await asyncio.to_thread(self.client.prefix_lookup, [_key(k) for k in keys])
        except OSError as e:
            return unanswered("contains", e, 0)

    # loads and stores
    def support_batched_get(self) -> bool:
        return True

    async def get(self, key: Any) -> Optional[Any]:
        return (await self.batched_get([key]))[0]

    async def batched_get(self, keys: List[Any]) -> List[Optional[Any]]:
        objs = [self._allocate() for _ in keys]
        allocated = [i for i, o in enumerate(objs) if o is not None]
        res = await asyncio.to_thread(
            self.client.batch_get_into_multi_buffers, [_key(keys[i]) for i in allocated],
            [[objs[i].byte_array] for i in allocated], [[objs[i].get_size()] for i in allocated])
        out: List[Optional[Any]] = [None] * len(keys)
        for i, r in zip(allocated, res):
            o = objs[i]
            if r <= 0:
                o.ref_count_down()
            elif r < o.get_size():
                out[i] = self.reshape_partial_chunk(o, r)
            else:
                out[i] = o
        return out

    def support_batched_get_non_blocking(self) -> bool:
        return True

    async def batched_get_non_blocking(self, lookup_id: str, keys: List[Any],
                                       transfer_spec: Any = None) -> List[Any]:
        """The prefetch path: one batch, the loaded leading chunks (those
        after the first miss go back to LMCache's allocator)."""
        out: List[Any] = []
        missed = False
        for o in await self.batched_get(keys):
            if o is None:
                missed = True
            elif missed:
                o.ref_count_down()
            else:
                out.append(o)
        return out

    def support_batched_put(self) -> bool:
        return True

    async def put(self, key: Any, memory_obj: Any) -> None:
        await self.batched_put([key], [memory_obj])

    async def batched_put(self, keys: List[Any], memory_objs: List[Any]) -> List[int]:
        # LMCache's wrapper (InstrumentedRemoteConnector) drops the objects'
        # references after put and batched_put; dropping them here too would
        # free chunks LMCache still caches
        return await asyncio.to_thread(
            self.client.batch_put_from_multi_buffers, [_key(k) for k in keys],
            [[o.byte_array] for o in memory_objs], [[o.get_size()] for o in memory_objs])

    def remove_sync(self, key: Any) -> bool:
        return self.client.remove(_key(key), force=True) == 0

    async def list(self) -> List[str]:
        infos = await asyncio.to_thread(self.client.list, None, 1 << 30)
        return [i["key"] for i in infos if i["state"] == "committed"]

    def support_ping(self) -> bool:
        return True

    async def ping(self) -> int:
        try:
            await asyncio.to_thread(self.client.status)
            return 0
        except OSError as e:
            return -e.errno

    async def close(self) -> None:
        self.client.close()


def _shape(dims: Any) -> Any:
    try:
        import torch
        return torch.Size([int(d) for d in dims])
    except ImportError:
        return tuple(int(d) for d in dims)


def _memory_format(mla: bool) -> Any:
    try:
        from lmcache.v1.memory_management import MemoryFormat  # type: ignore
        return MemoryFormat.KV_MLA_FMT if mla else MemoryFormat.KV_2LTD
    except ImportError:
        return "KV_MLA_FMT" if mla else "KV_2LTD"


PLUGIN_TYPE = "kvcache"


def _plugin_socket(context: Any) -> Optional[str]:
    """A plugin backend's socket: ``remote_storage_plugin.<name>.socket``,
    else the plugin type's, else None (the default)."""
    name = getattr(context, "plugin_name", None) or context.url[len("plugin://"):]
    extra = getattr(getattr(context, "config", None), "extra_config", None) or {}
    for n in (name, PLUGIN_TYPE):
        sock = extra.get("remote_storage_plugin.%s.socket" % n)
        if sock:
            return str(sock)
    return None


class KvcacheConnectorAdapter(ConnectorAdapter):
    """Makes KvcacheRemoteConnectors for ``kvcache://`` URLs, and for the
    ``plugin://kvcache[.instance]`` URL of a plugin's own backend."""

    def __init__(self) -> None:
        super().__init__("kvcache://")

    def can_parse(self, url: str) -> bool:
        if url.startswith("kvcache://"):
            return True
        return url.startswith("plugin://") and \
            url[len("plugin://"):].split(".", 1)[0] == PLUGIN_TYPE

    def create_connector(self, context: Any) -> KvcacheRemoteConnector:
        socket = socket_from_url(context.url) if context.url.startswith("kvcache://") \
            else _plugin_socket(context)
        return KvcacheRemoteConnector(socket, context.loop,
                                      context.local_cpu_backend,
                                      getattr(context, "config", None),
                                      getattr(context, "metadata", None))


class NativeClient:
    """LMCache's native-plugin contract: submit batches, learn of their
    completion through ``event_fd()``, collect them with
    ``drain_completions()`` as ``(future_id, ok, error, per-key bools)``."""

    def __init__(self, socket: Optional[str] = None, num_workers: int = 2, **kwargs: Any):
        self.client = _kvcache.Client(socket)
        self._fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._jobs: "queue.Queue[Optional[Tuple[int, str, list, Any]]]" = queue.Queue()
        self._lock = threading.Lock()
        self._done: List[Tuple[int, bool, str, Optional[List[bool]]]] = []
        self._next = 1
        self._closed = False
        self._threads = [threading.Thread(target=self._run, name="kvcache-lmcache-%d" % i,
                                          daemon=True) for i in range(max(1, int(num_workers)))]
        for t in self._threads:
            t.start()

    def event_fd(self) -> int:
        return self._fd

    def _submit(self, kind: str, keys: Sequence[str], views: Any = None) -> int:
        if self._closed:
            raise RuntimeError("the client is closed")
        keys = [_key(k) for k in keys]
        if views is not None:
            views = list(views)  # held until the completion is drained
            if len(views) != len(keys):
                raise ValueError("keys and memoryviews differ in length")
        with self._lock:
            fid = self._next
            self._next += 1
        self._jobs.put((fid, kind, keys, views))
        return fid

    def submit_batch_get(self, keys: Sequence[str], memoryviews: Sequence[Any]) -> int:
        return self._submit("get", keys, memoryviews)

    def submit_batch_set(self, keys: Sequence[str], memoryviews: Sequence[Any]) -> int:
        return self._submit("set", keys, memoryviews)

    def submit_batch_exists(self, keys: Sequence[str]) -> int:
        return self._submit("exists", keys)

    def submit_batch_delete(self, keys: Sequence[str]) -> int:
        return self._submit("delete", keys)

    def drain_completions(self) -> List[Tuple[int, bool, str, Optional[List[bool]]]]:
        try:
            os.eventfd_read(self._fd)
        except BlockingIOError:
            pass
        with self._lock:
            done, self._done = self._done, []
        return done

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            fid, kind, keys, views = job
            try:
                why: dict = {}
                ok, err, bools = True, "", self._do(kind, keys, views, why)
                if kind == "set" and not all(bools):
                    # LMCache counts every key of an ok store as stored
                    bad = [k for k, b in zip(keys, bools) if not b]
                    ok, err = False, "%d of %d keys not stored (first: %s: %s)" % (
                        len(bad), len(keys), bad[0], why.get(bad[0], "failed"))
            except Exception as e:  # noqa: BLE001 - reported, never lost
                ok, err, bools = False, "%s: %s" % (type(e).__name__, e), None
            with self._lock:
                self._done.append((fid, ok, err, bools))
            os.eventfd_write(self._fd, 1)

    def _do(self, kind: str, keys: List[str], views: Any, why: dict) -> List[bool]:
        c = self.client
        if not keys:
            return []
        if kind == "get":
            res = c.batch_get_into_multi_buffers(keys, [[v] for v in views],
                                                 [[memoryview(v).nbytes] for v in views])
            return [r > 0 for r in res]
        if kind == "set":
            res = c.batch_put_from_multi_buffers(keys, [[v] for v in views],
                                                 [[memoryview(v).nbytes] for v in views])
            why.update((k, _kvcache.strerror(r)) for k, r in zip(keys, res)
                       if r < 0 and r != -errno.EEXIST)
            return [r == 0 or r == -errno.EEXIST for r in res]
        if kind == "exists":
            try:
                return c.batch_exists(keys)
            except OSError as e:
                return unanswered("batch_exists", e, [False] * len(keys))
        return [c.remove(k, force=True) == 0 for k in keys]

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for _ in self._threads:
            self._jobs.put(None)
        for t in self._threads:
            t.join()
        self.client.close()
        os.close(self._fd)


__all__ = ["KvcacheConnectorAdapter", "KvcacheRemoteConnector", "NativeClient",
           "socket_from_url", "HAVE_LMCACHE"]
