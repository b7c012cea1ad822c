# SPDX-License-Identifier: MIT
"""``mooncake.async_store`` served by kvcache (see
kvcache.compat.async_store)."""
from kvcache.compat.async_store import MooncakeDistributedStoreAsync  # noqa: F401
