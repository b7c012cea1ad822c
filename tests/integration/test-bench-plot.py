# SPDX-License-Identifier: MIT
"""kvcache-bench local --plot draws the figures it printed (exit 77 without
gnuplot)."""
import os
import shutil
import subprocess
import sys
import tempfile

if not shutil.which("gnuplot"):
    print("gnuplot is not installed (Debian: gnuplot-nox); skipping")
    sys.exit(77)
d = tempfile.mkdtemp(prefix="kvc-plot-")
try:
    svg = os.path.join(d, "local.svg")
    r = subprocess.run([os.environ["KVCACHE_BENCH"], "local", "--duration", "0.05", "--sizes",
                        "4K,1M", "--ops", "get,put,acquire", "--plot", svg],
                       capture_output=True, text=True, timeout=120)
    if r.returncode != 0 or "chart: " + svg not in r.stdout:
        sys.exit("FAIL: bench exited %d: %s%s" % (r.returncode, r.stdout, r.stderr))
    text = open(svg).read()
    for want in ["<svg", "p50 latency", "bandwidth", "kvcache get", "kvcache put",
                 "kvcache acquire", "memcpy (this run)"]:
        if want not in text:
            sys.exit("FAIL: no %r in the chart" % want)
    r = subprocess.run([os.environ["KVCACHE_BENCH"], "churn", "--plot", svg],
                       capture_output=True, text=True)
    if r.returncode != 2:
        sys.exit("FAIL: --plot with churn exited %d" % r.returncode)
finally:
    shutil.rmtree(d, ignore_errors=True)
print("ok")
