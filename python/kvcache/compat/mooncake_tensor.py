# SPDX-License-Identifier: MIT
"""Tensors as Mooncake's store keeps them, whole or split by a parallelism.

The object format is Mooncake's TensorMetadata; the ``*_with_parallelism*``
calls follow ``store_py_parallel_write.h`` and ``store_py_parallel_read.h``
(Mooncake 3b5a594): the same keys, shard headers and manifests, so either
store reads what the other wrote.  Keys:

* one TP axis: ``<key>_tp_<rank>`` (as ``put_tensor_with_tp``);
* any other set of axes: ``<key>`` then, for each axis present, in this
  order whatever order the caller gave, ``__dp_<r>of<n>``,
  ``__tp_<r>of<n>_sd<d>``, ``__ep_<r>of<n>_eid<e>``, ``__pp_<r>of<n>_sid<s>``;
* a writer's partition: ``<key>__writer_<r>of<n>_sd<d>``;
* manifests (96 bytes: magic "NAMW", version 1, dtype, ndim, split dim,
  shard count, the whole shape): ``<key>__parallelism_manifest`` and
  ``<key>__writer_manifest``.

Only a TP axis splits data, evenly (an uneven split is refused: -600 on a
write, None on a read); DP, EP and PP name which replica, expert or stage a
shard belongs to.  Reads rebuild the whole tensor from its shards, or a
shard of another TP size from the shards stored.
"""

from __future__ import annotations

import ctypes
import struct
from typing import Any, List, Optional, Sequence

INVALID_PARAMS = -600  # Mooncake's, as in mooncake.py

# Tensors as Mooncake stores them: its TensorMetadata (integration_utils.h),
# 304 bytes, then the tensor's bytes, so either store reads what the other
# wrote.  A 40-byte header: magic "NOOM", version 1, header size 304, int32
# dtype, int32 ndim, layout (FULL 0, SHARD 1), flags, data offset, data
# bytes; then the layout: the global and the local shape (int64[8], -1
# past ndim), the axis count and 4 axes of (kind, index, rank, count,
# split_dim, reserved, int64 local extent).  Little-endian, as on the
# machines Mooncake runs on.
_TENSOR_MAGIC = 0x4D4F4F4E
_TENSOR_HDR = struct.Struct("<IHHiiIIQQ")
_TENSOR_SHAPE = struct.Struct("<8q")
_TENSOR_AXES = struct.Struct("<II")
_TENSOR_AXIS = struct.Struct("<iiiiiiq")
_TENSOR_META_SIZE = 304
_MAX_DIMS = 8
_LAYOUT_FULL, _LAYOUT_SHARD = 0, 1
_AXIS_TP = 1
_TENSOR_DTYPES = ("float32", "float64", "int8", "uint8", "int16", "uint16", "int32",
                  "uint32", "int64", "uint64", "bool", "float16", "bfloat16",
                  "float8_e4m3fn", "float8_e5m2")
_DTYPE_SIZES = (4, 8, 1, 1, 2, 2, 4, 4, 8, 8, 1, 2, 2, 1, 1)
# what kvcache wrote before it followed Mooncake's current layout (int32
# dtype, int32 ndim, int64 shape[4]): still read
_LEGACY_META = struct.Struct("<ii4q")


def _tensor_meta(dtype: int, local: Sequence[int], nbytes: int, global_shape=None,
                 axes: Sequence[tuple] = ()) -> bytes:
    """A TensorMetadata: FULL, or SHARD with global_shape and axes (each
    (kind, rank, count, split_dim, local extent[, expert or stage id]), at
    their index in the list)."""
    ndim = len(local)
    pad = [-1] * (_MAX_DIMS - ndim)
    g = list(global_shape if global_shape is not None else local)
    out = bytearray(_TENSOR_META_SIZE)
    _TENSOR_HDR.pack_into(out, 0, _TENSOR_MAGIC, 1, _TENSOR_META_SIZE, dtype, ndim,
                          _LAYOUT_SHARD if axes else _LAYOUT_FULL, 0, _TENSOR_META_SIZE, nbytes)
    _TENSOR_SHAPE.pack_into(out, 40, *(g + pad))
    _TENSOR_SHAPE.pack_into(out, 104, *(list(local) + pad))
    _TENSOR_AXES.pack_into(out, 168, len(axes), 0)
    for i, (kind, rank, count, split_dim, extent, *rest) in enumerate(axes):
        _TENSOR_AXIS.pack_into(out, 176 + 32 * i, kind, i, rank, count, split_dim,
                               rest[0] if rest else 0, extent)
    return bytes(out)


