# SPDX-License-Identifier: MIT
"""The shared tier (--shared-dir, docs/shared-tier.rst): nodes that share a
directory read what any of them wrote, whoever is still alive; records that
are torn, damaged, another key's or a newer writer's are never served; a
directory that is read-only, full or gone turns the tier off and local
service goes on.  Where this runs as root, each node reaches the directory
through its own bind mount, as nodes of a cluster mount one filesystem."""
import os
import shutil
import struct
import subprocess
import tempfile
import time

import pytest

import kvcache
from conftest import start_daemon, start_master, stop_daemon, stop_master

ROOT = os.geteuid() == 0


def wait_for(cond, timeout=10.0, what="condition"):
    end = time.time() + timeout
    while time.time() < end:
        v = cond()
        if v:
            return v
        time.sleep(0.02)
    raise AssertionError("timed out waiting for " + what)


def stat(c, name):
    return c.stats().get("shared." + name, 0)


class Dir:
    """A directory the nodes share, each through its own mount of it."""

    def __init__(self, tmpfs=True):
        # on a disk: O_DIRECT is taken there (tmpfs refuses it)
        self.base = tempfile.mkdtemp(prefix="kvc-shared-", dir=None if tmpfs else "/var/tmp")
        self.data = os.path.join(self.base, "data")
        os.mkdir(self.data)
        self.mounts = []
        self.tmpfs = ROOT and tmpfs
        if self.tmpfs:  # a filesystem of its own, as a network mount is
            subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512m", "kvc-shared",
                            self.data], check=True)

    def mount(self, name, ro=False):
        m = os.path.join(self.base, name)
        os.mkdir(m)
        if ROOT:
            subprocess.run(["mount", "--bind", self.data, m], check=True)
            if ro:
                subprocess.run(["mount", "-o", "remount,bind,ro", m], check=True)
            self.mounts.append(m)
            return m
        os.rmdir(m)
        return self.data

    def records(self):
        out = []
        for top, _, files in os.walk(os.path.join(self.data, "kvcache-v1")):
            out += [os.path.join(top, f) for f in files if f.endswith(".kvr")]
        return out

    def bytes(self):
        """What the records take (those deleted meanwhile count nothing)."""
        total = 0
        for r in self.records():
            try:
                total += os.path.getsize(r)
            except FileNotFoundError:
                pass
        return total

    def close(self):
        for m in reversed(self.mounts):
            subprocess.run(["umount", "-l", m])
        if self.tmpfs:
            subprocess.run(["umount", "-l", self.data])
        shutil.rmtree(self.base, ignore_errors=True)


@pytest.fixture
def shared():
    d = Dir()
    yield d
    d.close()


class Node:
    def __init__(self, path, *extra):
        self.proc, self.d, self.sock, self.log = start_daemon(
            "--shared-dir", path, "--log-level", "info", *extra)
        self.c = kvcache.Client(self.sock)
        wait_for(lambda: stat(self.c, "on"), what="the shared tier to come on")

    def kill(self):
        self.c.close()
        self.proc.kill()
        self.proc.wait()
        self.log.close()
        shutil.rmtree(self.d, ignore_errors=True)

    def stop(self):
        self.c.close()
        stop_daemon(self.proc, self.d, self.log)

    def text(self):
        return open(self.log.name).read()


def values(n, size=100000, prefix="k"):
    return {"%s%d" % (prefix, i): os.urandom(size + i) for i in range(n)}


@pytest.mark.parametrize("fs", ["tmpfs", "disk"])
def test_written_through_read_by_another_after_the_writer_died(fs):
    shared = Dir(tmpfs=fs == "tmpfs")
    try:
        written_through_read_by_another_after_the_writer_died(shared)
    finally:
        shared.close()


