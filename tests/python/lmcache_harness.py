# SPDX-License-Identifier: MIT
"""LMCache around a remote connector, as far as the connector can tell.

Transcribed from LMCache/LMCache (newest API, after PR #2314 "refactor
RemoteConnector", 2025-12-26; PR #1927, 2025-10-31, for batched_put):

* ``lmcache/v1/storage_backend/connector/__init__.py``: ConnectorManager
  loads ``remote_storage_plugins`` from ``extra_config``
  (``remote_storage_plugin.<name>.module_path`` / ``.class_name``), builds
  the adapter with no arguments, and ``create_connector(context)`` for the
  first adapter that ``can_parse`` the URL; the newest manager calls
  nothing else, the older one (``era=2``, @01712fbd) then
  ``init_chunk_meta(config, metadata)`` and ``post_init()``;
  ``CreateConnector`` wraps it in InstrumentedRemoteConnector;
* ``.../connector/instrumented_connector.py``: ``put`` and ``batched_put``
  drop the memory objects' references in ``finally``;
* ``lmcache/v1/storage_backend/remote_backend.py``: a put takes a reference,
  serializes (naive: the serializer holds one), drops it, and hands the
  object to the connector; ``batched_contains`` returns the connector's
  answer; gets run on the backend's event loop;
* ``lmcache/v1/storage_backend/storage_manager.py``: ``batched_contains``
  adds up each backend's count of leading hits and slices the keys with it;
* ``lmcache/v1/memory_management.py``: MemoryObj reference counts (a chunk
  goes back to the allocator at 0; below 0 is a bug);
* ``lmcache/utils.py``: ``CacheEngineKey.to_string()``;
* the newest ``storage_backend/__init__.py`` ``CreateStorageBackends``
  (after per-plugin backends): a ``RemoteBackend`` named
  ``RemoteBackend-<plugin>`` for each of ``remote_storage_plugins``, whose
  URL is ``plugin://<plugin>`` and whose context carries ``plugin_name``,
  then one more for a (deprecated) ``remote_url``; ``RemoteBackend.
  init_connection`` logs a failure to make its connector and leaves the
  backend without one (it then finds nothing and stores nothing); its
  ``batched_get_non_blocking`` (the prefetch of what a lookup found) asks
  the connector's, whose base default is a ``get`` per key.
"""

from __future__ import annotations

import asyncio
import importlib
import threading
from types import SimpleNamespace
from typing import Any, Dict, List, Optional

import torch

from kvcache import lmcache as kvl


class MemoryObj:
    """A chunk in LMCache's local CPU memory."""

    def __init__(self, allocator: "LocalCPUBackend", shapes, dtypes, fmt):
        self.allocator = allocator
        shape = shapes[0] if isinstance(shapes, list) else shapes
        dtype = dtypes[0] if isinstance(dtypes, list) else dtypes
        self.meta = SimpleNamespace(shape=torch.Size(shape), dtype=dtype, fmt=fmt)
        self.raw_data = torch.zeros(shape, dtype=dtype)
        self.ref_count = 1
        self.freed = False

    @property
    def byte_array(self) -> memoryview:
        assert not self.freed, "a freed chunk was used"
        return memoryview(self.raw_data.view(-1).view(torch.uint8).numpy())

    def get_size(self) -> int:
        return self.raw_data.numel() * self.raw_data.element_size()

    def get_shape(self):
        return self.meta.shape

    def reshaped(self, tokens: int) -> "MemoryObj":
        shape = list(self.meta.shape)
        shape[2] = tokens
        n = 1
        for d in shape:
            n *= d
        self.raw_data = self.raw_data.view(-1)[:n].view(shape)
        self.meta.shape = torch.Size(shape)
        return self

    def ref_count_up(self) -> None:
        assert not self.freed, "a freed chunk was referenced"
        self.ref_count += 1

    def ref_count_down(self) -> None:
        self.ref_count -= 1
        assert self.ref_count >= 0, "reference count below 0 (released twice)"
        if self.ref_count == 0:
            self.freed = True
            self.allocator.live -= 1