def _dtype_index(tensor: Any) -> int:
    name = str(tensor.dtype).replace("torch.", "")
    return _TENSOR_DTYPES.index(name) if name in _TENSOR_DTYPES else -1


def _tensor_parts(tensor: Any, global_shape=None, axes: Sequence[tuple] = ()):
    """(metadata bytes, the tensor's bytes as a memoryview, the contiguous
    tensor that owns them), or None when Mooncake would refuse it (not a
    tensor, an unknown dtype, more than 8 dimensions)."""
    if "Tensor" not in type(tensor).__name__:
        return None
    import torch
    dtype = _dtype_index(tensor)
    if dtype < 0 or tensor.dim() > _MAX_DIMS:
        return None
    t = tensor.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.contiguous()
    data = t.reshape(-1).view(torch.uint8).numpy()
    meta = _tensor_meta(dtype, list(t.shape), data.nbytes, global_shape, axes)
    return meta, memoryview(data).cast("B"), t


def _parse_meta(buf: Any, length: int):
    """(dtype, local shape, data offset) of a stored tensor object, by
    Mooncake's ValidateTensorMetadata (or the older kvcache layout), or
    None."""
    if length >= _TENSOR_META_SIZE and _TENSOR_HDR.unpack_from(buf, 0)[0] == _TENSOR_MAGIC:
        (_, ver, hsize, dtype, ndim, kind, flags, off, nbytes) = _TENSOR_HDR.unpack_from(buf, 0)
        g = _TENSOR_SHAPE.unpack_from(buf, 40)
        local = _TENSOR_SHAPE.unpack_from(buf, 104)
        n_axes, _ = _TENSOR_AXES.unpack_from(buf, 168)
        if (ver != 1 or hsize != _TENSOR_META_SIZE or not 0 <= dtype < len(_TENSOR_DTYPES) or
                not 0 <= ndim <= _MAX_DIMS or n_axes > 4 or kind > _LAYOUT_SHARD or
                not _TENSOR_META_SIZE <= off <= length or nbytes != length - off):
            return None
        if (any(d < 0 for d in local[:ndim] + g[:ndim]) or
                any(d != -1 for d in local[ndim:] + g[ndim:])):
            return None
        numel = 1
        for d in local[:ndim]:
            numel *= d
        if nbytes != numel * _DTYPE_SIZES[dtype]:
            return None
        for i in range(n_axes):
            k, _, rank, count, sd, _, _ = _TENSOR_AXIS.unpack_from(buf, 176 + 32 * i)
            if not 0 <= k <= 4 or count <= 0 or not 0 <= rank < count or not -1 <= sd < ndim:
                return None
        return dtype, list(local[:ndim]), off
    if length <= _LEGACY_META.size:
        return None
    dtype, ndim, *shape = _LEGACY_META.unpack_from(buf, 0)
    if not 0 <= ndim <= 4 or not 0 <= dtype < len(_TENSOR_DTYPES):
        return None
    numel = 1
    for d in shape[:ndim]:
        if d < 0:
            return None
        numel *= d
    if length - _LEGACY_META.size != numel * _DTYPE_SIZES[dtype]:
        return None
    return dtype, list(shape[:ndim]), _LEGACY_META.size


def _tensor_from(buf: Any, length: int) -> Any:
    """The tensor a stored value holds (a view of buf), or None when it is
    not one Mooncake's rules read."""
    import torch
    meta = _parse_meta(buf, length)
    if meta is None:
        return None
    dtype, shape, off = meta
    tdtype = getattr(torch, _TENSOR_DTYPES[dtype], None)
    if tdtype is None:
        return None  # a dtype this torch does not have
    if length == off:  # no elements
        return torch.empty(shape, dtype=tdtype)
    raw = torch.frombuffer(buf, dtype=torch.uint8, count=length - off, offset=off)
    t = raw.view(tdtype)
    return t.reshape(shape) if shape else t.reshape(())


def _serialize_tensor(tensor: Any):
    """As Mooncake's: (the 304-byte metadata, the data's address, its
    length, the contiguous tensor that owns it); ValueError when Mooncake
    would not store it."""
    parts = _tensor_parts(tensor)
    if parts is None:
        raise ValueError("unsupported tensor for Mooncake tensor serialization")
    meta, data, owner = parts
    return meta, owner.data_ptr(), data.nbytes, owner


def _tensor_metadata_size() -> int:
    return _TENSOR_META_SIZE


def _deserialize_tensor(data: Any) -> Any:
    """The tensor in [TensorMetadata][bytes] (a copy); ValueError when it is
    not one."""
    buf = bytearray(data)
    t = _tensor_from(buf, len(buf))
    if t is None:
        raise ValueError("invalid Mooncake tensor object")
    return t.clone()


