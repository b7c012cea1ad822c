# SPDX-License-Identifier: MIT
"""vLLM, as far as a KV connector can tell: the calls its scheduler and model
runner make, in their order, with the objects they pass.

Transcribed from vllm-project/vllm at 003df2961dd8830c317a61f9745ccd557da9fa06
(the files that commit has; the others from the versions named):

* ``vllm/v1/request.py``: ``Request`` and ``RequestStatus`` (attributes a
  connector reads: ``block_hashes``, ``num_publishable_block_hashes`` (0
  unless EAGLE prefix-cache hashing publishes), ``num_tokens``,
  ``num_prompt_tokens``, ``num_computed_tokens``, ``all_token_ids``, ...);
* ``vllm/v1/core/kv_cache_utils.py``: chained block hashes at
  ``hash_block_size`` (``resolve_kv_cache_block_sizes``: ``block_size *
  decode_context_parallel_size`` for one group);
* ``vllm/v1/core/kv_cache_manager.py``: ``KVCacheBlocks.get_block_ids()``
  (one list per KV cache group);
* ``vllm/v1/core/sched/scheduler.py``: ``schedule`` (lookup only when
  ``num_computed_tokens == 0``, ``None`` = ask again, no
  ``update_state_after_alloc`` when allocation fails, asynchronous loads in
  WAITING_FOR_REMOTE_KVS and a second ``update_state_after_alloc`` with 0
  after them, ``build_connector_meta`` on every step), ``update_from_output``
  (invalid blocks first, by ``kv_load_failure_policy``; then
  ``update_connector_output`` and the finished-transfer asserts of
  ``_update_from_kv_xfer_finished``; then stats and ``take_events``),
  ``finish_requests`` (an abort of a request still loading keeps its blocks
  until ``finished_recving``), ``_connector_finished`` (``SupportsHMA`` ->
  ``request_finished_all_groups``), ``_preempt_request``;
* ``vllm/v1/worker/kv_connector_model_runner_mixin.py`` and
  ``gpu_model_runner.py`` (000fc94): per step ``handle_preemptions``, bind,
  ``start_load_kv``, per layer ``wait_for_layer_load`` / ``save_kv_layer``,
  ``wait_for_save``, ``get_finished``, ``get_block_ids_with_load_errors``,
  ``get_kv_connector_stats``, ``get_kv_connector_kv_cache_events``, clear;
* ``gpu_model_runner.py`` (4e17906) ``_reshape_kv_cache_tensors``: the KV
  tensors are a raw buffer viewed in the backend's stride order and permuted
  back (HND is a non-contiguous view), with ``kernel_block_size`` rows per
  manager block split; FlashAttention ``(2, blocks, bs, H, D)``, FlashInfer
  ``(blocks, 2, bs, H, D)``, MLA ``(blocks, bs, D)``;
* ``kv_connector_model_runner_mixin.py`` and ``scheduler.py`` after
  2aac565c (vLLM #53333, 2026-08; the shape of 00f4240): the scheduler
  sets ``SchedulerOutput.has_sync_kv_loads`` when a request scheduled in
  the step loads synchronously, and without one the worker calls
  ``start_load_kv`` after the forward instead of before it
  (``Engine(..., loads_after_forward=False)`` for the order before);
  ``KVConnectorBase_V1.__init__`` there sets no
  ``use_eagle_prefix_cache_hashing``;
* ``kv_cache_manager.py`` / ``block_pool.py`` with prefix caching (on,
  as vLLM's default; ``Engine(..., prefix_caching=False)``): full blocks are cached by hash
  as they are allocated (a load's only once it is done when asynchronous),
  a freed block keeps its KV until it is handed out again (the free queue
  takes a request's blocks tail first, and hands out the oldest), a new
  request starts with its cached leading blocks (at most up to its last
  token) and the connector is asked with that local hit
  (``get_num_new_matched_tokens(request, num_new_local_computed_tokens)``);
  blocks a load failed are dropped from the cache;
* ``kv_connector/utils.py`` ``KVOutputAggregator``: a request finishes a
  transfer when every worker reported it;
* ``kv_connector/factory.py``: the class is ``getattr(import_module(
  kv_connector_module_path), kv_connector)``, built with three arguments.

vllm-project/vllm-ascend at 182b75ea84ff13ece27b57391331ef8935410aea,
``vllm_ascend/worker/model_runner_v1.py``: Ascend registers a tuple
``(k_cache, v_cache)`` per layer, each ``(blocks, bs, H, D)`` from its own
allocation (``ascend=True`` below).

The model is a stand-in: it "computes" a token's K and V as a function of
the token, its position, the layer and the head, and samples the next token
from the last one; what matters is that every byte of KV a request ends up
with can be checked against what it would have computed itself.
"""

from __future__ import annotations

import enum
import hashlib
import importlib
import pickle
import time
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Dict, List, Optional, Set

import torch

from kvcache import vllm as kvv


