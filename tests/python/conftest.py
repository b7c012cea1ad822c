# SPDX-License-Identifier: MIT
"""A private kvcached per test module, on a socket in its own directory."""
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time

import pytest


def ready(sock):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(sock)
        return True
    except OSError:
        return False
    finally:
        s.close()


def start_daemon(*extra):
    binary = os.environ.get("KVCACHED")
    if not binary:
        pytest.skip("KVCACHED is not set (run through meson test)")
    d = tempfile.mkdtemp(prefix="kvc-py-")
    sock = os.path.join(d, "kvcached.sock")
    env = dict(os.environ)
    # the interpreter runs with relaxed sanitizer options; the daemon not
    if "KVCACHE_DAEMON_ASAN_OPTIONS" in env:
        env["ASAN_OPTIONS"] = env["KVCACHE_DAEMON_ASAN_OPTIONS"]
    env.pop("LD_PRELOAD", None)
    log = open(os.path.join(d, "kvcached.log"), "w")
    proc = subprocess.Popen([binary, "--socket", sock, "--dram-size", "256MiB", "--poll-us", "0",
                             "--hugepages", "off"] + list(extra),
                            stdout=log, stderr=subprocess.STDOUT, env=env)
    for _ in range(1000):
        if ready(sock):
            break
        if proc.poll() is not None:
            raise RuntimeError("kvcached exited with %d: %s" %
                               (proc.returncode, open(log.name).read()))
        time.sleep(0.01)
    else:
        raise RuntimeError("kvcached did not come up")
    return proc, d, sock, log


def stop_pid(pid, timeout=30):
    """Stop a daemon this process did not start (a kvcachectl upgrade's
    new one) and wait until it is gone."""
    os.kill(pid, signal.SIGTERM)
    end = time.time() + timeout
    while time.time() < end:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    raise AssertionError("kvcached %d did not stop" % pid)


def stop_daemon(proc, d, log):
    proc.send_signal(signal.SIGTERM)
    rc = proc.wait(timeout=60)
    log.close()
    text = open(log.name).read()
    shutil.rmtree(d, ignore_errors=True)
    assert rc == 0, "kvcached exited with %d:\n%s" % (rc, text)


@pytest.fixture(scope="module")
def daemon():
    proc, d, sock, log = start_daemon()
    yield sock
    stop_daemon(proc, d, log)


@pytest.fixture
def client(daemon):
    import kvcache
    c = kvcache.Client(daemon)
    yield c
    import gc
    gc.collect()
    c.remove_prefix(None, force=True)
    c.close()


def start_master():
    """A kvcache-master on a loopback port of its own: (process, its
    directory, its log, the port)."""
    import re

    binary = os.environ.get("KVCACHE_MASTER")
    if not binary:
        pytest.skip("KVCACHE_MASTER is not set (run through meson test)")
    d = tempfile.mkdtemp(prefix="kvc-py-master-")
    log = open(os.path.join(d, "master.log"), "w+")
    master = subprocess.Popen([binary, "--port", "0", "--log-level", "info"],
                              stdout=log, stderr=subprocess.STDOUT)
    port = None
    for _ in range(400):
        m = re.search(r"listening on [^ ]*:(\d+) ", open(log.name).read())
        if m:
            port = int(m.group(1))
            break
        time.sleep(0.025)
    assert port, open(log.name).read()
    return master, d, log, port


def stop_master(m):
    master, d, log, _ = m
    master.terminate()
    master.wait(timeout=30)
    log.close()
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def two_nodes():
    """A master and two kvcached nodes of its cluster, on loopback."""
    m = start_master()
    port = m[3]
    nodes = [start_daemon("--master", "127.0.0.1:%d" % port, "--listen", "127.0.0.1:0",
                          "--node-id", name) for name in ("A", "B")]
    import kvcache
    for _ in range(400):  # both joined: each sees the other
        seen = [kvcache.Client(n[2]).cluster() for n in nodes]
        if all(len(c["nodes"]) == 2 for c in seen):
            break
        time.sleep(0.025)
    else:
        raise AssertionError("the nodes did not join: %s" % seen)
    yield [n[2] for n in nodes]
    for proc, nd, _, nlog in nodes:
        stop_daemon(proc, nd, nlog)
    stop_master(m)