def written_through_read_by_another_after_the_writer_died(shared):
    a = Node(shared.mount("a"), "--shared-write-through")
    b = Node(shared.mount("b"))
    try:
        vals = values(60)
        for k, v in vals.items():
            assert a.c.put(k, v) == 0
        wait_for(lambda: stat(a.c, "writes") == len(vals), what="every copy written")
        a.kill()
        a = None
        for k, v in vals.items():
            assert b.c.get(k) == v, k
        assert stat(b.c, "reads") == len(vals)
        assert b.c.get("never-stored") is None
        assert stat(b.c, "read_misses") >= 1
        # now in B's memory: read again without the shared tier
        assert b.c.get("k3") == vals["k3"]
        assert stat(b.c, "reads") == len(vals)
        if not shared.tmpfs:  # a disk takes O_DIRECT
            assert stat(b.c, "direct_reads") == len(vals)
    finally:
        if a:
            a.stop()
        b.stop()


def test_write_through_faster_than_the_directory_waits_its_turn(shared):
    # a quarter of dram may be queued for the shared tier (16 MiB here),
    # whose copies take 30 ms each: puts past that wait for room, in
    # order, and every one is written while all of them are still in
    # memory; then the writer dies and another node reads them all
    os.environ["KVCACHE_TEST_SHARED_WRITE_MS"] = "30"
    try:
        a = Node(shared.mount("a"), "--dram-size", "64MiB", "--shared-write-through")
    finally:
        del os.environ["KVCACHE_TEST_SHARED_WRITE_MS"]
    b = Node(shared.mount("b"))
    try:
        vals = values(12, size=4 << 20, prefix="t")
        for k, v in vals.items():
            assert a.c.put(k, v) == 0
        wait_for(lambda: stat(a.c, "writes") == len(vals), what="every copy written")
        st = a.c.stats()
        assert st["shared_through_waited"] > 0
        assert st["shared_through_dropped"] == 0
        assert st["evictions"] == 0  # none was copied for leaving memory
        a.kill()
        a = None
        for k, v in vals.items():
            assert b.c.get(k) == v, k
    finally:
        if a:
            a.stop()
        b.stop()


def test_objects_leaving_memory_are_copied_first(shared):
    n = Node(shared.mount("n"), "--dram-size", "16MiB")
    try:
        vals = values(40, size=1 << 20, prefix="e")
        for k, v in vals.items():
            assert n.c.put(k, v) == 0
        st = n.c.stats()
        assert st["evictions"] > 0
        assert st["shared.writes"] >= st["evictions"] - 1
        for k, v in vals.items():
            assert n.c.get(k) == v, k
        assert stat(n.c, "reads") > 0
        assert len(shared.records()) == stat(n.c, "writes")
    finally:
        n.stop()


def test_exists_and_prefix_lookup_see_the_shared_tier(shared):
    a = Node(shared.mount("a"), "--shared-write-through")
    b = Node(shared.mount("b"))
    try:
        keys = ["p/%d" % i for i in range(20)]
        for k in keys[:12]:
            assert a.c.put(k, b"x" * 5000) == 0
        wait_for(lambda: stat(a.c, "writes") == 12)
        assert b.c.batch_exists(keys) == [True] * 12 + [False] * 8
        assert b.c.prefix_lookup(keys) == 12
        assert b.c.exists("p/3") and not b.c.exists("p/13")
        # one statx-class question per key at most, then the cache
        assert stat(b.c, "lookup_keys") <= len(keys) + 2
        assert stat(b.c, "reads") == 0  # found, not read
    finally:
        a.stop()
        b.stop()


def test_the_whole_cluster_restarted_reads_what_any_node_wrote(shared):
    a = Node(shared.mount("a"), "--shared-write-through")
    b = Node(shared.mount("b"), "--shared-write-through")
    va, vb = values(20, prefix="a"), values(20, prefix="b")
    for k, v in va.items():
        assert a.c.put(k, v) == 0
    for k, v in vb.items():
        assert b.c.put(k, v) == 0
    wait_for(lambda: stat(a.c, "writes") == 20 and stat(b.c, "writes") == 20)
    a.stop()
    b.stop()
    a, b = Node(shared.mount("a2")), Node(shared.mount("b2"))
    try:
        for k, v in list(va.items()) + list(vb.items()):
            assert a.c.get(k) == v and b.c.get(k) == v, k
    finally:
        a.stop()
        b.stop()


