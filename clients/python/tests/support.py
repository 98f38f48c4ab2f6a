"""What the async tests share: bounded waits (each fails with a message instead of hanging) and
the pieces of a scripted node."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any, Awaitable, Callable, Dict, List


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


class Recorder:
    """The side of a scripted node that reads the client's commands and keeps every one."""

    def __init__(self) -> None:
        self.received: List[Dict[str, Any]] = []

    async def recv(self, ws: Any) -> Dict[str, Any]:
        msg: Dict[str, Any] = json.loads(await ws.recv())
        self.received.append(msg)
        return msg


def connect_reply(cmd: Dict[str, Any], client: str = "c1", ping_interval: int = 25, **extra: Any) -> str:
    """A scripted node's answer to the client's ``connect`` command ``cmd``."""
    return json.dumps({"id": cmd["id"], "connect": {"client": client, "node": "n", "ping_interval": ping_interval, **extra}})
