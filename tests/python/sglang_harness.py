# SPDX-License-Identifier: MIT
"""SGLang's HiCache, as far as an L3 storage backend can tell.

Transcribed from sgl-project/sglang at 001067fffe33427bee0ed2f007fb7551a1d76b44
(``hicache_storage.py``, ``storage/backend_factory.py``,
``managers/cache_controller.py``) and, where that commit does not hold them,
the versions named:

* ``HiCacheStorageConfig``: tp/pp/attn-cp ranks, ``is_mla_model``,
  ``model_name``, ``extra_config`` (the parsed
  ``--hicache-storage-backend-extra-config``);
* ``StorageBackendFactory._create_dynamic_backend``: ``backend_class(
  storage_config, {})``, then the controller's ``register_mem_pool_host``;
* the cache controller: existence checks, loads and backups in batches of
  ``STORAGE_BATCH_SIZE`` (128) pages; ``batch_exists`` is a count of leading
  pages, a load counts leading successes, a backup stops at the first batch
  whose ``batch_set_v1`` is not all true; ``prefix_keys`` (with
  ``hicache_storage_pass_prefix_keys``) are the hashes from the root to the
  parent, grown in place batch after batch when not empty;
* ``hiradix_cache.check_hicache_events``: with ``--enable-metrics`` the
  backend's ``get_stats()`` goes to ``log_storage_metrics``, which asserts it
  is a ``StorageMetrics``;
* host pools (``pool_host/mha.py`` @0047d999, ``pool_host/mla.py`` @01c0ede3):
  ``kv_buffer`` by layout (``page_first`` (2, size, L, H, D),
  ``layer_first`` (2, L, size, H, D)), ``get_page_buffer_meta`` (K and V per
  page, or per layer for layer_first); asymmetric MHA pools hold a tuple;
  MLA pools one piece per page, or with ``page_first_kv_split`` (Ascend)
  K, V, index K and scales from buffers of their own; a logical anchor (DeepSeek V4) has
  ``kv_buffer`` None and its bytes in side pools registered with
  ``register_mem_host_pool_v2``;
* the hybrid controller (``HybridController``: ``mem_cache/hybrid_cache/
  hybrid_cache_controller.py`` and ``unified_radix_cache.py`` @92389675,
  the components and sidecar specs of ``mamba_component.py``,
  ``swa_component.py`` and ``hybrid_pool_assembler.py`` @17313cf4b): a
  backup is one ``batch_set_v2`` of a radix node's side pools (a Mamba
  state under the node's last page only, an SWA window under its last
  pages, KV-derived pools under every page) before its KV batches; a
  prefetch asks ``batch_exists_v2`` once over every page on each rank,
  takes the least hit over the ranks, loads KV in batches of 128 with the
  KV-derived pools beside each batch, then (where a rank loaded every page)
  the other side pools at the window ending at the hit, and keeps the whole
  prefetch only if every rank's side pools loaded all of it.
"""

from __future__ import annotations

import hashlib
import importlib
from dataclasses import dataclass
from typing import Any, List, Optional

import torch

from kvcache import sglang as kvs

STORAGE_BATCH_SIZE = 128


@dataclass
class HiCacheStorageConfig:
    tp_rank: int
    tp_size: int
    pp_rank: int
    pp_size: int
    attn_cp_rank: int
    attn_cp_size: int
    is_mla_model: bool
    enable_storage_metrics: bool
    is_page_first_layout: bool
    model_name: Optional[str]
    dp_rank: int = 0
    dp_size: int = 1
    tp_lcm_size: Optional[int] = None
    should_split_heads: bool = False
    extra_config: Optional[dict] = None


@dataclass
class HiCacheStorageExtraInfo:
    prefix_keys: Optional[List[str]] = None
    extra_info: Optional[dict] = None


@dataclass
class PoolTransfer:
    name: str
    host_indices: Optional[torch.Tensor] = None
    device_indices: Optional[torch.Tensor] = None
    keys: Optional[List[str]] = None
    hit_policy: str = "all_pages"
    nodes_to_load: Optional[List[Any]] = None
    indices_from_pool: Optional[str] = None