def _tp_key(key: str, rank: int) -> str:
    return "%s_tp_%d" % (key, rank)



class ParallelAxis:
    """One axis of a tensor's parallelism: kind "tp", "dp", "ep" or "pp",
    this rank and the size, and the split dimension (tp), expert (ep) or
    stage (pp)."""

    def __init__(self):
        self.kind = ""
        self.rank = 0
        self.size = 1
        self.split_dim: Optional[int] = None
        self.expert_id: Optional[int] = None
        self.stage_id: Optional[int] = None


class TensorParallelism:
    def __init__(self):
        self.axes: List[ParallelAxis] = []


class ReadTarget:
    """How a tensor is read back: "as_stored", "shard" or "full"."""

    _MODES = ("as_stored", "shard", "full")

    def __init__(self):
        self._mode = "as_stored"
        self.parallelism: Optional[TensorParallelism] = None

    @property
    def mode(self) -> str:
        return self._mode

    @mode.setter
    def mode(self, value: str) -> None:
        v = str(value).lower()
        if v not in self._MODES:
            raise RuntimeError("Unsupported ReadTarget mode")
        self._mode = v


# ---- parallelism: axes, keys, manifests ----

_KINDS = {"DP": 0, "TP": 1, "EP": 2, "PP": 3}
_KIND_NAMES = {v: k.lower() for k, v in _KINDS.items()}
_AXIS_EP, _AXIS_PP = 2, 3
_MANIFEST = struct.Struct("<IHHiiiii4x8q")
_MANIFEST_MAGIC = 0x574D414E
_MANIFEST_SIZE = 96


class _Axis:
    """A parsed ParallelAxis: kind (0-3), rank, size, split_dim, expert_id,
    stage_id (None where not set)."""

    __slots__ = ("kind", "rank", "size", "split_dim", "expert_id", "stage_id")

    def __init__(self, kind, rank, size, split_dim=None, expert_id=None, stage_id=None):
        self.kind, self.rank, self.size = kind, rank, size
        self.split_dim, self.expert_id, self.stage_id = split_dim, expert_id, stage_id

    def fields(self) -> tuple:
        return (self.kind, self.rank, self.size, self.split_dim, self.expert_id,
                self.stage_id)

    def with_tp(self, rank: int, size: Optional[int] = None) -> "_Axis":
        if self.kind != _AXIS_TP:
            return self
        return _Axis(self.kind, rank, self.size if size is None else size, self.split_dim,
                     self.expert_id, self.stage_id)

    def suffix(self) -> str:
        s = "%s_%dof%d" % (_KIND_NAMES[self.kind], self.rank, self.size)
        if self.split_dim is not None:
            s += "_sd%d" % self.split_dim
        if self.expert_id is not None:
            s += "_eid%d" % self.expert_id
        if self.stage_id is not None:
            s += "_sid%d" % self.stage_id
        return s

    def meta(self, local: Sequence[int]) -> tuple:
        """(kind, rank, count, split_dim, local extent, id) for _tensor_meta."""
        sd = -1 if self.split_dim is None else self.split_dim
        extent = local[sd] if self.split_dim is not None else 0
        rid = (self.expert_id if self.kind == _AXIS_EP else
               self.stage_id if self.kind == _AXIS_PP else None)
        return (self.kind, self.rank, self.size, sd, extent, rid or 0)


def _opt_int(v: Any) -> Optional[int]:
    return None if v is None else int(v)


def _parse_axes(par: Any) -> Optional[List[_Axis]]:
    """A TensorParallelism (any object with ``axes``) checked as Mooncake's
    validate_parallelism_spec does, or None.  A missing split_dim,
    expert_id or stage_id attribute raises AttributeError, as there."""
    if par is None or not hasattr(par, "axes"):
        return None
    axes = []
    for a in list(par.axes):
        if not all(hasattr(a, n) for n in ("kind", "rank", "size")):
            return None
        kind = _KINDS.get(str(a.kind).upper())
        ax = _Axis(kind, int(a.rank), int(a.size), _opt_int(a.split_dim),
                   _opt_int(a.expert_id), _opt_int(a.stage_id))
        if kind is None or ax.size <= 0 or not 0 <= ax.rank < ax.size:
            return None
        if kind == _AXIS_TP and ax.split_dim is None:
            return None
        if kind != _AXIS_TP and ax.split_dim is not None:
            return None
        if (kind == _AXIS_EP and ax.expert_id is None) or (kind == _AXIS_PP and
                                                            ax.stage_id is None):
            return None
        axes.append(ax)
    kinds = [a.kind for a in axes]
    if not axes or len(axes) > 4 or len(set(kinds)) != len(kinds):
        return None
    return axes


