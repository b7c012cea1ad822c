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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m kvcache.bench")
    ap.add_argument("--socket", required=True)
    ap.add_argument("--duration", type=float, default=1.0)
    ap.add_argument("--big", type=int, default=16 << 20)
    a = ap.parse_args(argv)
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
