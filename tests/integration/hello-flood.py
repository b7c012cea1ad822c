#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Connections that say Hello to a node's peer port, from one address.

    hello-flood.py PORT SOURCE N
    hello-flood.py unix SOCKET N

Makes N connections to 127.0.0.1:PORT from SOURCE (a loopback address), each
sending a well-formed Hello (major 1, minor 2, a node id, the node role) at
once, in steps the listen backlog takes (or N connections to a daemon's
Unix socket that say nothing), holds them half a second, and prints "MADE
OPEN": how many were made and how many the other side kept open.
"""
import resource
import socket
import sys
import time

soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 8192), hard))
unix = sys.argv[1] == "unix"
n = int(sys.argv[3])
body = b"\x08\x01\x10\x02\x22\x05flood\x30\x01"
hello = (b"\x4b\x50\x01\x01" + len(body).to_bytes(4, "little") + (1).to_bytes(4, "little") +
         bytes(4) + body)
conns = []
for i in range(n):
    try:
        if unix:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(2)
            s.connect(sys.argv[2])
        else:
            s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=2,
                                         source_address=(sys.argv[2], 0))
            s.sendall(hello)
        conns.append(s)
    except OSError:
        pass
    if i % 50 == 49:
        time.sleep(0.05)
time.sleep(0.5)
alive = 0
for s in conns:
    s.setblocking(False)
    try:
        alive += s.recv(4096) != b""
    except BlockingIOError:
        alive += 1
    except OSError:
        pass
print(len(conns), alive)