class RequestStatus(enum.IntEnum):
    WAITING = enum.auto()
    WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR = enum.auto()
    WAITING_FOR_REMOTE_KVS = enum.auto()
    WAITING_FOR_STREAMING_REQ = enum.auto()
    RUNNING = enum.auto()
    PREEMPTED = enum.auto()
    FINISHED_STOPPED = enum.auto()
    FINISHED_LENGTH_CAPPED = enum.auto()
    FINISHED_ABORTED = enum.auto()
    FINISHED_IGNORED = enum.auto()
    FINISHED_ERROR = enum.auto()
    FINISHED_REPETITION = enum.auto()

    @staticmethod
    def is_finished(status: "RequestStatus") -> bool:
        return status > RequestStatus.PREEMPTED


NONE_HASH = hashlib.sha256(b"PYTHONHASHSEED=0").digest()


def block_hasher(hash_block_size: int, salt: str = ""):
    """get_request_block_hasher: chained hashes of full hash blocks."""
    def hasher(req: "Request") -> List[bytes]:
        start = len(req.block_hashes) * hash_block_size
        parent = req.block_hashes[-1] if req.block_hashes else NONE_HASH
        out = []
        toks = req._all_token_ids
        while start + hash_block_size <= len(toks):
            extra = (salt,) if salt else None
            parent = hashlib.sha256(pickle.dumps(
                (parent, tuple(toks[start:start + hash_block_size]), extra))).digest()
            out.append(parent)
            start += hash_block_size
        return out
    return hasher


class Request:
    """vllm/v1/request.py @003df, the attributes a connector can read."""

    def __init__(self, request_id: str, prompt_token_ids: List[int], max_tokens: int,
                 hasher=None, cache_salt: Optional[str] = None):
        self.request_id = request_id
        self.client_index = 0
        self.priority = 0
        self.sampling_params = SimpleNamespace(max_tokens=max_tokens, extra_args=None)
        self.pooling_params = None
        self.lora_request = None
        self.status = RequestStatus.WAITING
        self.kv_transfer_params = None
        self.ec_transfer_params = None
        self.kv_cache_report_mode = "incremental"
        self.max_tokens = max_tokens
        self.prompt_token_ids = list(prompt_token_ids)
        self.prompt_embeds = None
        self.num_prompt_tokens = len(prompt_token_ids)
        self._output_token_ids: List[int] = []
        self._all_token_ids: List[int] = list(prompt_token_ids)
        self.num_output_placeholders = 0
        self.num_in_flight_tokens = 0
        self.spec_token_ids: List[int] = []
        self.num_computed_tokens = 0
        self.cache_salt = cache_salt
        self.mm_features: List[Any] = []
        self.output_token_ids = tuple(self._output_token_ids)
        self.all_token_ids = tuple(self._all_token_ids)
        self.num_preemptions = 0
        self.block_hashes: List[bytes] = []
        self.num_publishable_block_hashes = 0
        self._block_hasher = hasher
        self.update_block_hashes()
        self.skip_reading_prefix_cache = False
        self.abort_immediately = False

    def update_block_hashes(self) -> None:
        if self._block_hasher is not None:
            self.block_hashes.extend(self._block_hasher(self))

    def append_output_token_ids(self, token: int) -> None:
        self._output_token_ids.append(token)
        self._all_token_ids.append(token)
        self.output_token_ids = tuple(self._output_token_ids)
        self.all_token_ids = tuple(self._all_token_ids)
        self.update_block_hashes()

    @property
    def num_tokens(self) -> int:
        return len(self._all_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self._output_token_ids)

    def is_finished(self) -> bool:
        return RequestStatus.is_finished(self.status)


@dataclass
class KVCacheBlock:
    block_id: int
    block_hash: Optional[bytes] = None
    is_null: bool = False


@dataclass
class KVCacheBlocks:
    blocks: tuple

    def get_block_ids(self, allow_none: bool = False):
        if allow_none and all(len(g) == 0 for g in self.blocks):
            return None
        return tuple([b.block_id for b in g] for g in self.blocks)

    def get_unhashed_block_ids(self) -> List[int]:
        assert len(self.blocks) == 1, "Only one group is supported"
        return [b.block_id for b in self.blocks[0] if b.block_hash is None]