class LocalCPUBackend:
    def __init__(self, config: Any, metadata: Any):
        self.config = config
        self.metadata = metadata
        self.live = 0

    def allocate(self, shapes, dtypes, fmt=None, eviction: bool = True,
                 busy_loop: bool = True) -> MemoryObj:
        self.live += 1
        return MemoryObj(self, shapes, dtypes, fmt)


class Metadata:
    """LMCacheMetadata: (layers, 2, chunk tokens, heads, head size)."""

    def __init__(self, model="org/tiny", world_size=1, worker_id=0, layers=2, chunk=16,
                 heads=2, head_size=8, dtype=torch.bfloat16, use_mla=False):
        self.model_name = model
        self.world_size = world_size
        self.worker_id = worker_id
        self.kv_dtype = dtype
        self.kv_shape = (layers, 2, chunk, heads, head_size)
        self.use_mla = use_mla
        self.chunk_size = chunk

    def get_shapes(self) -> List[torch.Size]:
        k = self.kv_shape
        return [torch.Size([k[1], k[0], k[2], k[3] * k[4]])]

    def get_dtypes(self) -> List[torch.dtype]:
        return [self.kv_dtype]

    def get_num_groups(self) -> int:
        return 1


class CacheEngineKey:
    def __init__(self, meta: Metadata, chunk_hash: int):
        self.meta = meta
        self.chunk_hash = chunk_hash

    def to_string(self) -> str:
        m = self.meta
        return "%s@%d@%d@%x@%s" % (m.model_name, m.world_size, m.worker_id, self.chunk_hash,
                                   str(m.kv_dtype).replace("torch.", ""))


def config(socket: str, plugins: Optional[List[str]] = None, url: bool = True,
           **extra: Any) -> SimpleNamespace:
    """LMCache's config with kvcache as its remote plugin: with url, the
    socket in a kvcache:// remote_url (LMCache before per-plugin backends);
    else in remote_storage_plugin.<plugin>.socket."""
    plugins = plugins or ["kvcache"]
    e: Dict[str, Any] = {}
    for p in plugins:
        e["remote_storage_plugin.%s.module_path" % p] = "kvcache.lmcache"
        e["remote_storage_plugin.%s.class_name" % p] = "KvcacheConnectorAdapter"
        if not url:
            e["remote_storage_plugin.%s.socket" % p] = socket
    e.update(extra)
    return SimpleNamespace(remote_url="kvcache://localhost:0/?socket=" + socket if url else None,
                           remote_serde="naive", remote_storage_plugins=plugins,
                           extra_config=e, use_layerwise=False, blocking_timeout_secs=10)


class InstrumentedRemoteConnector:
    def __init__(self, connector: Any):
        self._connector = connector

    def __getattr__(self, name: str) -> Any:
        return getattr(self._connector, name)

    async def put(self, key, memory_obj) -> None:
        try:
            await self._connector.put(key, memory_obj)
        finally:
            memory_obj.ref_count_down()

    async def batched_put(self, keys, memory_objs) -> None:
        try:
            await self._connector.batched_put(keys, memory_objs)
        finally:
            for memory_obj in memory_objs:
                memory_obj.ref_count_down()


def create_connector(cfg, loop, local_cpu_backend, metadata, era: int = 3,
                     plugin_name: Optional[str] = None) -> Any:
    """CreateConnector: the plugin's adapter, its connector, wrapped."""
    adapters = []
    for name in set(cfg.remote_storage_plugins or ()):
        module = importlib.import_module(cfg.extra_config[
            "remote_storage_plugin.%s.module_path" % name])
        adapter = getattr(module, cfg.extra_config[
            "remote_storage_plugin.%s.class_name" % name])()
        assert isinstance(adapter, kvl.ConnectorAdapter)
        adapters.append(adapter)
    url = "plugin://%s" % plugin_name if plugin_name is not None else cfg.remote_url
    context = SimpleNamespace(url=url, loop=loop, local_cpu_backend=local_cpu_backend,
                              config=cfg, metadata=metadata, plugin_name=plugin_name)
    for adapter in adapters:
        if adapter.can_parse(context.url):
            connector = adapter.create_connector(context)
            if era < 3:
                connector.init_chunk_meta(context.config, context.metadata)
                connector.post_init() if hasattr(connector, "post_init") else None
            return InstrumentedRemoteConnector(connector)
    raise ValueError("No adapter found for URL: %s" % context.url)