def page_hashes(tokens: List[int], page_size: int, prior: Optional[str] = None) -> List[str]:
    """get_hash_str: chained sha256 of each page's tokens."""
    out = []
    last = prior
    for i in range(0, len(tokens) - len(tokens) % page_size, page_size):
        h = hashlib.sha256()
        if last is not None:
            h.update(bytes.fromhex(last))
        for t in tokens[i:i + page_size]:
            h.update(int(t).to_bytes(4, "little", signed=False))
        last = h.hexdigest()
        out.append(last)
    return out


class MHAHostPool:
    """MHATokenToKVPoolHost: kv_buffer (2, size, L, H, D) page_first or
    (2, L, size, H, D) layer_first; ``asymmetric``: (k, v) of different head
    dims, a tuple."""

    def __init__(self, size, page_size, layers, heads, dim, layout="page_first", seed=0,
                 asymmetric=False, dtype=torch.bfloat16):
        g = torch.Generator().manual_seed(seed)
        self.size, self.page_size, self.layout, self.dtype = size, page_size, layout, dtype
        self.item = torch.empty((), dtype=dtype).element_size()  # dtype.itemsize
        self.layer_num, self.head_num, self.head_dim = layers, heads, dim
        self.v_head_dim = dim // 2 if asymmetric else dim
        if layout == "page_first":
            ks, vs = (size, layers, heads, dim), (size, layers, heads, self.v_head_dim)
        else:
            ks, vs = (layers, size, heads, dim), (layers, size, heads, self.v_head_dim)
        if asymmetric:
            self.k_buffer = torch.randn(ks, generator=g).to(dtype)
            self.v_buffer = torch.randn(vs, generator=g).to(dtype)
            self.kv_buffer = (self.k_buffer, self.v_buffer)
        else:
            self.kv_buffer = torch.randn((2,) + ks, generator=g).to(dtype)
            self.k_buffer, self.v_buffer = self.kv_buffer[0], self.kv_buffer[1]

    def get_hybrid_pool_buffer(self):
        return [self.k_buffer, self.v_buffer]

    def get_ksize_per_token(self):
        return self.layer_num * self.head_num * (self.head_dim + self.v_head_dim) * \
            self.item

    def get_page_buffer_meta(self, indices):
        assert len(indices) % self.page_size == 0
        item = self.item
        kp, vp = self.k_buffer.data_ptr(), self.v_buffer.data_ptr()
        kt, vt = self.head_num * self.head_dim * item, self.head_num * self.v_head_dim * item
        ptrs, sizes = [], []
        for i in range(0, len(indices), self.page_size):
            idx = int(indices[i])
            if self.layout == "layer_first":
                for layer in range(self.layer_num):
                    ptrs += [kp + (layer * self.size + idx) * kt,
                             vp + (layer * self.size + idx) * vt]
                    sizes += [self.page_size * kt, self.page_size * vt]
            else:
                ptrs += [kp + idx * self.layer_num * kt, vp + idx * self.layer_num * vt]
                sizes += [self.page_size * self.layer_num * kt,
                          self.page_size * self.layer_num * vt]
        return ptrs, sizes

    def page(self, start):
        """Every byte of the page at token slot start."""
        if self.layout == "layer_first":
            return [self.k_buffer[:, start:start + self.page_size],
                    self.v_buffer[:, start:start + self.page_size]]
        return [self.k_buffer[start:start + self.page_size],
                self.v_buffer[start:start + self.page_size]]


class MLAHostPool:
    """MLATokenToKVPoolHost, page_first: (size, L, 1, D), one piece a page;
    ``dummy``: a logical anchor with kv_buffer None."""

    def __init__(self, size, page_size, layers, dim, seed=0, dummy=False, dtype=torch.bfloat16):
        g = torch.Generator().manual_seed(seed)
        self.size, self.page_size, self.layout, self.dtype = size, page_size, "page_first", dtype
        self.item = torch.empty((), dtype=dtype).element_size()  # dtype.itemsize
        self.layer_num, self.kv_dim = layers, dim
        self.kv_buffer = None if dummy else \
            torch.randn(size, layers, 1, dim, generator=g).to(dtype)

    def get_ksize_per_token(self):
        return self.layer_num * self.kv_dim * self.item

    def get_page_buffer_meta(self, indices):
        tok = self.layer_num * self.kv_dim * self.item
        base = self.kv_buffer.data_ptr()
        ptrs = [base + int(indices[i]) * tok for i in range(0, len(indices), self.page_size)]
        return ptrs, [self.page_size * tok] * len(ptrs)

    def page(self, start):
        return [self.kv_buffer[start:start + self.page_size]]


