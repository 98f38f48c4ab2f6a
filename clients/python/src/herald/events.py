"""Event payloads and the small emitter behind ``on()`` and the async iterators.

Every event is a dataclass whose ``kind`` names it (``"publication"``, ``"connected"`` ...): the
same name is used with ``on(kind, callback)``, and ``async for event in client.events()`` yields
the same objects.
"""

from __future__ import annotations

import asyncio
import inspect
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable, ClassVar, Dict, List, Optional, Set


def as_int(v: Any) -> int:
    """An integer field of a server message, 0 when absent or not an integer."""
    return v if isinstance(v, int) and not isinstance(v, bool) else 0


@dataclass(frozen=True)
class StreamPosition:
    """Where a subscriber stands in a channel's stream."""

    epoch: str
    offset: int

    def to_json(self) -> Dict[str, Any]:
        return {"epoch": self.epoch, "offset": self.offset}


@dataclass
class StateChanged:
    kind: ClassVar[str] = "state"
    old_state: str
    new_state: str


@dataclass
class Connecting:
    """The client is (re)connecting. ``code`` 0: ``connect()`` was called; otherwise why the last
    connection was lost (a close code, or a :class:`~herald.codes.ClientCode`), and it retries."""

    kind: ClassVar[str] = "connecting"
    code: int
    reason: str


@dataclass
class Connected:
    kind: ClassVar[str] = "connected"
    client: str
    node: str
    ping_interval: float
    expires_in: Optional[float] = None
    data: Any = None


@dataclass
class Disconnected:
    """The client stopped for good and will not reconnect on its own."""

    kind: ClassVar[str] = "disconnected"
    code: int
    reason: str


@dataclass
class Subscribed:
    """A subscribe reply took effect (fresh, after a reconnect, or a resubscribe).

    ``recovered``: missed publications were recovered (they follow as ``publication`` events).
    For server-side subscriptions it is ``None`` when no recovery was asked for.
    """

    kind: ClassVar[str] = "subscribed"
    channel: str
    epoch: str
    offset: int
    recoverable: bool
    recovered: Optional[bool]
    resubscribed: bool = False
    server_side: bool = False
    data: Any = None


@dataclass
class RecoveryFailed:
    """The SDK asked to recover from ``since`` and the server could not (history no longer holds
    it or the stream was recreated): reload the app's state. Emitted just before ``subscribed``."""

    kind: ClassVar[str] = "recovery_failed"
    channel: str
    since: StreamPosition
    epoch: str
    offset: int
    server_side: bool = False


@dataclass
class Publication:
    """A publication, exactly once, in offset order. ``epoch``: the stream's epoch when known.
    ``offset`` is 0 for a publication kept out of history (``skip_history``): live only, it moves
    no position."""

    kind: ClassVar[str] = "publication"
    channel: str
    offset: int
    data: Any
    info: Optional[Dict[str, Any]] = None
    epoch: Optional[str] = None
    #: The publisher's tags, when it set some (docs/protocol.md, "Tags and tag filters").
    tags: Optional[Dict[str, str]] = None


@dataclass
class Skipped:
    """The server left publications ``from_`` to ``to`` of ``channel`` out for this connection, by
    its namespace's ``backpressure`` policy (``conflate`` or ``drop_oldest``): the client read more
    slowly than they came. They are not recovered: the position is now ``to`` and the next
    publication is ``to + 1``. Reload what they would have changed if the app needs it."""

    kind: ClassVar[str] = "skipped"
    channel: str
    from_: int
    to: int


@dataclass
class Join:
    kind: ClassVar[str] = "join"
    channel: str
    info: Dict[str, Any]


@dataclass
class Leave:
    kind: ClassVar[str] = "leave"
    channel: str
    info: Dict[str, Any]


@dataclass
class Unsubscribed:
    """A subscription ended for good (``unsub`` push, a refusal, or ``unsubscribe()``)."""

    kind: ClassVar[str] = "unsubscribed"
    channel: str
    code: int
    reason: str


@dataclass
class ErrorEvent:
    """A non-fatal error. ``type``: transport, connect, token, refresh, subscribe, protocol, listener."""

    kind: ClassVar[str] = "error"
    type: str
    error: Exception
    channel: Optional[str] = None


Listener = Callable[[Any], Any]


class EventStream:
    """An async iterator over events (``async for event in stream``). It ends after an event in
    ``end_kinds`` was yielded, or when :meth:`close` is called."""

    def __init__(self, emitter: "Emitter", kinds: Optional[Set[str]], end_kinds: Set[str]) -> None:
        self._queue: "asyncio.Queue[Any]" = asyncio.Queue()
        self._kinds = kinds
        self._end_kinds = end_kinds
        self._done = False
        self._emitter = emitter
        emitter._streams.append(self)

    def _push(self, event: Any) -> None:
        if self._done:
            return
        if event.kind in self._end_kinds:
            self._done = True
            self._emitter._streams.remove(self)
            if self._kinds is None or event.kind in self._kinds:
                self._queue.put_nowait(event)
            self._queue.put_nowait(_END)
        elif self._kinds is None or event.kind in self._kinds:
            self._queue.put_nowait(event)

    def close(self) -> None:
        if not self._done:
            self._done = True
            self._emitter._streams.remove(self)
            self._queue.put_nowait(_END)

    def __aiter__(self) -> "EventStream":
        return self

    async def __anext__(self) -> Any:
        item = await self._queue.get()
        if item is _END:
            self._queue.put_nowait(_END)
            raise StopAsyncIteration
        return item


_END = object()


class Emitter:
    """Callbacks run synchronously, in the order events happen. A callback that returns an awaitable
    has it scheduled as a task (its order relative to later events is then not guaranteed)."""

    def __init__(self) -> None:
        self._listeners: Dict[str, List[Listener]] = {}
        self._streams: List[EventStream] = []
        self._tasks: Set["asyncio.Task[Any]"] = set()

    def on(self, kind: str, callback: Listener) -> Callable[[], None]:
        """Call ``callback(event)`` for each ``kind`` event; returns a function that removes it."""
        self._listeners.setdefault(kind, []).append(callback)
        return lambda: self.off(kind, callback)

    def off(self, kind: str, callback: Listener) -> None:
        ls = self._listeners.get(kind)
        if ls and callback in ls:
            ls.remove(callback)

    def once(self, kind: str, callback: Listener) -> Callable[[], None]:
        def wrapper(event: Any) -> Any:
            self.off(kind, wrapper)
            return callback(event)

        return self.on(kind, wrapper)

    def listener_count(self, kind: str) -> int:
        return len(self._listeners.get(kind, ()))

    def _emit(self, event: Any) -> None:
        for cb in list(self._listeners.get(event.kind, ())):
            try:
                r = cb(event)
                if inspect.isawaitable(r):
                    task = asyncio.ensure_future(r)
                    self._tasks.add(task)
                    task.add_done_callback(self._task_done)
            except Exception as e:  # a listener's bug must not corrupt the SDK's state
                self._listener_error(event.kind, e)
        for s in list(self._streams):
            s._push(event)

    def _task_done(self, task: "asyncio.Task[Any]") -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self._listener_error("task", task.exception())  # type: ignore[arg-type]

    def _listener_error(self, kind: str, error: BaseException) -> None:  # pragma: no cover - overridden
        raise error
