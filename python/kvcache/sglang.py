# SPDX-License-Identifier: MIT
"""An SGLang HiCache storage backend (L3) backed by the node's kvcached.

Enable it with::

    --enable-hierarchical-cache --hicache-mem-layout page_first
    --hicache-storage-backend dynamic
    --hicache-storage-backend-extra-config '{"backend_name": "kvcache",
        "module_path": "kvcache.sglang", "class_name": "KvcacheStore",
        "interface_v1": 1, "socket": "/run/kvcached.sock"}'

``interface_v1`` must be 1: SGLang picks its zero-copy page path
(``batch_get_v1``/``batch_set_v1`` over the host pool) by that flag.  Hybrid
models (Mamba, SWA, the DSA indexer, DeepSeek V4) also use the v2 calls
(``register_mem_host_pool_v2``, ``batch_exists_v2``, ``batch_get_v2``,
``batch_set_v2``): each extra pool's pages are objects of their own, under a
key spec of their own.

One object per page and rank holds the page's pieces as the host pool lists
them (K and V, or one for MLA, or per layer), where Mooncake's backend
stores two objects (``_k`` and ``_v``): half the keys, and a page is never
half present.  Keys are ``kvcache.keys`` keys: the model, the host pool's
dtype, the layout, the page size and the rank (TP, PP, and the attention
context-parallel rank, which holds its own slice even of MLA pages) beside
SGLang's page hash; MLA pages are shared by every TP rank.  As with
Mooncake's backend, ``extra_backend_tag`` (the weights' identity, say) and
``tenant_id`` in the extra config put the model's pages in a domain of
their own.  A batch of pages
is stored in one call, each page naming the one before it as its parent
(the page before the batch comes from ``prefix_keys`` when SGLang passes
them, else from the batch before it in the same backup).

``get_stats`` answers SGLang's ``StorageMetrics`` (pages and GB/s of each
prefetch and backup batch since the last call), as ``--enable-metrics``
requires.

SGLang is not installed where the test suite runs: the suite drives this
class through ``tests/python/sglang_harness.py``, a transcription of
SGLang's cache controller and host pools.
"""

from __future__ import annotations

import errno
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from . import _kvcache
from .engine import unanswered
from .keys import KeySpec

try:
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorage  # type: ignore
    HAVE_SGLANG = True
except ImportError:
    HAVE_SGLANG = False

    class HiCacheStorage:  # type: ignore[no-redef]
        """The shape of SGLang's base class, for use without SGLang."""

        def register_mem_pool_host(self, mem_pool_host: Any) -> None:
            self.mem_pool_host = mem_pool_host

        def register_mem_host_pool_v2(self, host_pool: Any, host_pool_name: Any) -> None:
            if not hasattr(self, "registered_pools"):
                self.registered_pools = {}
            self.registered_pools[host_pool_name] = host_pool

try:  # newer SGLang: pool_transfer.py (hicache_storage.py re-exports them)
    from sglang.srt.mem_cache.pool_transfer import (  # type: ignore
        PoolHitPolicy,
        PoolTransferResult,
    )
except ImportError:
    try:
        from sglang.srt.mem_cache.hicache_storage import (  # type: ignore
            PoolHitPolicy,
            PoolTransferResult,
        )
    except ImportError:
        class PoolHitPolicy:  # type: ignore[no-redef]
            ALL_PAGES = "all_pages"
            TRAILING_PAGES = "trailing_pages"

        @dataclass
        class PoolTransferResult:  # type: ignore[no-redef]
            kv_hit_pages: int
            extra_pool_hit_pages: Dict[str, int]
            restorable_prefix_pages: Optional[List[int]] = None

try:
    from sglang.srt.observability.metrics_collector import StorageMetrics  # type: ignore
except ImportError:
    try:
        from sglang.srt.metrics.collector import StorageMetrics  # type: ignore
    except ImportError:
        @dataclass
        class StorageMetrics:  # type: ignore[no-redef]
            prefetch_pgs: List[int] = field(default_factory=list)
            backup_pgs: List[int] = field(default_factory=list)
            prefetch_bandwidth: List[float] = field(default_factory=list)
            backup_bandwidth: List[float] = field(default_factory=list)