class MLASplitHostPool:
    """MLATokenToKVPoolHost with ``page_first_kv_split`` (``pool_host/mla.py``
    @01c0ede3; SGLang picks it on Ascend for MLA models): K (the latent),
    V (RoPE) and, with an indexer, its K and FP32 scales in allocations of
    their own, each (page_num, layers, page_size, 1, width); per page,
    ``get_page_buffer_meta`` gives K, V (not with FP8 DSA, which packs V
    into K), index K, scale.  ``kv_buffer`` is the K buffer."""

    def __init__(self, size, page_size, layers, k_width, rope, index_dim=None, scales=False,
                 index_layers=None, fp8_dsa=False, seed=0, dtype=torch.bfloat16):
        g = torch.Generator().manual_seed(seed)
        self.size, self.page_size, self.layout, self.dtype = size, page_size, \
            "page_first_kv_split", dtype
        self.page_num = size // page_size + 1
        self.layer_num, self.qk_rope_head_dim = layers, rope
        self.dsa_kv_cache_store_fp8 = fp8_dsa
        base = (self.page_num, layers, page_size, 1)
        nidx = index_layers or layers
        idx = (self.page_num, nidx, page_size, 1)
        self.k_buffer = torch.randn(base + (k_width,), generator=g).to(dtype)
        self.v_buffer = torch.randn(base + (rope,), generator=g).to(dtype)
        self.index_k_buffer = None if index_dim is None else \
            torch.randn(idx + (index_dim,), generator=g).to(dtype)
        self.index_k_scale_buffer = torch.randn(idx + (1,), generator=g) \
            if scales else None
        self.kv_buffer = self.k_buffer

    def get_ksize_per_token(self):
        n = self.layer_num * (self.k_buffer.shape[-1] + self.qk_rope_head_dim) * \
            self.k_buffer.element_size()
        if self.index_k_buffer is not None:
            n += self.index_k_buffer.shape[1] * self.index_k_buffer.shape[-1] * \
                self.index_k_buffer.element_size()
        if self.index_k_scale_buffer is not None:
            n += 4 * self.index_k_scale_buffer.shape[1]
        return n

    def get_page_buffer_meta(self, indices):
        assert len(indices) % self.page_size == 0
        indices = indices.tolist()
        kw, ki = self.k_buffer.shape[-1], self.k_buffer.element_size()
        item = self.v_buffer.element_size()
        ik = self.index_k_buffer
        nidx = ik.shape[1] if ik is not None else 0
        iw = ik.shape[-1] if ik is not None else 0
        ii = ik.element_size() if ik is not None else 0
        sc = self.index_k_scale_buffer
        ptrs, sizes = [], []
        for i in range(0, len(indices), self.page_size):
            t = indices[i]
            ptrs.append(self.k_buffer.data_ptr() + t * self.layer_num * kw * ki)
            sizes.append(self.layer_num * ki * self.page_size * kw)
            if not self.dsa_kv_cache_store_fp8:
                ptrs.append(self.v_buffer.data_ptr() + t * self.layer_num *
                            self.qk_rope_head_dim * item)
                sizes.append(self.layer_num * item * self.page_size * self.qk_rope_head_dim)
            if ik is not None:
                ptrs.append(ik.data_ptr() + t * nidx * iw * ii)
                sizes.append(nidx * ii * self.page_size * iw)
            if sc is not None:
                ptrs.append(sc.data_ptr() + t * nidx * 4)
                sizes.append(nidx * 4 * self.page_size)
        return ptrs, sizes

    def page(self, start):
        p = start // self.page_size
        out = [self.k_buffer[p]]
        if not self.dsa_kv_cache_store_fp8:
            out.append(self.v_buffer[p])
        out += [b[p] for b in (self.index_k_buffer, self.index_k_scale_buffer)
                if b is not None]
        return out


