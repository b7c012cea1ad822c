# SPDX-License-Identifier: MIT
"""Other stores' Python APIs on kvcache (``kvcache.compat.mooncake``)."""
