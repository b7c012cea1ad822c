# SPDX-License-Identifier: MIT
"""Warm restarts through the real binaries: kvcachectl upgrade (kvcached
--take-over) under load, and systemd's file-descriptor store after a clean
stop and after a crash, driven over the NOTIFY_SOCKET and LISTEN_FDS
protocols as systemd speaks them.  Every object is read back and its bytes
compared."""
import fcntl
import hashlib
import json
import mmap
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

import pytest

import kvcache
from conftest import stop_pid

N = 100000


def value(i, gen=0):
    """The bytes of object i: 256 B to 4 KiB, derived from i."""
    n = 256 + (i * 7919) % 3841
    seed = hashlib.blake2b(b"%d/%d" % (i, gen), digest_size=32).digest()
    return (seed * (n // 32 + 1))[:n]


def env_for_daemon():
    env = dict(os.environ)
    if "KVCACHE_DAEMON_ASAN_OPTIONS" in env:
        env["ASAN_OPTIONS"] = env["KVCACHE_DAEMON_ASAN_OPTIONS"]
    env.pop("LD_PRELOAD", None)
    return env


def binary(name):
    b = os.environ.get(name)
    if not b:
        pytest.skip("%s is not set (run through meson test)" % name)
    return b


def serving(sock, pid=None, timeout=60):
    """Wait until kvcached (pid, if given) answers on sock."""
    end = time.time() + timeout
    while time.time() < end:
        try:
            c = kvcache.Client(sock)
            st = c.status()
            c.close()
            if pid is None or st["pid"] == pid:
                return st
        except OSError:
            pass
        time.sleep(0.02)
    raise AssertionError("nothing serves %s" % sock)


def stats(sock):
    c = kvcache.Client(sock)
    s = c.stats()
    c.close()
    return s


def verify(sock, keys):
    """Every key of keys (name -> bytes) reads back whole."""
    c = kvcache.Client(sock)
    bad = [k for k, v in keys.items() if c.get(k) != v]
    c.close()
    return bad


FLAGS = ["--dram-size", "768MiB", "--hugepages", "off", "--poll-us", "0"]

LOAD = r"""
import json, os, random, sys, time
sys.path[:0] = %r
import kvcache
from test_warm import value, N
sock, out, stop = sys.argv[1:4]
# one Client all along: it connects again by itself once the daemon went
c = kvcache.Client(sock)
committed, wrong, errors, gets, after = [], 0, 0, 0, 0
i = 0
rnd = random.Random(7)
while not os.path.exists(stop):
    i += 1
    k = "load-%%d" %% i
    try:
        if c.put(k, value(N + i)) == 0:
            committed.append(i)
            after += c.reconnects > 0
        else:
            errors += 1
            time.sleep(0.002)
            continue
        j = rnd.randrange(N)
        v = c.get("obj-%%d" %% j)
        gets += 1
        if v is not None and v != value(j):
            wrong += 1
        if committed and rnd.random() < 0.5:
            j = rnd.choice(committed)
            v = c.get("load-%%d" %% j)
            if v is not None and v != value(N + j):
                wrong += 1
    except OSError:
        errors += 1
        time.sleep(0.002)
json.dump({"committed": committed, "wrong": wrong, "errors": errors,
           "reconnects": c.reconnects, "gets": gets, "after": after}, open(out, "w"))
"""


@pytest.fixture
def place():
    d = tempfile.mkdtemp(prefix="kvc-warm-")
    procs = []
    yield d, procs
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()
    subprocess.run(["rm", "-rf", d])


def test_upgrade_under_load(place):
    """100K objects, a client storing and reading all along, kvcachectl
    upgrade: every committed object is there after, bytes verified, and
    the client never read a wrong byte."""
    d, procs = place
    sock = os.path.join(d, "kvcached.sock")
    log = open(os.path.join(d, "kvcached.log"), "w")
    old = subprocess.Popen([binary("KVCACHED"), "--socket", sock] + FLAGS, stdout=log,
                           stderr=subprocess.STDOUT, env=env_for_daemon())
    procs.append(old)
    serving(sock, old.pid)
    c = kvcache.Client(sock)
    for i in range(N):
        assert c.put("obj-%d" % i, value(i)) == 0
    c.close()
    here = os.path.dirname(os.path.abspath(__file__))
    out, stop = os.path.join(d, "load.json"), os.path.join(d, "stop")
    load = subprocess.Popen([sys.executable, "-c", LOAD % ([here] + sys.path[:1]), sock, out,
                             stop])
    procs.append(load)
    time.sleep(1.0)
    up = subprocess.run([binary("KVCACHECTL"), "-s", sock, "--json", "upgrade"],
                        capture_output=True, text=True, timeout=300)
    assert up.returncode == 0, up.stderr + open(log.name).read()
    res = json.loads(up.stdout)
    assert old.wait(60) == 0, open(log.name).read()
    assert res["old_pid"] == old.pid
    time.sleep(1.0)  # the load goes on against the new daemon
    open(stop, "w").close()
    assert load.wait(120) == 0
    r = json.load(open(out))
    assert r["wrong"] == 0, r
    assert r["reconnects"] == 1, r  # its connection did end, and came back once
    assert r["after"] > 0, r  # and the same Client stored more after
    assert r["gets"] > 0 and len(r["committed"]) > 0
    s = stats(sock)
    assert s["warm_kept_objects"] >= N, s
    assert s["warm_dropped_objects"] == 0, s
    keys = {"obj-%d" % i: value(i) for i in range(N)}
    keys.update({"load-%d" % i: value(N + i) for i in r["committed"]})
    assert verify(sock, keys) == []
    print("upgrade with %d objects under load: serving again after %d ms "
          "(warm start %d ms), load committed %d puts, %d failed calls, %d reconnects" %
          (N, res["serving_after_ms"], s["warm_start_ms"], len(r["committed"]), r["errors"],
           r["reconnects"]))
    stop_pid(res["pid"])
    log.close()


def test_take_over_refused_and_nobody(place):
    """Another dram size: refused (exit 2) and the running daemon goes on
    with everything; with nobody serving, --take-over starts empty."""
    d, procs = place
    sock = os.path.join(d, "kvcached.sock")
    flags = ["--dram-size", "64MiB", "--hugepages", "off"]
    old = subprocess.Popen([binary("KVCACHED"), "--socket", sock] + flags,
                           stderr=subprocess.DEVNULL, env=env_for_daemon())
    procs.append(old)
    serving(sock, old.pid)
    c = kvcache.Client(sock)
    assert c.put("kept", b"x" * 5000) == 0
    c.close()
    r = subprocess.run([binary("KVCACHED"), "--socket", sock, "--dram-size", "128MiB",
                        "--hugepages", "off", "--take-over"], capture_output=True, text=True,
                       env=env_for_daemon(), timeout=60)
    assert r.returncode == 2, r.stderr
    assert "another size" in r.stderr
    assert old.poll() is None
    assert verify(sock, {"kept": b"x" * 5000}) == []
    old.send_signal(signal.SIGTERM)
    assert old.wait(30) == 0
    new = subprocess.Popen([binary("KVCACHED"), "--socket", sock, "--take-over"] + flags,
                           stderr=subprocess.PIPE, env=env_for_daemon())
    procs.append(new)
    serving(sock, new.pid)
    assert verify(sock, {"kept": None}) == []  # empty
    new.send_signal(signal.SIGTERM)
    assert new.wait(30) == 0
    assert b"no kvcached serves" in new.stderr.read()


def test_upgrade_with_disk_tier(place):
    """With a disk tier: records of objects kept in memory stay their
    copies below (nothing is written again), objects without one are
    copied by the next flush, and after the memory is emptied every
    object reads back from disk."""
    d, procs = place
    sock = os.path.join(d, "kvcached.sock")
    disk = os.path.join(d, "disk")
    os.mkdir(disk)
    flags = ["--dram-size", "64MiB", "--hugepages", "off", "--disk-dir", disk,
             "--disk-size", "256MiB"]
    log = open(os.path.join(d, "kvcached.log"), "w")
    old = subprocess.Popen([binary("KVCACHED"), "--socket", sock] + flags, stdout=log,
                           stderr=subprocess.STDOUT, env=env_for_daemon())
    procs.append(old)
    serving(sock, old.pid)
    ctl = [binary("KVCACHECTL"), "-s", sock]
    c = kvcache.Client(sock)
    keys = {"d-%d" % i: value(i) * 20 for i in range(50)}
    for k, v in keys.items():
        assert c.put(k, v) == 0
    c.close()
    subprocess.run(ctl + ["flush"], check=True)
    assert stats(sock)["disk.records"] == 50
    c = kvcache.Client(sock)
    more = {"e-%d" % i: value(i, 3) * 20 for i in range(20)}
    for k, v in more.items():
        assert c.put(k, v) == 0
    c.close()
    up = subprocess.run(ctl + ["--json", "upgrade"], capture_output=True, text=True, timeout=120)
    assert up.returncode == 0, up.stderr + open(log.name).read()
    assert old.wait(60) == 0
    new = json.loads(up.stdout)["pid"]
    serving(sock, new)
    for _ in range(500):  # the disk tier's records are indexed in the background
        s = stats(sock)
        if not s.get("disk.recovering"):
            break
        time.sleep(0.01)
    assert s["warm_kept_objects"] == 70, s
    assert s["disk.records"] == 50, s  # the records stayed, as those objects' copies
    writes = s["disk.writes"]
    subprocess.run(ctl + ["flush"], check=True)
    s = stats(sock)
    assert s["disk.records"] == 70, s
    assert s["disk.writes"] == writes + 20, s  # only those without a copy
    subprocess.run(ctl + ["evict", "--tier", "dram", "--all"], check=True, capture_output=True)
    keys.update(more)
    assert verify(sock, keys) == []
    assert stats(sock)["dram.objects"] <= len(keys)
    stop_pid(new)
    log.close()


class Systemd:
    """The service manager's side of Type=notify with FileDescriptorStoreMax=:
    it keeps what the daemon stores (FDSTORE=1, FDNAME=) and passes it back
    to the next start (LISTEN_FDS, LISTEN_PID, LISTEN_FDNAMES)."""

    def __init__(self, d):
        self.path = os.path.join(d, "notify")
        self.ns = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.ns.bind(self.path)
        self.ns.settimeout(60)
        self.store = {}
        self.log = os.path.join(d, "kvcached.log")

    def start(self, argv):
        names = list(self.store)
        fds = [fcntl.fcntl(self.store[n], fcntl.F_DUPFD, 100) for n in names]
        logfd = os.open(self.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        env = env_for_daemon()
        env["NOTIFY_SOCKET"] = self.path
        pid = os.fork()
        if pid == 0:
            try:
                for i, fd in enumerate(fds):
                    os.dup2(fd, 3 + i)
                os.dup2(logfd, 1)
                os.dup2(logfd, 2)
                if fds:
                    env["LISTEN_FDS"] = str(len(fds))
                    env["LISTEN_PID"] = str(os.getpid())
                    env["LISTEN_FDNAMES"] = ":".join(names)
                os.execve(argv[0], argv, env)
            finally:
                os._exit(127)
        for fd in fds:
            os.close(fd)
        os.close(logfd)
        self.pid = pid
        self.wait_ready()
        return pid

    def wait_ready(self):
        """READY=1, then the fds it stores."""
        ready = False
        while True:
            msg, fds, _, _ = socket.recv_fds(self.ns, 4096, 8)
            msg = msg.decode()
            fields = dict(line.split("=", 1) for line in msg.split("\n") if "=" in line)
            if "FDSTOREREMOVE" in fields:
                old = self.store.pop(fields["FDNAME"], None)
                if old is not None:
                    os.close(old)
            elif "FDSTORE" in fields:
                assert len(fds) == 1, msg
                name = fields["FDNAME"]
                if name in self.store:
                    os.close(self.store[name])
                self.store[name] = fds[0]
                if ready and len(self.store) >= 3:
                    return
            elif "READY" in fields:
                ready = True
            for fd in fds if "FDSTORE" not in fields else []:
                os.close(fd)

    def stop(self, sig):
        os.kill(self.pid, sig)
        _, status = os.waitpid(self.pid, 0)
        return status

    def close(self):
        for fd in self.store.values():
            os.close(fd)
        self.ns.close()


def test_fdstore_restart_crash_and_scribbles(place):
    """A clean stop keeps everything; a crash keeps what has a checksum
    (kept before, or taken ahead since) and drops the rest (counted); bytes changed in memory after their
    checksum was taken are dropped, never served; a catalog that is not
    one starts the memory empty."""
    d, procs = place
    sock = os.path.join(d, "kvcached.sock")
    sd = Systemd(d)
    argv = [binary("KVCACHED"), "--socket", sock, "--dram-size", "64MiB", "--hugepages", "off"]
    try:
        sd.start(argv)
        assert sorted(sd.store) == ["kvcache-catalog", "kvcache-dram", "kvcache-listen"]
        c = kvcache.Client(sock)
        for i in range(200):
            assert c.put("a-%d" % i, value(i)) == 0
        c.close()
        assert sd.stop(signal.SIGTERM) == 0
        # the socket stays: connections wait in its backlog for the next run
        assert os.path.exists(sock)

        sd.start(argv)
        s = stats(sock)
        assert s["warm_kept_objects"] == 200 and s["warm_dropped_objects"] == 0, s
        assert verify(sock, {"a-%d" % i: value(i) for i in range(200)}) == []
        c = kvcache.Client(sock)
        # under the file-descriptor store a lone daemon takes checksums
        # ahead (objects of 64 KiB and up): these survive a crash
        big = {"c-%d" % i: value(i, 2) * 300 for i in range(10)}
        for k, v in big.items():
            assert c.put(k, v) == 0
        for _ in range(1000):
            if c.stats().get("sums_ahead", 0) >= 10:
                break
            time.sleep(0.01)
        else:
            raise AssertionError("no checksums taken ahead: %s" % c.stats())
        for i in range(100):
            assert c.put("b-%d" % i, value(i, 1)) == 0
        c.close()
        os.kill(sd.pid, signal.SIGKILL)
        os.waitpid(sd.pid, 0)

        # after the crash, one object's bytes change in memory
        seg = mmap.mmap(sd.store["kvcache-dram"], 0)
        at = seg.find(value(17))
        assert at > 0
        seg[at + 100] ^= 0xff
        seg.close()
        sd.start(argv)
        s = stats(sock)
        assert s["warm_kept_objects"] == 209, s
        assert s["warm_unverified_objects"] == 100, s
        assert s["warm_mismatched_objects"] == 1, s
        want = {"a-%d" % i: value(i) for i in range(200) if i != 17}
        want.update(big)
        want.update({"b-%d" % i: None for i in range(100)})
        want["a-17"] = None
        assert verify(sock, want) == []
        assert sd.stop(signal.SIGTERM) == 0

        # a catalog that is not one
        cat = mmap.mmap(sd.store["kvcache-catalog"], 0)
        cat[0:8] = b"garbage!"
        cat.close()
        sd.start(argv)
        s = stats(sock)
        assert s["warm_kept_objects"] == 0, s
        assert verify(sock, {"a-1": None}) == []
        c = kvcache.Client(sock)
        assert c.put("a-1", value(1)) == 0
        assert c.get("a-1") == value(1)
        c.close()
        assert sd.stop(signal.SIGTERM) == 0
        assert "not taking over the previous run's catalog" in open(sd.log).read()
    finally:
        try:
            os.kill(sd.pid, signal.SIGKILL)
            os.waitpid(sd.pid, 0)
        except (ProcessLookupError, ChildProcessError, AttributeError):
            pass
        sd.close()
