# SPDX-License-Identifier: MIT
"""A vLLM v1 KV connector backed by the node's kvcached.

Load it with::

    --kv-transfer-config '{"kv_connector": "KvcacheConnector",
                           "kv_connector_module_path": "kvcache.vllm",
                           "kv_role": "kv_both",
                           "kv_connector_extra_config": {"load_async": true}}'

Keys are ``kvcache.keys`` keys: the model, the KV cache dtype, the layout
(``vllm-<NHD|HND>``), the block size and the rank beside vLLM's block hash
(set ``PYTHONHASHSEED`` the same in every instance, and preferably
``--prefix-caching-hash-algo sha256_cbor``, so that instances agree on
hashes).

How it works, in vLLM's terms:

* scheduler: ``get_num_new_matched_tokens`` asks kvcached directly (one
  ``batch_exists`` over every rank's keys, no worker round trip) how many
  leading blocks all ranks have; a full hit is reduced by one token so the
  engine computes the last one.  ``request_finished`` hands the request's
  publishable full blocks to the workers to store and keeps them allocated
  until the workers report them stored.
* worker: loads run in ``start_load_kv`` (or on the connector's thread with
  ``load_async``, reported through ``get_finished``; or layer by layer in
  ``wait_for_layer_load`` with ``use_layerwise``); stores run on the
  connector's thread and are reported through ``get_finished``.  A block that
  could not be loaded is reported by ``get_block_ids_with_load_errors``.

``kv_connector_extra_config`` keys: ``socket`` (kvcached's socket; default
``$KVCACHE_SOCKET`` and the usual places), ``load_async`` (default true),
``use_layerwise`` (default false), ``kv_layout`` (``NHD``/``HND``, default
``$VLLM_KV_CACHE_LAYOUT`` or ``NHD``), ``transfer`` (``pointers`` or
``torch``; device caches always use ``torch``), and the keys users of
Mooncake's connectors already write, accepted and unused:
``register_buffer``, ``mooncake_rpc_port``, ``lookup_rpc_port``,
``discard_partial_chunks``, ``enable_cross_layers_blocks``.

The engine-independent work (keys, lookup across ranks, block <-> object,
layer offsets) is ``kvcache.engine``; this module is the thin part that
speaks vLLM's interface.  vLLM is not installed where the test suite runs:
the suite drives this class with objects shaped like vLLM's (request,
blocks, config), and ``kvcache-ttft`` drives it with a real model.
"""

from __future__ import annotations

import enum
import math
import os
import queue
import threading
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Set, Tuple

from . import _kvcache
from .engine import BlockStore, KVLayout
from .keys import KeySpec

try:  # the real base class, when vLLM is there
    from vllm.distributed.kv_transfer.kv_connector.v1.base import (  # type: ignore
        KVConnectorBase_V1,
        KVConnectorMetadata,
        KVConnectorRole,
    )
    HAVE_VLLM = True
except ImportError:  # the same shape, for use and tests without vLLM
    HAVE_VLLM = False

    class KVConnectorRole(enum.Enum):  # type: ignore[no-redef]
        SCHEDULER = 0
        WORKER = 1

    class KVConnectorMetadata:  # type: ignore[no-redef]
        pass

    class KVConnectorBase_V1:  # type: ignore[no-redef]  # noqa: N801
        def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any = None):
            self._vllm_config = vllm_config
            self._role = role
            self._kv_transfer_config = vllm_config.kv_transfer_config
            self._connector_metadata = None

        def bind_connector_metadata(self, connector_metadata: Any) -> None:
            self._connector_metadata = connector_metadata

        def clear_connector_metadata(self) -> None:
            self._connector_metadata = None

        def _get_connector_metadata(self) -> Any:
            return self._connector_metadata

        @property
        def role(self) -> Any:
            return self._role

UNUSED_EXTRA_KEYS = ("register_buffer", "mooncake_rpc_port", "lookup_rpc_port",
                     "discard_partial_chunks", "enable_cross_layers_blocks")


@dataclass
class BlockJob:
    req_id: str
    hashes: List[bytes]
    block_ids: List[int]
    parent: Optional[bytes] = None


@dataclass
class KvcacheConnectorMetadata(KVConnectorMetadata):  # type: ignore[misc]
    loads: List[BlockJob] = field(default_factory=list)
    saves: List[BlockJob] = field(default_factory=list)


def _extra(vllm_config: Any) -> Dict[str, Any]:
    ktc = vllm_config.kv_transfer_config
    return dict(getattr(ktc, "kv_connector_extra_config", None) or {})


def _flag(v: Any) -> bool:
    if isinstance(v, str):
        return v.strip().lower() in ("1", "true", "yes", "on")
    return bool(v)


