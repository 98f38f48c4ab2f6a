"""Reconnect delays: exponential backoff with full jitter, bounded above.

Full jitter (a delay uniform in ``[0, min(max, min * factor ** attempt))``) spreads a crowd of
clients that lost the same server at the same moment over the whole window. A server hint
(``after_ms``) is a floor: the server already jittered it, and the client never comes back earlier.
"""

from __future__ import annotations

import random as _random
from typing import Callable, Optional


class Backoff:
    """Delays in seconds. ``min_delay`` is the first window's upper bound, ``max_delay`` the cap."""

    def __init__(
        self,
        min_delay: float = 0.5,
        max_delay: float = 20.0,
        factor: float = 2.0,
        random: Optional[Callable[[], float]] = None,
    ) -> None:
        self.min = max(0.001, float(min_delay))
        self.max = max(self.min, float(max_delay))
        self.factor = max(1.0, float(factor))
        self.random = random or _random.random
        self.attempts = 0

    def window(self) -> float:
        """The upper bound of the window for the current attempt."""
        exp = min(self.attempts, 64)
        return min(self.max, self.min * self.factor**exp)

    def next(self, floor: Optional[float] = None) -> float:
        """The next delay in seconds; ``floor`` (a server ``after_ms``, in seconds) is a minimum."""
        window = self.window()
        self.attempts += 1
        jittered = self.random() * window
        return max(floor if floor is not None and floor > 0 else 0.0, jittered)

    def reset(self) -> None:
        """A connection succeeded: start again from the smallest window."""
        self.attempts = 0
