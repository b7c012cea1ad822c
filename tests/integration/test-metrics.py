# SPDX-License-Identifier: MIT
"""kvcached's and kvcache-master's /metrics and /health: the text format,
figures that move, bad requests and flags, and a real Prometheus scraping
them.  One case per run: test-metrics.py CASE (exit 77: skipped)."""
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

KVCACHED = os.environ["KVCACHED"]
KVCACHECTL = os.environ["KVCACHECTL"]
WORKLOAD = os.environ["KVCACHE_WORKLOAD"]
MASTER = os.environ["KVCACHE_MASTER"]
DIR = tempfile.mkdtemp(prefix="kvc-metrics-")
PROCS = []


def fail(msg):
    for name in sorted(os.listdir(DIR)):
        if name.endswith(".log"):
            sys.stderr.write("--- %s\n%s" % (name, open(os.path.join(DIR, name)).read()))
    raise SystemExit("FAIL: " + msg)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def spawn(argv, log):
    p = subprocess.Popen(argv, stdout=subprocess.DEVNULL,
                         stderr=open(os.path.join(DIR, log), "w"))
    PROCS.append(p)
    return p


def until(what, fn, timeout=20.0):
    """A deadline for something to happen at all, not a measurement."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            v = fn()
            if v:
                return v
        except (OSError, ValueError):
            pass
        time.sleep(0.05)
    fail("never happened: " + what)


def http(port, path, method="GET", headers=None):
    req = urllib.request.Request("http://127.0.0.1:%d%s" % (port, path), method=method,
                                 headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.headers.get("Content-Type", ""), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Content-Type", ""), e.read().decode()


def start_daemon(port, *extra):
    sock = os.path.join(DIR, "kvcached.sock")
    p = spawn([KVCACHED, "--socket", sock, "--dram-size", "64MiB", "--hugepages", "off",
               "--metrics-port", str(port)] + list(extra), "kvcached.log")
    until("kvcached answers", lambda: subprocess.run(
        [KVCACHECTL, "-s", sock, "status"], capture_output=True).returncode == 0)
    return p, sock


def parse(text):
    """Prometheus text format: {(name, labels): value}, and checks."""
    samples, types, helps = {}, {}, {}
    for line in text.splitlines():
        if line.startswith("# HELP "):
            name = line.split()[2]
            if name in helps:
                fail("second HELP for " + name)
            helps[name] = True
        elif line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            if name in types:
                fail("second TYPE for " + name)
            types[name] = kind
        elif line and not line.startswith("#"):
            m = re.fullmatch(r'([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)', line)
            if not m:
                fail("not a sample line: %r" % line)
            samples[(m.group(1), m.group(2) or "")] = float(m.group(3))
    for name, kind in types.items():
        if kind == "counter" and not name.endswith("_total"):
            fail("counter %s does not end in _total" % name)
    return samples, types


def metrics(port):
    status, ctype, body = http(port, "/metrics")
    if status != 200 or not ctype.startswith("text/plain; version=0.0.4"):
        fail("/metrics: %d %s" % (status, ctype))
    return parse(body)


def case_daemon():
    port = free_port()
    p, sock = start_daemon(port)
    samples, types = metrics(port)
    for fam in ["kvcache_puts_total", "kvcache_hits_total", "kvcache_tier_capacity",
                "kvcache_tier_used", "kvcache_clients", "kvcache_op_duration_seconds"]:
        if fam not in types:
            fail("no family " + fam)
    if samples[("kvcache_tier_capacity", '{tier="dram"}')] != 64 << 20:
        fail("dram capacity")
    before = samples[("kvcache_puts_total", "")]
    # an engine-like workload over the channels: puts, gets, exists
    r = subprocess.run([WORKLOAD, "--socket", sock, "--prompts", "8", "--blocks", "8",
                        "--block-size", "64K"], capture_output=True, text=True)
    if r.returncode != 0:
        fail("workload: " + r.stdout + r.stderr)
    st = dict(line.split() for line in subprocess.run(
        [KVCACHECTL, "-s", sock, "stats"], capture_output=True, text=True).stdout.splitlines()
        if len(line.split()) == 2)
    puts = float(st["puts"])

    def moved():
        s, _ = metrics(port)
        return s if s[("kvcache_puts_total", "")] == puts else None
    samples = until("puts_total reaches kvcachectl's count", moved)
    if puts <= before:
        fail("the workload stored nothing")
    # histograms: cumulative buckets, +Inf equal to the count, some timed
    timed = 0
    for op in ["exists", "acquire", "reserve", "commit", "get_into", "put_from"]:
        prev = 0
        for b in ["1e-06", "2.5e-06", "5e-06", "1e-05", "0.0001", "0.001", "+Inf"]:
            v = samples[("kvcache_op_duration_seconds_bucket", '{op="%s",le="%s"}' % (op, b))]
            if v < prev:
                fail("buckets of %s go down" % op)
            prev = v
        count = samples[("kvcache_op_duration_seconds_count", '{op="%s"}' % op)]
        if prev != count:
            fail("+Inf bucket of %s is not its count" % op)
        timed += count
    if timed == 0:
        fail("no request was timed")
    if http(port, "/health")[0] != 200:
        fail("/health while serving")
    p.send_signal(signal.SIGTERM)
    if p.wait(30) != 0:
        fail("kvcached did not stop cleanly")


def case_bad_requests():
    port = free_port()
    p, sock = start_daemon(port)
    if http(port, "/nope")[0] != 404:
        fail("unknown path")
    if http(port, "/metrics", "POST")[0] != 405:
        fail("POST")
    # headers past the limit: refused by the library, nobody else affected
    status = None
    try:
        status = http(port, "/metrics", headers={"X-Big": "x" * 40000})[0]
    except (OSError, urllib.error.URLError):
        status = "closed"
    if status == 200:
        fail("a 40 KB header was served")
    # slow clients hold connections; the daemon and the endpoint still answer
    slow = []
    for _ in range(4):
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
        slow.append(s)
    garbage = socket.create_connection(("127.0.0.1", port))
    garbage.sendall(os.urandom(2000))
    t0 = time.monotonic()
    if http(port, "/health")[0] != 200:
        fail("/health with slow clients")
    r = subprocess.run([KVCACHECTL, "-s", sock, "status"], capture_output=True)
    if r.returncode != 0 or time.monotonic() - t0 > 10:
        fail("kvcachectl with slow metrics clients")
    # the library drops a connection idle past its timeout
    slow[0].settimeout(30)
    try:
        while slow[0].recv(4096):
            pass
    except socket.timeout:
        fail("an idle metrics connection was never dropped")
    except OSError:
        pass
    for s in slow + [garbage]:
        s.close()
    p.send_signal(signal.SIGTERM)
    if p.wait(30) != 0:
        fail("kvcached did not stop cleanly")


def case_flags():
    def refused(args, code):
        r = subprocess.run([KVCACHED, "--socket", os.path.join(DIR, "x.sock"),
                            "--hugepages", "off"] + args, capture_output=True, text=True,
                           timeout=30)
        if r.returncode != code:
            fail("%s exited %d, expected %d: %s" % (args, r.returncode, code, r.stderr))
        return r.stderr
    refused(["--metrics-port", "70000"], 2)
    refused(["--metrics-port", "abc"], 2)
    if "metrics" not in refused(["--metrics-port", "1234", "--metrics-address", "not-an-ip"], 2):
        fail("the bad address is not named")
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    if "metrics" not in refused(["--metrics-port", str(busy.getsockname()[1])], 1):
        fail("a port in use is not named")
    busy.close()
    # Mooncake's spelling and the JSON config
    port = free_port()
    cfg = os.path.join(DIR, "kvcached.json")
    json.dump({"metrics_port": port, "global_segment_size": 32 << 20}, open(cfg, "w"))
    sock = os.path.join(DIR, "json.sock")
    p = spawn([KVCACHED, "--socket", sock, "--hugepages", "off", "--config", cfg], "json.log")
    until("/health from the JSON config", lambda: http(port, "/health")[0] == 200)
    p.send_signal(signal.SIGTERM)
    p.wait(30)
    port = free_port()
    p = spawn([KVCACHED, "--socket", sock, "--hugepages", "off", "--metrics_port=%d" % port],
              "underscore.log")
    until("/health with --metrics_port", lambda: http(port, "/health")[0] == 200)
    p.send_signal(signal.SIGTERM)
    p.wait(30)


def case_master():
    mport = free_port()
    p = spawn([MASTER, "--port", "0", "--rpc_address", "127.0.0.1", "--metrics_port", str(mport)],
              "master.log")
    until("the master's /health", lambda: http(mport, "/health")[0] == 200)
    samples, types = metrics(mport)
    if samples.get(("kvcache_master_nodes", '{state="up"}')) != 0:
        fail("master: nodes up before any joined")
    log = open(os.path.join(DIR, "master.log")).read()
    mport_peer = int(re.search(r"listening on [^ ]*:(\d+)", log).group(1))
    sock = os.path.join(DIR, "node.sock")
    nport = free_port()
    spawn([KVCACHED, "--socket", sock, "--dram-size", "16MiB", "--hugepages", "off",
           "--master", "127.0.0.1:%d" % mport_peer, "--listen", "127.0.0.1:0",
           "--node-id", "n1", "--metrics-port", str(nport)], "node.log")
    until("the node counted up", lambda: metrics(mport)[0].get(
        ("kvcache_master_nodes", '{state="up"}')) == 1)
    # the node's cluster figures: levels are gauges, counts are counters
    path = os.path.join(DIR, "v")
    with open(path, "wb") as f:
        f.write(os.urandom(100000))
    subprocess.run([KVCACHECTL, "-s", sock, "put", "v", path], check=True)
    until("its checksum taken ahead", lambda: metrics(nport)[0].get(
        ("kvcache_sums_ahead_total", "")) == 1)
    samples, types = metrics(nport)
    for name in ("remote_fetching", "remote_fetch_waiting", "remote_peer_connections",
                 "sums_ahead_waiting"):
        if types.get("kvcache_" + name) != "gauge":
            fail("node: %s is not a gauge: %s" % (name, types.get("kvcache_" + name)))
    for name in ("remote_hits", "remote_fetched_ahead", "sums_ahead_bytes", "remote_served_summed"):
        if types.get("kvcache_%s_total" % name) != "counter":
            fail("node: %s is not a counter" % name)
    if samples.get(("kvcache_sums_ahead_bytes_total", "")) != 100000:
        fail("node: sums_ahead_bytes %s" % samples.get(("kvcache_sums_ahead_bytes_total", "")))
    p.send_signal(signal.SIGTERM)


def case_prometheus():
    prom = shutil.which("prometheus")
    if not prom:
        print("prometheus is not installed (Debian: prometheus); skipping")
        raise SystemExit(77)
    port, pport = free_port(), free_port()
    p, sock = start_daemon(port)
    cfg = os.path.join(DIR, "prometheus.yml")
    open(cfg, "w").write(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
        "scrape_configs:\n  - job_name: kvcached\n    static_configs:\n"
        "      - targets: ['127.0.0.1:%d']\n" % port)
    spawn([prom, "--config.file=" + cfg, "--storage.tsdb.path=" + os.path.join(DIR, "tsdb"),
           "--web.listen-address=127.0.0.1:%d" % pport], "prometheus.log")

    def query(q):
        status, _, body = http(pport, "/api/v1/query?query=" + urllib.request.quote(q))
        if status != 200:
            return None
        res = json.loads(body)["data"]["result"]
        return float(res[0]["value"][1]) if res else None

    until("Prometheus sees the target up", lambda: query('up{job="kvcached"}') == 1, 60)
    first = until("a first scrape of puts", lambda: query("kvcache_puts_total") is not None
                  and (query("kvcache_puts_total"),), 60)[0]
    r = subprocess.run([WORKLOAD, "--socket", sock, "--prompts", "8", "--blocks", "8",
                        "--block-size", "64K"], capture_output=True, text=True)
    if r.returncode != 0:
        fail("workload: " + r.stdout + r.stderr)
    until("Prometheus sees the puts", lambda: (query("kvcache_puts_total") or 0) > first, 60)
    if (query('kvcache_tier_capacity{tier="dram"}') or 0) != 64 << 20:
        fail("Prometheus has the wrong dram capacity")
    p.send_signal(signal.SIGTERM)


def main():
    case = sys.argv[1]
    try:
        globals()["case_" + case.replace("-", "_")]()
    finally:
        for p in PROCS:
            if p.poll() is None:
                p.kill()
            p.wait()
        shutil.rmtree(DIR, ignore_errors=True)
    print("ok: " + case)


if __name__ == "__main__":
    main()