def key_spec(vllm_config: Any, tp_rank: int = 0, pp_rank: int = 0) -> KeySpec:
    """The key spec of one rank, from vLLM's configuration alone (the
    scheduler has no tensors to look at)."""
    extra = _extra(vllm_config)
    mc = vllm_config.model_config
    cc = vllm_config.cache_config
    pc = vllm_config.parallel_config
    dtype = getattr(cc, "cache_dtype", "auto") or "auto"
    if dtype == "auto":
        dtype = str(getattr(mc, "dtype", "auto")).replace("torch.", "")
    layout = extra.get("kv_layout") or os.environ.get("VLLM_KV_CACHE_LAYOUT") or "NHD"
    mla = bool(getattr(mc, "use_mla", False))
    return KeySpec(str(mc.model).rstrip("/"), dtype, "vllm-" + layout, int(cc.block_size),
                   tp_rank, int(getattr(pc, "tensor_parallel_size", 1)), pp_rank,
                   int(getattr(pc, "pipeline_parallel_size", 1)), shared_across_ranks=mla)


def _block_ids(blocks: Any) -> List[int]:
    """vLLM's KVCacheBlocks (first group) or a plain list of ids."""
    if hasattr(blocks, "get_block_ids"):
        ids = blocks.get_block_ids()
        return list(ids[0]) if ids and isinstance(ids[0], (list, tuple)) else list(ids)
    return list(blocks)