class NaiveSerializer:
    def serialize(self, memory_obj: MemoryObj) -> MemoryObj:
        memory_obj.ref_count_up()  # held for the connector; the wrapper drops it
        return memory_obj


class RemoteBackend:
    """The remote backend of one LMCache engine: its event loop thread, its
    connector, naive serde."""

    def __init__(self, cfg, metadata: Metadata, era: int = 3,
                 plugin_name: Optional[str] = None, quiet: bool = False):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.local_cpu_backend = LocalCPUBackend(cfg, metadata)
        self.config = cfg
        self.serializer = NaiveSerializer()
        self.connection = None
        self.error: Optional[Exception] = None
        try:
            self.connection = create_connector(cfg, self.loop, self.local_cpu_backend, metadata,
                                               era, plugin_name)
        except ValueError as e:  # init_connection: logged, the backend goes on without
            if not quiet:
                raise
            self.error = e

    def _run(self, coro) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(
            self.config.blocking_timeout_secs)

    def submit_put_task(self, key, memory_obj: MemoryObj) -> None:
        memory_obj.ref_count_up()
        compressed = self.serializer.serialize(memory_obj)
        memory_obj.ref_count_down()
        self._run(self.connection.put(key, compressed))

    def batched_submit_put_task(self, keys, memory_objs) -> None:
        for o in memory_objs:
            o.ref_count_up()
        compressed = []
        try:
            for o in memory_objs:
                compressed.append(self.serializer.serialize(o))
        finally:
            for o in memory_objs:
                o.ref_count_down()
        self._run(self.connection.batched_put(keys, compressed))

    def batched_contains(self, keys, pin: bool = False) -> int:
        if self.connection is None:
            return 0
        if not self.connection.support_batched_contains():
            n = 0
            for k in keys:
                if not self.connection.exists_sync(k):
                    break
                n += 1
            return n
        return self.connection.batched_contains(keys)

    def get_blocking(self, key) -> Optional[MemoryObj]:
        return self._run(self.connection.get(key))

    def batched_get_blocking(self, keys) -> List[Optional[MemoryObj]]:
        return self._run(self.connection.batched_get(keys))

    def batched_get_non_blocking(self, lookup_id: str, keys) -> List[MemoryObj]:
        """The storage manager's prefetch of keys a lookup found: on the
        backend's loop, bounded by blocking_timeout_secs."""
        if self.connection is None or not self.connection.support_batched_get_non_blocking():
            return []
        return self._run(asyncio.wait_for(
            self.connection.batched_get_non_blocking(lookup_id, keys),
            self.config.blocking_timeout_secs))

    def close(self) -> None:
        if self.connection is not None:
            self._run(self.connection.close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()


def create_storage_backends(cfg, metadata: Metadata) -> Dict[str, RemoteBackend]:
    """The newest CreateStorageBackends' remote part: a backend per plugin,
    then one for remote_url; a backend whose connector could not be made
    stays, without one."""
    backends: Dict[str, RemoteBackend] = {}
    for name in cfg.remote_storage_plugins or ():
        backends["RemoteBackend-%s" % name] = RemoteBackend(cfg, metadata, plugin_name=name,
                                                            quiet=True)
    if cfg.remote_url is not None:
        backends["RemoteBackend"] = RemoteBackend(cfg, metadata, quiet=True)
    return backends


def storage_manager_batched_contains(backends: Dict[str, Any], keys) -> tuple:
    """StorageManager.batched_contains: leading hits, backend after backend."""
    total_keys = len(keys)
    total_hit_chunks = 0
    block_mapping = {}
    for name, backend in backends.items():
        hit_chunks = backend.batched_contains(keys, False)
        if hit_chunks == 0:
            continue
        block_mapping[name] = keys[:hit_chunks]
        total_hit_chunks += hit_chunks
        if total_hit_chunks == total_keys:
            break
        keys = keys[hit_chunks:]
    return total_hit_chunks, block_mapping


__all__ = ["RemoteBackend", "create_storage_backends", "Metadata", "CacheEngineKey", "MemoryObj", "LocalCPUBackend",
           "config", "storage_manager_batched_contains"]
