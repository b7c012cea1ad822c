# SPDX-License-Identifier: MIT
"""Mooncake's asyncio store: every method of the store, as a coroutine.

``MooncakeDistributedStoreAsync`` is the store with, for each method
``m``, an ``async_m`` that runs ``m`` on the event loop's default executor
and returns its result (``await store.async_get("k")``).  The store's
calls release the GIL while the daemon works, so several run at once.
With the kvcache shim on ``PYTHONPATH``, ``from mooncake.async_store
import MooncakeDistributedStoreAsync`` finds this class.
"""
import asyncio
import functools

from .mooncake import MooncakeDistributedStore


class MooncakeDistributedStoreAsync(MooncakeDistributedStore):
    def __getattr__(self, name: str):
        # only what the class does not have comes here
        if not name.startswith("async_") or len(name) == len("async_"):
            raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")
        sync = getattr(self, name[len("async_"):], None)
        if sync is None or not callable(sync):
            raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")

        async def call(*args, **kwargs):
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(None, functools.partial(sync, *args, **kwargs))

        call.__name__ = name
        return call