class KvcacheConnector(KVConnectorBase_V1):  # type: ignore[misc]
    """vLLM v1 connector over kvcached (see the module's text)."""

    def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any = None):
        try:
            super().__init__(vllm_config, role, kv_cache_config)
        except TypeError:  # vLLM versions with the two-argument base
            super().__init__(vllm_config, role)
        self._config = vllm_config
        self._is_scheduler = getattr(role, "name", str(role)).endswith("SCHEDULER")
        extra = _extra(vllm_config)
        ktc = vllm_config.kv_transfer_config
        self.kv_role = getattr(ktc, "kv_role", None) or "kv_both"
        self.load_async = _flag(extra.get("load_async", True))
        self.use_layerwise = _flag(extra.get("use_layerwise", False))
        self.transfer = extra.get("transfer", "pointers")
        self.block_size = int(vllm_config.cache_config.block_size)
        pc = vllm_config.parallel_config
        tp = int(getattr(pc, "tensor_parallel_size", 1))
        rank = int(getattr(pc, "rank", 0))
        self.client = _kvcache.Client(extra.get("socket"))
        self.store = BlockStore(self.client, key_spec(vllm_config, rank % tp, rank // tp),
                                transfer=self.transfer)
        # scheduler side
        self._matched: Dict[str, Tuple[int, int]] = {}
        self._loads: List[BlockJob] = []
        self._saves: List[BlockJob] = []
        self._saving: Set[str] = set()
        # worker side
        self._layer_names: Dict[str, int] = {}
        self._layerwise: List[Tuple[str, Any]] = []
        self._jobs: "queue.Queue[Optional[Tuple[str, BlockJob]]]" = queue.Queue()
        self._done_lock = threading.Lock()
        self._done_sending: Set[str] = set()
        self._done_recving: Set[str] = set()
        self._load_errors: Set[int] = set()
        self._thread: Optional[threading.Thread] = None

    # ---- properties vLLM asks for ----
    @property
    def requires_kv_delivery(self) -> bool:
        return False  # a pool is best-effort

    @classmethod
    def requires_piecewise_for_cudagraph(cls, extra_config: Dict[str, Any]) -> bool:
        return _flag((extra_config or {}).get("use_layerwise", False))

    # ---- scheduler ----
    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int
                                   ) -> Tuple[Optional[int], bool]:
        if self.kv_role == "kv_producer":
            return 0, False
        hashes = list(request.block_hashes)
        hit = self.store.lookup(hashes) * self.block_size
        if hit >= request.num_tokens:
            hit = request.num_tokens - 1  # the engine computes the last token
        if hit <= num_computed_tokens:
            return 0, False
        self._matched[request.request_id] = (num_computed_tokens, hit)
        return hit - num_computed_tokens, self.load_async and not self.use_layerwise

    def update_state_after_alloc(self, request: Any, blocks: Any,
                                 num_external_tokens: int) -> None:
        matched = self._matched.pop(request.request_id, None)
        if num_external_tokens <= 0 or matched is None:
            return
        computed, hit = matched
        ids = _block_ids(blocks)
        start = computed // self.block_size
        end = min(math.ceil(hit / self.block_size), len(ids), len(request.block_hashes))
        if end <= start:
            return
        self._loads.append(BlockJob(request.request_id, list(request.block_hashes[start:end]),
                                    ids[start:end]))

    def build_connector_meta(self, scheduler_output: Any) -> KvcacheConnectorMetadata:
        meta = KvcacheConnectorMetadata(self._loads, self._saves)
        self._loads, self._saves = [], []
        return meta

    def request_finished(self, request: Any, block_ids: List[int]
                         ) -> Tuple[bool, Optional[Dict[str, Any]]]:
        if self.kv_role == "kv_consumer":
            return False, None
        hashes = list(request.block_hashes)
        n = getattr(request, "num_publishable_block_hashes", len(hashes))
        n = min(n, len(hashes), len(block_ids),
                getattr(request, "num_computed_tokens", len(hashes) * self.block_size)
                // self.block_size)
        if n <= 0:
            return False, None
        self._saves.append(BlockJob(request.request_id, hashes[:n], list(block_ids[:n])))
        self._saving.add(request.request_id)
        return True, None

    def update_connector_output(self, connector_output: Any) -> None:
        for r in getattr(connector_output, "finished_sending", None) or ():
            self._saving.discard(r)

    def has_pending_saves(self) -> bool:
        return bool(self._saves or self._saving)

    # ---- worker ----
    def register_kv_caches(self, kv_caches: Dict[str, Any]) -> None:
        self._layer_names = {name: i for i, name in enumerate(kv_caches)}
        tensors = list(kv_caches.values())
        layout = KVLayout.from_tensors(tensors)
        if getattr(tensors[0], "is_cuda", False):
            self.store.transfer = "torch"
            self._pin_segments()
        self.store.attach(layout)
        self._thread = threading.Thread(target=self._run, name="kvcache-connector", daemon=True)
        self._thread.start()

    def _pin_segments(self) -> None:
        """Let device copies DMA straight to and from kvcached's memory."""
        try:
            import torch
            cudart = torch.cuda.cudart()
            for base, length in self.client.segments():
                cudart.cudaHostRegister(base, length, 0)
        except Exception:  # noqa: BLE001 - pageable copies still work
            pass

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        meta = self._get_connector_metadata()
        if not meta:
            return
        for job in meta.loads:
            if self.use_layerwise:
                self._layerwise.append((job, self.store.begin_load(job.hashes, job.block_ids)))
            elif self.load_async:
                self._jobs.put(("load", job))
            else:
                self._load(job, report=False)
        for job in meta.saves:
            self._jobs.put(("save", job))

    def wait_for_layer_load(self, layer_name: str) -> None:
        if not self._layerwise:
            return
        layer = self._layer_names.get(layer_name)
        if layer is None:
            return
        for _, load in self._layerwise:
            load.load_layer(layer)
        if layer == len(self._layer_names) - 1:
            for job, load in self._layerwise:
                self._note_load(job.req_id, load.finish(), job.block_ids, report=False)
            self._layerwise = []

    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any,
                      **kwargs: Any) -> None:
        pass  # blocks are stored whole when their request finishes

    def wait_for_save(self) -> None:
        pass  # stores run on the connector's thread, reported by get_finished

    def get_finished(self, finished_req_ids: Set[str]
                     ) -> Tuple[Optional[Set[str]], Optional[Set[str]]]:
        with self._done_lock:
            sending, self._done_sending = self._done_sending, set()
            recving, self._done_recving = self._done_recving, set()
        return (sending or None), (recving or None)

    def get_block_ids_with_load_errors(self) -> Set[int]:
        with self._done_lock:
            errors, self._load_errors = self._load_errors, set()
        return errors

    def wait_idle(self) -> None:
        """Until every queued load and store is done (tools and tests)."""
        self._jobs.join()

    def shutdown(self) -> None:
        if self._thread is not None:
            self._jobs.put(None)
            self._thread.join()
            self._thread = None
        for _, load in self._layerwise:
            load.finish()
        self._layerwise = []
        del self.store
        self.client.close()

    # ---- the connector's thread ----
    def _run(self) -> None:
        while True:
            item = self._jobs.get()
            try:
                if item is None:
                    return
                kind, job = item
                if kind == "load":
                    self._load(job, report=True)
                else:
                    self.store.save(job.hashes, job.block_ids)
                    with self._done_lock:
                        self._done_sending.add(job.req_id)
            finally:
                self._jobs.task_done()

    def _load(self, job: BlockJob, report: bool) -> None:
        self._note_load(job.req_id, self.store.load(job.hashes, job.block_ids), job.block_ids,
                        report)

    def _note_load(self, req_id: str, results: List[int], block_ids: List[int],
                   report: bool) -> None:
        with self._done_lock:
            for r, b in zip(results, block_ids):
                if r < 0:
                    self._load_errors.add(b)
            if report:
                self._done_recving.add(req_id)


__all__ = ["KvcacheConnector", "KvcacheConnectorMetadata", "BlockJob", "key_spec",
           "HAVE_VLLM"]
