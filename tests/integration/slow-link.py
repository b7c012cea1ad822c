#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""A slow link for the cluster tests: a TCP relay on loopback.

    slow-link.py LISTEN_HOST:PORT TARGET_HOST:PORT RATE READY_FILE [CUT_FILE]

Every connection to LISTEN is relayed to TARGET.  What TARGET sends back
passes at RATE bytes a second in all (one budget shared by every
connection, like one link), in 16 KiB steps; what the clients send passes
at once.  While CUT_FILE exists nothing passes either way (a partition:
what was sent waits, as TCP's retransmissions would, until it heals).
Writes "ready" to READY_FILE once listening.  Runs until killed.
"""
import os
import socket
import sys
import threading
import time

STEP = 16 << 10


class Budget:
    """RATE bytes a second, shared."""

    def __init__(self, rate):
        self.rate = rate
        self.lock = threading.Lock()
        self.next = time.monotonic()

    def take(self, n):
        with self.lock:
            now = time.monotonic()
            start = max(now, self.next)
            self.next = start + n / self.rate
        if start > now:
            time.sleep(start - now)


CUT = None


def pump(src, dst, budget):
    try:
        while True:
            data = src.recv(STEP)
            if not data:
                break
            while CUT and os.path.exists(CUT):
                time.sleep(0.02)
            if budget:
                budget.take(len(data))
            dst.sendall(data)
    except OSError:
        pass
    for s in (src, dst):
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def main():
    global CUT
    if len(sys.argv) > 5:
        CUT = sys.argv[5]
    lhost, lport = sys.argv[1].rsplit(":", 1)
    thost, tport = sys.argv[2].rsplit(":", 1)
    budget = Budget(float(sys.argv[3]))
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((lhost, int(lport)))
    srv.listen(64)
    with open(sys.argv[4], "w") as f:
        f.write("ready\n")
    while True:
        c, _ = srv.accept()
        try:
            u = socket.create_connection((thost, int(tport)))
        except OSError:
            c.close()
            continue
        for s in (c, u):
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.Thread(target=pump, args=(c, u, None), daemon=True).start()
        threading.Thread(target=pump, args=(u, c, budget), daemon=True).start()


if __name__ == "__main__":
    main()
