"""Bounded waits shared by the async tests: each fails with a message instead of hanging."""

from __future__ import annotations

import asyncio
import time
from typing import Any, Awaitable, Callable


def run(coro: Awaitable[Any], timeout: float = 20) -> Any:
    """Run one async test, bounded: it fails with a TimeoutError instead of hanging."""
    return asyncio.run(asyncio.wait_for(coro, timeout))


async def until(pred: Callable[[], Any], what: str, timeout: float = 5) -> None:
    """Poll ``pred`` until it holds, or fail after ``timeout`` seconds naming ``what``."""
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0.01)
