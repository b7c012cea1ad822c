# SPDX-License-Identifier: MIT
"""A vLLM v1 KV connector backed by the node's kvcached.

Load it with::

    --kv-transfer-config '{"kv_connector": "KvcacheConnector",
                           "kv_connector_module_path": "kvcache.vllm",
                           "kv_role": "kv_both",
                           "kv_load_failure_policy": "recompute"}'

vLLM-Ascend users keep their connector's name and add the module path:
``"kv_connector": "AscendStoreConnector"`` (or ``"MooncakeConnectorStoreV1"``)
with ``"kv_connector_module_path": "kvcache.vllm"`` runs this connector with
vLLM-Ascend's defaults and ``kv_connector_extra_config`` keys.

Keys are ``kvcache.keys`` keys: the model, the KV cache dtype, the layout,
the tokens per block and the rank beside vLLM's block hash (set
``PYTHONHASHSEED`` the same in every instance, and preferably
``--prefix-caching-hash-algo sha256_cbor``, so that instances agree on
hashes).  An object holds one block of every layer of one rank, each layer's
K then V in vLLM's logical order (tokens, heads, dims): an HND cache, or one
whose attention kernels split a block into several rows, stores the same
bytes as an NHD one, so engines of either kind share the pool.

How it works, in vLLM's terms:

* scheduler: ``get_num_new_matched_tokens`` asks kvcached directly (one
  ``batch_exists`` over every rank's keys, no worker round trip) how many
  leading blocks all ranks have; a full hit is reduced by one token so the
  engine computes the last one.  The objects it finds are leased by that
  lookup (``--default-kv-lease-ttl``, 10 s), so eviction does not take them
  before the load.  ``request_finished`` hands the request's full blocks to
  the workers to store and keeps them allocated until the workers report
  them stored; it announces them to kvcached at once, so that a decode
  instance asking for them before the store lands waits for it instead of
  missing (PD disaggregation through the pool).  A request aborted while
  its blocks are still loading is not stored (its blocks hold no KV yet).
* worker: loads run in ``start_load_kv`` (or on the connector's thread with
  ``load_async``, reported through ``get_finished``; or layer by layer in
  ``wait_for_layer_load`` with ``use_layerwise``); stores run on the
  connector's thread and are reported through ``get_finished``.  A block that
  could not be loaded is reported by ``get_block_ids_with_load_errors``: set
  ``kv_load_failure_policy`` to ``recompute`` so that vLLM computes it
  instead of failing the request.
* observability: ``get_kv_connector_stats`` (lookups, hit tokens, blocks and
  bytes loaded and stored, seconds, errors) and, with
  ``--kv-events-config``, ``BlockStored`` events for what was stored.

The engine-independent work (keys, lookup across ranks, block <-> object,
layer offsets) is ``kvcache.engine``; this module is the part that speaks
vLLM's interface.  vLLM is not installed where the test suite runs: the
suite drives this class through ``tests/python/vllm_harness.py``, a
transcription of vLLM's scheduler and model runner calls, and
``kvcache-ttft`` drives it with a real model.  docs/python.rst lists every
``kv_connector_extra_config`` key.
"""

from __future__ import annotations

import enum
import importlib
import importlib.util
import logging
import math
import os
import queue
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Optional, Sequence, Set, Tuple

from . import _kvcache
from .engine import BlockStore, HeadSplitStore, KVLayout
from .keys import KeySpec

log = logging.getLogger("kvcache.vllm")

# vLLM's names, where its newest layout keeps them (vllm/backends/...)
# and where it kept them before (vllm/distributed/..., re-exported there)
_V1 = ("vllm.backends.distributed.kv_transfer.kv_connector.v1.",
       "vllm.distributed.kv_transfer.kv_connector.v1.")
_EVENTS = ("vllm.backends.distributed.kv_events", "vllm.distributed.kv_events")


def _from_vllm(modules: Sequence[str], *names: str) -> Optional[List[Any]]:
    """names from the first of modules that has them all, or None."""
    for m in modules:
        try:
            mod = importlib.import_module(m)
        except ImportError:
            continue
        if all(hasattr(mod, n) for n in names):
            return [getattr(mod, n) for n in names]
    return None


def _vllm_installed() -> bool:
    try:
        return importlib.util.find_spec("vllm") is not None
    except (ImportError, ValueError):
        return False


_base = _from_vllm([v + "base" for v in _V1], "KVConnectorBase_V1", "KVConnectorMetadata",
                   "KVConnectorRole")
if _base is None and _vllm_installed():
    # a stand-in base would be loaded by vLLM and fail there (its workers
    # assert the connector is a KVConnectorBase): say so now
    raise ImportError("kvcache.vllm: vLLM is installed, but its KV connector base class is "
                      "in neither %s: a vLLM this adapter does not know"
                      % " nor ".join(v + "base" for v in _V1))
if _base is not None:  # the real base classes, when vLLM is there
    KVConnectorBase_V1, KVConnectorMetadata, KVConnectorRole = _base
    HAVE_VLLM = True
