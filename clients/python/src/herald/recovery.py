"""Recovery bookkeeping for one subscription: the (epoch, offset) handed to the app, and the
decisions that make delivery exactly-once and in order. Pure logic: no timers, no I/O. A port of
clients/js/src/recovery.ts."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from .events import StreamPosition


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


@dataclass
class SubscribeOutcome:
    #: Recovered publications to hand to the app, in offset order, none already delivered.
    publications: List[Dict[str, Any]] = field(default_factory=list)
    #: We asked to recover and the server could not: the app must reload its state.
    recovery_failed: bool = False
    #: The recovered batch ends before the stream's newest offset (should not happen).
    gap: bool = False
    recovered: bool = False


class StreamTracker:
    def __init__(self, since: Optional[StreamPosition] = None, filtered: bool = False) -> None:
        self.epoch: Optional[str] = None
        self.offset = 0
        self.recoverable = False
        # A tag filter: the server leaves out what it does not match, so offsets have holes that
        # are no gaps (continuity is the server's: it sends ``unsub`` 4003 when lost).
        self.filtered = filtered
        if since is not None:
            self.epoch = str(since.epoch)
            self.offset = int(since.offset)
            self.recoverable = True

    def since(self) -> Optional[StreamPosition]:
        """The position to send as ``since`` when (re)subscribing, if the channel can be recovered."""
        if self.epoch is None or not self.recoverable:
            return None
        return StreamPosition(self.epoch, self.offset)

    def position(self) -> Optional[StreamPosition]:
        if self.epoch is None:
            return None
        return StreamPosition(self.epoch, self.offset)

    def apply_subscribe(self, result: Dict[str, Any], asked: Optional[StreamPosition]) -> SubscribeOutcome:
        epoch = str(result.get("epoch", ""))
        newest = result["offset"] if _is_int(result.get("offset")) else 0
        self.recoverable = result.get("recoverable") is not False
        if asked is None:
            self.epoch = epoch
            self.offset = newest
            return SubscribeOutcome()
        # A reply claiming recovery across an epoch change contradicts the protocol: failed.
        recovered = result.get("recovered") is True and epoch == asked.epoch
        if not recovered:
            self.epoch = epoch
            self.offset = newest
            return SubscribeOutcome(recovery_failed=True)
        if self.epoch != epoch:
            self.epoch = epoch
            self.offset = asked.offset
        pubs = sorted(
            (p for p in (result.get("publications") or []) if isinstance(p, dict) and _is_int(p.get("offset"))),
            key=lambda p: p["offset"],
        )
        out: List[Dict[str, Any]] = []
        gap = False
        for p in pubs:
            if p["offset"] <= self.offset:
                continue
            if p["offset"] != self.offset + 1 and not self.filtered:
                gap = True
                break
            out.append(p)
            self.offset = p["offset"]
        # A filtered recovery ends at its last match; the stream's newest is our position after it.
        if self.filtered and newest > self.offset:
            self.offset = newest
        if not gap and newest > self.offset:
            gap = True
        return SubscribeOutcome(publications=out, gap=gap, recovered=True)

    def apply_skip(self, from_: int, to: int) -> str:
        """The server left ``from_``..``to`` out (backpressure): 'deliver' when the position moves
        to ``to``, 'gap' when ``from_`` is past the next offset (a hole before the skip: recover),
        'duplicate' when it is all behind us."""
        if not self.recoverable or self.epoch is None:
            return "deliver"
        if to <= self.offset:
            return "duplicate"
        if from_ > self.offset + 1 and not self.filtered:
            return "gap"
        self.offset = to
        return "deliver"

    def apply_publication(self, pub: Dict[str, Any]) -> str:
        """'deliver', 'duplicate' or 'gap' for one live publication."""
        if not self.recoverable or self.epoch is None:
            return "deliver"
        off = pub.get("offset")
        # No offset (0): kept out of history (``skip_history``), live only; the position stays.
        if not isinstance(off, int) or isinstance(off, bool) or off == 0:
            return "deliver"
        if off <= self.offset:
            return "duplicate"
        if off != self.offset + 1 and not self.filtered:
            return "gap"
        self.offset = off
        return "deliver"