LAYOUTS = ("page_first", "page_first_direct", "layer_first", "page_head", "page_first_kv_split")
# page_first_kv_split (SGLang on Ascend, MLA): the pieces of a page live in
# allocations of their own, kv_buffer being only the first
KV_SPLIT = ("k_buffer", "v_buffer", "index_k_buffer", "index_k_scale_buffer")
STORAGE_BATCH_SIZE = 128  # SGLang's pages per batched storage call
KV = "kv"


def _dtype_name(dtype: Any) -> str:
    return str(dtype).replace("torch.", "")


def _name(pool_name: Any) -> str:
    return str(getattr(pool_name, "value", pool_name))


def _buffers(pool: Any) -> List[Any]:
    """The tensors of a host pool: each piece's with page_first_kv_split,
    else get_hybrid_pool_buffer() where it has one, else kv_buffer (a
    tensor, or a tuple for asymmetric K and V)."""
    get = getattr(pool, "get_hybrid_pool_buffer", None)
    if getattr(pool, "layout", None) == "page_first_kv_split":
        bufs = [getattr(pool, n, None) for n in KV_SPLIT]
    else:
        bufs = get() if callable(get) else getattr(pool, "kv_buffer", None)
    if bufs is None:
        return []
    if not isinstance(bufs, (list, tuple)):
        bufs = [bufs]
    return [b for b in bufs if b is not None]


def _split_pieces(pool: Any) -> str:
    """Which pieces a page_first_kv_split page has (its objects differ)."""
    if getattr(pool, "layout", None) != "page_first_kv_split":
        return ""
    out = "" if getattr(pool, "dsa_kv_cache_store_fp8", False) else "+v"
    if getattr(pool, "index_k_buffer", None) is not None:
        out += "+ik"
    if getattr(pool, "index_k_scale_buffer", None) is not None:
        out += "+iks"
    return out


