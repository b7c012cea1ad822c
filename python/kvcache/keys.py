# SPDX-License-Identifier: MIT
"""The key format shared by every kvcache adapter.

Engines hash a block's tokens (and its parent's hash) but leave out what the
bytes depend on besides: the model, the KV dtype, the memory layout, the
tokens per block and which rank's slice of the heads the block holds.  Two
engines that store the same prefix differently must never read each other's
bytes, so a kvcache key carries all of it::

    kv1@<model>@<kv_dtype>@<layout>@b<block_tokens>@<rank>@<block_hash>

* every field is percent-encoded: ``%`` and ``@``, and any byte outside
  printable ASCII (UTF-8 first), become ``%XX``, so ``@`` only separates;
* ``<rank>`` is ``tp<r>of<n>`` with ``-pp<r>of<n>`` appended when there is
  pipeline parallelism, or ``all`` for KV every tensor-parallel rank holds
  alike (MLA); ``-cp<r>of<n>`` follows when context-parallel ranks hold
  different slices (vLLM's prefill context parallelism, SGLang's attention
  context parallelism), MLA included;
* ``<block_hash>`` is the engine's hash: bytes become lower-case hex, an int
  its hex (``-`` first when negative), a str is taken as it is (escaped).

The whole key is at most 511 bytes (``kvcache.KEY_MAX``); a longer one is a
ValueError, never a truncation.  docs/python.rst lists test vectors.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, List, Union

VERSION = "kv1"
KEY_MAX = 511

BlockHash = Union[bytes, bytearray, memoryview, int, str]

_SAFE = frozenset(range(0x21, 0x7F)) - {ord("%"), ord("@")}


def escape(field: str) -> str:
    """Percent-encode one field so that it never contains '@'."""
    out = []
    for b in field.encode("utf-8"):
        out.append(chr(b) if b in _SAFE else "%%%02X" % b)
    return "".join(out)


def hash_text(h: BlockHash) -> str:
    """The block-hash field for an engine's hash."""
    if isinstance(h, (bytes, bytearray, memoryview)):
        return bytes(h).hex()
    if isinstance(h, bool):
        raise TypeError("a block hash is bytes, int or str, not bool")
    if isinstance(h, int):
        return format(h, "x")
    if isinstance(h, str):
        if not h:
            raise ValueError("an empty block hash")
        return escape(h)
    raise TypeError("a block hash is bytes, int or str, not %s" % type(h).__name__)


@dataclass(frozen=True)
class KeySpec:
    """What a block's bytes depend on besides its tokens.

    ``KeySpec("meta-llama/Llama-3.1-8B", "bfloat16", "vllm-nhd", 16,
    tp_rank=1, tp_size=2).key(block_hash)``
    """

    model: str
    kv_dtype: str
    layout: str
    block_tokens: int
    tp_rank: int = 0
    tp_size: int = 1
    pp_rank: int = 0
    pp_size: int = 1
    shared_across_ranks: bool = False
    cp_rank: int = 0
    cp_size: int = 1

    def __post_init__(self) -> None:
        for name in ("model", "kv_dtype", "layout"):
            if not getattr(self, name):
                raise ValueError("KeySpec.%s is empty" % name)
        if self.block_tokens <= 0:
            raise ValueError("block_tokens must be positive")
        if not (0 <= self.tp_rank < self.tp_size and 0 <= self.pp_rank < self.pp_size
                and 0 <= self.cp_rank < self.cp_size):
            raise ValueError("ranks must lie in [0, size)")

    @property
    def rank(self) -> str:
        if self.shared_across_ranks:
            r = "all"
        else:
            r = "tp%dof%d" % (self.tp_rank, self.tp_size)
            if self.pp_size > 1:
                r += "-pp%dof%d" % (self.pp_rank, self.pp_size)
        if self.cp_size > 1:
            r += "-cp%dof%d" % (self.cp_rank, self.cp_size)
        return r

    def for_rank(self, tp_rank: int, pp_rank: int = 0, cp_rank: int = 0) -> "KeySpec":
        """The same spec as seen by another rank (the scheduler asks for all)."""
        return KeySpec(self.model, self.kv_dtype, self.layout, self.block_tokens, tp_rank,
                       self.tp_size, pp_rank, self.pp_size, self.shared_across_ranks,
                       cp_rank, self.cp_size)

    def ranks(self) -> List["KeySpec"]:
        """Every rank's spec: one per context-parallel rank when the KV is
        shared across the others."""
        if self.shared_across_ranks:
            return [self.for_rank(0, 0, c) for c in range(self.cp_size)]
        return [self.for_rank(t, p, c) for c in range(self.cp_size)
                for p in range(self.pp_size) for t in range(self.tp_size)]

    def prefix(self) -> str:
        """Every key of this spec starts with this (for list and remove_prefix)."""
        return "%s@%s@%s@%s@b%d@%s@" % (VERSION, escape(self.model), escape(self.kv_dtype),
                                        escape(self.layout), self.block_tokens, self.rank)

    def key(self, block_hash: BlockHash) -> str:
        k = self.prefix() + hash_text(block_hash)
        if len(k.encode()) > KEY_MAX:
            raise ValueError("key of %d bytes is longer than %d: %s..." %
                             (len(k.encode()), KEY_MAX, k[:60]))
        return k

    def keys(self, block_hashes: Iterable[BlockHash]) -> List[str]:
        p = self.prefix()
        out = []
        for h in block_hashes:
            k = p + hash_text(h)
            if len(k.encode()) > KEY_MAX:
                raise ValueError("key longer than %d bytes: %s..." % (KEY_MAX, k[:60]))
            out.append(k)
        return out


def parse(key: str) -> dict:
    """Split a key back into its fields (escaped fields are decoded)."""
    parts = key.split("@")
    if len(parts) != 7 or parts[0] != VERSION or not parts[4].startswith("b"):
        raise ValueError("not a %s key: %r" % (VERSION, key))

    def unescape(s: str) -> str:
        raw = bytearray()
        i = 0
        while i < len(s):
            if s[i] == "%":
                raw.append(int(s[i + 1:i + 3], 16))
                i += 3
            else:
                raw += s[i].encode()
                i += 1
        return raw.decode("utf-8")

    return {"model": unescape(parts[1]), "kv_dtype": unescape(parts[2]),
            "layout": unescape(parts[3]), "block_tokens": int(parts[4][1:]),
            "rank": parts[5], "block_hash": unescape(parts[6])}
