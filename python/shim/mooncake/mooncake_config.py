# SPDX-License-Identifier: MIT
"""``mooncake.mooncake_config`` served by kvcache (see
kvcache.compat.mooncake_config)."""
from kvcache.compat.mooncake_config import (  # noqa: F401
    DEFAULT_GLOBAL_SEGMENT_SIZE,
    DEFAULT_LOCAL_BUFFER_SIZE,
    MooncakeConfig,
)