else:  # the same shape, for use and tests without vLLM
    HAVE_VLLM = False

    class KVConnectorRole(enum.Enum):  # type: ignore[no-redef]
        SCHEDULER = 0
        WORKER = 1

    class KVConnectorMetadata:  # type: ignore[no-redef]
        pass

    class KVConnectorBase_V1:  # type: ignore[no-redef]  # noqa: N801
        """vLLM's base class as its scheduler and workers use it, with its
        defaults (vllm/backends/distributed/kv_transfer/kv_connector/v1/
        base.py @055e47c2)."""

        def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any = None):
            self._connector_metadata = None
            self._vllm_config = vllm_config
            self._kv_transfer_config = vllm_config.kv_transfer_config
            self._kv_cache_config = kv_cache_config
            self._role = role
            self.use_eagle_prefix_cache_hashing = False

        def set_eagle_prefix_cache_hashing(self, enabled: bool) -> None:
            self.use_eagle_prefix_cache_hashing = enabled

        def bind_connector_metadata(self, connector_metadata: Any) -> None:
            self._connector_metadata = connector_metadata

        def clear_connector_metadata(self) -> None:
            self._connector_metadata = None

        def _get_connector_metadata(self) -> Any:
            return self._connector_metadata

        def has_connector_metadata(self) -> bool:
            return self._connector_metadata is not None

        @property
        def role(self) -> Any:
            return self._role

        # called on every connector, with these defaults
        supports_divergent_local_hybrid_hits = False

        def bind_gpu_block_pool(self, block_pool: Any) -> None:
            return None

        def on_new_request(self, request: Any) -> None:
            return None

        def has_pending_push_work(self) -> bool:
            return False

        def reset_cache(self) -> Optional[bool]:
            return None

        def get_finished_count(self) -> Optional[int]:
            return None

        def set_host_xfer_buffer_ops(self, copy_operation: Any) -> None:
            return None

        def build_connector_worker_meta(self) -> Any:
            return None

_got = _from_vllm([v + "base" for v in _V1], "SupportsHMA")
if _got is not None:
    (SupportsHMA,) = _got
else:
    class SupportsHMA:  # type: ignore[no-redef]
        pass

_got = _from_vllm([v + "metrics" for v in _V1], "KVConnectorStats")
if _got is not None:
    (KVConnectorStats,) = _got
else:
    @dataclass
    class KVConnectorStats:  # type: ignore[no-redef]
        data: Dict[str, Any] = field(default_factory=dict)

_got = _from_vllm(_EVENTS, "BlockStored", "KVConnectorKVEvents", "KVEventAggregator")
MEDIUM_CPU = (_from_vllm(_EVENTS, "MEDIUM_CPU") or ["CPU"])[0]  # host memory
if _got is not None:
    BlockStored, KVConnectorKVEvents, KVEventAggregator = _got
else:
    from collections import Counter

    class BlockStored:  # type: ignore[no-redef]
        """vLLM's event, field for field (vllm/distributed/kv_events.py)."""

        def __init__(self, block_hashes, parent_block_hash, token_ids, block_size, lora_id,
                     medium, lora_name=None, extra_keys=None, group_idx=None):
            self.block_hashes = list(block_hashes)
            self.parent_block_hash = parent_block_hash
            self.token_ids = list(token_ids)
            self.block_size = block_size
            self.lora_id = lora_id
            self.medium = medium
            self.lora_name = lora_name
            self.extra_keys = extra_keys
            self.group_idx = group_idx

        def _fields(self) -> tuple:
            return (tuple(self.block_hashes), self.parent_block_hash, tuple(self.token_ids),
                    self.block_size, self.lora_id, self.medium, self.lora_name, self.group_idx)

        def __eq__(self, other: Any) -> bool:
            return isinstance(other, BlockStored) and self._fields() == other._fields()

        def __hash__(self) -> int:
            return hash(self._fields())

    class KVConnectorKVEvents:  # type: ignore[no-redef]
        def merge(self, other: Any) -> Any:
            self.add_events(other.get_all_events())
            return self

    class KVEventAggregator:  # type: ignore[no-redef]
        """Events every worker reported (vllm/distributed/kv_events.py)."""

        def __init__(self, num_workers: int) -> None:
            if num_workers <= 0:
                raise ValueError("num_workers must be positive")
            self._counter: Counter = Counter()
            self._num_workers = num_workers

        def add_events(self, events: List[Any]) -> None:
            self._counter.update(events)

        def get_common_events(self) -> List[Any]:
            return [e for e, n in self._counter.items() if n == self._num_workers]

        def get_all_events(self) -> List[Any]:
            return list(self._counter.elements())

        def clear_events(self) -> None:
            self._counter.clear()

        def increment_workers(self, count: int = 1) -> None:
            self._num_workers += count

        def reset_workers(self) -> None:
            self._num_workers = 1

        def get_number_of_workers(self) -> int:
            return self._num_workers


# ---- kv_connector_extra_config ----

_BOOL_KEYS = ("load_async", "use_layerwise", "consumer_is_to_put", "consumer_is_to_load",
              "save_decode_cache")
# Keys of vLLM-Ascend's and Mooncake's connectors for machinery kvcache does
# not need: accepted, and the log says so once.
_NOT_NEEDED = {
    "lookup_rpc_port": "the scheduler asks kvcached itself, with no lookup server",
    "mooncake_rpc_port": "the scheduler asks kvcached itself, with no lookup server",
    "register_buffer": "the KV cache is always registered",
    "enable_cross_layers_blocks": "per-layer caches are used; objects are the same",
    "h2d_stagger_us": "layer loads copy from kvcached's memory as each layer is needed",
    "layerwise_max_transfer_blocks": "layer loads are not batched by a transfer engine",
    "layerwise_max_transfer_bytes": "layer loads are not batched by a transfer engine",
    "layerwise_prefetch_layers": "every block of a step is held in view before its layers load",
    "layerwise_num_shared_buffers": "layer loads copy straight into the KV cache",
    "layerwise_independent_layers": "layer loads copy straight into the KV cache",
}


