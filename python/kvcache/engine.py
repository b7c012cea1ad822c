# SPDX-License-Identifier: MIT
"""What every engine adapter does, without any engine.

An engine keeps its KV cache in paged tensors: per layer, one (or a K and a V)
tensor whose first dimension is the block.  kvcache stores one object per
block and rank: the block's bytes of every layer, K then V, layer after
layer, under a key from ``kvcache.keys``.  ``KVLayout`` says where a
block's bytes lie in the engine's tensors; ``BlockStore`` moves blocks
between them and kvcached:

* ``lookup(hashes)``: how many leading blocks every rank has stored (one
  ``batch_exists`` over all ranks' keys: the scheduler process asks for all
  of them, no worker round trip);
* ``save(hashes, block_ids)``/``load(hashes, block_ids)``: whole blocks,
  existing ones skipped on save, each block's key naming its parent so
  eviction keeps prefixes usable;
* ``begin_save``/``begin_load``: layer by layer, for engines that overlap
  the transfer of layer i with the compute of layer i+1 (a reservation or a
  view held over the whole step, one layer's bytes copied at a time).

``HeadSplitStore`` is the same for a rank whose blocks are kept under the
keys of a larger TP (a prefill and a decode of different TP sizes): one
object per group of its KV heads, each what a rank of the larger TP holds.

Two ways to move the bytes: ``"pointers"`` (host tensors: their memory is
registered once and libkvcache copies, with the GIL released) and
``"torch"`` (``tensor.copy_`` into reservation and view memory: what device
tensors need; the daemon's memory can be pinned with ``cudaHostRegister`` on
``client.segments()`` so those copies are DMA).  Both run on CPU tensors in
the tests; neither has run on a GPU here.
"""

from __future__ import annotations

import errno
import logging
import time
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

from .keys import BlockHash, KeySpec

log = logging.getLogger("kvcache")
_said = [0.0]


def unanswered(what: str, e: OSError, default):
    """A question the daemon could not answer (it is restarting, or gone):
    the engine goes on as on a miss and computes, never fails a step for
    it; said once in 10 s.  The Client connects again by itself at a later
    call."""
    now = time.monotonic()
    if now - _said[0] >= 10:
        _said[0] = now
        log.warning("kvcache: %s failed (%s): answered as a miss", what, e)
    return default


@dataclass(frozen=True)
class Segment:
    """One tensor (or the K or V half of one) holding a block per row.

    A block's bytes in the object are its elements in the tensor's logical
    order (``tensor[b]`` read row-major), whatever the physical layout: for
    vLLM that is NHD even when the cache is HND, so engines with either
    layout (or another kernel block size) share objects.  ``direct`` says
    the block's bytes lie in that order in one run of memory (NHD, MLA,
    Ascend): those are copied as plain bytes; the others (HND) are gathered
    and scattered by torch."""

    base: int         # address of block 0
    block_bytes: int  # bytes of one block
    stride: int       # bytes from one block to the next
    num_blocks: int
    layer: int
    tensor: object = None  # torch view with the block as dim 0 (for "torch")
    direct: bool = True    # the block is one run of memory in logical order


def _kv_halves(t, num_blocks: Optional[int]) -> list:
    """A tensor's K and V halves, each with blocks in dim 0, or [t].

    FlashAttention's ``(2, num_blocks, bs, H, D)`` (also when a hybrid model
    re-strides it blocks-outermost) and FlashInfer's ``(num_blocks, 2, bs,
    H, D)`` both split into K and V, so their objects are the same bytes,
    also where a kernel block size splits a block into rows (FlashInfer's K
    and V then alternate inside a block)."""
    if t.dim() >= 3 and t.shape[0] == 2:
        if num_blocks is not None and num_blocks > 2:
            if t.shape[1] % num_blocks == 0:
                return [t[0], t[1]]
        elif t.stride(0) > t.stride(1) or t.shape[1] != 2:
            return [t[0], t[1]]
    if t.dim() == 5 and t.shape[1] == 2:
        return [t[:, 0], t[:, 1]]
    return [t]


def _flatten(value) -> list:
    """A layer's cache: one tensor, or a tuple or list of them (vLLM-Ascend
    registers ``(k_cache, v_cache)``, ``(k_cache,)``, ``(indexer_k, scale)``;
    Mamba state lists)."""
    if isinstance(value, (tuple, list)):
        out = []
        for v in value:
            out += _flatten(v)
        return out
    return [value]