def test_concurrent_writers_of_the_same_keys(shared):
    a = Node(shared.mount("a"), "--shared-write-through")
    b = Node(shared.mount("b"), "--shared-write-through")
    c = Node(shared.mount("c"))
    try:
        va, vb = values(40, prefix="same"), values(40, prefix="same")
        import threading
        ta = threading.Thread(target=lambda: [a.c.put(k, v) for k, v in va.items()])
        tb = threading.Thread(target=lambda: [b.c.put(k, v) for k, v in vb.items()])
        ta.start(), tb.start(), ta.join(), tb.join()
        wait_for(lambda: stat(a.c, "writes") + stat(a.c, "write_skips") == 40 and
                 stat(b.c, "writes") + stat(b.c, "write_skips") == 40)
        # one writer of each key won: exactly 40 records, each whole
        assert stat(a.c, "writes") + stat(b.c, "writes") == 40
        assert len(shared.records()) == 40
        assert not [f for f in os.listdir(shared.data) if f.endswith(".tmp")]
        for k in va:
            got = c.c.get(k)
            assert got in (va[k], vb[k]), k
    finally:
        a.stop()
        b.stop()
        c.stop()


def record_of(shared, key):
    """The file of key's record (the only one there)."""
    recs = shared.records()
    assert len(recs) == 1, recs
    return recs[0]


@pytest.mark.parametrize("damage", ["torn", "flipped", "other-key", "newer"])
def test_damaged_records_are_never_served(shared, damage):
    a = Node(shared.mount("a"), "--shared-write-through")
    v = os.urandom(300000)
    assert a.c.put("victim", v) == 0
    wait_for(lambda: stat(a.c, "writes") == 1)
    a.stop()
    path = record_of(shared, "victim")
    data = bytearray(open(path, "rb").read())
    if damage == "torn":  # a writer that died mid-write, published anyway
        data = data[:len(data) // 2]
    elif damage == "flipped":
        data[-5000] ^= 0x40
    elif damage == "other-key":  # a record written for another key
        other = os.path.join(os.path.dirname(path), "x.kvr")
        b = Node(shared.mount("w"), "--shared-write-through")
        assert b.c.put("other", v) == 0
        wait_for(lambda: stat(b.c, "writes") == 1)
        b.stop()
        for p in shared.records():
            if p != path:
                data = bytearray(open(p, "rb").read())
                os.unlink(p)
        del other
    elif damage == "newer":  # a future writer's record version
        struct.pack_into("<I", data, 8, 2)
    open(path, "wb").write(data)
    b = Node(shared.mount("b"))
    try:
        assert b.c.get("victim") is None
        want = {"torn": "skipped_damaged", "flipped": "checksum_failures",
                "other-key": "skipped_damaged", "newer": "skipped_newer"}[damage]
        assert stat(b.c, want) == 1
        assert stat(b.c, "reads") == 0
        assert b.c.put("fine", b"ok") == 0  # local service goes on
        assert b.c.get("fine") == b"ok"
    finally:
        b.stop()


def test_temporary_files_are_never_seen_and_old_ones_go(shared):
    a = Node(shared.mount("a"), "--shared-write-through")
    assert a.c.put("t", b"y" * 10000) == 0
    wait_for(lambda: stat(a.c, "writes") == 1)
    a.stop()
    path = record_of(shared, "t")
    tmp = os.path.join(os.path.dirname(path),
                       "." + os.path.basename(path)[:-4] + ".00000000deadbeef.tmp")
    os.rename(path, tmp)  # a writer that died before its rename
    old = time.time() - 3600
    os.utime(tmp, (old, old))
    b = Node(shared.mount("b"))
    try:
        assert b.c.get("t") is None
        wait_for(lambda: not os.path.exists(tmp), 30, "the dead writer's file to go")
        wait_for(lambda: stat(b.c, "tmp_removed") == 1, what="it to be counted")
    finally:
        b.stop()


@pytest.mark.skipif(not ROOT, reason="needs a read-only bind mount (root)")
def test_a_read_only_directory_serves_and_takes_no_copies(shared):
    a = Node(shared.mount("a"), "--shared-write-through")
    assert a.c.put("ro", b"z" * 20000) == 0
    wait_for(lambda: stat(a.c, "writes") == 1)
    a.stop()
    b = Node(shared.mount("b", ro=True), "--shared-write-through")
    try:
        wait_for(lambda: not stat(b.c, "writable") and stat(b.c, "on"))
        assert b.c.get("ro") == b"z" * 20000
        assert b.c.put("new", b"w" * 1000) == 0
        assert b.c.get("new") == b"w" * 1000
        assert stat(b.c, "writes") == 0
    finally:
        b.stop()


def small_filesystem(base):
    """A small filesystem at base: a loop-mounted ext4 image of 6 MiB, or
    where loop devices are not to be had, a tmpfs of 3 MiB."""
    img = base + ".img"
    with open(img, "wb") as f:
        f.truncate(6 << 20)
    if (subprocess.run(["mkfs.ext4", "-q", "-F", "-O", "^has_journal", img],
                       capture_output=True).returncode == 0 and
            subprocess.run(["mount", "-o", "loop", img, base],
                           capture_output=True).returncode == 0):
        return img
    os.unlink(img)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "kvc-full", base], check=True)
    return None