def retention_interval() -> Optional[int]:
    """vLLM's ``VLLM_PREFIX_CACHE_RETENTION_INTERVAL`` (tokens; None when
    unset), read as vLLM-Ascend's pool scheduler reads it: from vllm.envs,
    else (no vLLM) from the environment."""
    if _vllm_installed():  # (a vLLM that does not know it: None)
        envs = _from_vllm(("vllm.foundation.system.envs", "vllm.envs"),
                          "VLLM_PREFIX_CACHE_RETENTION_INTERVAL")
        value = envs[0] if envs else None
    else:
        raw = os.environ.get("VLLM_PREFIX_CACHE_RETENTION_INTERVAL", "")
        try:
            value = int(raw) if raw else None
        except ValueError:
            value = None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _flag(v: Any) -> bool:
    if isinstance(v, str):
        return v.strip().lower() in ("1", "true", "yes", "on")
    return bool(v)


def _extra(vllm_config: Any) -> Dict[str, Any]:
    ktc = vllm_config.kv_transfer_config
    return dict(getattr(ktc, "kv_connector_extra_config", None) or {})


class Options:
    """``kv_connector_extra_config``, checked: every key does what it does in
    the connector that defined it, is logged as not needed here, or is
    refused with a reason."""

    def __init__(self, vllm_config: Any, defaults: Dict[str, bool]):
        extra = _extra(vllm_config)
        pc = vllm_config.parallel_config
        mla = bool(getattr(vllm_config.model_config, "use_mla", False))
        role = getattr(vllm_config.kv_transfer_config, "kv_role", None) or "kv_both"
        self.socket: Optional[str] = extra.pop("socket", None)
        extra.pop("cache_prefix", None)  # (key_spec: the reuse domain)
        self.transfer = extra.pop("transfer", "pointers")
        if self.transfer not in ("pointers", "torch"):
            raise ValueError("kv_connector_extra_config transfer: 'pointers' or 'torch', not %r"
                             % (self.transfer,))
        for k in _BOOL_KEYS:
            setattr(self, k, _flag(extra.pop(k, defaults[k])))
        layout = extra.pop("kv_layout", None)
        if layout is not None:
            if str(layout).upper() not in ("NHD", "HND"):
                raise ValueError("kv_connector_extra_config kv_layout: NHD or HND, not %r"
                                 % (layout,))
            log.info("kv_layout %s: objects hold blocks in vLLM's logical order whatever the "
                     "cache's layout, so engines of either layout share them", layout)
        backend = str(extra.pop("backend", "mooncake")).lower()
        if backend not in ("mooncake", "kvcache"):
            raise ValueError("kv_connector_extra_config backend %r: kvcache.vllm is the pool "
                             "(as backend 'mooncake'); remove the key or set 'mooncake'"
                             % backend)
        discard = extra.pop("discard_partial_chunks", True)
        if not _flag(discard):
            log.warning("discard_partial_chunks false: kvcache stores whole blocks only; a "
                        "partial last block is computed again")
        # Prefill and decode of different shapes (vLLM-Ascend's PD keys).
        # Of different TP sizes, the pool's keys go by the larger: a rank of
        # the smaller holds each block as ``head_groups`` objects, each the
        # bytes (its heads' share) a rank of the larger holds
        tp = int(getattr(pc, "tensor_parallel_size", 1))
        pp = int(getattr(pc, "pipeline_parallel_size", 1))
        self.key_tp, self.head_groups = tp, 1
        peer_key = "prefill_tp_size" if role == "kv_consumer" else "decode_tp_size"
        for key in ("prefill_tp_size", "decode_tp_size"):
            v = extra.pop(key, None)
            if v is None or key != peer_key or int(v) == tp or mla:
                continue
            peer = int(v)
            if peer <= 0 or max(peer, tp) % min(peer, tp):
                raise ValueError(
                    "kv_connector_extra_config %s=%s with tensor parallelism %d here: one TP "
                    "size must be a multiple of the other, for a rank's KV heads to be whole "
                    "head groups of the other's" % (key, v, tp))
            self.key_tp = max(peer, tp)
            self.head_groups = self.key_tp // tp
        ppp = extra.pop("prefill_pp_size", None)
        partition = extra.pop("prefill_pp_layer_partition", None)
        if ppp is not None and int(ppp) != pp and role == "kv_consumer" and self.consumer_is_to_put:
            raise ValueError(
                "kv_connector_extra_config prefill_pp_size=%s with pipeline parallelism %d "
                "here: kvcache keys a block per pipeline stage, so a decode does not store "
                "for a prefill of another PP size; run both with the same PP size" % (ppp, pp))
        if partition is not None and (ppp is None or int(ppp) == pp):
            log.info("prefill_pp_layer_partition %r: the pipeline stages are the same here "
                     "as on the prefill, nothing to split", partition)
        for k in list(extra):
            if k in _NOT_NEEDED:
                log.info("kv_connector_extra_config %s: not needed (%s)", k, _NOT_NEEDED[k])
                extra.pop(k)
        for k in sorted(extra):
            log.warning("kv_connector_extra_config %s: not a key kvcache.vllm knows; it has no "
                        "effect (docs/python.rst lists the keys)", k)


# ---- geometry ----