class KvcacheStore(HiCacheStorage):
    def __init__(self, storage_config: Any, kwargs: Optional[dict] = None):
        self.config = storage_config
        extra = dict(getattr(storage_config, "extra_config", None) or {})
        self.extra = extra
        if getattr(storage_config, "should_split_heads", False):
            raise ValueError("kvcache does not split pages by heads across TP sizes "
                             "(--hicache-mem-layout page_head with tp_lcm_size); run prefill "
                             "and decode with the same TP size, or another layout")
        self.client = _kvcache.Client(extra.get("socket"))
        self.spec: Optional[KeySpec] = None
        self.pool = None
        self.anchor = False  # a host pool whose KV is logical only (kv_buffer None)
        self.is_mla = bool(getattr(storage_config, "is_mla_model", False))
        self.specs: Dict[str, KeySpec] = {}
        self.pools: Dict[str, Any] = {}
        self._stats_lock = threading.Lock()
        self._metrics = StorageMetrics()
        self._gb_per_page = 0.0
        self._last = threading.local()  # the backup thread's last full batch

    # ---- host pools ----
    def _spec(self, pool: Any, name: str) -> KeySpec:
        layout = getattr(pool, "layout", "page_first")
        if layout not in LAYOUTS:
            raise ValueError("kvcache takes --hicache-mem-layout %s, not %s"
                             % ("/".join(LAYOUTS), layout))
        c = self.config
        dtype = getattr(pool, "dtype", None)
        layout_field = "sglang-" + layout + _split_pieces(pool) + ("" if name == KV else "-" + name)
        return KeySpec(
            self._domain() + (getattr(c, "model_name", None) or self.extra.get("model_name")
                              or "unknown"),
            _dtype_name(dtype) if dtype is not None else "unknown", layout_field,
            int(getattr(pool, "page_size", 1) or 1),
            int(getattr(c, "tp_rank", 0)) if not self.is_mla else 0,
            int(getattr(c, "tp_size", 1)), int(getattr(c, "pp_rank", 0)),
            int(getattr(c, "pp_size", 1)), shared_across_ranks=self.is_mla,
            cp_rank=int(getattr(c, "attn_cp_rank", 0) or 0),
            cp_size=int(getattr(c, "attn_cp_size", 1) or 1))

    def _domain(self) -> str:
        """The reuse domain before the model's name: Mooncake's backend
        prefixes its keys with ``extra_backend_tag`` (operators set it to
        the weights' identity, so that deployments of other weights under
        the same served name never read each other's pages) and keeps each
        ``tenant_id``'s keys apart."""
        out = ""
        tenant = self.extra.get("tenant_id")
        if tenant not in (None, "", "default"):
            out += "tenant:%s/" % tenant
        tag = self.extra.get("extra_backend_tag")
        if tag not in (None, ""):
            out += "%s_" % tag
        return out

    def _register(self, pool: Any) -> None:
        for buf in _buffers(pool):
            r = self.client.register_memory(buf.data_ptr(), buf.numel() * buf.element_size())
            if r < 0:
                raise OSError(-r, "cannot register SGLang's host KV pool: %s"
                              % _kvcache.strerror(r))

    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        super().register_mem_pool_host(mem_pool_host)
        self.pool = mem_pool_host
        self.spec = self._spec(mem_pool_host, KV)
        self.specs[KV] = self.spec
        self.pools[KV] = mem_pool_host
        # a logical anchor (DeepSeek V4, MLA host dedup) holds no bytes: its
        # pages are the side pools' (register_mem_host_pool_v2)
        self.anchor = getattr(mem_pool_host, "kv_buffer", None) is None
        if not self.anchor:
            self._register(mem_pool_host)
            per_token = getattr(mem_pool_host, "get_ksize_per_token", None)
            if callable(per_token):
                self._gb_per_page = per_token() * int(mem_pool_host.page_size) / (1 << 30)

    def register_mem_host_pool_v2(self, host_pool: Any, host_pool_name: Any) -> None:
        super().register_mem_host_pool_v2(host_pool, host_pool_name)
        name = _name(host_pool_name)
        if name == KV:
            if self.pool is not host_pool:
                self.register_mem_pool_host(host_pool)
            return
        self.specs[name] = self._spec(host_pool, name)
        self.pools[name] = host_pool
        self._register(host_pool)

    def _keys(self, keys: List[str], pool: str = KV) -> List[str]:
        spec = self.specs.get(pool)
        if spec is None:
            raise RuntimeError("no host pool %r registered" % pool)
        return spec.keys(keys)

    def _pages(self, pool: Any, host_indices: Any, n: int):
        """Per page, its pointers and sizes in the host pool."""
        page = int(getattr(pool, "page_size", 1) or 1)
        if len(host_indices) != n * page:
            raise ValueError("%d host indices for %d pages of %d" % (len(host_indices), n, page))
        ptrs, sizes = pool.get_page_buffer_meta(host_indices)
        per = len(ptrs) // n if n else 0
        if n == 0 or per * n != len(ptrs):
            raise ValueError("%d pointers for %d pages" % (len(ptrs), n))
        return ([list(ptrs[i * per:(i + 1) * per]) for i in range(n)],
                [list(sizes[i * per:(i + 1) * per]) for i in range(n)])

    # ---- pages ----
    def _get(self, pool_name: str, keys: List[str], host_indices: Any) -> List[bool]:
        if not keys:
            return []
        pool = self.pools[pool_name]
        ptrs, sizes = self._pages(pool, host_indices, len(keys))
        res = self.client.batch_get_into_multi_buffers(self._keys(keys, pool_name), ptrs, sizes)
        return [r > 0 for r in res]

    def _set(self, pool_name: str, keys: List[str], host_indices: Any,
             extra_info: Any) -> List[bool]:
        if not keys:
            return []
        pool = self.pools[pool_name]
        ks = self._keys(keys, pool_name)
        ptrs, sizes = self._pages(pool, host_indices, len(keys))
        # pages stored already are refused before any byte is copied
        res = self.client.batch_put_from_multi_buffers(
            ks, ptrs, sizes, parent=self._parent_before(keys, extra_info, pool_name),
            chain=True)
        out = [r == 0 or r == -errno.EEXIST for r in res]
        if pool_name == KV:
            # what the next batch of this backup follows (SGLang sends 128
            # pages at a time, one backup's batches back to back)
            prefix = getattr(extra_info, "prefix_keys", None)
            self._last.prefix = prefix
            self._last.key = ks[-1] if prefix is not None or len(keys) == STORAGE_BATCH_SIZE \
                else None
        return out

    def _parent_before(self, keys: List[str], extra_info: Any, pool_name: str) -> Optional[str]:
        """The page before keys[0].  With hicache_storage_pass_prefix_keys
        SGLang passes the hashes from the root: the last is the parent, and
        the list grows by each batch stored; a root-level backup's list stays
        empty, the same list object batch after batch.  Without them: the
        last page of the full batch this thread stored just before."""
        if pool_name != KV:
            return None
        prefix = getattr(extra_info, "prefix_keys", None)
        if prefix:
            return self._keys([prefix[-1]])[0]
        if prefix is not None:
            return self._last.key if getattr(self._last, "prefix", None) is prefix else None
        return getattr(self._last, "key", None)

    def _note(self, what: str, pages: int, seconds: float) -> None:
        if not pages:
            return
        with self._stats_lock:
            getattr(self._metrics, what + "_pgs").append(pages)
            if seconds > 0 and self._gb_per_page:
                getattr(self._metrics, what + "_bandwidth").append(
                    pages * self._gb_per_page / seconds)

    # ---- the zero-copy page path (interface_v1) ----
    def batch_exists(self, keys: List[str], extra_info: Any = None) -> int:
        """How many leading pages are stored."""
        if not keys:
            return 0
        if self.anchor:
            return len(keys)
        try:
            return self.client.prefix_lookup(self._keys(keys))
        except OSError as e:
            return unanswered("batch_exists", e, 0)

    def batch_get_v1(self, keys: List[str], host_indices: Any,
                     extra_info: Any = None) -> List[bool]:
        if self.anchor:
            return [True] * len(keys)
        t0 = time.perf_counter()
        out = self._get(KV, keys, host_indices)
        self._note("prefetch", sum(out), time.perf_counter() - t0)
        return out

    def batch_set_v1(self, keys: List[str], host_indices: Any,
                     extra_info: Any = None) -> List[bool]:
        if self.anchor:
            return [True] * len(keys)
        t0 = time.perf_counter()
        out = self._set(KV, keys, host_indices, extra_info)
        self._note("backup", sum(out), time.perf_counter() - t0)
        return out

    # ---- hybrid models (v2) ----
    def batch_exists_v2(self, keys: List[str], pool_transfers: Any = None,
                        extra_info: Any = None) -> Any:
        """The longest prefix every pool can end: each pool's possible ends
        (ALL_PAGES: every length up to its first missing page;
        TRAILING_PAGES: every length whose last ``len(transfer.keys)`` pages
        it holds) intersected with the KV prefix's.  Those ends go back as
        ``restorable_prefix_pages`` (SGLang intersects them across ranks), the
        longest as ``kv_hit_pages``; as Mooncake's backend answers.  A
        trailing pool's ends have holes, so the least of the pools' longest
        ends need not be one of them."""
        kv_pages = self.batch_exists(keys, extra_info)
        hits: Dict[str, int] = {KV: kv_pages} if kv_pages else {}
        ends = list(range(1, kv_pages + 1))
        for t in pool_transfers or ():
            if not ends:
                break
            name = _name(t.name)
            try:
                present = self.client.batch_exists(self._keys(keys[:kv_pages], name))
            except OSError as e:
                present = unanswered("batch_exists_v2", e, [False] * kv_pages)
            if _name(getattr(t, "hit_policy", PoolHitPolicy.ALL_PAGES)) == \
                    _name(PoolHitPolicy.TRAILING_PAGES):
                window = max(1, len(getattr(t, "keys", None) or ()))
                pool_ends = [n for n in range(kv_pages, 0, -1)
                             if all(present[max(0, n - window):n])]
                longest = pool_ends[0] if pool_ends else 0
            else:
                longest = present.index(False) if False in present else kv_pages
                pool_ends = list(range(1, longest + 1))
            if longest:
                hits[name] = longest
            usable = set(pool_ends)
            ends = [n for n in ends if n in usable]
        final = ends[-1] if ends else 0
        try:
            return PoolTransferResult(final, hits, ends)
        except TypeError:  # SGLang before restorable_prefix_pages
            return PoolTransferResult(kv_hit_pages=final, extra_pool_hit_pages=hits)

    def batch_get_v2(self, transfers: Any, extra_info: Any = None) -> Dict[str, List[bool]]:
        out: Dict[str, List[bool]] = {}
        for t in transfers:
            name = _name(t.name)
            out[name] = self.batch_get_v1(t.keys, t.host_indices, extra_info) if name == KV \
                else self._get(name, list(t.keys), t.host_indices)
        return out

    def batch_set_v2(self, transfers: Any, extra_info: Any = None) -> Dict[str, List[bool]]:
        out: Dict[str, List[bool]] = {}
        for t in transfers:
            name = _name(t.name)
            out[name] = self.batch_set_v1(t.keys, t.host_indices, extra_info) if name == KV \
                else self._set(name, list(t.keys), t.host_indices, extra_info)
        return out

    # ---- the generic (tensor) path ----
    def exists(self, key: str) -> bool:
        try:
            return self.client.exists(self._keys([key])[0])
        except OSError as e:
            return unanswered("exists", e, False)

    def get(self, key: str, target_location: Any = None, target_sizes: Any = None):
        """Into target_location (a tensor or writable buffer) when given, else
        a new uint8 tensor; None on a miss."""
        k = self._keys([key])[0]
        if target_location is not None:
            n = self.client.get_into(k, _as_buffer(target_location, writable=True))
            return target_location if n > 0 else None
        try:
            data = self.client.get(k)
        except OSError as e:
            return unanswered("get", e, None)
        if data is None:
            return None
        import torch
        return torch.frombuffer(bytearray(data), dtype=torch.uint8)

    def batch_get(self, keys: List[str], target_locations: Any = None,
                  target_sizes: Any = None):
        locs = target_locations if target_locations is not None else [None] * len(keys)
        return [self.get(k, t) for k, t in zip(keys, locs)]

    def set(self, key: str, value: Any = None, target_location: Any = None,
            target_sizes: Any = None) -> bool:
        src = value if value is not None else target_location
        if src is None:
            return False
        k = self._keys([key])[0]
        r = self.client.put(k, _as_buffer(src))
        return r == 0 or r == -errno.EEXIST

    def batch_set(self, keys: List[str], values: Any = None, target_locations: Any = None,
                  target_sizes: Any = None) -> bool:
        vals = values if values is not None else target_locations
        return all(self.set(k, v) for k, v in zip(keys, vals))

    # ---- housekeeping ----
    def clear(self) -> None:
        """Remove this model's and rank's pages (other users of the daemon
        keep theirs)."""
        for spec in self.specs.values():
            self.client.remove_prefix(spec.prefix(), force=True)

    def get_stats(self) -> Any:
        """SGLang's StorageMetrics since the last call (its scheduler asks
        on every event check with --enable-metrics)."""
        with self._stats_lock:
            out, self._metrics = self._metrics, StorageMetrics()
        return out

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
            self.client = None


def _as_buffer(t: Any, writable: bool = False):
    """A CPU tensor's bytes as a buffer (no copy when writable), or t."""
    if hasattr(t, "numpy") and hasattr(t, "is_cuda"):
        import torch
        if t.is_cuda:
            raise ValueError("a device tensor: SGLang's host pool is the place for copies")
        if writable and not t.is_contiguous():
            raise ValueError("the target tensor is not contiguous")
        return t.contiguous().view(-1).view(torch.uint8).numpy()
    return t


__all__ = ["KvcacheStore", "StorageMetrics", "PoolTransferResult", "HAVE_SGLANG"]
