# SPDX-License-Identifier: MIT
"""systemd: readiness (Type=notify) of kvcached and kvcache-master over the
NOTIFY_SOCKET protocol, and the units checked by systemd-analyze verify.
One case per run: test-units.py CASE (exit 77: skipped)."""
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile

DIR = tempfile.mkdtemp(prefix="kvc-units-")


def fail(msg):
    raise SystemExit("FAIL: " + msg)


def notifications(argv, ready_check):
    """Run argv with NOTIFY_SOCKET set; return what it said by READY=1 and
    by its exit after SIGTERM."""
    path = os.path.join(DIR, "notify")
    ns = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    ns.bind(path)
    ns.settimeout(20)
    env = dict(os.environ, NOTIFY_SOCKET=path)
    p = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        msg = ns.recv(4096).decode()
        if "READY=1" not in msg:
            fail("first notification is not READY=1: %r" % msg)
        if "MAINPID=" in msg and int(msg.split("MAINPID=")[1].split()[0]) != p.pid:
            fail("MAINPID is not the daemon's pid: %r" % msg)
        ready_check()  # it serves already when it says so
        p.send_signal(signal.SIGTERM)
        msg2 = ns.recv(4096).decode()
        while "FDSTORE" in msg2:  # kvcached's memory for the next start
            msg2 = ns.recv(4096).decode()
        if "STOPPING=1" not in msg2:
            fail("no STOPPING=1 on SIGTERM: %r" % msg2)
        if p.wait(30) != 0:
            fail("exit status %d: %s" % (p.returncode, p.stderr.read().decode()))
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        ns.close()
    return msg


def case_notify_kvcached():
    sock = os.path.join(DIR, "kvcached.sock")

    def check():
        c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        c.connect(sock)  # accepting connections at READY=1
        c.close()
    msg = notifications([os.environ["KVCACHED"], "--socket", sock, "--dram-size", "16MiB",
                         "--hugepages", "off"], check)
    if "STATUS=serving on " + sock not in msg:
        fail("STATUS does not name the socket: %r" % msg)


def case_notify_master():
    def check():
        pass
    notifications([os.environ["KVCACHE_MASTER"], "--port", "0", "--rpc_address", "127.0.0.1"],
                  check)


def case_verify():
    tool = shutil.which("systemd-analyze")
    if not tool:
        print("systemd-analyze is not installed; skipping")
        raise SystemExit(77)
    units = os.environ["KVCACHE_UNITS"]
    binaries = {"kvcached": os.environ["KVCACHED"], "kvcache-master": os.environ["KVCACHE_MASTER"]}
    for unit in ["kvcached.service", "kvcache-master.service"]:
        text = open(os.path.join(units, unit)).read()
        # point ExecStart at the binaries built here: verify wants them to exist
        lines = []
        for line in text.splitlines():
            if line.startswith("ExecStart="):
                exe, rest = line[len("ExecStart="):].split(" ", 1)
                line = "ExecStart=%s %s" % (binaries[os.path.basename(exe)], rest)
            lines.append(line)
        path = os.path.join(DIR, unit)
        open(path, "w").write("\n".join(lines) + "\n")
        r = subprocess.run([tool, "verify", path], capture_output=True, text=True)
        # man: pages of Documentation= may not be installed where this runs
        errors = [l for l in (r.stdout + r.stderr).splitlines()
                  if l.strip() and "man:" not in l and "Command 'man " not in l]
        if r.returncode != 0 and errors:
            fail("%s: %s" % (unit, "\n".join(errors)))
        for want in ["Type=notify", "ProtectSystem=strict", "PrivateTmp=true"]:
            if want not in text:
                fail("%s lacks %s" % (unit, want))
    text = open(os.path.join(units, "kvcached.service")).read()
    for want in ["RuntimeDirectory=kvcached", "LimitMEMLOCK=infinity",
                 "EnvironmentFile=-/etc/default/kvcached"]:
        if want not in text:
            fail("kvcached.service lacks " + want)


def main():
    try:
        globals()["case_" + sys.argv[1].replace("-", "_")]()
    finally:
        shutil.rmtree(DIR, ignore_errors=True)
    print("ok: " + sys.argv[1])


if __name__ == "__main__":
    main()
