#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""No call cycle between the files of daemon/ (docs/ARCHITECTURE.rst).

A file "calls" another when it names, followed by "(", a function the
other defines without static.  Calls that go up a layer go through
callbacks a lower file is handed (ops tables, listeners, the links'
callbacks), which this does not see, on purpose: those are the
inversions that keep the files a ladder.  Prints every cycle (its files)
and fails when there is one.
"""
import glob
import os
import re
import sys

root = os.environ.get("MESON_SOURCE_ROOT", os.path.join(os.path.dirname(__file__), ".."))
os.chdir(root)
files = sorted(glob.glob("daemon/**/*.c", recursive=True))
defines = {}
definition = re.compile(r"^(?!static)[a-z][^;\n(]*?\b(\w+)\([^;]*?\)\n\{", re.M)
for f in files:
    for m in definition.finditer(open(f).read()):
        defines.setdefault(m.group(1), f)
calls = {f: set() for f in files}
for f in files:
    src = re.sub(r"/\*.*?\*/", "", open(f).read(), flags=re.S)
    for name in set(re.findall(r"\b(\w+)\(", src)):
        g = defines.get(name)
        if g and g != f:
            calls[f].add(g)

# Tarjan's strongly connected components
index, low, stack, on, cycles, counter = {}, {}, [], set(), [], [0]
sys.setrecursionlimit(10000)


def visit(v):
    index[v] = low[v] = counter[0]
    counter[0] += 1
    stack.append(v)
    on.add(v)
    for w in calls[v]:
        if w not in index:
            visit(w)
            low[v] = min(low[v], low[w])
        elif w in on:
            low[v] = min(low[v], index[w])
    if low[v] == index[v]:
        comp = []
        while True:
            w = stack.pop()
            on.discard(w)
            comp.append(w)
            if w == v:
                break
        if len(comp) > 1:
            cycles.append(sorted(comp))


for v in files:
    if v not in index:
        visit(v)
for c in cycles:
    print("call cycle:", " ".join(c))
if not files:
    print("no daemon sources found")
    sys.exit(1)
print(f"{len(files)} files, {sum(len(c) for c in calls.values())} calls between them, "
      f"{len(cycles)} cycle(s)")
sys.exit(1 if cycles else 0)
