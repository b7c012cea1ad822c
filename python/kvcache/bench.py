# SPDX-License-Identifier: MIT
"""The Python half of ``kvcache-bench python``: per-call latency and copy
bandwidth through the module, printed as JSON lines for kvcache-bench to
set beside the C API's figures of the same run."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Callable, List

from . import _kvcache


def timed(fn: Callable[[], object], duration: float, batch: int = 1) -> List[float]:
    """Per-call seconds, over duration (batch calls per sample)."""
    for _ in range(200):
        fn()
    out: List[float] = []
    pc = time.perf_counter_ns
    end = time.monotonic() + duration
    while time.monotonic() < end and len(out) < 2_000_000:
        t0 = pc()
        for _ in range(batch):
            fn()
        out.append((pc() - t0) / batch / 1e9)
    return out


def p50(v: List[float]) -> float:
    return sorted(v)[len(v) // 2]


def emit(op: str, size: int, samples: List[float], per_call_bytes: int = 0) -> None:
    rec = {"op": op, "size": size, "n": len(samples), "p50_us": p50(samples) * 1e6}
    if per_call_bytes:
        rec["gbs"] = per_call_bytes / p50(samples) / 1e9
    print(json.dumps(rec), flush=True)


def engine_load(a) -> int:
    """``kvcache-bench engine``'s load through the adapters' core: a vLLM
    FlashAttention cache (NHD, CPU tensors), BlockStore.lookup then
    BlockStore.load of every prompt the C engine stored under its keys."""
    import torch

    from .engine import BlockStore, KVLayout
    from .keys import KeySpec

    layers, heads, dim, bt = a.layers, a.kv_heads, a.head_dim, 16
    nb = a.prompts * a.blocks
    cache = [torch.full((2, nb, bt, heads, dim), 1.0, dtype=torch.bfloat16)
             for _ in range(layers)]  # in use: warm
    c = _kvcache.Client(a.socket)
    store = BlockStore(c, KeySpec("bench/" + a.model, "bfloat16", "vllm-NHD", bt, a.rank, a.tp),
                       KVLayout.from_tensors(cache))
    lookup = data = 0.0
    loaded = 0
    for p in range(a.prompts):
        hashes = ["%08x%08x" % ((p * 2654435761) & 0xffffffff, b) for b in range(a.blocks)]
        t0 = time.perf_counter()
        hit = store.lookup(hashes, all_ranks=False)
        lookup += time.perf_counter() - t0
        if hit != a.blocks:
            print("python: prompt %d: %d of %d found" % (p, hit, a.blocks), file=sys.stderr)
            return 1
        t0 = time.perf_counter()
        res = store.load(hashes, list(range(p * a.blocks, (p + 1) * a.blocks)))
        data += time.perf_counter() - t0
        loaded += sum(1 for r in res if r == store.layout.block_bytes)
    print("lookup_s %.6f\ndata_s %.6f\nobjects %d\nbad %d" %
          (lookup, data, loaded, a.prompts * a.blocks - loaded), flush=True)
    c.close()
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m kvcache.bench")
    ap.add_argument("--socket", required=True)
    ap.add_argument("--duration", type=float, default=1.0)
    ap.add_argument("--big", type=int, default=16 << 20)
    ap.add_argument("--engine", action="store_true", help="kvcache-bench engine's load")
    for k in ("layers", "kv-heads", "head-dim", "prompts", "blocks", "rank", "tp"):
        ap.add_argument("--" + k, type=int, default=0 if k == "rank" else 1)
    ap.add_argument("--model", default="llama3-8b")
    a = ap.parse_args(argv)
    if a.engine:
        return engine_load(a)
    c = _kvcache.Client(a.socket)
    small = bytes(range(256)) * 16
    assert c.put("pybench/4k", small) in (0, -17)
    emit("exists", 0, timed(lambda: c.exists("pybench/4k"), a.duration, 8))
    emit("get", 4096, timed(lambda: c.get("pybench/4k"), a.duration, 8))
    out = bytearray(4096)
    emit("get_into", 4096, timed(lambda: c.get_into("pybench/4k", out), a.duration, 8))
    big = bytes(a.big)
    assert c.put("pybench/big", big) in (0, -17)
    buf = c.buffer_alloc(a.big)
    plain = bytearray(a.big)
    n = a.big
    emit("get_into_buffer", n,
         timed(lambda: c.get_into("pybench/big", buf), a.duration), n)
    emit("get_into", n, timed(lambda: c.get_into("pybench/big", plain), a.duration), n)
    assert bytes(memoryview(buf)[:16]) == big[:16] and bytes(plain) == big
    buf.free()
    c.remove("pybench/4k", force=True)
    c.remove("pybench/big", force=True)
    c.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
