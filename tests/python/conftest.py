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