@pytest.mark.skipif(not ROOT, reason="needs a small filesystem mounted (root)")
def test_a_full_directory_turns_copies_off_until_there_is_room():
    base = tempfile.mkdtemp(prefix="kvc-shared-full-")
    img = small_filesystem(base)
    try:
        n = Node(base, "--shared-write-through")
        try:
            for i in range(8):
                assert n.c.put("f%d" % i, os.urandom(1 << 20)) == 0
            wait_for(lambda: not stat(n.c, "writable"), what="ENOSPC to turn copies off")
            assert stat(n.c, "on") == 1  # still read
            assert stat(n.c, "offs") == 1
            assert "takes no more copies" in n.text()
            for i in range(8):
                assert len(n.c.get("f%d" % i)) == 1 << 20  # nothing lost here
            # room again: copies come back on by themselves
            for top, _, files in os.walk(os.path.join(base, "kvcache-v1")):
                for f in files:
                    os.unlink(os.path.join(top, f))
            wait_for(lambda: stat(n.c, "writable"), what="the tier to take copies again")
            before = stat(n.c, "writes")
            assert n.c.put("after", b"a" * 1000) == 0
            wait_for(lambda: stat(n.c, "writes") == before + 1)
            assert n.c.get("after") == b"a" * 1000
        finally:
            n.stop()
    finally:
        subprocess.run(["umount", "-l", base])
        os.rmdir(base)
        if img:
            os.unlink(img)


