# SPDX-License-Identifier: MIT
"""An SGLang HiCache storage backend (L3) backed by the node's kvcached.

Enable it with::

    --enable-hierarchical-cache --hicache-mem-layout page_first
    --hicache-storage-backend dynamic
    --hicache-storage-backend-extra-config '{"backend_name": "kvcache",
        "module_path": "kvcache.sglang", "class_name": "KvcacheStore",
        "interface_v1": 1, "socket": "/run/kvcached.sock"}'

``interface_v1`` must be 1: SGLang picks its zero-copy page path
(``batch_get_v1``/``batch_set_v1`` over the host pool) by that flag.

One object per page and rank holds the page's K and V (two pieces), where
Mooncake's backend stores two objects (``_k`` and ``_v``): half the keys, and
a page is never half present.  Keys are ``kvcache.keys`` keys: the model,
the host pool's dtype, the layout, the page size and the rank beside
SGLang's page hash; MLA pages are shared by every TP rank.  Each page names
the page before it as its parent, so eviction keeps prefixes usable.

SGLang is not installed where the test suite runs: the suite drives this
class with a host pool shaped like SGLang's ``page_first`` pool and real
tensors.
"""

from __future__ import annotations

import errno
from typing import Any, List, Optional

from . import _kvcache
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

LAYOUTS = ("page_first", "page_first_direct")


def _dtype_name(dtype: Any) -> str:
    return str(dtype).replace("torch.", "")


class KvcacheStore(HiCacheStorage):
    def __init__(self, storage_config: Any, kwargs: Optional[dict] = None):
        self.config = storage_config
        extra = dict(getattr(storage_config, "extra_config", None) or {})
        self.extra = extra
        self.client = _kvcache.Client(extra.get("socket"))
        self.spec: Optional[KeySpec] = None
        self.pool = None
        self.is_mla = bool(getattr(storage_config, "is_mla_model", False))

    # ---- the host pool ----
    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        layout = getattr(mem_pool_host, "layout", "page_first")
        if layout not in LAYOUTS:
            raise ValueError("kvcache needs --hicache-mem-layout page_first or "
                             "page_first_direct, not %s" % layout)
        self.pool = mem_pool_host
        self.mem_pool_host = mem_pool_host
        buf = mem_pool_host.kv_buffer
        r = self.client.register_memory(buf.data_ptr(), buf.numel() * buf.element_size())
        if r < 0:
            raise OSError(-r, "cannot register SGLang's host KV pool: %s" % _kvcache.strerror(r))
        c = self.config
        tp_size = int(getattr(c, "tp_size", 1))
        self.spec = KeySpec(
            getattr(c, "model_name", None) or self.extra.get("model_name") or "unknown",
            _dtype_name(getattr(mem_pool_host, "dtype", "unknown")),
            "sglang-" + layout, int(mem_pool_host.page_size),
            int(getattr(c, "tp_rank", 0)) if not self.is_mla else 0, tp_size,
            int(getattr(c, "pp_rank", 0)), int(getattr(c, "pp_size", 1)),
            shared_across_ranks=self.is_mla)

    def _keys(self, keys: List[str]) -> List[str]:
        if self.spec is None:
            raise RuntimeError("register_mem_pool_host() was not called")
        return self.spec.keys(keys)

    def _pages(self, host_indices: Any, n: int):
        """Per page, its pointers and sizes in the host pool (K and V, or
        one for MLA)."""
        if len(host_indices) != n * self.pool.page_size:
            raise ValueError("%d host indices for %d pages of %d" %
                             (len(host_indices), n, self.pool.page_size))
        ptrs, sizes = self.pool.get_page_buffer_meta(host_indices)
        per = len(ptrs) // n if n else 0
        if n == 0 or per * n != len(ptrs):
            raise ValueError("%d pointers for %d pages" % (len(ptrs), n))
        return ([list(ptrs[i * per:(i + 1) * per]) for i in range(n)],
                [list(sizes[i * per:(i + 1) * per]) for i in range(n)])

    # ---- the zero-copy page path (interface_v1) ----
    def batch_exists(self, keys: List[str], extra_info: Any = None) -> int:
        """How many leading pages are stored."""
        if not keys:
            return 0
        return self.client.prefix_lookup(self._keys(keys))

    def batch_get_v1(self, keys: List[str], host_indices: Any,
                     extra_info: Any = None) -> List[bool]:
        if not keys:
            return []
        ptrs, sizes = self._pages(host_indices, len(keys))
        res = self.client.batch_get_into_multi_buffers(self._keys(keys), ptrs, sizes)
        return [r > 0 for r in res]

    def batch_set_v1(self, keys: List[str], host_indices: Any,
                     extra_info: Any = None) -> List[bool]:
        if not keys:
            return []
        ks = self._keys(keys)
        ptrs, sizes = self._pages(host_indices, len(keys))
        present = self.client.batch_exists(ks)
        out = []
        prefix = getattr(extra_info, "prefix_keys", None) if extra_info is not None else None
        parent = self.spec.key(prefix[-1]) if prefix else None
        for i, k in enumerate(ks):
            if present[i]:
                out.append(True)
            else:
                r = self.client.batch_put_from_multi_buffers([k], [ptrs[i]], [sizes[i]],
                                                             parent=parent)[0]
                out.append(r == 0 or r == -errno.EEXIST)
            parent = k
        return out

    # ---- the generic (tensor) path ----
    def exists(self, key: str) -> bool:
        return self.client.exists(self._keys([key])[0])

    def get(self, key: str, target_location: Any = None, target_sizes: Any = None):
        """Into target_location (a tensor or writable buffer) when given, else
        a new uint8 tensor; None on a miss."""
        k = self._keys([key])[0]
        if target_location is not None:
            n = self.client.get_into(k, _as_buffer(target_location, writable=True))
            return target_location if n > 0 else None
        data = self.client.get(k)
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
        if self.spec is not None:
            self.client.remove_prefix(self.spec.prefix(), force=True)

    def get_stats(self):
        return self.client.stats()

    def close(self) -> None:
        self.client.close()


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


__all__ = ["KvcacheStore", "HAVE_SGLANG"]
