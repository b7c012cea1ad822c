# SPDX-License-Identifier: MIT
"""``mooncake.store`` served by kvcache (see kvcache.compat.mooncake)."""
from kvcache.compat.mooncake import (  # noqa: F401
    BufferDescriptor,
    BufferHandle,
    DiskDescriptor,
    MemoryDescriptor,
    MooncakeDistributedStore,
    MooncakeHostMemAllocator,
    ReplicaDescriptor,
    ReplicaStatus,
    ReplicateConfig,
    SoftPinAction,
)
