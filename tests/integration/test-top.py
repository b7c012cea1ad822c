# SPDX-License-Identifier: MIT
"""kvcachectl top: plain text when stdout is not a terminal, and a live
screen in a real terminal (tmux) that 'q' quits.  One case per run:
test-top.py CASE (exit 77: skipped)."""
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

KVCACHED = os.environ["KVCACHED"]
KVCACHECTL = os.environ["KVCACHECTL"]
WORKLOAD = os.environ["KVCACHE_WORKLOAD"]
DIR = tempfile.mkdtemp(prefix="kvc-top-")
PROCS = []  # stopped whatever happens


def fail(msg):
    raise SystemExit("FAIL: " + msg)


def until(what, fn, timeout=20.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = fn()
        if v:
            return v
        time.sleep(0.1)
    fail("never happened: " + what)


def busy(screen):
    """Some operations per second on the ops/s line."""
    for line in screen.splitlines():
        if line.startswith("ops/s"):
            nums = re.findall(r"(?:put|get|exists|remove|reserve) (\d+)", line)
            return any(int(n) > 0 for n in nums)
    return False


def daemon():
    sock = os.path.join(DIR, "kvcached.sock")
    p = subprocess.Popen([KVCACHED, "--socket", sock, "--dram-size", "256MiB", "--hugepages",
                          "off"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    PROCS.append(p)
    until("kvcached answers", lambda: subprocess.run(
        [KVCACHECTL, "-s", sock, "status"], capture_output=True).returncode == 0)
    return p, sock


class Load:
    """Traffic in the background until stopped (or a minute passes)."""

    def __init__(self, sock):
        self.stop_file = os.path.join(DIR, "stop-load")
        self.p = subprocess.Popen(["sh", "-c", "i=0; while [ ! -f %s ] && [ $i -lt 600 ]; do "
                                   "%s --socket %s --prompts 8 --blocks 8 --block-size 64K "
                                   ">/dev/null || exit 1; i=$((i+1)); done"
                                   % (self.stop_file, WORKLOAD, sock)])
        PROCS.append(self.p)

    def wait(self):
        open(self.stop_file, "w").close()
        if self.p.wait(120) != 0:
            fail("the workload failed")


def case_plain():
    p, sock = daemon()
    w = Load(sock)
    r = subprocess.run([KVCACHECTL, "-s", sock, "top", "-n", "3"], capture_output=True,
                       text=True, timeout=60)
    w.wait()
    if r.returncode != 0:
        fail("top -n 3 exited %d: %s" % (r.returncode, r.stderr))
    out = r.stdout
    if "\033" in out:
        fail("escape codes in plain output")
    blocks = [b for b in out.split("\n\n") if b.strip()]
    if len(blocks) != 3:
        fail("%d refreshes, expected 3:\n%s" % (len(blocks), out))
    for b in blocks:
        for want in ["kvcachectl top: kvcached", "ops/s", "hit ratio", "dram", "slowest"]:
            if want not in b:
                fail("no %r in a refresh:\n%s" % (want, b))
    if not any(busy(b) for b in blocks):
        fail("no operations per second seen while the workload ran:\n" + out)
    for args, code in [(["top", "-n", "0"], 2), (["top", "extra"], 2), (["stats", "-n", "2"], 2)]:
        r = subprocess.run([KVCACHECTL, "-s", sock] + args, capture_output=True)
        if r.returncode != code:
            fail("%s exited %d, expected %d" % (args, r.returncode, code))
    p.send_signal(signal.SIGTERM)
    p.wait(30)


def case_tmux():
    tmux = shutil.which("tmux")
    if not tmux:
        print("tmux is not installed (Debian: tmux); skipping")
        raise SystemExit(77)
    p, sock = daemon()
    env = dict(os.environ, TMUX_TMPDIR=DIR, TERM="xterm")
    session = "kvctop"

    def t(*args, check=True):
        r = subprocess.run([tmux] + list(args), env=env, capture_output=True, text=True)
        if check and r.returncode != 0:
            fail("tmux %s: %s" % (args, r.stderr))
        return r

    done = os.path.join(DIR, "exit-status")
    t("new-session", "-d", "-s", session, "-x", "120", "-y", "30",
      "%s -s %s top; echo $? > %s" % (KVCACHECTL, sock, done))
    w = Load(sock)
    screen = until("top draws a screen with traffic", lambda: (
        lambda s: s if "ops/s" in s and "q quits" in s and busy(s) else None)(
        t("capture-pane", "-p", "-t", session).stdout), 60)
    for want in ["kvcachectl top: kvcached", "hit ratio", "dram", "tier", "slowest"]:
        if want not in screen:
            fail("no %r on the screen:\n%s" % (want, screen))
    if screen.count("kvcachectl top:") != 1:
        fail("the screen is not redrawn in place:\n" + screen)
    t("send-keys", "-t", session, "q")
    until("top quits on q", lambda: os.path.exists(done) and open(done).read().strip(), 60)
    if open(done).read().strip() != "0":
        fail("top exited %s after q" % open(done).read().strip())
    w.wait()
    t("kill-server", check=False)
    p.send_signal(signal.SIGTERM)
    p.wait(30)


def main():
    try:
        globals()["case_" + sys.argv[1]]()
    finally:
        open(os.path.join(DIR, "stop-load"), "w").close()
        if shutil.which("tmux"):
            subprocess.run(["tmux", "kill-server"], env=dict(os.environ, TMUX_TMPDIR=DIR),
                           capture_output=True)
        for p in PROCS:
            if p.poll() is None:
                p.kill()
            p.wait()
        shutil.rmtree(DIR, ignore_errors=True)
    print("ok: " + sys.argv[1])


if __name__ == "__main__":
    main()
