# SPDX-License-Identifier: MIT
"""Opt-in shim: with this directory's parent on PYTHONPATH, code that does
``from mooncake.store import MooncakeDistributedStore`` gets kvcache's
compatible class.  Never install it over a real Mooncake."""