def test_a_directory_that_disappears_and_comes_back(shared):
    path = shared.mount("a")
    n = Node(path, "--shared-write-through")
    try:
        assert n.c.put("before", b"b" * 4000) == 0
        wait_for(lambda: stat(n.c, "writes") == 1)
        if ROOT:  # unmounted: the directory below the mount point shows
            subprocess.run(["umount", "-l", path], check=True)
            shared.mounts.remove(path)
        else:
            os.rename(shared.data, shared.data + ".away")
        assert n.c.put("during", b"d" * 4000) == 0
        wait_for(lambda: not stat(n.c, "on"), what="the tier to go off")
        assert "is off" in n.text()
        t0 = time.time()
        assert n.c.get("never") is None
        assert time.time() - t0 < 1.0  # a miss, at once
        assert n.c.get("during") == b"d" * 4000  # local service goes on
        if ROOT:
            subprocess.run(["mount", "--bind", shared.data, path], check=True)
            shared.mounts.append(path)
        else:
            os.rename(shared.data + ".away", shared.data)
        wait_for(lambda: stat(n.c, "on"), what="the tier to come back")
        assert "shared tier %s is on" % path in n.text()
        n.c.remove("before")
        wait_for(lambda: not shared.records(), what="the removed key's record to go")
        wait_for(lambda: stat(n.c, "unlinked") == 1, what="it to be counted")
    finally:
        n.stop()


def test_records_above_the_watermark_go_oldest_first(shared):
    size = 8 << 20
    a = Node(shared.mount("a"), "--shared-write-through")
    vals = values(12, size=1 << 20, prefix="old")
    for k, v in vals.items():
        assert a.c.put(k, v) == 0
    wait_for(lambda: stat(a.c, "writes") == 12)
    a.stop()
    # as if written over the last hours, ten minutes apart
    recs = sorted(shared.records())
    now = time.time()
    ages = {r: 7200 + 600 * i for i, r in enumerate(recs)}
    for r, age in ages.items():
        os.utime(r, (now - age, now - age))
    w = Node(shared.mount("w"), "--shared-write-through")
    assert w.c.put("young", os.urandom(1 << 20)) == 0  # younger than a lease: never evicted
    wait_for(lambda: stat(w.c, "writes") == 1)
    young = [r for r in shared.records() if r not in ages][0]
    w.stop()
    # two nodes keep the capacity together
    a, b = (Node(shared.mount(m), "--shared-size", str(size)) for m in ("a2", "b2"))
    try:
        wait_for(lambda: shared.bytes() <= size * 0.95,
                 60, "eviction below the watermark")
        left = [r for r in recs if os.path.exists(r)]
        gone = [r for r in recs if not os.path.exists(r)]
        assert gone and left
        assert max(ages[r] for r in left) < min(ages[r] for r in gone)  # oldest first
        assert os.path.exists(young)
        wait_for(lambda: stat(a.c, "evicted") + stat(b.c, "evicted") == len(gone),
                 what="the evictions to be counted")
    finally:
        a.stop()
        b.stop()


def test_a_cluster_miss_goes_on_to_the_shared_tier(shared):
    """A node of a cluster looks in the shared tier when the directory
    does not know the key, and when the only holder it names is dead."""
    master = start_master()
    port = master[3]
    join = ("--master", "127.0.0.1:%d" % port, "--listen", "127.0.0.1:0")
    a = Node(shared.mount("a"), *join, "--node-id", "A", "--shared-write-through")
    b = Node(shared.mount("b"), *join, "--node-id", "B", "--remote-timeout-ms", "1000")
    try:
        wait_for(lambda: len(b.c.cluster()["nodes"]) == 2, what="both nodes to join")
        vals = values(30, prefix="c")
        for k, v in vals.items():
            assert a.c.put(k, v) == 0
        wait_for(lambda: stat(a.c, "writes") == len(vals))
        # from A while it is there (the directory knows it)
        assert b.c.get("c0") == vals["c0"]
        assert stat(b.c, "reads") == 0
        # A dies: the directory still names it for a while, then forgets
        a.kill()
        a = None
        for k, v in vals.items():
            assert b.c.get(k) == v, k
        assert stat(b.c, "reads") == len(vals) - 1
        assert b.c.get("c-never") is None
        assert b.c.batch_exists(["c5", "c-never"]) == [True, False]
    finally:
        if a:
            a.stop()
        b.stop()
        stop_master(master)