def config(sock: str, *, role: str = "kv_both", connector: str = "KvcacheConnector",
           model: str = "org/tiny-llama", block_size: int = 16, num_blocks: int = 64,
           tp: int = 1, pp: int = 1, dcp: int = 1, use_mla: bool = False,
           policy: str = "recompute", events: bool = False, dtype=torch.float16,
           **extra: Any) -> SimpleNamespace:
    """A VllmConfig with the fields the connector reads, and the
    KVCacheConfig vLLM passes as the third argument."""
    extra.setdefault("socket", sock)
    ktc = SimpleNamespace(kv_connector=connector, kv_connector_module_path="kvcache.vllm",
                          kv_role=role, kv_connector_extra_config=extra,
                          kv_load_failure_policy=policy, engine_id="e0",
                          is_kv_producer=role in ("kv_producer", "kv_both"),
                          is_kv_consumer=role in ("kv_consumer", "kv_both"))
    vc = SimpleNamespace(
        kv_transfer_config=ktc,
        model_config=SimpleNamespace(model=model, dtype=dtype, use_mla=use_mla),
        cache_config=SimpleNamespace(block_size=block_size, cache_dtype="auto",
                                     num_gpu_blocks=num_blocks, enable_prefix_caching=True,
                                     prefix_match_unit=None),
        parallel_config=SimpleNamespace(tensor_parallel_size=tp, pipeline_parallel_size=pp,
                                        decode_context_parallel_size=dcp,
                                        prefill_context_parallel_size=1, rank=0,
                                        data_parallel_rank=0),
        scheduler_config=SimpleNamespace(disable_hybrid_kv_cache_manager=False),
        kv_events_config=SimpleNamespace(enable_kv_cache_events=events),
        speculative_config=None)
    kcc = SimpleNamespace(num_blocks=num_blocks, kv_cache_groups=[
        SimpleNamespace(kv_cache_spec=SimpleNamespace(block_size=block_size))])
    return SimpleNamespace(vllm=vc, kv_cache=kcc)


def create_connector(cfg: SimpleNamespace, role: Any, rank: int = 0) -> Any:
    """KVConnectorFactory.create_connector: the module path's class, with
    kv_cache_config as the third argument."""
    vc = cfg.vllm
    if rank:
        vc = SimpleNamespace(**vars(vc))
        vc.parallel_config = SimpleNamespace(**vars(cfg.vllm.parallel_config))
        vc.parallel_config.rank = rank
    ktc = vc.kv_transfer_config
    cls = getattr(importlib.import_module(ktc.kv_connector_module_path), ktc.kv_connector)
    return cls(vc, kvv.KVConnectorRole.SCHEDULER if role == "scheduler"
               else kvv.KVConnectorRole.WORKER, cfg.kv_cache)


# ---- the model's KV: what a token's K and V are ----

HEADS, HEAD_DIM, LAYERS = 4, 8, 3
INDEXER, INDEXER_DIM = "model.layers.%d.self_attn.indexer.k_cache", 4


def kv_value(tokens: List[int], pos: int, layer: int, kv: int, heads: int, dim: int,
             dtype, head0: int = 0) -> torch.Tensor:
    """K (kv=0) or V (kv=1) of the token at pos, heads head0.. of the
    model's: depends on the prefix's last token, the position and the head
    (the same prompt gives the same KV, whatever the TP size)."""
    base = (tokens[pos] * 7 + pos * 3 + layer * 11 + kv * 5) % 251
    h = torch.arange(head0, head0 + heads, dtype=torch.float32).view(heads, 1) * 0.25
    d = torch.arange(dim, dtype=torch.float32).view(1, dim) * 0.03125
    return (base / 8.0 + h + d).to(dtype)


def next_token(tokens: List[int]) -> int:
    return (tokens[-1] * 31 + len(tokens)) % 997 + 3


# ---- the model runner ----