def storage_config(socket, tp_rank=0, tp_size=1, mla=False, cp_rank=0, cp_size=1,
                   model="Qwen/Qwen3-8B", **extra) -> HiCacheStorageConfig:
    e = {"backend_name": "kvcache", "module_path": "kvcache.sglang",
         "class_name": "KvcacheStore", "interface_v1": 1, "socket": socket}
    e.update(extra)
    return HiCacheStorageConfig(tp_rank, tp_size, 0, 1, cp_rank, cp_size, mla, True, True,
                                model, extra_config=e)


def create_backend(cfg: HiCacheStorageConfig, host_pool: Any) -> Any:
    """StorageBackendFactory, dynamic, then the controller's registration."""
    e = cfg.extra_config
    cls = getattr(importlib.import_module(e["module_path"]), e["class_name"])
    assert issubclass(cls, kvs.HiCacheStorage)
    backend = cls(cfg, {})
    backend.register_mem_pool_host(host_pool)
    return backend


class Controller:
    """The cache controller's storage paths (interface_v1)."""

    def __init__(self, backend: Any, page_size: int, pass_prefix_keys: bool = False):
        self.backend = backend
        self.page_size = page_size
        self.pass_prefix_keys = pass_prefix_keys
        self.logged: List[Any] = []

    def storage_hit_query(self, hashes: List[str],
                          prefix_keys: Optional[List[str]] = None) -> List[str]:
        prefix_keys = prefix_keys.copy() if prefix_keys else None
        hit = []
        for start in range(0, len(hashes), STORAGE_BATCH_SIZE):
            batch = hashes[start:start + STORAGE_BATCH_SIZE]
            n = self.backend.batch_exists(batch, HiCacheStorageExtraInfo(prefix_keys=prefix_keys))
            hit.extend(batch[:n])
            if n < len(batch):
                break
            if prefix_keys and len(prefix_keys) > 0:
                prefix_keys += batch
        return hit

    def page_get(self, hashes: List[str], host_indices: torch.Tensor,
                 prefix_keys: Optional[List[str]] = None) -> int:
        """_page_transfer with _page_get_zero_copy: pages loaded from the start."""
        if not self.pass_prefix_keys:
            prefix_keys = None
        done = 0
        for start in range(0, len(hashes), STORAGE_BATCH_SIZE):
            batch = hashes[start:start + STORAGE_BATCH_SIZE]
            idx = host_indices[start * self.page_size:(start + len(batch)) * self.page_size]
            results = self.backend.batch_get_v1(
                batch, idx, HiCacheStorageExtraInfo(prefix_keys=prefix_keys))
            if prefix_keys and len(prefix_keys) > 0:
                prefix_keys += batch  # in place, as _page_transfer grows it
            inc = 0
            for r in results:
                if not r:
                    break
                inc += 1
            done += inc
            if inc < len(batch):
                break
        return done

    def page_backup(self, hashes: List[str], host_indices: torch.Tensor,
                    prefix_keys: Optional[List[str]] = None) -> int:
        """_page_backup with _page_set_zero_copy: tokens backed up."""
        if not self.pass_prefix_keys:
            prefix_keys = None
        completed = 0
        for start in range(0, len(hashes), STORAGE_BATCH_SIZE):
            batch = hashes[start:start + STORAGE_BATCH_SIZE]
            idx = host_indices[start * self.page_size:(start + len(batch)) * self.page_size]
            extra = HiCacheStorageExtraInfo(prefix_keys=prefix_keys)
            if not all(self.backend.batch_set_v1(batch, idx, extra)):
                break
            if prefix_keys and len(prefix_keys) > 0:
                prefix_keys += batch
            completed += self.page_size * len(batch)
        return completed

    def check_hicache_events(self) -> None:
        """hiradix_cache with --enable-metrics: log_storage_metrics()."""
        m = self.backend.get_stats()
        if m is None:
            return
        assert isinstance(m, kvs.StorageMetrics)
        self.logged.append(m)

    def logged_pages(self, what: str) -> int:
        return sum(sum(getattr(m, what + "_pgs")) for m in self.logged)