def test_the_directory_from_a_config_file(shared):
    """JSON shared_dir, and UCM's storage_backends key, name the directory."""
    import json
    for key in ("shared_dir", "storage_backends"):
        cfg = os.path.join(shared.base, key + ".json")
        json.dump({key: shared.mount(key), "shared_size": "1GiB"}, open(cfg, "w"))
        proc, d, sock, log = start_daemon("--config", cfg)
        try:
            c = kvcache.Client(sock)
            wait_for(lambda: stat(c, "on"), what="the tier from " + key)
            assert stat(c, "size") == 1 << 30
            c.close()
        finally:
            stop_daemon(proc, d, log)


def hung_record(shared, key):
    """key's record, as a FIFO nobody writes: a reader's open() blocks as
    on a hung network filesystem, until unblock()."""
    w = Node(shared.mount("w-" + key), "--shared-write-through")
    assert w.c.put(key, b"s" * 5000) == 0
    wait_for(lambda: stat(w.c, "writes") == 1)
    w.stop()
    path = record_of(shared, key)
    os.unlink(path)
    os.mkfifo(path)
    return path


def test_a_hung_directory_costs_a_miss_not_a_stall(shared):
    """A read that never returns (here: its record is a FIFO nobody writes,
    so open() blocks as on a hung network filesystem) ends the request with
    a miss at the call's deadline, turns the tier off, never holds up
    anything else, and the tier comes back once the call returns."""
    import threading
    path = hung_record(shared, "slow")
    n = Node(shared.mount("n"))
    try:
        got = {}

        def reader():
            c = kvcache.Client(n.sock)
            t0 = time.time()
            got["value"] = c.get("slow")
            got["took"] = time.time() - t0
            c.close()
        t = threading.Thread(target=reader)
        t.start()
        time.sleep(0.5)
        # meanwhile this node answers its other clients at once
        t0 = time.time()
        assert n.c.put("other", b"o" * 1000) == 0
        assert n.c.get("other") == b"o" * 1000
        assert time.time() - t0 < 0.5
        t.join(30)
        assert not t.is_alive()
        assert got["value"] is None  # a miss, at the call's deadline
        assert 4 < got["took"] < 10, got
        assert stat(n.c, "timeouts") == 1 and not stat(n.c, "on")
        assert "did not return in time" in n.text()
        # off: the next miss does not wait
        t0 = time.time()
        assert n.c.get("slow2") is None
        assert time.time() - t0 < 0.5
        # the call returns (a writer at last): the tier comes back
        unblock(path)
        wait_for(lambda: stat(n.c, "on"), what="the tier to come back")
    finally:
        unblock(path)
        n.stop()
        release(path)


OPENED = {}


def unblock(fifo):
    """Readers blocked opening fifo go on, and the next ones do not block:
    a writer holds it open (an empty record: a damaged one) until
    release()."""
    if fifo not in OPENED:
        OPENED[fifo] = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)


def release(fifo):
    fd = OPENED.pop(fifo, None)
    if fd is not None:
        os.close(fd)


def test_a_stop_does_not_wait_for_a_hung_call(shared):
    import threading
    path = hung_record(shared, "stuck")
    n = Node(shared.mount("n"))
    try:
        t = threading.Thread(target=lambda: kvcache.Client(n.sock).get("stuck"))
        t.start()
        wait_for(lambda: stat(n.c, "timeouts") == 1, 20, "the call to run out of time")
        t.join(10)
        n.c.close()
        t0 = time.time()
        n.proc.terminate()
        assert n.proc.wait(timeout=20) == 0
        assert time.time() - t0 < 10
        assert "still hung in the filesystem" in n.text()
    finally:
        unblock(path)
        release(path)
        if n.proc.poll() is None:
            n.proc.kill()
        n.log.close()
        shutil.rmtree(n.d, ignore_errors=True)