class Worker:
    """One rank's model runner: its KV tensors, built as vLLM builds them,
    and the connector calls of a step."""

    def __init__(self, cfg: SimpleNamespace, rank: int = 0, backend: str = "flash_attn",
                 layout: str = "NHD", kernel_block_size: Optional[int] = None,
                 ascend: bool = False, indexer: bool = False):
        vc = cfg.vllm
        self.cfg = cfg
        self.rank = rank
        self.tp = vc.parallel_config.tensor_parallel_size
        self.dcp = vc.parallel_config.decode_context_parallel_size
        self.block_size = vc.cache_config.block_size  # tokens of a physical block here
        self.kbs = kernel_block_size or self.block_size
        self.num_blocks = cfg.kv_cache.num_blocks
        self.dtype = vc.model_config.dtype
        self.mla = vc.model_config.use_mla
        self.heads = 1 if self.mla else max(1, HEADS // self.tp)
        # vLLM shards KV heads by TP rank (a rank's are heads rank*heads..;
        # with fewer heads than ranks each is on tp/HEADS ranks)
        tp_rank = rank % self.tp
        self.head0 = 0 if self.mla else \
            (tp_rank * self.heads if HEADS >= self.tp else tp_rank // (self.tp // HEADS))
        self.backend = backend
        self.layout = layout
        self.ascend = ascend
        self.kv_caches = {"model.layers.%d.self_attn.attn" % i: self._alloc(i)
                          for i in range(LAYERS)}
        # a sparse-attention model on Ascend (model_runner_v1 at 182b75e):
        # each layer's indexer cache, (indexer_k_cache,), under a name of
        # its own, in the same KV cache group (here after every layer's)
        self.indexer = indexer
        self.kinds = (0, 1, 2) if indexer else (0, 1)
        if indexer:
            ratio = self.block_size // self.kbs
            for i in range(LAYERS):
                g = torch.Generator().manual_seed(2000 + i)
                self.kv_caches[INDEXER % i] = (torch.rand(
                    self.num_blocks * ratio, self.kbs, 1, INDEXER_DIM, generator=g)
                    .to(self.dtype),)
        self.connector = create_connector(cfg, "worker", rank)
        self.connector.register_kv_caches(self.kv_caches)
        self.preemptions_seen: List[Any] = []

    def _alloc(self, layer: int):
        ratio = self.block_size // self.kbs
        nb = self.num_blocks * ratio
        g = torch.Generator().manual_seed(1000 + layer)  # stale bytes, not zeros
        if self.ascend:  # K and V from their own allocations
            return tuple(torch.rand(nb, self.kbs, self.heads, HEAD_DIM, generator=g)
                         .to(self.dtype) for _ in range(2))
        if self.mla:
            shape, order = (nb, self.kbs, HEAD_DIM), (0, 1, 2)
        elif self.backend == "flash_attn":
            shape = (2, nb, self.kbs, self.heads, HEAD_DIM)
            order = (0, 1, 2, 3, 4) if self.layout == "NHD" else (0, 1, 3, 2, 4)
        elif self.backend == "hybrid_flash_attn":
            # _update_hybrid_attention_mamba_layout: (2, blocks, ...) re-strided
            # blocks-outermost
            t = torch.rand(nb, 2, self.kbs, self.heads, HEAD_DIM, generator=g).to(self.dtype)
            return t.transpose(0, 1)
        else:  # flashinfer
            shape = (nb, 2, self.kbs, self.heads, HEAD_DIM)
            order = (0, 1, 2, 3, 4) if self.layout == "NHD" else (0, 1, 3, 2, 4)
        phys = tuple(shape[i] for i in order)
        inv = [order.index(i) for i in range(len(order))]
        raw = torch.rand(phys, generator=g).to(self.dtype)
        return raw.view(phys).permute(*inv)

    def _kv_slot(self, layer: int, kv: int, block_id: int, offset: int) -> torch.Tensor:
        """The (heads, dim) view of one token's K or V, by logical index."""
        ratio = self.block_size // self.kbs
        row, off = block_id * ratio + offset // self.kbs, offset % self.kbs
        if kv == 2:
            return self.kv_caches[INDEXER % layer][0][row, off]
        t = self.kv_caches["model.layers.%d.self_attn.attn" % layer]
        if self.ascend:
            return t[kv][row, off]
        if self.mla:
            return t[row, off].view(1, HEAD_DIM) if kv == 0 else None
        if self.backend in ("flash_attn", "hybrid_flash_attn"):
            return t[kv, row, off]
        return t[row, kv, off]

    def _head0(self, kv: int) -> int:
        return 0 if kv == 2 else self.head0  # (an indexer cache has one head)

    def _place(self, block_ids: List[int], pos: int):
        """Where this rank keeps the token at pos, or None (DCP: another rank)."""
        if self.dcp > 1:
            if pos % self.dcp != self.rank % self.dcp:
                return None
            pos //= self.dcp
        return block_ids[pos // self.block_size], pos % self.block_size

    def compute(self, tokens: List[int], block_ids: List[int], start: int, end: int) -> None:
        for pos in range(start, end):
            place = self._place(block_ids, pos)
            if place is None:
                continue
            for layer in range(LAYERS):
                for kv in self.kinds:
                    dst = self._kv_slot(layer, kv, *place)
                    if dst is not None:
                        dst.copy_(kv_value(tokens, pos, layer, kv, dst.shape[0], dst.shape[1],
                                           self.dtype, self._head0(kv)))

    def check(self, tokens: List[int], block_ids: List[int], upto: int) -> List[int]:
        """Positions below upto whose KV here is not what compute() writes."""
        bad = []
        for pos in range(upto):
            place = self._place(block_ids, pos)
            if place is None:
                continue
            for layer in range(LAYERS):
                for kv in self.kinds:
                    got = self._kv_slot(layer, kv, *place)
                    if got is not None and not torch.equal(got, kv_value(
                            tokens, pos, layer, kv, got.shape[0], got.shape[1], self.dtype,
                            self._head0(kv))):
                        bad.append(pos)
        return sorted(set(bad))

    def execute_model(self, so: "SchedulerOutput") -> SimpleNamespace:
        """GPUModelRunner.execute_model with the connector mixin's calls."""
        c = self.connector
        meta = so.kv_connector_metadata
        c.handle_preemptions(meta)
        self.preemptions_seen.append(meta)
        c.bind_connector_metadata(meta)
        # synchronous loads feed this step's forward; asynchronous ones
        # start after it (2aac565c)
        if so.has_sync_kv_loads:
            c.start_load_kv(SimpleNamespace(attn_metadata={}))
        for name in self.kv_caches:
            if not name.endswith(".indexer.k_cache"):  # the attention asks, by its name
                c.wait_for_layer_load(name)
        # the forward: every scheduled token's KV, layer by layer
        for job in so.scheduled:
            self.compute(job.tokens, job.block_ids, job.start, job.end)
        for name, t in self.kv_caches.items():
            c.save_kv_layer(name, t, None)
        if not so.has_sync_kv_loads:
            c.start_load_kv(SimpleNamespace(attn_metadata={}))
        c.wait_for_save()
        worker_meta = c.build_connector_worker_meta()  # (055e47c2)
        sending, recving = c.get_finished(so.finished_req_ids)
        out = SimpleNamespace(finished_sending=sending, finished_recving=recving,
                              invalid_block_ids=c.get_block_ids_with_load_errors(),
                              kv_connector_stats=c.get_kv_connector_stats(),
                              kv_cache_events=c.get_kv_connector_kv_cache_events(),
                              kv_connector_worker_meta=worker_meta)
        c.clear_connector_metadata()
        return out


class KVOutputAggregator:
    """kv_connector/utils.py: a transfer is finished when every worker said so."""

    def __init__(self, expected: int):
        self.expected = expected
        self.send_remaining: Dict[str, int] = {}
        self.recv_remaining: Dict[str, int] = {}

    def aggregate(self, outputs: List[SimpleNamespace]) -> SimpleNamespace:
        finished_sending: Set[str] = set()
        finished_recving: Set[str] = set()
        invalid: Set[int] = set()
        stats = None
        events = None

        def update(ids, remaining, done):
            for r in ids or ():
                left = remaining.get(r, self.expected) - 1
                remaining[r] = left
                if left == 0:
                    done.add(r)
                    del remaining[r]

        for o in outputs:
            update(o.finished_sending, self.send_remaining, finished_sending)
            update(o.finished_recving, self.recv_remaining, finished_recving)
            invalid |= o.invalid_block_ids
            if o.kv_connector_stats is not None:
                stats = o.kv_connector_stats if stats is None else \
                    stats.aggregate(o.kv_connector_stats)
            if o.kv_cache_events is not None:
                if events is None:
                    events = o.kv_cache_events
                else:
                    events.add_events(o.kv_cache_events.get_all_events())
                    events.increment_workers(1)
        return SimpleNamespace(finished_sending=finished_sending or None,
                               finished_recving=finished_recving or None,
                               invalid_block_ids=invalid, kv_connector_stats=stats,
                               kv_cache_events=events)


@dataclass
class Scheduled:
    req_id: str
    tokens: List[int]
    block_ids: List[int]
    start: int
    end: int


@dataclass
class SchedulerOutput:
    scheduled: List[Scheduled]
    num_scheduled_tokens: Dict[str, int]
    finished_req_ids: Set[str]
    preempted_req_ids: Set[str]
    kv_connector_metadata: Any = None
    has_sync_kv_loads: bool = True


class Engine:
    """The scheduler (vllm/v1/core/sched/scheduler.py) and its workers."""

    def __init__(self, cfg: SimpleNamespace, loads_after_forward: bool = True,
                 prefix_caching: bool = True, **worker_kw: Any):
        self.cfg = cfg
        self.loads_after_forward = loads_after_forward
        self.prefix_caching = prefix_caching
        self.cached: Dict[Any, int] = {}      # block hash -> a block holding its KV
        self.block_hash: Dict[int, Any] = {}
        self.refs: Dict[int, int] = {}
        self.local_hit_tokens = 0  # what new requests found in the prefix cache
        vc = cfg.vllm
        # resolve_kv_cache_block_sizes, one KV cache group
        self.block_size = self.hash_block_size = \
            vc.cache_config.block_size * vc.parallel_config.decode_context_parallel_size
        self.policy = vc.kv_transfer_config.kv_load_failure_policy
        self.connector = create_connector(cfg, "scheduler")
        self.connector.bind_gpu_block_pool(SimpleNamespace(blocks=cfg.kv_cache.num_blocks))
        tp, pp = vc.parallel_config.tensor_parallel_size, vc.parallel_config.pipeline_parallel_size
        self.workers = [Worker(cfg, r, **worker_kw) for r in range(tp * pp)]
        self.aggregator = KVOutputAggregator(len(self.workers))
        self.free = list(range(cfg.kv_cache.num_blocks))
        self.req_blocks: Dict[str, List[int]] = {}
        self.requests: Dict[str, Request] = {}
        self.waiting: List[Request] = []
        self.running: List[Request] = []
        self.finished_recving_kv_req_ids: Set[str] = set()
        self.failed_recving_kv_req_ids: Set[str] = set()
        self.finished_req_ids: Set[str] = set()
        self.reset_preempted_req_ids: Set[str] = set()
        self.finished: Dict[str, RequestStatus] = {}
        self.stats: List[Dict[str, Any]] = []
        self.events: List[Any] = []
        self.aborts: List[str] = []
        self.kv_at_finish: Dict[str, List[int]] = {}
        self.step_hook = None

    # -- requests --
    def add_request(self, rid: str, prompt: List[int], max_tokens: int = 4,
                    salt: str = "") -> Request:
        req = Request(rid, prompt, max_tokens, block_hasher(self.hash_block_size, salt))
        self.requests[rid] = req
        self.waiting.append(req)
        self.connector.on_new_request(req)  # (055e47c2: add_request tells the connector)
        return req

    def abort(self, rid: str) -> None:
        """Queued like EngineCore's aborts: applied before update_from_output."""
        self.aborts.append(rid)

    def has_requests(self) -> bool:
        num_in_queues = len(self.waiting) + len(self.running)
        return bool(num_in_queues or self.finished_req_ids or len(self.requests) > num_in_queues)

    # -- blocks --
    def _allocate(self, req: Request, num_tokens: int) -> bool:
        blocks = self.req_blocks.setdefault(req.request_id, [])
        per_rank = -(-num_tokens // self.workers[0].dcp) if self.workers[0].dcp > 1 else num_tokens
        need = -(-per_rank // self.workers[0].block_size) - len(blocks)
        if need > len(self.free):
            return False
        for _ in range(max(0, need)):
            b = self.free.pop(0)
            self._uncache(b)  # handed out again: its KV goes
            self.refs[b] = 1
            blocks.append(b)
        return True

    def _free_request_blocks(self, req: Request) -> None:
        blocks = self.req_blocks.pop(req.request_id, [])
        if not self.prefix_caching:
            self.free += blocks
            return
        for b in reversed(blocks):  # the tail goes first
            self.refs[b] -= 1
            if self.refs[b] == 0:
                self.free.append(b)

    # -- the prefix cache --
    def _uncache(self, b: int) -> None:
        h = self.block_hash.pop(b, None)
        if h is not None and self.cached.get(h) == b:
            del self.cached[h]

    def _cache_blocks(self, req: Request, num_tokens: int) -> None:
        """The request's full blocks up to num_tokens, by hash."""
        if not self.prefix_caching:
            return
        ids = self.req_blocks.get(req.request_id, [])
        for i, h in enumerate(req.block_hashes[:min(num_tokens // self.block_size, len(ids))]):
            if h not in self.cached and ids[i] not in self.block_hash:
                self.cached[h] = ids[i]
                self.block_hash[ids[i]] = h

    def _local_hit(self, req: Request) -> List[int]:
        """get_computed_blocks: the cached leading blocks, short of the
        last token (one KV cache group, no context parallelism)."""
        if not self.prefix_caching:
            return []
        hit = []
        for h in req.block_hashes[:(req.num_tokens - 1) // self.block_size]:
            b = self.cached.get(h)
            if b is None:
                break
            hit.append(b)
        return hit

    def _allocate_with_hit(self, req: Request, hit: List[int], num_tokens: int) -> bool:
        """allocate_slots with new computed blocks: nothing changes if the
        rest does not fit."""
        reusable = sum(1 for b in hit if self.refs.get(b, 0) == 0)
        need = -(-num_tokens // self.workers[0].block_size) - len(hit)
        if need > len(self.free) - reusable:
            return False
        for b in hit:
            if self.refs.get(b, 0) == 0:
                self.free.remove(b)
            self.refs[b] = self.refs.get(b, 0) + 1
        self.req_blocks[req.request_id] = list(hit)
        return self._allocate(req, num_tokens)

    def _blocks_of(self, req: Request) -> KVCacheBlocks:
        return KVCacheBlocks(([KVCacheBlock(b) for b in self.req_blocks.get(req.request_id, [])],))

    # -- schedule --
    def schedule(self) -> SchedulerOutput:
        scheduled: List[Scheduled] = []
        num_scheduled: Dict[str, int] = {}
        has_sync_kv_loads = not self.loads_after_forward
        for req in list(self.running):
            n = req.num_tokens - req.num_computed_tokens
            while not self._allocate(req, req.num_computed_tokens + n):
                victim = self.running[-1]
                self._preempt_request(victim)
                if victim is req:
                    break
            if req.status != RequestStatus.RUNNING:
                continue
            self._cache_blocks(req, req.num_computed_tokens + n)
            scheduled.append(Scheduled(req.request_id, list(req._all_token_ids),
                                       list(self.req_blocks[req.request_id]),
                                       req.num_computed_tokens, req.num_computed_tokens + n))
            num_scheduled[req.request_id] = n
        still_waiting = []
        for req in self.waiting:
            if req.status == RequestStatus.WAITING_FOR_REMOTE_KVS:
                if req.request_id not in self.finished_recving_kv_req_ids:
                    still_waiting.append(req)
                    continue
                self._update_waiting_for_remote_kv(req)
                req.status = RequestStatus.PREEMPTED if req.num_preemptions \
                    else RequestStatus.WAITING
            load_async = False
            if req.num_computed_tokens == 0:
                hit = self._local_hit(req)
                local = len(hit) * self.block_size
                self.local_hit_tokens += local
                ext, load_async = self.connector.get_num_new_matched_tokens(req, local)
                if ext is None:
                    still_waiting.append(req)
                    continue
                assert not (load_async and ext == 0)
                num_computed = local + ext
                assert num_computed <= req.num_tokens
                if not self._allocate_with_hit(req, hit, req.num_tokens):
                    still_waiting.append(req)  # no update_state_after_alloc
                    continue
                self.connector.update_state_after_alloc(req, self._blocks_of(req), ext)
                has_sync_kv_loads |= ext > 0 and not load_async
                if load_async:
                    self._cache_blocks(req, local)  # the loaded ones once loaded
                    req.status = RequestStatus.WAITING_FOR_REMOTE_KVS
                    req.num_computed_tokens = num_computed
                    still_waiting.append(req)
                    continue
            else:
                num_computed = req.num_computed_tokens
                if not self._allocate(req, req.num_tokens):
                    still_waiting.append(req)
                    continue
                self.connector.update_state_after_alloc(req, self._blocks_of(req), 0)
            req.status = RequestStatus.RUNNING
            req.num_computed_tokens = num_computed
            self.running.append(req)
            n = req.num_tokens - num_computed
            self._cache_blocks(req, num_computed + n)
            scheduled.append(Scheduled(req.request_id, list(req._all_token_ids),
                                       list(self.req_blocks[req.request_id]), num_computed,
                                       num_computed + n))
            num_scheduled[req.request_id] = n
        self.waiting = still_waiting
        so = SchedulerOutput(scheduled, num_scheduled, set(self.finished_req_ids),
                             set(self.reset_preempted_req_ids),
                             has_sync_kv_loads=has_sync_kv_loads)
        so.kv_connector_metadata = self.connector.build_connector_meta(so)
        for req_id, n in num_scheduled.items():
            self.requests[req_id].num_computed_tokens += n
        self.finished_req_ids = set()
        self.reset_preempted_req_ids = set()
        return so

    def _update_waiting_for_remote_kv(self, req: Request) -> None:
        if req.request_id in self.failed_recving_kv_req_ids:
            if not req.num_computed_tokens:
                self._free_request_blocks(req)
            self.failed_recving_kv_req_ids.remove(req.request_id)
        elif req.num_computed_tokens == req.num_tokens:
            req.num_computed_tokens = req.num_tokens - 1
        self._cache_blocks(req, req.num_computed_tokens)  # loaded: cached now
        self.finished_recving_kv_req_ids.remove(req.request_id)

    def _preempt_request(self, req: Request) -> None:
        assert req.status == RequestStatus.RUNNING
        self._free_request_blocks(req)
        self.running.remove(req)
        req.status = RequestStatus.PREEMPTED
        req.num_computed_tokens = 0
        req.num_publishable_block_hashes = 0
        req.num_preemptions += 1
        self.waiting.insert(0, req)
        self.reset_preempted_req_ids.add(req.request_id)

    # -- outputs --
    def update_from_output(self, so: SchedulerOutput, out: SimpleNamespace) -> None:
        failed: Set[str] = set()
        if out.invalid_block_ids:
            failed = self._handle_invalid_blocks(out.invalid_block_ids, so.num_scheduled_tokens)
        errors = set()
        for req_id in so.num_scheduled_tokens:
            req = self.requests.get(req_id)
            if req is None or req.is_finished():
                continue
            if req_id in failed:
                if self.policy == "fail":
                    errors.add(req_id)
                continue
            if req.num_computed_tokens >= req.num_tokens:
                req.append_output_token_ids(next_token(req._all_token_ids))
                if req.num_output_tokens >= req.max_tokens:
                    req.status = RequestStatus.FINISHED_LENGTH_CAPPED
                    self.running.remove(req)
                    self.kv_at_finish[req_id] = sorted(set().union(*(
                        w.check(req._all_token_ids, self.req_blocks[req_id],
                                req.num_computed_tokens) for w in self.workers)))
                    self._free_request(req)
        if errors:
            self.finish_requests(errors, RequestStatus.FINISHED_ERROR)
        self._update_from_kv_xfer_finished(out)
        stats = out.kv_connector_stats
        sched_stats = self.connector.get_kv_connector_stats()
        if sched_stats is not None and not sched_stats.is_empty():
            stats = stats.aggregate(sched_stats) if stats is not None else sched_stats
        if stats is not None:
            self.stats.append(dict(stats.data))
        self.events += list(self.connector.take_events() or ())

    def _handle_invalid_blocks(self, invalid: Set[int], num_scheduled: Dict[str, int]) -> Set[str]:
        async_failed, sync_failed = set(), set()
        for b in invalid:
            self._uncache(b)  # their KV is not what the hash says
        for req in list(self.waiting) + list(self.running):
            if req.status not in (RequestStatus.WAITING_FOR_REMOTE_KVS, RequestStatus.RUNNING):
                continue
            ids = self.req_blocks.get(req.request_id, [])
            computed = req.num_computed_tokens - num_scheduled.get(req.request_id, 0)
            if req.status == RequestStatus.WAITING_FOR_REMOTE_KVS:
                computed = req.num_computed_tokens
            n = -(-computed // self.block_size)
            for idx, b in enumerate(ids[:n]):
                if b in invalid:
                    req.num_computed_tokens = idx * self.block_size
                    req.num_publishable_block_hashes = min(
                        req.num_publishable_block_hashes,
                        req.num_computed_tokens // self.hash_block_size)
                    (async_failed if req.status == RequestStatus.WAITING_FOR_REMOTE_KVS
                     else sync_failed).add(req.request_id)
                    break
        if self.policy == "fail":
            return async_failed | sync_failed
        self.failed_recving_kv_req_ids |= async_failed
        return sync_failed

    def finish_requests(self, request_ids, status: RequestStatus) -> None:
        assert RequestStatus.is_finished(status)
        valid = []
        for rid in request_ids:
            req = self.requests.get(rid)
            if req is None or req.is_finished():
                continue
            valid.append(req)
            if req in self.running:
                self.running.remove(req)
            elif req in self.waiting:
                self.waiting.remove(req)
        for req in valid:
            delay = False
            if req.status == RequestStatus.WAITING_FOR_REMOTE_KVS:
                delay = req.request_id not in self.finished_recving_kv_req_ids
                self.finished_recving_kv_req_ids.discard(req.request_id)
                self.failed_recving_kv_req_ids.discard(req.request_id)
            req.status = status
            self._free_request(req, delay_free_blocks=delay)

    def _free_request(self, req: Request, delay_free_blocks: bool = False) -> None:
        assert req.is_finished()
        self.finished[req.request_id] = req.status
        n = -(-req.num_computed_tokens // self.block_size)
        ids = (list(self.req_blocks.get(req.request_id, []))[:n],)
        hma = getattr(kvv, "SupportsHMA", None)  # vLLM's class where vLLM is there
        if hma is not None and isinstance(self.connector, hma):
            delay, _ = self.connector.request_finished_all_groups(req, ids)
        else:
            delay, _ = self.connector.request_finished(req, ids[0])
        self.finished_req_ids.add(req.request_id)
        if not (delay_free_blocks or delay):
            self._free_blocks(req)

    def _free_blocks(self, req: Request) -> None:
        assert req.is_finished()
        self._free_request_blocks(req)
        del self.requests[req.request_id]

    def _update_from_kv_xfer_finished(self, out: SimpleNamespace) -> None:
        self.connector.update_connector_output(out)
        for req_id in out.finished_recving or ():
            assert req_id in self.requests
            req = self.requests[req_id]
            if req.status == RequestStatus.WAITING_FOR_REMOTE_KVS:
                self.finished_recving_kv_req_ids.add(req_id)
            else:
                assert RequestStatus.is_finished(req.status)
                self._free_blocks(req)
        for req_id in out.finished_sending or ():
            assert req_id in self.requests
            self._free_blocks(self.requests[req_id])

    # -- the engine loop --
    def step(self) -> None:
        so = self.schedule()
        outs = [w.execute_model(so) for w in self.workers]
        out = self.aggregator.aggregate(outs)
        if self.step_hook is not None:
            self.step_hook(self, so)
        for rid in self.aborts:  # _process_aborts_queue, before update_from_output
            self.finish_requests([rid], RequestStatus.FINISHED_ABORTED)
        self.aborts = []
        self.update_from_output(so, out)

    def run(self, max_steps: int = 3000) -> None:
        for _ in range(max_steps):
            if not self.has_requests():
                return
            self.step()
            if not any(s for s in (self.running,)):
                time.sleep(0.001)  # asynchronous transfers on the connector's thread
        raise AssertionError("the engine did not finish: %d requests left (%s)" % (
            len(self.requests), {r: q.status.name for r, q in self.requests.items()}))

    def run_one(self, rid: str, tokens: List[int], max_tokens: int = 3) -> None:
        """One request to its end: it must finish by length with every byte
        of its KV what it would have computed itself."""
        self.add_request(rid, tokens, max_tokens)
        self.run()
        assert self.finished[rid] == RequestStatus.FINISHED_LENGTH_CAPPED, self.finished[rid]
        assert self.kv_at_finish[rid] == [], "wrong KV at positions %s" % self.kv_at_finish[rid]

    def shutdown(self) -> None:
        self.connector.shutdown()
        for w in self.workers:
            w.connector.shutdown()

    def stat(self, name: str) -> float:
        return sum(s.get(name, 0) for s in self.stats)


__all__ = ["Engine", "Request", "RequestStatus", "Worker", "config", "create_connector",
           "block_hasher", "KVCacheBlocks"]