TRAILING, ALL_PAGES = "trailing_pages", "all_pages"


def _leading(results) -> int:
    results = list(results)
    return results.index(False) if False in results else len(results)


def count_pool_hits(results) -> dict:
    """hicache_storage.count_pool_hits: each pool's leading successes."""
    return {str(name): _leading(r) for name, r in results.items()}


@dataclass
class SideSpec:
    """A side pool as the radix tree's components and sidecar specs make
    its transfers: ``source`` None for a component (Mamba: window 1, SWA:
    its window in pages), "kv" for a pool that follows KV page by page (an
    indexer, DeepSeek V4's compressed pools)."""
    name: str
    hit_policy: str = ALL_PAGES
    source: Optional[str] = None
    window: int = 1


class HybridController:
    """One controller per attention rank (``ranks``: each a backend and its
    host pools by name, "kv" among them); the all-reduces (MIN over the
    ranks) are taken across them.  ``threshold``: the prefetch threshold in
    tokens (SGLang's default is 256)."""

    def __init__(self, ranks, page_size: int, specs: List[SideSpec],
                 pass_prefix_keys: bool = False, backup_skip: bool = False,
                 threshold: int = 0):
        self.ranks, self.page_size, self.specs = ranks, page_size, specs
        self.pass_prefix_keys, self.backup_skip, self.threshold = \
            pass_prefix_keys, backup_skip, threshold
        self.kv = [Controller(backend, page_size, pass_prefix_keys) for backend, _ in ranks]
        for backend, pools in ranks:  # attach_storage_backend
            for name, pool in pools.items():
                backend.register_mem_host_pool_v2(pool, name)

    def backup(self, node_hashes: List[str], slots: List[dict],
               prefix_keys: Optional[List[str]] = None) -> List[int]:
        """write_backup_storage of one radix node, ``slots[r]``: the host
        indices of its KV pages and of each component's share on rank r.
        Tokens backed up, per rank."""
        pk = prefix_keys if self.pass_prefix_keys else None
        out = []
        for r, (backend, pools) in enumerate(self.ranks):
            transfers = []
            for spec in self.specs:
                if spec.source == "kv":
                    t = PoolTransfer(spec.name, host_indices=slots[r]["kv"],
                                     keys=list(node_hashes), hit_policy=spec.hit_policy,
                                     indices_from_pool="kv")
                elif spec.name == "mamba":  # mamba_component: the node's last page
                    t = PoolTransfer(spec.name, host_indices=slots[r][spec.name],
                                     keys=[node_hashes[-1]], hit_policy=TRAILING)
                else:  # swa_component: the window's pages at the node's end
                    idx = slots[r][spec.name]
                    n = len(idx) // pools[spec.name].page_size
                    t = PoolTransfer(spec.name, host_indices=idx, keys=node_hashes[-n:],
                                     hit_policy=TRAILING)
                transfers.append(t)
            skip = self.backup_skip and r != 0
            if skip:  # should_backup: only Mamba
                transfers = [t for t in transfers if t.name == "mamba"]
            res = backend.batch_set_v2(transfers, HiCacheStorageExtraInfo(prefix_keys=pk)) \
                if transfers else {}
            if not skip:
                out.append(self.kv[r].page_backup(node_hashes, slots[r]["kv"], pk))
            else:
                out.append(len(node_hashes) * self.page_size if transfers and all(
                    len(res.get(t.name, [])) == len(t.keys) and all(res[t.name])
                    for t in transfers) else 0)
        return out

    def _transfers(self) -> List[PoolTransfer]:
        """prefetch_from_storage's component and sidecar transfers."""
        out = []
        for spec in self.specs:
            if spec.source == "kv":
                out.append(PoolTransfer(spec.name, keys=None, hit_policy=spec.hit_policy,
                                        indices_from_pool="kv"))
            else:
                out.append(PoolTransfer(spec.name, keys=["__placeholder__"] * spec.window,
                                        hit_policy=TRAILING))
        return out

    def prefetch(self, hashes: List[str], dest: List[dict],
                 prefix_keys: Optional[List[str]] = None):
        """A prefetch into ``dest[r]`` (host indices by pool: "kv" for the
        pages, each component's staging).  (tokens kept, pool hits after
        the MIN, kept)."""
        pk = prefix_keys if self.pass_prefix_keys else None
        ops = [self._transfers() for _ in self.ranks]
        hits = []
        for r, (backend, _) in enumerate(self.ranks):  # _storage_hit_query
            extra = HiCacheStorageExtraInfo(prefix_keys=pk.copy() if pk else None)
            hits.append(backend.batch_exists_v2(hashes, ops[r], extra).kv_hit_pages if ops[r]
                        else backend.batch_exists(hashes, extra))
        hv = hashes[:min(hits)]  # the MIN over prefetch_hits_sync_groups
        if not hv or len(hv) * self.page_size < self.threshold:
            return 0, {}, False  # revoked: nothing is loaded
        done, keys_after = [], []
        for r, (backend, pools) in enumerate(self.ranks):
            for t in ops[r]:  # _alloc_prefetch_aux_staging, at the hit
                if t.indices_from_pool is None:
                    n = min(len(t.keys), len(hv)) * pools[t.name].page_size
                    t.host_indices = dest[r][t.name][:n]
            kp = pk  # op.prefix_keys: grown in place batch by batch
            derived = [t for t in ops[r] if t.indices_from_pool == "kv"]
            ok, pages = True, 0
            for i in range(0, len(hv), STORAGE_BATCH_SIZE):  # _page_transfer_kv_batch
                if not ok:
                    continue
                batch = hv[i:i + STORAGE_BATCH_SIZE]
                idx = dest[r]["kv"][i * self.page_size:(i + len(batch)) * self.page_size]
                n = _leading(backend.batch_get_v1(batch, idx,
                                                  HiCacheStorageExtraInfo(prefix_keys=kp)))
                if derived:
                    got = backend.batch_get_v2([PoolTransfer(t.name, host_indices=idx, keys=batch)
                                                for t in derived])
                    n = min([n] + list(count_pool_hits(got).values()))
                ok = n == len(batch)
                if kp:
                    kp += batch
                pages += n
            done.append(pages)
            keys_after.append(kp)
        completed = min(done) * self.page_size  # MIN of the acks
        pool_hits = []
        for r, (backend, pools) in enumerate(self.ranks):  # _page_transfer_sidecar
            got = {}
            if done[r] == len(hv):  # this rank's own count
                others = [t for t in ops[r] if t.indices_from_pool != "kv"]
                for t in others:  # _sync_trailing_keys
                    if t.hit_policy == TRAILING:
                        n = len(t.keys) if t.keys else 1
                        t.keys = hv[max(0, done[r] - n):done[r]]
                        if t.host_indices is not None:
                            t.host_indices = t.host_indices[:len(t.keys) * pools[t.name].page_size]
                got = count_pool_hits(backend.batch_get_v2(
                    others, extra_info=HiCacheStorageExtraInfo(prefix_keys=keys_after[r])))
            pool_hits.append(got)
        names = {t.name for t in ops[0]}
        reduced = {n: min(h.get(n, 0) for h in pool_hits) for n in names}  # absent: 0
        others = [t for t in ops[0] if t.indices_from_pool != "kv"]
        if not others:  # KV and pools that follow it: what loaded is kept
            return completed, reduced, True
        kept = completed == len(hv) * self.page_size and all(
            t.keys is not None and reduced[t.name] == len(t.keys) for t in others)
        return (completed if kept else 0), reduced, kept


__all__ = ["Controller", "HybridController", "SideSpec", "count_pool_hits", "HiCacheStorageConfig", "HiCacheStorageExtraInfo", "PoolTransfer",
           "MHAHostPool", "MLAHostPool", "MLASplitHostPool", "storage_config", "create_backend", "page_hashes"]