def block_sizes(vllm_config: Any, kv_cache_config: Any = None) -> Tuple[int, int]:
    """(scheduler block size, hash block size) in tokens: vLLM's
    ``resolve_kv_cache_block_sizes`` where vLLM is there, else its rule for
    one KV cache group (``block_size * decode_context_parallel_size``)."""
    groups = list(getattr(kv_cache_config, "kv_cache_groups", None) or ())
    if len(groups) > 1:
        raise ValueError("kvcache.vllm stores models with one KV cache group; this model has "
                         "%d (a hybrid model)" % len(groups))
    if kv_cache_config is not None:
        try:
            from vllm.v1.core.kv_cache_utils import (  # type: ignore
                resolve_kv_cache_block_sizes,
            )
            return tuple(resolve_kv_cache_block_sizes(kv_cache_config, vllm_config))
        except ImportError:
            pass
    dcp = int(getattr(vllm_config.parallel_config, "decode_context_parallel_size", 1) or 1)
    bs = int(vllm_config.cache_config.block_size) * dcp
    return bs, bs


def key_spec(vllm_config: Any, tp_rank: int = 0, pp_rank: int = 0, pcp_rank: int = 0,
             kv_cache_config: Any = None, tp_size: Optional[int] = None) -> KeySpec:
    """The key spec of one rank, from vLLM's configuration alone (the
    scheduler has no tensors to look at); ``tp_size``: the TP size the
    keys go by, when not this instance's."""
    mc = vllm_config.model_config
    cc = vllm_config.cache_config
    pc = vllm_config.parallel_config
    dtype = getattr(cc, "cache_dtype", "auto") or "auto"
    if dtype == "auto":
        dtype = str(getattr(mc, "dtype", "auto")).replace("torch.", "")
    mla = bool(getattr(mc, "use_mla", False))
    # kv_connector_extra_config cache_prefix, as vLLM's Mooncake store
    # connector takes it: a reuse domain before the model's name (operators
    # set the weights' identity, so that other weights under the same name
    # never share blocks)
    prefix = _extra(vllm_config).get("cache_prefix")
    model = str(mc.model).rstrip("/")
    if prefix not in (None, ""):
        model = "%s@%s" % (prefix, model)
    return KeySpec(model, dtype, "vllm-NHD",
                   block_sizes(vllm_config, kv_cache_config)[0],
                   tp_rank, tp_size or int(getattr(pc, "tensor_parallel_size", 1)), pp_rank,
                   int(getattr(pc, "pipeline_parallel_size", 1)), shared_across_ranks=mla,
                   cp_rank=pcp_rank,
                   cp_size=int(getattr(pc, "prefill_context_parallel_size", 1) or 1))


