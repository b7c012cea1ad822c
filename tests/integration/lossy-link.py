#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""A lossy, slow link for the cluster tests: an Ethernet relay between two
interfaces, run inside a namespace of the test's own between two hosts.

    lossy-link.py IF_A IF_B DELAY_MS LOSS_PERCENT READY_FILE [CUT_FILE]

Every frame that arrives on IF_A leaves on IF_B and the other way round,
DELAY_MS later, except LOSS_PERCENT of them (at random, the same seed each
run), which are dropped.  While CUT_FILE exists every frame is dropped (a
partition).  Frames keep the virtio-net header the kernel gives a packet
socket (PACKET_VNET_HDR), so segmentation and checksum offloads pass
through as they came.  Writes "ready" to READY_FILE once both sockets are
bound; runs until killed.  This kernel has no netem: this is the test's
own.
"""
import heapq
import os
import random
import select
import socket
import sys
import time

ETH_P_ALL = 0x0003
SOL_PACKET = 263
PACKET_VNET_HDR = 15
PACKET_OUTGOING = 4


def bind(ifname):
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    s.setsockopt(SOL_PACKET, PACKET_VNET_HDR, 1)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8 << 20)
    s.bind((ifname, 0))
    s.setblocking(False)
    return s


def main():
    if_a, if_b = sys.argv[1], sys.argv[2]
    delay = float(sys.argv[3]) / 1000.0
    loss = float(sys.argv[4]) / 100.0
    ready = sys.argv[5]
    cut = sys.argv[6] if len(sys.argv) > 6 else None
    rng = random.Random(1)
    a, b = bind(if_a), bind(if_b)
    other = {a.fileno(): b, b.fileno(): a}
    queue = []  # (due, seq, out socket, frame)
    seq = 0
    cut_seen, cut_looked = False, 0.0
    with open(ready, "w") as f:
        f.write("ready\n")
    while True:
        now = time.monotonic()
        timeout = max(0.0, queue[0][0] - now) if queue else 0.1
        readable, _, _ = select.select([a, b], [], [], min(timeout, 0.1))
        now = time.monotonic()
        if cut and now - cut_looked > 0.02:
            cut_seen, cut_looked = os.path.exists(cut), now
        for s in readable:
            for _ in range(256):
                try:
                    frame, addr = s.recvfrom(1 << 17)
                except BlockingIOError:
                    break
                if addr[2] == PACKET_OUTGOING:
                    continue  # what this relay itself sent
                if cut_seen or (loss and rng.random() < loss):
                    continue
                seq += 1
                heapq.heappush(queue, (now + delay, seq, other[s.fileno()], frame))
        while queue and queue[0][0] <= time.monotonic():
            _, _, out, frame = heapq.heappop(queue)
            try:
                out.send(frame)
            except OSError:
                pass  # a full queue: as a link drops it


if __name__ == "__main__":
    main()