def _segment(h, layer: int, num_blocks: Optional[int]) -> Segment:
    """The segment of a tensor whose dim 0 is (kernel) blocks."""
    if h.dim() < 1 or h.shape[0] == 0:
        raise ValueError("layer %d: a KV tensor without blocks" % layer)
    rows = h.shape[0]
    n = rows if not num_blocks else num_blocks
    if rows % n:
        raise ValueError("layer %d: %d rows are not a whole number of %d blocks"
                         % (layer, rows, n))
    if rows != n:  # kernel blocks: a block is rows // n adjacent rows
        h = h.unflatten(0, (n, rows // n))
    block = h[0]
    nbytes = block.numel() * block.element_size()
    return Segment(h.data_ptr(), nbytes, h.stride(0) * h.element_size(), n, layer, h,
                   block.is_contiguous())


class KVLayout:
    """Where each block's bytes lie in an engine's KV tensors, and where
    each segment lands inside the block's object."""

    def __init__(self, segments: Sequence[Segment]):
        if not segments:
            raise ValueError("a layout needs at least one segment")
        self.segments = list(segments)
        self.num_blocks = min(s.num_blocks for s in self.segments)
        self.offsets = []
        off = 0
        for s in self.segments:
            self.offsets.append(off)
            off += s.block_bytes
        self.block_bytes = off
        self.num_layers = max(s.layer for s in self.segments) + 1
        self.direct = all(s.direct for s in self.segments)

    @classmethod
    def from_tensors(cls, tensors: Sequence, num_blocks: Optional[int] = None) -> "KVLayout":
        """Per layer, a tensor of shape ``(num_blocks, ...)`` (one segment:
        MLA, FlashInfer), ``(2, num_blocks, ...)`` (K and V: FlashAttention),
        or a tuple or list of such tensors (vLLM-Ascend, Mamba).

        ``num_blocks`` is the engine's block count (vLLM's
        ``kv_cache_config.num_blocks``): a tensor with ``r`` times as many
        rows holds each block as ``r`` adjacent kernel blocks (attention
        kernels whose block size is smaller than the scheduler's).  Views
        of the same memory registered under several layer names are stored
        once."""
        segs = []
        seen = set()
        for layer, value in enumerate(tensors):
            for t in _flatten(value):
                if t is None:
                    continue
                ident = (t.data_ptr(), tuple(t.shape), tuple(t.stride()))
                if ident in seen:
                    continue  # a layer that shares another's cache
                seen.add(ident)
                for h in _kv_halves(t, num_blocks):
                    segs.append(_segment(h, layer, num_blocks))
        return cls(segs)

    def pieces(self, block_id: int, layer: Optional[int] = None) -> Tuple[List[int], List[int]]:
        """Addresses and lengths of a block's bytes (one layer's, or all)."""
        if not 0 <= block_id < self.num_blocks:
            raise IndexError("block %d of %d" % (block_id, self.num_blocks))
        if not self.direct:
            raise ValueError("blocks of this layout are not runs of memory: copy with torch")
        ptrs, sizes = [], []
        for s in self.segments:
            if layer is None or s.layer == layer:
                ptrs.append(s.base + block_id * s.stride)
                sizes.append(s.block_bytes)
        return ptrs, sizes

    def head_group(self, group: int, groups: int) -> "KVLayout":
        """The layout of one of ``groups`` equal groups of each segment's
        KV heads (the next to last dimension of a block in logical order):
        the blocks a rank of a ``groups`` times larger TP holds, gathered by
        torch."""
        segs = []
        for s in self.segments:
            shape = tuple(s.tensor.shape[1:]) if s.tensor is not None else ()
            if len(shape) < 2 or shape[-2] % groups:
                raise ValueError(
                    "layer %d: blocks of shape %s do not split into %d KV head groups (the "
                    "other instance's TP size needs whole heads per rank)"
                    % (s.layer, shape, groups))
            h = shape[-2] // groups
            segs.append(Segment(s.base, s.block_bytes // groups, s.stride, s.num_blocks,
                                s.layer, s.tensor[..., group * h:(group + 1) * h, :], False))
        return KVLayout(segs)

    def ranges(self) -> List[Tuple[int, int]]:
        """The memory the segments span, merged: what to register."""
        spans = sorted((s.base, s.base + (s.num_blocks - 1) * s.stride + s.block_bytes)
                       for s in self.segments)
        out: List[List[int]] = []
        for lo, hi in spans:
            if out and lo <= out[-1][1]:
                out[-1][1] = max(out[-1][1], hi)
            else:
                out.append([lo, hi])
        return [(lo, hi - lo) for lo, hi in out]


def _byte_view(t):
    """A flat uint8 view of a contiguous tensor (no copy)."""
    import torch
    return t.reshape(-1).view(torch.uint8)


def _block_to(seg: Segment, block_id: int, dst) -> None:
    """Copy a block's elements, in logical order, into dst (uint8)."""
    import torch
    blk = seg.tensor[block_id]
    if seg.direct:
        dst.copy_(_byte_view(blk))
    else:  # HND and other strided blocks: torch gathers them
        dst.view(blk.dtype).view(blk.shape).copy_(blk)


def _block_from(seg: Segment, block_id: int, src) -> None:
    """Copy src (uint8, a block in logical order) into the block."""
    blk = seg.tensor[block_id]
    if seg.direct:
        _byte_view(blk).copy_(src)
    else:
        blk.copy_(src.view(blk.dtype).view(blk.shape))


class BlockStore:
    """Blocks of one rank's KV cache in kvcached (see the module's text)."""

    def __init__(self, client, spec: KeySpec, layout: Optional[KVLayout] = None,
                 transfer: str = "pointers"):
        if transfer not in ("pointers", "torch"):
            raise ValueError("transfer is 'pointers' or 'torch'")
        self.client = client
        self.spec = spec
        self.layout = None
        self.transfer = transfer
        self.stats = {"saved": 0, "skipped": 0, "loaded": 0, "save_failed": 0,
                      "load_failed": 0, "pressure": 0}
        if layout is not None:
            self.attach(layout)

    def attach(self, layout: KVLayout) -> None:
        """Use these tensors.  With "pointers" their memory is registered;
        memory that is not host memory (a device tensor) falls back to
        "torch" copies."""
        self.layout = layout
        if self.transfer == "pointers" and not layout.direct:
            self.transfer = "torch"  # strided blocks (HND): torch gathers them
        if self.transfer != "pointers":
            return
        for base, length in layout.ranges():
            r = self.client.register_memory(base, length)
            if r == -errno.EFAULT and all(s.tensor is not None for s in layout.segments):
                self.transfer = "torch"
                return
            if r < 0:
                raise OSError(-r, "cannot register the KV cache memory: %s" %
                              self.client_strerror(r))

    @staticmethod
    def client_strerror(r: int) -> str:
        from . import strerror
        return strerror(r)

    # ---- keys and lookup ----
    def keys(self, hashes: Sequence[BlockHash]) -> List[str]:
        return self.spec.keys(hashes)

    def lookup(self, hashes: Sequence[BlockHash], all_ranks: bool = True) -> int:
        """Leading blocks stored for every rank (or this one)."""
        if not hashes:
            return 0
        specs = self.spec.ranks() if all_ranks else [self.spec]
        try:
            if len(specs) == 1:
                return self.client.prefix_lookup(specs[0].keys(hashes))
            keys: List[str] = []
            for s in specs:
                keys += s.keys(hashes)
            present = self.client.batch_exists(keys)
        except OSError as e:
            return unanswered("lookup", e, 0)
        n = len(hashes)
        hit = n
        for r in range(len(specs)):
            row = present[r * n:(r + 1) * n]
            first_miss = row.index(False) if False in row else n
            hit = min(hit, first_miss)
        return hit

    # ---- whole blocks ----
    def save(self, hashes: Sequence[BlockHash], block_ids: Sequence[int],
             parent: Optional[BlockHash] = None, skip_existing: bool = True,
             raw: bool = False) -> List[int]:
        """Store blocks (hashes[i] from block_ids[i]): 0 or -errno each; a
        block stored already answers 0 (-EEXIST with ``raw``: its put is
        refused before any byte is copied; no lookup first, which would wait
        for a put announced for these very blocks).  ``parent`` is the hash
        of the block before hashes[0], if any."""
        self._need_layout()
        if len(hashes) != len(block_ids):
            raise ValueError("hashes and block_ids differ in length")
        keys = self.keys(hashes)
        parents = [self.spec.key(parent) if parent is not None else None] + keys[:-1]
        pending = list(range(len(keys)))
        results = [0] * len(keys)
        if self.transfer == "pointers":
            # one call per run of consecutive blocks, each naming the one
            # before it as its parent (chain)
            for run in _runs(pending):
                ptrs, sizes = [], []
                for i in run:
                    p, n = self.layout.pieces(block_ids[i])
                    ptrs.append(p)
                    sizes.append(n)
                res = self.client.batch_put_from_multi_buffers(
                    [keys[i] for i in run], ptrs, sizes, parent=parents[run[0]], chain=True)
                for i, r in zip(run, res):
                    self._note_save(results, i, r, raw)
                if -errno.ENOSPC in res:
                    # store pressure: the other runs would fail too
                    self.stats["pressure"] += 1
                    for j in pending[pending.index(run[-1]) + 1:]:
                        results[j] = -errno.ENOSPC
                    break
            return results
        for i in pending:
            r = self._save_torch(keys[i], block_ids[i], parents[i])
            self._note_save(results, i, r, raw)
            if r == -errno.ENOSPC:
                self.stats["pressure"] += 1
                # store pressure: the rest would fail too
                for j in pending[pending.index(i) + 1:]:
                    results[j] = -errno.ENOSPC
                break
        return results

    def _note_save(self, results: List[int], i: int, r: int, raw: bool = False) -> None:
        results[i] = 0 if r == -errno.EEXIST and not raw else r
        if r == -errno.EEXIST:
            self.stats["skipped"] += 1
        elif r == 0:
            self.stats["saved"] += 1
        else:
            self.stats["save_failed"] += 1

    def _save_torch(self, key: str, block_id: int, parent: Optional[str]) -> int:
        import torch
        try:
            res = self.client.reserve(key, self.layout.block_bytes, parent=parent)
        except OSError as e:
            return -e.errno
        dst = torch.frombuffer(res.memoryview(), dtype=torch.uint8)
        for s, off in zip(self.layout.segments, self.layout.offsets):
            _block_to(s, block_id, dst[off:off + s.block_bytes])
        _sync(self.layout)
        del dst
        return res.commit()

    def load(self, hashes: Sequence[BlockHash], block_ids: Sequence[int]) -> List[int]:
        """Load blocks into block_ids: the object's length or -errno each."""
        self._need_layout()
        if len(hashes) != len(block_ids):
            raise ValueError("hashes and block_ids differ in length")
        keys = self.keys(hashes)
        if self.transfer == "pointers":
            ptrs, sizes = [], []
            for b in block_ids:
                p, s = self.layout.pieces(b)
                ptrs.append(p)
                sizes.append(s)
            res = self.client.batch_get_into_multi_buffers(keys, ptrs, sizes)
        else:
            res = [self._load_torch(k, b) for k, b in zip(keys, block_ids)]
        for i, r in enumerate(res):
            if r >= 0 and r != self.layout.block_bytes:
                res[i] = -errno.EBADMSG  # another layout's bytes under this key
        self.stats["loaded"] += sum(1 for r in res if r >= 0)
        self.stats["load_failed"] += sum(1 for r in res if r < 0)
        return res

    def _load_torch(self, key: str, block_id: int) -> int:
        import torch
        v = self.client.acquire(key)
        if v is None:
            return -errno.ENOENT
        with v:
            if v.size != self.layout.block_bytes:
                return v.size
            src = torch.frombuffer(v.memoryview(), dtype=torch.uint8)
            for s, off in zip(self.layout.segments, self.layout.offsets):
                _block_from(s, block_id, src[off:off + s.block_bytes])
            _sync(self.layout)
            del src
            return v.size

    # ---- layer by layer ----
    def begin_save(self, hashes: Sequence[BlockHash], block_ids: Sequence[int],
                   parent: Optional[BlockHash] = None) -> "LayerwiseSave":
        self._need_layout()
        return LayerwiseSave(self, hashes, block_ids, parent)

    def begin_load(self, hashes: Sequence[BlockHash], block_ids: Sequence[int]) -> "LayerwiseLoad":
        self._need_layout()
        return LayerwiseLoad(self, hashes, block_ids)

    def _need_layout(self) -> None:
        if self.layout is None:
            raise RuntimeError("no KV cache attached (BlockStore.attach)")


class HeadSplitStore:
    """A rank's blocks kept as ``groups`` objects each, under the keys of a
    TP ``groups`` times larger (a prefill and a decode of different TP
    sizes): object g of a block holds the g-th group of this rank's KV heads
    and is, byte for byte, the object that rank ``tp_rank + g`` of the
    larger TP stores, so either side reads the other's.  ``spec``: the key
    spec of this rank's first group.  A block is stored, loaded or skipped
    when every group is; its result is the first group's error otherwise,
    and a load's the block's length."""

    def __init__(self, client, spec: KeySpec, groups: int):
        self.client = client
        self.spec = spec
        self.groups = groups
        self.layout: Optional[KVLayout] = None
        self.transfer = "torch"
        self.parts = [BlockStore(client, spec.for_rank(spec.tp_rank + g, spec.pp_rank,
                                                       spec.cp_rank), transfer="torch")
                      for g in range(groups)]
        self.stats = {"saved": 0, "skipped": 0, "loaded": 0, "save_failed": 0,
                      "load_failed": 0, "pressure": 0}

    def attach(self, layout: KVLayout) -> None:
        parts = [layout.head_group(g, self.groups) for g in range(self.groups)]
        self.layout = layout
        for store, part in zip(self.parts, parts):
            store.attach(part)

    def keys(self, hashes: Sequence[BlockHash]) -> List[str]:
        return self.spec.keys(hashes)

    def lookup(self, hashes: Sequence[BlockHash], all_ranks: bool = True) -> int:
        if all_ranks:
            return self.parts[0].lookup(hashes)
        return min(p.lookup(hashes, all_ranks=False) for p in self.parts)

    def save(self, hashes: Sequence[BlockHash], block_ids: Sequence[int],
             parent: Optional[BlockHash] = None, skip_existing: bool = True) -> List[int]:
        skipped = [0] * len(hashes)
        results = [0] * len(hashes)
        for p in self.parts:
            for i, r in enumerate(p.save(hashes, block_ids, parent, raw=True)):
                skipped[i] += r == -errno.EEXIST
                if r not in (0, -errno.EEXIST) and results[i] == 0:
                    results[i] = r
        for i, r in enumerate(results):
            if r:
                self.stats["save_failed"] += 1
            elif skipped[i] == self.groups:
                self.stats["skipped"] += 1
            else:
                self.stats["saved"] += 1
        if any(p.stats["pressure"] for p in self.parts):
            self.stats["pressure"] = max(p.stats["pressure"] for p in self.parts)
        return results

    def _merge_loads(self, per_group: List[List[int]]) -> List[int]:
        out = []
        for rs in zip(*per_group):
            bad = [r for r in rs if r < 0]
            out.append(bad[0] if bad else sum(rs))
        self.stats["loaded"] += sum(1 for r in out if r >= 0)
        self.stats["load_failed"] += sum(1 for r in out if r < 0)
        return out

    def load(self, hashes: Sequence[BlockHash], block_ids: Sequence[int]) -> List[int]:
        return self._merge_loads([p.load(hashes, block_ids) for p in self.parts])

    def begin_save(self, hashes, block_ids, parent=None) -> "_GroupedLayers":
        return _GroupedLayers([p.begin_save(hashes, block_ids, parent) for p in self.parts],
                              self._merge_saves)

    def begin_load(self, hashes, block_ids) -> "_GroupedLayers":
        return _GroupedLayers([p.begin_load(hashes, block_ids) for p in self.parts],
                              self._merge_loads)

    @staticmethod
    def _merge_saves(per_group: List[List[int]]) -> List[int]:
        return [next((r for r in rs if r), 0) for rs in zip(*per_group)]


class _GroupedLayers:
    """Layer-by-layer saves or loads of every head group of the blocks."""

    def __init__(self, parts, merge):
        self.parts, self.merge = parts, merge

    def save_layer(self, layer: int) -> None:
        for p in self.parts:
            p.save_layer(layer)

    def load_layer(self, layer: int) -> None:
        for p in self.parts:
            p.load_layer(layer)

    def finish(self, *args) -> List[int]:
        return self.merge([p.finish(*args) for p in self.parts])


def _runs(idx: List[int]) -> List[List[int]]:
    """Consecutive runs of sorted indexes: [1, 2, 4] -> [[1, 2], [4]]."""
    out: List[List[int]] = []
    for i in idx:
        if out and out[-1][-1] == i - 1:
            out[-1].append(i)
        else:
            out.append([i])
    return out


def _sync(layout: KVLayout) -> None:
    """Device copies must be done before a commit or a release: through the
    device's own stream API (torch.cuda, torch.npu with torch_npu, ...)."""
    t = layout.segments[0].tensor
    dev = getattr(t, "device", None)
    if dev is None or dev.type == "cpu":
        return
    import torch
    mod = getattr(torch, dev.type, None)
    if mod is not None and hasattr(mod, "current_stream"):
        mod.current_stream(dev).synchronize()


def _layer_segments(layout: KVLayout, layer: int):
    """(segment, offset in the block's object) for one layer's segments."""
    return ((s, off) for s, off in zip(layout.segments, layout.offsets) if s.layer == layer)


class LayerwiseSave:
    """Reserve every missing block's object now, copy one layer's bytes at a
    time (``save_layer``), commit at ``finish``."""

    def __init__(self, store: BlockStore, hashes, block_ids, parent):
        self.store = store
        keys = store.keys(hashes)
        parents = [store.spec.key(parent) if parent is not None else None] + keys[:-1]
        self.results = [0] * len(keys)
        self.items: List[Tuple[int, object, int]] = []  # (position, reservation, block id)
        for i, k in enumerate(keys):
            try:
                res = store.client.reserve(k, store.layout.block_bytes, parent=parents[i])
            except OSError as e:
                if e.errno != errno.EEXIST:  # stored already: nothing to do
                    self.results[i] = -e.errno
                continue
            self.items.append((i, res, block_ids[i]))

    def save_layer(self, layer: int) -> None:
        for _, res, b in self.items:
            for s, off in _layer_segments(self.store.layout, layer):
                if self.store.transfer == "pointers":
                    res.write_from(off, s.base + b * s.stride, s.block_bytes)
                else:
                    import torch
                    dst = torch.frombuffer(res.memoryview(), dtype=torch.uint8)
                    _block_to(s, b, dst[off:off + s.block_bytes])
                    del dst

    def finish(self, ok: bool = True) -> List[int]:
        _sync(self.store.layout)
        for i, res, _ in self.items:
            r = res.commit() if ok else res.abort()
            self.results[i] = 0 if r == -errno.EEXIST else r
        self.store.stats["saved"] += sum(1 for i, _, _ in self.items if self.results[i] == 0)
        self.items = []
        return self.results


class LayerwiseLoad:
    """Acquire every block's object now (the views pin them), copy one
    layer's bytes at a time (``load_layer``), release at ``finish``."""

    def __init__(self, store: BlockStore, hashes, block_ids):
        self.store = store
        self.results: List[int] = []
        self.items: List[Tuple[object, int]] = []
        for k, b in zip(store.keys(hashes), block_ids):
            v = store.client.acquire(k)
            if v is None:
                self.results.append(-errno.ENOENT)
            elif v.size != store.layout.block_bytes:
                v.release()
                self.results.append(-errno.EBADMSG)
            else:
                self.results.append(v.size)
                self.items.append((v, b))

    def load_layer(self, layer: int) -> None:
        for v, b in self.items:
            for s, off in _layer_segments(self.store.layout, layer):
                if self.store.transfer == "pointers":
                    v.read_into(off, s.base + b * s.stride, s.block_bytes)
                else:
                    import torch
                    src = torch.frombuffer(v.memoryview(), dtype=torch.uint8)
                    _block_from(s, b, src[off:off + s.block_bytes])
                    del src

    def finish(self) -> List[int]:
        _sync(self.store.layout)
        for v, _ in self.items:
            v.release()
        self.items = []
        self.store.stats["loaded"] += sum(1 for r in self.results if r >= 0)
        return self.results


def block_hashes_of(tokens: Sequence[int], block_tokens: int,
                    salt: bytes = b"") -> List[bytes]:
    """Chained sha256 block hashes of full blocks (SGLang's scheme, over
    little-endian uint32 tokens): for engines and tools that bring none."""
    import hashlib
    import struct
    out: List[bytes] = []
    prev = salt
    for i in range(0, len(tokens) - len(tokens) % block_tokens, block_tokens):
        h = hashlib.sha256(prev)
        h.update(struct.pack("<%dI" % block_tokens, *tokens[i:i + block_tokens]))
        prev = h.digest()
        out.append(prev)
    return out


__all__ = ["Segment", "KVLayout", "BlockStore", "HeadSplitStore", "LayerwiseSave",
           "LayerwiseLoad",
           "block_hashes_of"]