def test_removals_by_prefix_reach_every_node(shared):
    a = Node(shared.mount("a"), "--shared-write-through")
    try:
        gone = {"r/%d" % i: os.urandom(3000 + i) for i in range(5)}
        kept = {"keep/%d" % i: os.urandom(2000 + i) for i in range(3)}
        for k, v in list(gone.items()) + list(kept.items()):
            assert a.c.put(k, v) == 0
        wait_for(lambda: stat(a.c, "writes") == 8)
        time.sleep(0.01)  # (records written strictly before the removal)
        a.c.remove_prefix("r/")
        wait_for(lambda: stat(a.c, "removals_written") == 1)
        assert a.c.get("r/1") is None  # not from the shared tier either
        b = Node(shared.mount("b"))
        try:
            assert b.c.get("r/2") is None
            assert b.c.get("keep/1") == kept["keep/1"]
            assert b.c.batch_exists(["r/3", "keep/2"]) == [False, True]
            assert stat(b.c, "removed_skips") == 1
            wait_for(lambda: stat(b.c, "unlinked") == 1)  # and it went
            # put again after the removal: served again, everywhere
            assert a.c.put("r/4", b"new") == 0
            wait_for(lambda: stat(a.c, "writes") == 9)
            assert b.c.get("r/4") == b"new"
            # everything
            a.c.remove_prefix(None)
            wait_for(lambda: stat(a.c, "removals_written") == 2)
            wait_for(lambda: stat(b.c, "removals") == 2, 15, "B to hear of it")
            c = Node(shared.mount("c"))
            try:
                assert c.c.get("keep/0") is None
                assert c.c.get("r/4") is None
            finally:
                c.stop()
        finally:
            b.stop()
    finally:
        a.stop()


def test_metrics_show_the_shared_tier(shared):
    import socket as so
    import urllib.request
    s = so.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    n = Node(shared.mount("m"), "--shared-write-through", "--metrics-port", str(port))
    try:
        assert n.c.put("m1", b"x" * 10000) == 0
        wait_for(lambda: stat(n.c, "writes") == 1)
        def scrape():
            try:
                text = urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port,
                                              timeout=5).read().decode()
            except OSError:
                return None  # not listening yet
            lines = {ln.split()[0]: ln.split()[1] for ln in text.splitlines()
                     if ln and not ln.startswith("#")}
            # (the figures are a snapshot the loop refreshes)
            return text if lines.get("kvcache_shared_writes_total") == "1" else None
        text = wait_for(scrape, what="/metrics to count the write")
        assert "\nkvcache_shared_on 1\n" in text
        assert "# TYPE kvcache_shared_bytes gauge" in text
        assert "# TYPE kvcache_shared_reads_total counter" in text
    finally:
        n.stop()


def test_beside_a_disk_tier(shared):
    """With a private disk tier too: an object leaving memory is copied to
    the shared tier and kept on this node's disk; this node reads it back
    from its disk, another node from the shared tier."""
    disk = tempfile.mkdtemp(prefix="kvc-shared-disk-", dir="/var/tmp")
    a = Node(shared.mount("a"), "--dram-size", "16MiB", "--disk-dir", disk)
    try:
        vals = values(30, size=1 << 20, prefix="d")
        for k, v in vals.items():
            assert a.c.put(k, v) == 0, k  # (copies in flight: it waits for room)
        st = a.c.stats()
        assert st["evictions"] + st["demotions"] > 0
        wait_for(lambda: stat(a.c, "writes") >= 14, what="copies of what left memory")
        for k, v in vals.items():
            assert a.c.get(k) == v, k
        assert stat(a.c, "reads") == 0  # its own disk had them all
        assert a.c.stats()["disk.reads"] > 0
        b = Node(shared.mount("b"))
        try:
            left = [k for k in vals if shared.records() and b.c.exists(k)]
            assert len(left) == stat(a.c, "writes")
            for k in left:
                assert b.c.get(k) == vals[k], k
        finally:
            b.stop()
    finally:
        a.stop()
        shutil.rmtree(disk, ignore_errors=True)
