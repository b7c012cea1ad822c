# SPDX-License-Identifier: MIT
"""``mooncake.store`` served by kvcache (see kvcache.compat.mooncake)."""
from kvcache.compat.mooncake import (  # noqa: F401
    MooncakeDistributedStore,
    MooncakeHostMemAllocator,
    ReplicateConfig,
    SoftPinAction,
)