def worker_ranks(vllm_config: Any) -> Tuple[int, int, int]:
    """(tp, pp, pcp) rank of this worker: vLLM's process groups where they
    are set up, else ``parallel_config.rank``."""
    pc = vllm_config.parallel_config
    tp = int(getattr(pc, "tensor_parallel_size", 1))
    pp = int(getattr(pc, "pipeline_parallel_size", 1))
    pcp = int(getattr(pc, "prefill_context_parallel_size", 1) or 1)
    try:
        from vllm.distributed import get_pp_group, get_tensor_model_parallel_rank  # type: ignore
        tp_rank = get_tensor_model_parallel_rank()
        pp_rank = get_pp_group().rank_in_group
        pcp_rank = 0
        if pcp > 1:
            from vllm.distributed import get_pcp_group  # type: ignore
            pcp_rank = get_pcp_group().rank_in_group
        return tp_rank, pp_rank, pcp_rank
    except Exception:  # noqa: BLE001 - no vLLM, or its groups are not set up here
        rank = int(getattr(pc, "rank", 0))
        return rank % tp, (rank // tp) % pp, (rank // (tp * pp)) % pcp


def _block_ids(blocks: Any) -> List[int]:
    """vLLM's KVCacheBlocks (first group), a tuple of groups, or a plain list."""
    if hasattr(blocks, "get_block_ids"):
        blocks = blocks.get_block_ids()
    if isinstance(blocks, tuple) and blocks and isinstance(blocks[0], (list, tuple)):
        return list(blocks[0])
    return list(blocks)


# ---- metadata, stats, events ----

@dataclass
class BlockJob:
    req_id: str
    hashes: List[bytes]
    block_ids: List[int]
    parent: Optional[bytes] = None
    token_ids: Optional[List[int]] = None  # for BlockStored events


@dataclass
class KvcacheConnectorMetadata(KVConnectorMetadata):  # type: ignore[misc]
    loads: List[BlockJob] = field(default_factory=list)
    saves: List[BlockJob] = field(default_factory=list)
    preempted: Set[str] = field(default_factory=set)


_STAT_FIELDS = ("lookups", "lookup_tokens", "hit_tokens", "lookup_seconds",
                "load_blocks", "load_bytes", "load_seconds", "load_errors",
                "save_blocks", "save_bytes", "save_seconds", "save_skipped", "save_errors",
                "lookups_skipped")


@dataclass
class KvcacheConnectorStats(KVConnectorStats):  # type: ignore[misc]
    """What the connector did since the last report: plain numbers, so that
    vLLM can send ``data`` to its logger process."""

    def __post_init__(self) -> None:
        if not self.data:
            self.reset()

    def reset(self) -> None:
        self.data = {k: 0 for k in _STAT_FIELDS}

    def add(self, **kw: float) -> None:
        for k, v in kw.items():
            self.data[k] = self.data.get(k, 0) + v

    def aggregate(self, other: Any) -> "KvcacheConnectorStats":
        for k, v in (getattr(other, "data", None) or {}).items():
            if isinstance(v, (int, float)):
                self.data[k] = self.data.get(k, 0) + v
        return self

    def reduce(self) -> Dict[str, Any]:
        d = self.data
        out: Dict[str, Any] = {
            "Lookups": d.get("lookups", 0),
            "Hit rate": round(d.get("hit_tokens", 0) / d["lookup_tokens"], 4)
            if d.get("lookup_tokens") else 0.0,
            "Blocks loaded": d.get("load_blocks", 0),
            "Blocks stored": d.get("save_blocks", 0),
            "Load errors": d.get("load_errors", 0),
            "Store errors": d.get("save_errors", 0),
        }
        if d.get("lookups_skipped"):
            out["Lookups skipped (short prompts)"] = d["lookups_skipped"]
        for what in ("load", "save"):
            secs = d.get(what + "_seconds", 0)
            out[what.capitalize() + " GB/s"] = round(d.get(what + "_bytes", 0) / secs / 1e9, 3) \
                if secs else 0.0
        return out

    def is_empty(self) -> bool:
        return not any(self.data.get(k) for k in _STAT_FIELDS)

    def take(self) -> Optional["KvcacheConnectorStats"]:
        """This interval's figures (None when nothing happened); starts the next."""
        if self.is_empty():
            return None
        out = KvcacheConnectorStats(data=dict(self.data))
        self.reset()
        return out


class KvcacheKVEvents(KVConnectorKVEvents):  # type: ignore[misc]
    """Stored-block events of the workers: only what every worker stored
    reaches vLLM's publisher."""

    def __init__(self, num_workers: int) -> None:
        self._aggregator = KVEventAggregator(num_workers)

    def add_events(self, events: List[Any]) -> None:
        self._aggregator.add_events(events)

    def aggregate(self) -> "KvcacheKVEvents":
        common = self._aggregator.get_common_events()
        self._aggregator.clear_events()
        self._aggregator.add_events(common)
        self._aggregator.reset_workers()
        return self

    def increment_workers(self, count: int = 1) -> None:
        self._aggregator.increment_workers(count)

    def get_all_events(self) -> List[Any]:
        return self._aggregator.get_all_events()

    def get_number_of_workers(self) -> int:
        return self._aggregator.get_number_of_workers()

    def clear_events(self) -> None:
        self._aggregator.clear_events()
        self._aggregator.reset_workers()


# ---- the connector ----

def _physical_layers(names: List[str]) -> Tuple[Dict[str, int], List[List[int]]]:
    """The registered caches grouped by model layer (``layers.<n>``, MTP
    layers after the others; a name without a layer number on its own), in
    the order their layers first appear: vLLM-Ascend registers a sparse
    attention layer's indexer cache under a name of its own
    (``...layers.<n>....indexer.k_cache``) that the forward never passes to
    ``wait_for_layer_load``."""
    keys: Dict[Any, int] = {}
    groups: List[List[int]] = []
    of: Dict[str, int] = {}
    for i, name in enumerate(names):
        mtp = re.search(r"(?:^|\.)mtp(?:\.layers)?\.(\d+)(?:\.|$)", name)
        m = re.search(r"layers\.(\d+)", name)
        key = ("mtp", int(mtp.group(1))) if mtp else ("layers", int(m.group(1))) if m \
            else ("name", name)
        if key not in keys:
            keys[key] = len(groups)
            groups.append([])
        groups[keys[key]].append(i)
        of[name] = keys[key]
    return of, groups


class KvcacheConnector(KVConnectorBase_V1, SupportsHMA):  # type: ignore[misc]
    """vLLM v1 connector over kvcached (see the module's text)."""

    # vLLM's base sets it where EAGLE prefix-cache hashing exists; where it
    # does not (vLLM with has_sync_kv_loads, 00f4240), every hash publishes
    use_eagle_prefix_cache_hashing = False

    # kv_connector_extra_config defaults: kvcache is a shared pool, so a
    # decode instance (kv_consumer) loads from it, loads do not hold up the
    # step, and what a request generated is stored too
    DEFAULTS = {"load_async": True, "use_layerwise": False, "consumer_is_to_put": False,
                "consumer_is_to_load": True, "save_decode_cache": True}
    # vLLM-Ascend's pool scheduler looks nothing up for a prompt shorter than
    # twice VLLM_PREFIX_CACHE_RETENTION_INTERVAL (unless layerwise)
    SHORT_PROMPTS_SKIP_LOOKUP = False

    def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any = None):
        try:
            super().__init__(vllm_config, role, kv_cache_config)
        except TypeError:  # vLLM versions with the two-argument base
            super().__init__(vllm_config, role)
        self._config = vllm_config
        self._kvc_cache_config = kv_cache_config
        self._is_scheduler = getattr(role, "name", str(role)).endswith("SCHEDULER")
        self.options = Options(vllm_config, self.DEFAULTS)
        ktc = vllm_config.kv_transfer_config
        self.kv_role = getattr(ktc, "kv_role", None) or "kv_both"
        self.load_async = self.options.load_async
        self.use_layerwise = self.options.use_layerwise
        self.transfer = self.options.transfer
        self.retention_interval = retention_interval() if self.SHORT_PROMPTS_SKIP_LOOKUP \
            else None
        self.block_size, self.hash_block_size = block_sizes(vllm_config, kv_cache_config)
        if self.block_size % self.hash_block_size:
            raise ValueError("block size %d is not a multiple of the hash block size %d"
                             % (self.block_size, self.hash_block_size))
        self.num_blocks = getattr(kv_cache_config, "num_blocks", None) or \
            getattr(vllm_config.cache_config, "num_gpu_blocks", None)
        tp_rank, pp_rank, pcp_rank = (0, 0, 0) if self._is_scheduler else worker_ranks(vllm_config)
        self.client = _kvcache.Client(self.options.socket)
        groups = self.options.head_groups
        spec = key_spec(vllm_config, tp_rank * groups, pp_rank, pcp_rank, kv_cache_config,
                        self.options.key_tp)
        self.store = BlockStore(self.client, spec, transfer=self.transfer) \
            if groups == 1 or self._is_scheduler else \
            HeadSplitStore(self.client, spec, groups)
        events = getattr(vllm_config, "kv_events_config", None)
        self._events_on = bool(getattr(events, "enable_kv_cache_events", False))
        self._stats = KvcacheConnectorStats()
        self._stats_lock = threading.Lock()
        # scheduler side
        self._matched: Dict[str, Tuple[int, int, bool]] = {}
        self._loads: List[BlockJob] = []
        self._saves: List[BlockJob] = []
        self._loading: Set[str] = set()  # asynchronous loads not reported done
        self._saving: Set[str] = set()
        self._kv_events: Optional[KvcacheKVEvents] = None
        # worker side
        # layer by layer: the caches of each model layer (its attention's,
        # and a sparse-attention indexer's), in the order the forward asks
        self._layer_group: Dict[str, int] = {}
        self._groups: List[List[int]] = []
        self._layerwise: List[Tuple[BlockJob, Any]] = []
        self._layerwise_next = 0
        self._jobs: "queue.Queue[Optional[Tuple[str, BlockJob]]]" = queue.Queue()
        self._done_lock = threading.Lock()
        self._done_sending: Set[str] = set()
        self._done_recving: Set[str] = set()
        self._pinned: List[int] = []  # segment bases registered with CUDA
        self._pinned_gen = 0          # the client's reconnects when they were
        self._load_errors: Set[int] = set()
        self._stored_events: List[Any] = []
        self._thread: Optional[threading.Thread] = None

    # ---- properties and class hooks vLLM asks for ----
    @property
    def requires_kv_delivery(self) -> bool:
        return False  # a pool is best-effort: a dropped store is a future miss

    @property
    def prefer_cross_layer_blocks(self) -> bool:
        return False

    @classmethod
    def get_required_kvcache_layout(cls, vllm_config: Any) -> Optional[str]:
        return None  # NHD and HND are both stored in logical order

    @classmethod
    def requires_piecewise_for_cudagraph(cls, extra_config: Dict[str, Any]) -> bool:
        return _flag((extra_config or {}).get("use_layerwise", cls.DEFAULTS["use_layerwise"]))

    @classmethod
    def build_kv_connector_stats(cls, data: Optional[Dict[str, Any]] = None
                                 ) -> KvcacheConnectorStats:
        return KvcacheConnectorStats(data=dict(data)) if data is not None \
            else KvcacheConnectorStats()

    def get_kv_connector_stats(self) -> Optional[KvcacheConnectorStats]:
        with self._stats_lock:
            return self._stats.take()

    def _stat(self, **kw: float) -> None:
        with self._stats_lock:
            self._stats.add(**kw)

    # ---- scheduler ----
    def _hashes(self, request: Any) -> List[bytes]:
        """One hash per scheduler block: the last of its hash blocks (vLLM's
        hashes are chained, so that one names the whole prefix)."""
        hashes = list(request.block_hashes)
        scale = self.block_size // self.hash_block_size
        if scale == 1:
            return hashes
        return [hashes[(i + 1) * scale - 1] for i in range(len(hashes) // scale)]

    def _publishable(self, request: Any) -> List[bytes]:
        """With EAGLE prefix-cache hashing, only the hashes vLLM has
        published; without it (kvcache does not ask for it), every hash."""
        hashes = list(request.block_hashes)
        if self.use_eagle_prefix_cache_hashing:
            hashes = hashes[:getattr(request, "num_publishable_block_hashes", 0)]
        scale = self.block_size // self.hash_block_size
        return hashes if scale == 1 else \
            [hashes[(i + 1) * scale - 1] for i in range(len(hashes) // scale)]

    def _loads_here(self) -> bool:
        # a prefill (kv_producer) loads the prefixes the pool has, as
        # vLLM-Ascend's pool connector does: only a kv_consumer may opt out
        return self.kv_role != "kv_consumer" or self.options.consumer_is_to_load

    def _stores_here(self) -> bool:
        return self.kv_role != "kv_consumer" or self.options.consumer_is_to_put

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int
                                   ) -> Tuple[Optional[int], bool]:
        if not self._loads_here():
            return 0, False
        if self.retention_interval is not None and not self.use_layerwise and \
                len(request.prompt_token_ids) < 2 * self.retention_interval:
            self._stat(lookups_skipped=1)
            return 0, False
        hashes = self._hashes(request)
        t0 = time.perf_counter()
        hit = self.store.lookup(hashes) * self.block_size
        self._stat(lookups=1, lookup_tokens=len(hashes) * self.block_size,
                   hit_tokens=hit, lookup_seconds=time.perf_counter() - t0)
        if hit >= request.num_tokens:
            hit = request.num_tokens - 1  # the engine computes the last token
        if hit <= num_computed_tokens:
            self._matched.pop(request.request_id, None)
            return 0, False
        asynchronous = self.load_async and not self.use_layerwise
        self._matched[request.request_id] = (num_computed_tokens, hit, asynchronous)
        return hit - num_computed_tokens, asynchronous

    def update_state_after_alloc(self, request: Any, blocks: Any,
                                 num_external_tokens: int) -> None:
        matched = self._matched.pop(request.request_id, None)
        # decide on num_external_tokens: vLLM may have cut the hit to 0, and
        # calls again with 0 once an asynchronous load is done
        if num_external_tokens <= 0 or matched is None:
            return
        computed, _, asynchronous = matched
        ids = _block_ids(blocks)
        hashes = self._hashes(request)
        start = computed // self.block_size
        end = min(math.ceil((computed + num_external_tokens) / self.block_size), len(ids),
                  len(hashes))
        if end <= start:
            return
        self._loads.append(BlockJob(request.request_id, hashes[start:end], ids[start:end]))
        if asynchronous:
            self._loading.add(request.request_id)

    def build_connector_meta(self, scheduler_output: Any) -> KvcacheConnectorMetadata:
        preempted = set(getattr(scheduler_output, "preempted_req_ids", None) or ())
        meta = KvcacheConnectorMetadata(self._loads, self._saves, preempted)
        self._loads, self._saves = [], []
        return meta

    def request_finished(self, request: Any, block_ids: List[int]
                         ) -> Tuple[bool, Optional[Dict[str, Any]]]:
        rid = request.request_id
        self._matched.pop(rid, None)
        if not self._stores_here():
            return False, None
        if rid in self._loading:
            # aborted while its blocks load: they hold no KV of its own, and
            # vLLM frees them when the load is reported
            return False, None
        hashes = self._publishable(request)
        n = min(len(hashes), len(block_ids),
                getattr(request, "num_computed_tokens", 0) // self.block_size)
        if not self.options.save_decode_cache:
            n = min(n, getattr(request, "num_prompt_tokens", 0) // self.block_size)
        if n <= 0:
            return False, None
        tokens = None
        if self._events_on:
            all_tokens = list(getattr(request, "all_token_ids", None) or ())
            tokens = all_tokens[:n * self.block_size]
        self._saves.append(BlockJob(rid, hashes[:n], list(block_ids[:n]), None, tokens))
        self._saving.add(rid)
        self._announce(hashes[:n])
        return True, None

    def _announce(self, hashes: List[bytes]) -> None:
        """Tell kvcached these blocks are about to be stored: a decode
        instance that looks them up before the workers' stores land waits
        for them (--lookup-wait-ms) instead of missing.  Best effort."""
        keys: List[str] = []
        for spec in self.store.spec.ranks():
            keys += spec.keys(hashes)
        for i in range(0, len(keys), 4096):
            try:
                self.client.announce(keys[i:i + 4096])
            except Exception:  # noqa: BLE001 - an older daemon: lookups just miss
                return

    def request_finished_all_groups(self, request: Any, block_ids: Tuple[List[int], ...]
                                    ) -> Tuple[bool, Optional[Dict[str, Any]]]:
        if len(block_ids) != 1:  # refused at construction; a request without blocks
            self._matched.pop(request.request_id, None)
            return False, None
        return self.request_finished(request, list(block_ids[0]))

    def update_connector_output(self, connector_output: Any) -> None:
        for r in getattr(connector_output, "finished_recving", None) or ():
            self._loading.discard(r)
        for r in getattr(connector_output, "finished_sending", None) or ():
            self._saving.discard(r)
        events = getattr(connector_output, "kv_cache_events", None)
        if isinstance(events, KvcacheKVEvents):
            if self._kv_events is None:
                self._kv_events = events
            else:
                self._kv_events.add_events(events.get_all_events())
                self._kv_events.increment_workers(events.get_number_of_workers())

    def take_events(self) -> Iterable[Any]:
        if self._kv_events is not None:
            self._kv_events.aggregate()
            yield from self._kv_events.get_all_events()
            self._kv_events.clear_events()
            self._kv_events = None

    def has_pending_saves(self) -> bool:
        return bool(self._saves or self._saving)

    # ---- worker ----
    def register_kv_caches(self, kv_caches: Dict[str, Any]) -> None:
        self._layer_group, self._groups = _physical_layers(list(kv_caches))
        values = list(kv_caches.values())
        layout = KVLayout.from_tensors(values, self.num_blocks)
        dev = getattr(layout.segments[0].tensor, "device", None)
        if dev is not None and dev.type != "cpu":
            self.store.transfer = "torch"  # device memory: torch copies it
            if dev.type == "cuda":
                self._pin_segments()
        self.store.attach(layout)
        self._thread = threading.Thread(target=self._run, name="kvcache-connector", daemon=True)
        self._thread.start()

    def _pin_segments(self) -> None:
        """Let device copies DMA straight to and from kvcached's memory."""
        try:
            import torch
            cudart = torch.cuda.cudart()
            self._pinned_gen = self.client.reconnects
            for base, length in self.client.segments():
                cudart.cudaHostRegister(base, length, 0)
                self._pinned.append(base)
        except Exception:  # noqa: BLE001 - pageable copies still work
            pass

    def _repin_if_reconnected(self) -> None:
        """After the daemon restarted (kvcachectl upgrade) the client maps
        its memory again at other addresses: pin those, and let the old
        registrations go (they would keep the old pages pinned)."""
        if not self._pinned or self.client.reconnects == self._pinned_gen:
            return
        try:
            import torch
            cudart = torch.cuda.cudart()
            for base in self._pinned:
                cudart.cudaHostUnregister(base)
        except Exception:  # noqa: BLE001 - already gone with the mapping
            pass
        self._pinned = []
        self._pin_segments()

    def handle_preemptions(self, kv_connector_metadata: Any = None) -> None:
        """Nothing to do: stores read only blocks of finished requests, which
        vLLM keeps until they are reported stored, and a load is done before
        its request runs (vLLM passes this step's metadata; older versions
        a set of request ids)."""

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        meta = self._get_connector_metadata() if self.has_connector_metadata() else None
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

    def has_connector_metadata(self) -> bool:
        return self._connector_metadata is not None

    def wait_for_layer_load(self, layer_name: str) -> None:
        """Every cache of the layer asked for (and of any layer before it
        not asked for), so a sparse-attention indexer's cache, which the
        forward never names, comes with its layer's."""
        group = self._layer_group.get(layer_name)
        if not self._layerwise or group is None:
            return
        self._load_groups(group + 1)

    def _load_groups(self, upto: int) -> None:
        for g in range(self._layerwise_next, upto):
            for layer in self._groups[g]:
                for _, load in self._layerwise:
                    load.load_layer(layer)
        self._layerwise_next = max(self._layerwise_next, upto)
        if self._layerwise_next >= len(self._groups):
            for job, load in self._layerwise:
                self._note_load(job, load.finish(), report=False, seconds=0.0)
            self._layerwise = []
            self._layerwise_next = 0

    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any,
                      **kwargs: Any) -> None:
        pass  # blocks are stored whole when their request finishes

    def wait_for_save(self) -> None:
        # stores run on the connector's thread, reported by get_finished;
        # after the forward, a layer-by-layer load whose last layers were
        # never asked for ends here
        if self._layerwise:
            self._load_groups(len(self._groups))

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

    def get_kv_connector_kv_cache_events(self) -> Optional[KvcacheKVEvents]:
        with self._done_lock:
            events, self._stored_events = self._stored_events, []
        if not events:
            return None
        out = KvcacheKVEvents(num_workers=1)
        out.add_events(events)
        return out

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
                    self._save(job)
            except Exception:  # noqa: BLE001 - a job that raised still reports
                log.exception("kvcache: %s of request %s failed", item[0], item[1].req_id)
                self._failed(*item)
            finally:
                self._jobs.task_done()

    def _failed(self, kind: str, job: BlockJob) -> None:
        with self._done_lock:
            if kind == "load":
                self._load_errors.update(job.block_ids)
                self._done_recving.add(job.req_id)
            else:
                self._done_sending.add(job.req_id)

    def _save(self, job: BlockJob) -> None:
        self._repin_if_reconnected()
        t0 = time.perf_counter()
        skipped0 = self.store.stats["skipped"]
        results = self.store.save(job.hashes, job.block_ids, job.parent)
        self._repin_if_reconnected()  # its first call may have connected again
        ok = sum(1 for r in results if r == 0)
        skipped = self.store.stats["skipped"] - skipped0
        self._stat(save_blocks=ok - skipped, save_skipped=skipped,
                   save_bytes=(ok - skipped) * self.store.layout.block_bytes,
                   save_seconds=time.perf_counter() - t0,
                   save_errors=len(results) - ok)
        with self._done_lock:
            if self._events_on and job.token_ids is not None:
                lead = next((i for i, r in enumerate(results) if r != 0), len(results))
                if lead:
                    self._stored_events.append(BlockStored(
                        block_hashes=list(job.hashes[:lead]), parent_block_hash=job.parent,
                        token_ids=job.token_ids[:lead * self.block_size],
                        block_size=self.block_size, lora_id=None, medium=MEDIUM_CPU,
                        lora_name=None))
            self._done_sending.add(job.req_id)

    def _load(self, job: BlockJob, report: bool) -> None:
        self._repin_if_reconnected()
        t0 = time.perf_counter()
        results = self.store.load(job.hashes, job.block_ids)
        self._repin_if_reconnected()
        self._note_load(job, results, report, time.perf_counter() - t0)

    def _note_load(self, job: BlockJob, results: List[int], report: bool,
                   seconds: float) -> None:
        ok = sum(1 for r in results if r >= 0)
        self._stat(load_blocks=ok, load_bytes=ok * self.store.layout.block_bytes,
                   load_seconds=seconds, load_errors=len(results) - ok)
        with self._done_lock:
            for r, b in zip(results, job.block_ids):
                if r < 0:
                    self._load_errors.add(b)
            if report:
                self._done_recving.add(job.req_id)


class AscendStoreConnector(KvcacheConnector):
    """The same connector under vLLM-Ascend's name, with its defaults: loads
    in the step (``load_async`` false), a decode instance (kv_consumer)
    neither loads nor stores unless ``consumer_is_to_load`` /
    ``consumer_is_to_put`` say so, and only the prompt's blocks are stored
    unless ``save_decode_cache``."""

    DEFAULTS = {"load_async": False, "use_layerwise": False, "consumer_is_to_put": False,
                "consumer_is_to_load": False, "save_decode_cache": False}
    SHORT_PROMPTS_SKIP_LOOKUP = True


MooncakeConnectorStoreV1 = AscendStoreConnector

__all__ = ["KvcacheConnector", "AscendStoreConnector", "MooncakeConnectorStoreV1",
           "KvcacheConnectorMetadata", "KvcacheConnectorStats", "KvcacheKVEvents",
           "BlockJob", "Options", "block_sizes", "key_spec", "retention_interval", "worker_ranks",
           "HAVE_VLLM"]
