# SPDX-License-Identifier: MIT
"""kvcache: attach an inference engine to the node's kvcached.

``Client`` is a connection to the daemon (``kvcache._kvcache``, a thin
binding of libkvcache).  Copying calls take and return bytes-like objects;
``acquire`` and ``reserve`` hand out the daemon's own memory as ``View`` and
``Reservation`` objects with the buffer protocol; batch calls answer with
one int per key (``>= 0`` ok, ``-errno`` failure).  ``kvcache.keys`` builds
keys that carry the model, KV dtype, layout and rank; the adapters for
engines live in ``kvcache.vllm``, ``kvcache.lmcache`` and ``kvcache.sglang``,
and ``kvcache.compat.mooncake`` is a drop-in for Mooncake's store class.
"""

from ._kvcache import (  # noqa: F401
    ASYNC_MAX,
    KEY_MAX,
    LOCAL_ONLY,
    OP_EXISTS,
    OP_GET_INTO,
    OP_PUT_FROM,
    PEEK,
    OP_REMOVE,
    TIER_DEFAULT,
    TIER_DEVICE,
    TIER_DISK,
    TIER_DRAM,
    VALUE_MAX,
    Buffer,
    Client,
    Reservation,
    View,
    parse_size,
    socket_path,
    strerror,
)
from .keys import KeySpec  # noqa: F401

__all__ = [
    "Client", "View", "Reservation", "Buffer", "KeySpec", "strerror", "parse_size",
    "socket_path", "TIER_DEFAULT", "TIER_DEVICE", "TIER_DRAM", "TIER_DISK", "OP_GET_INTO",
    "OP_PUT_FROM", "OP_EXISTS", "OP_REMOVE", "KEY_MAX", "VALUE_MAX", "ASYNC_MAX", "LOCAL_ONLY", "PEEK",
]