def _tp_of(axes: Sequence[_Axis]) -> Optional[_Axis]:
    for a in axes:
        if a.kind == _AXIS_TP:
            return a
    return None


def _canonical(axes: Sequence[_Axis]) -> List[_Axis]:
    return sorted(axes, key=lambda a: a.kind)


def _shard_key(key: str, axes: Sequence[_Axis]) -> str:
    """Where the shard of these coordinates is stored."""
    if len(axes) == 1 and axes[0].kind == _AXIS_TP:
        return _tp_key(key, axes[0].rank)
    return key + "".join("__" + a.suffix() for a in _canonical(axes))


def _writer_key(key: str, rank: int, size: int, split_dim: int) -> str:
    return "%s__writer_%dof%d_sd%d" % (key, rank, size, split_dim)


def _manifest(dtype: int, global_shape: Sequence[int], split_dim: int, count: int) -> bytes:
    g = list(global_shape) + [-1] * (_MAX_DIMS - len(global_shape))
    return _MANIFEST.pack(_MANIFEST_MAGIC, 1, _MANIFEST_SIZE, dtype, len(global_shape),
                          split_dim, count, 0, *g)


def _parse_manifest(buf: bytes):
    """(dtype, global shape, split dim, shard count), or None."""
    if len(buf) < _MANIFEST_SIZE:
        return None
    magic, ver, hsize, dtype, ndim, sd, count, _, *g = _MANIFEST.unpack_from(buf, 0)
    if (magic != _MANIFEST_MAGIC or ver != 1 or hsize != _MANIFEST_SIZE or
            not 0 <= ndim <= _MAX_DIMS or count <= 0 or not 0 <= sd < ndim or
            any(d < 0 for d in g[:ndim]) or not 0 <= dtype < len(_TENSOR_DTYPES)):
        return None
    return dtype, list(g[:ndim]), sd, count


class _Stored:
    """A stored tensor object, parsed: its tensor (local shape), layout kind,
    global shape and axes."""

    def __init__(self, buf: bytearray):
        self.buf = buf
        self.tensor = _tensor_from(buf, len(buf))
        self.layout = _LAYOUT_FULL
        self.global_shape: List[int] = []
        self.axes: List[_Axis] = []
        if self.tensor is None or len(buf) < _TENSOR_META_SIZE or \
                _TENSOR_HDR.unpack_from(buf, 0)[0] != _TENSOR_MAGIC:
            return
        hdr = _TENSOR_HDR.unpack_from(buf, 0)
        ndim, self.layout = hdr[4], hdr[5]
        self.global_shape = list(_TENSOR_SHAPE.unpack_from(buf, 40)[:ndim])
        n_axes = _TENSOR_AXES.unpack_from(buf, 168)[0]
        for i in range(n_axes):
            kind, _, rank, count, sd, rid, _ = _TENSOR_AXIS.unpack_from(buf, 176 + 32 * i)
            self.axes.append(_Axis(kind, rank, count, sd if sd >= 0 else None,
                                   rid if kind == _AXIS_EP else None,
                                   rid if kind == _AXIS_PP else None))

    def is_shard(self) -> bool:
        return self.tensor is not None and self.layout == _LAYOUT_SHARD

    def matches(self, axes: Sequence[_Axis], compare_tp_rank: bool = True,
                tp_size: Optional[int] = None) -> bool:
        """Its axes are these (canonical order); the TP axis's rank is not
        compared unless asked, its size is tp_size when given."""
        mine, want = _canonical(self.axes), _canonical(axes)
        if len(mine) != len(want):
            return False
        for m, w in zip(mine, want):
            if w.kind == _AXIS_TP:
                if (m.kind != _AXIS_TP or m.split_dim != w.split_dim or
                        m.size != (w.size if tp_size is None else tp_size) or
                        (compare_tp_rank and m.rank != w.rank)):
                    return False
            elif m.fields() != w.fields():
                return False
        return True


def _even(d: int, n: int) -> bool:
    return n > 0 and d % n == 0


def _assemble(sources: Sequence[_Stored], split: int, lo: int, hi: int) -> Any:
    """[lo, hi) of the split dimension from the shards (each covering
    [G*rank/count, +G/count)), or None if they leave a gap."""
    import torch
    pieces, at = [], lo
    spans = []
    for s in sources:
        tp = _tp_of(s.axes)
        g = s.global_shape
        if tp is None or tp.split_dim != split or len(s.tensor.shape) != len(g):
            return None
        if any(a != b for i, (a, b) in enumerate(zip(s.tensor.shape, g)) if i != split):
            return None
        extent = g[split] // tp.size
        if s.tensor.shape[split] != extent:
            return None
        spans.append((g[split] * tp.rank // tp.size, extent, s.tensor))
    for start, extent, t in sorted(spans, key=lambda x: x[0]):
        end = start + extent
        if end <= at or start >= hi:
            continue
        if start > at:
            return None  # a gap
        take_to = min(end, hi)
        pieces.append(t.narrow(split, at - start, take_to - at))
        at = take_to
        if at >= hi:
            break
    if at < hi:
        return None
    if not pieces:
        return sources[0].tensor.narrow(split, 0, 0).clone()
    return torch.cat(pieces, dim=split).contiguous()


class TensorParallelIO:
    """The ``*_with_parallelism*`` calls of MooncakeDistributedStore
    (needs its get, put, upsert, put_parts, upsert_parts, get_tensor,
    batch_get_tensor, _put_tensors, pub_tensor, upsert_pub_tensor,
    put_tensor_from/upsert_tensor_from, put_from/upsert_from,
    _find_registered and _client)."""

    # ---- writes ----
    def _par_request(self, parallelism, writer):
        """("direct"|"writer"|"tp"|"generic", detail) or None (-600)."""
        if writer is not None and parallelism is not None:
            return None
        if writer is not None:
            if not all(hasattr(writer, n) for n in ("rank", "size", "split_dim")):
                return None
            w = (int(writer.rank), int(writer.size), int(writer.split_dim))
            if w[1] <= 0 or not 0 <= w[0] < w[1] or w[2] < 0:
                return None
            return "writer", w
        if parallelism is None:
            return "direct", None
        axes = _parse_axes(parallelism)
        if axes is None:
            return None
        return ("tp" if _tp_of(axes) else "generic"), axes

    def _par_put_obj(self, key: str, tensor: Any, global_shape, axes, config, replace) -> int:
        return self._put_tensors([key], [tensor], config, replace,
                                 [(global_shape, axes)])[0]

    def _par_put_bytes(self, key: str, data: bytes, config, replace) -> int:
        return (self.upsert if replace else self.put)(key, data, config)

    def _par_write_tensor(self, key, tensor, parallelism, config, writer, replace) -> int:
        req = self._par_request(parallelism, writer)
        if req is None or self._client is None:
            return INVALID_PARAMS
        route, detail = req
        if route == "direct":
            return (self.upsert_pub_tensor if replace else self.pub_tensor)(key, tensor, config)
        if "Tensor" not in type(tensor).__name__ or _dtype_index(tensor) < 0 or \
                tensor.dim() > _MAX_DIMS:
            return INVALID_PARAMS
        dtype, shape = _dtype_index(tensor), list(tensor.shape)
        if route == "writer":
            rank, size, sd = detail
            if sd >= len(shape) or not _even(shape[sd], size):
                return INVALID_PARAMS
            step = shape[sd] // size
            shard = tensor.narrow(sd, rank * step, step)
            r = self._par_put_obj(_writer_key(key, rank, size, sd), shard, shape,
                                  [(_AXIS_TP, rank, size, sd, step)], config, replace)
            if r != 0:
                return r
            return self._par_put_bytes(key + "__writer_manifest",
                                       _manifest(dtype, shape, sd, size), config, replace)
        axes = detail
        if route == "generic":
            return self._par_put_obj(_shard_key(key, axes), tensor, shape,
                                     [a.meta(shape) for a in axes], config, replace)
        tp = _tp_of(axes)
        sd = tp.split_dim
        if sd >= len(shape):
            return INVALID_PARAMS
        if len(axes) == 1:
            # one TP axis: the tensor is this rank's shard already
            local, shard = shape, tensor
            global_shape = list(shape)
            global_shape[sd] *= tp.size
        else:
            if not _even(shape[sd], tp.size):
                return INVALID_PARAMS
            step = shape[sd] // tp.size
            shard = tensor.narrow(sd, tp.rank * step, step)
            local, global_shape = list(shard.shape), shape
        r = self._par_put_obj(_shard_key(key, axes), shard, global_shape,
                              [a.meta(local) for a in axes], config, replace)
        if r != 0:
            return r
        return self._par_put_bytes(key + "__parallelism_manifest",
                                   _manifest(dtype, global_shape, sd, tp.size), config, replace)

    def _par_write_from(self, key, ptr, size, parallelism, config, writer, replace) -> int:
        req = self._par_request(parallelism, writer)
        if req is None or self._client is None:
            return INVALID_PARAMS
        route, detail = req
        if route == "direct":
            if config is None:
                return (self.upsert_tensor_from if replace else self.put_tensor_from)(
                    key, ptr, size)
            if not self._tensor_buffer_ok(ptr, size):
                return INVALID_PARAMS
            return (self.upsert_from if replace else self.put_from)(key, ptr, size, config)
        if not ptr or size < _TENSOR_META_SIZE:
            return INVALID_PARAMS
        st = _Stored(bytearray((ctypes.c_char * size).from_address(ptr)))
        if st.tensor is None or (st.tensor.dim() and not st.global_shape):
            return INVALID_PARAMS  # not a tensor, or kvcache's older layout (no whole shape)
        t, g = st.tensor, st.global_shape
        dtype = _dtype_index(t)
        if route == "generic":
            axes = detail
            return self._par_put_obj(_shard_key(key, axes), t, g,
                                     [a.meta(list(t.shape)) for a in axes], config, replace)
        if list(t.shape) != g:
            return INVALID_PARAMS  # the whole tensor is split, not a shard of it
        if route == "writer":
            rank, count, sd = detail
            if sd >= len(g) or not _even(g[sd], count):
                return INVALID_PARAMS
            step = g[sd] // count
            r = self._par_put_obj(_writer_key(key, rank, count, sd),
                                  t.narrow(sd, rank * step, step), g,
                                  [(_AXIS_TP, rank, count, sd, step)], config, replace)
            if r != 0:
                return r
            return self._par_put_bytes(key + "__writer_manifest",
                                       _manifest(dtype, g, sd, count), config, replace)
        axes = detail
        tp = _tp_of(axes)
        sd = tp.split_dim
        if sd >= len(g) or not _even(g[sd], tp.size):
            return INVALID_PARAMS
        step = g[sd] // tp.size
        for rank in range(tp.size):  # every rank's shard, no manifest (as Mooncake)
            mine = [a.with_tp(rank) for a in axes]
            shard = t.narrow(sd, rank * step, step)
            r = self._par_put_obj(_shard_key(key, mine), shard, g,
                                  [a.meta(list(shard.shape)) for a in mine], config, replace)
            if r != 0:
                return r
        return 0

    def _par_batch(self, one, keys, values, sizes, parallelisms, config, writers) -> List[int]:
        n = len(keys)
        groups = getattr(config, "group_ids", None) if config is not None else None
        if groups and len(groups) != n:
            return [INVALID_PARAMS] * n
        if parallelisms is not None and writers is not None:
            return [INVALID_PARAMS] * n
        if len(values) != n or (sizes is not None and len(sizes) != n):
            return [INVALID_PARAMS] * n
        for lst in (parallelisms, writers):
            if lst is not None and (not isinstance(lst, list) or len(lst) != n):
                return [INVALID_PARAMS] * n
        out = []
        for i in range(n):
            cfg = config
            if groups:
                import copy
                cfg = copy.copy(config)
                cfg.group_ids = [groups[i]]
            par = parallelisms[i] if parallelisms is not None else None
            w = writers[i] if writers is not None else None
            if sizes is None:
                out.append(one(keys[i], values[i], par, cfg, w))
            else:
                out.append(one(keys[i], values[i], sizes[i], par, cfg, w))
        return out

    def put_tensor_with_parallelism(self, key: str, tensor: Any, parallelism: Any = None,
                                    config: Any = None, writer_partition: Any = None) -> int:
        """One TP axis: tensor is this rank's shard (stored as
        ``<key>_tp_<rank>`` with the parallelism manifest); TP with other
        axes: tensor is the whole one, and this rank's shard is stored; no
        TP axis: stored as it is under the axes' key; writer_partition
        (rank, size, split_dim): this writer's part of the whole tensor and
        the writer manifest.  0, or a Mooncake code (-600: refused)."""
        return self._par_write_tensor(key, tensor, parallelism, config, writer_partition, False)

    def upsert_tensor_with_parallelism(self, key: str, tensor: Any, parallelism: Any = None,
                                       config: Any = None, writer_partition: Any = None) -> int:
        return self._par_write_tensor(key, tensor, parallelism, config, writer_partition, True)

    def batch_put_tensor_with_parallelism(self, keys: Sequence[str], tensors_list: list,
                                          parallelisms: Optional[list] = None,
                                          config: Any = None,
                                          writer_partitions: Optional[list] = None) -> List[int]:
        return self._par_batch(self.put_tensor_with_parallelism, keys, tensors_list, None,
                               parallelisms, config, writer_partitions)

    def batch_upsert_tensor_with_parallelism(self, keys: Sequence[str], tensors_list: list,
                                             parallelisms: Optional[list] = None,
                                             config: Any = None,
                                             writer_partitions: Optional[list] = None
                                             ) -> List[int]:
        return self._par_batch(self.upsert_tensor_with_parallelism, keys, tensors_list, None,
                               parallelisms, config, writer_partitions)

    def put_tensor_with_parallelism_from(self, key: str, buffer_ptr: int, size: int,
                                         parallelism: Any = None, config: Any = None,
                                         writer_partition: Any = None) -> int:
        """buffer_ptr holds a whole tensor object; with a TP axis every
        rank's shard is stored (no manifest), as Mooncake's does."""
        return self._par_write_from(key, buffer_ptr, size, parallelism, config,
                                    writer_partition, False)

    def upsert_tensor_with_parallelism_from(self, key: str, buffer_ptr: int, size: int,
                                            parallelism: Any = None, config: Any = None,
                                            writer_partition: Any = None) -> int:
        return self._par_write_from(key, buffer_ptr, size, parallelism, config,
                                    writer_partition, True)

    def batch_put_tensor_with_parallelism_from(self, keys: Sequence[str],
                                               buffer_ptrs: Sequence[int],
                                               sizes: Sequence[int],
                                               parallelisms: Optional[list] = None,
                                               config: Any = None,
                                               writer_partitions: Optional[list] = None
                                               ) -> List[int]:
        return self._par_batch(self.put_tensor_with_parallelism_from, keys, buffer_ptrs, sizes,
                               parallelisms, config, writer_partitions)

    def batch_upsert_tensor_with_parallelism_from(self, keys: Sequence[str],
                                                  buffer_ptrs: Sequence[int],
                                                  sizes: Sequence[int],
                                                  parallelisms: Optional[list] = None,
                                                  config: Any = None,
                                                  writer_partitions: Optional[list] = None
                                                  ) -> List[int]:
        return self._par_batch(self.upsert_tensor_with_parallelism_from, keys, buffer_ptrs,
                               sizes, parallelisms, config, writer_partitions)

    # ---- reads ----
    def _par_load(self, key: str) -> Optional[_Stored]:
        v = self.get(key)
        if not v:
            return None
        st = _Stored(bytearray(v))
        return st if st.tensor is not None else None

    def _par_sources(self, key: str, axes: List[_Axis]):
        """(shards, split dim) making up the whole tensor of these
        coordinates (the TP rank aside), or None."""
        tp = _tp_of(axes)
        m = self.get(key + "__parallelism_manifest")
        man = _parse_manifest(m) if m else None
        if man is not None:
            _, g, sd, count = man
            if tp.split_dim == sd and _even(g[sd], tp.size) and _even(g[sd], count):
                srcs = []
                for r in range(count):
                    st = self._par_load(_shard_key(key, [a.with_tp(r, count) for a in axes]))
                    if st is None or not st.is_shard() or not st.matches(axes, False, count):
                        srcs = None
                        break
                    srcs.append(st)
                if srcs:
                    return srcs, sd
        if len(axes) == 1:
            first = self._par_load(key if tp.size <= 1 else _tp_key(key, 0))
            ftp = _tp_of(first.axes) if first is not None and first.is_shard() else None
            if ftp is None or ftp.split_dim != tp.split_dim:
                return None
            g, sd, count = first.global_shape, ftp.split_dim, ftp.size
            if not (_even(g[sd], tp.size) and _even(g[sd], count)):
                return None
            srcs = [first]
            for r in range(1, count):
                st = self._par_load(_tp_key(key, r))
                stp = _tp_of(st.axes) if st is not None and st.is_shard() else None
                if stp is None or (stp.rank, stp.size, stp.split_dim) != (r, count, sd):
                    return None
                srcs.append(st)
            return srcs, sd
        srcs = []
        for r in range(tp.size):
            st = self._par_load(_shard_key(key, [a.with_tp(r) for a in axes]))
            if st is None or not st.is_shard() or not st.matches(axes, False):
                return None
            srcs.append(st)
        g = srcs[0].global_shape
        return (srcs, tp.split_dim) if _even(g[tp.split_dim], tp.size) else None

    def _par_writer_full(self, key: str):
        m = self.get(key + "__writer_manifest")
        man = _parse_manifest(m) if m else None
        if man is None:
            return None
        _, g, sd, count = man
        srcs = []
        for r in range(count):
            st = self._par_load(_writer_key(key, r, count, sd))
            tp = _tp_of(st.axes) if st is not None and st.is_shard() else None
            if tp is None or len(st.axes) != 1 or (tp.rank, tp.size, tp.split_dim) != \
                    (r, count, sd):
                return None
            srcs.append(st)
        t = _assemble(srcs, sd, 0, g[sd]) if g else None
        return ("tensor", t, None) if t is not None else None

    def _par_read(self, key: str, target: Any):
        """("key", a key to read as stored), ("legacy", the same for the
        non-into read only), ("tensor", tensor, SHARD axes for its header
        or None), or None."""
        if target is None:
            return "key", key
        if not (hasattr(target, "mode") and hasattr(target, "parallelism")):
            return None
        mode = str(target.mode).lower()
        if mode not in ("as_stored", "shard", "full"):
            return None
        if target.parallelism is None:
            if mode == "as_stored":
                return "key", key
            if mode == "full":
                return self._par_writer_full(key) or ("key", key)
        axes = _parse_axes(target.parallelism)
        if axes is None or mode == "as_stored":
            return None
        tp = _tp_of(axes)
        if mode == "full":
            if tp is None:
                return None
            src = self._par_sources(key, axes)
            if src is None:
                return None
            srcs, sd = src
            t = _assemble(srcs, sd, 0, srcs[0].global_shape[sd])
            return ("tensor", t, None) if t is not None else None
        # a shard: stored as asked, or a writer's part, or cut from the set
        k = _shard_key(key, axes)
        st = self._par_load(k)
        if st is not None and st.is_shard() and st.matches(axes):
            return "key", k
        if len(axes) == 1:
            k = _writer_key(key, tp.rank, tp.size, tp.split_dim)
            st = self._par_load(k)
            if st is not None and st.is_shard() and len(st.axes) == 1 and st.matches(axes):
                return "key", k
        if tp is None:
            return None
        src = self._par_sources(key, axes)
        if src is not None:
            srcs, sd = src
            g = srcs[0].global_shape[sd]
            lo = g * tp.rank // tp.size
            if _even(g, tp.size):
                t = _assemble(srcs, sd, lo, lo + g // tp.size)
                if t is not None:
                    return "tensor", t, axes
        if len(axes) == 1:
            return ("legacy", key if tp.size <= 1 else _tp_key(key, tp.rank))
        return None

    def get_tensor_with_parallelism(self, key: str, target: Any = None) -> Any:
        """The tensor a ReadTarget asks for: as stored (target None), one
        shard (stored, or cut from the shards of another TP size), or the
        whole tensor rebuilt from its shards; None when it cannot be had."""
        if self._client is None:
            return None
        r = self._par_read(key, target)
        if r is None:
            return None
        return r[1] if r[0] == "tensor" else self.get_tensor(r[1])

    def batch_get_tensor_with_parallelism(self, keys: Sequence[str],
                                          targets: Optional[list] = None) -> List[Any]:
        if targets is None:
            return self.batch_get_tensor(keys)
        if not isinstance(targets, list) or len(targets) != len(keys):
            return [None] * len(keys)
        return [self.get_tensor_with_parallelism(k, t) for k, t in zip(keys, targets)]

    def get_tensor_with_parallelism_into(self, key: str, buffer_ptr: int, size: int,
                                         target: Any = None) -> Any:
        """As get_tensor_with_parallelism, into registered memory at
        buffer_ptr ([TensorMetadata][bytes]); a tensor over that memory, or
        None."""
        if self._client is None or not buffer_ptr or size <= 0:
            return None
        if not self._find_registered(buffer_ptr, size):
            return None
        r = self._par_read(key, target)
        if r is None or r[0] == "legacy":
            return None
        if r[0] == "key":
            return self.get_tensor_into(r[1], buffer_ptr, size)
        _, t, axes = r
        import torch
        data = t.reshape(-1).view(torch.uint8).numpy()
        local = list(t.shape)
        if axes is None:
            meta = _tensor_meta(_dtype_index(t), local, data.nbytes)
        else:
            tp = _tp_of(axes)
            g = local[:]
            g[tp.split_dim] *= tp.size
            meta = _tensor_meta(_dtype_index(t), local, data.nbytes, g,
                                [a.meta(local) for a in axes])
        need = len(meta) + data.nbytes
        if need > size:
            return None
        ctypes.memmove(buffer_ptr, meta, len(meta))
        if data.nbytes:
            ctypes.memmove(buffer_ptr + len(meta), data.ctypes.data, data.nbytes)
        return _tensor_from((ctypes.c_char * need).from_address(buffer_ptr), need)

    def batch_get_tensor_with_parallelism_into(self, keys: Sequence[str],
                                               buffer_ptrs: Sequence[int],
                                               sizes: Sequence[int],
                                               targets: Optional[list] = None) -> List[Any]:
        n = len(keys)
        if not (n == len(buffer_ptrs) == len(sizes)):
            return [None] * n
        if targets is not None and (not isinstance(targets, list) or len(targets) != n):
            return [None] * n
        ts = targets if targets is not None else [None] * n
        return [self.get_tensor_with_parallelism_into(k, p, s, t)
                for k, p, s, t in zip(keys, buffer_ptrs, sizes, ts)]
