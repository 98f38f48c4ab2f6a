"""The app's handle on one channel: its state, recovery bookkeeping, retry and token timers, and
events. The client decides when to send subscribe / unsubscribe and reports what happened through
the ``_`` methods, each one named transition. A port of clients/js/src/subscription.ts."""

from __future__ import annotations

import asyncio
import inspect
import json
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Set, Tuple

from .backoff import Backoff
from .codes import ClientCode
from .errors import HeraldError
from .events import (
    Emitter,
    ErrorEvent,
    EventStream,
    Join,
    Leave,
    Publication,
    RecoveryFailed,
    Skipped,
    StreamPosition,
    Subscribed,
    Unsubscribed,
    as_int,
)
from .fossil import DeltaError, apply_delta_text
from .recovery import StreamTracker

if TYPE_CHECKING:
    from .client import Client

SubTokenGetter = Callable[[str], Any]


class Subscription(Emitter):
    """Created by :meth:`herald.Client.subscribe`. Events: ``subscribed``, ``recovery_failed``,
    ``publication``, ``join``, ``leave``, ``unsubscribed``, ``error``."""

    def __init__(
        self,
        client: "Client",
        channel: str,
        since: Optional[StreamPosition] = None,
        token: Optional[str] = None,
        get_token: Optional[SubTokenGetter] = None,
        data: Any = None,
        tags_filter: Optional[Dict[str, Any]] = None,
        delta: Optional[str] = None,
    ) -> None:
        super().__init__()
        self._client = client
        self.channel = channel
        self._state = "subscribing"
        self._tracker = StreamTracker(since, filtered=tags_filter is not None)
        self._tags_filter = tags_filter
        self._delta = delta
        # The last live publication in text form, (offset, text): the base of the next delta.
        self._delta_base: Optional[Tuple[int, str]] = None
        self._sent_since: Optional[StreamPosition] = None
        self._busy = False
        self._backoff = Backoff(0.2, 10.0)
        self._retry_handle: Optional[asyncio.TimerHandle] = None
        self._refresh_handle: Optional[asyncio.TimerHandle] = None
        self._token = token
        self._get_token = get_token
        self._data = data
        self._need_token = token is None and get_token is not None
        self._subscribed_once = False
        self._waiters: List["asyncio.Future[None]"] = []
        self._end_error: Optional[HeraldError] = None

    @property
    def state(self) -> str:
        """``subscribing``, ``subscribed`` or ``unsubscribed``."""
        return self._state

    @property
    def position(self) -> Optional[StreamPosition]:
        """The last position delivered to the app (store it to resume with ``since``)."""
        return self._tracker.position()

    async def ready(self, timeout: Optional[float] = None) -> None:
        """Wait until subscribed; raises if the subscription ends or the client stops first."""
        if self._state == "subscribed":
            return
        if self._state == "unsubscribed":
            raise self._end_error or HeraldError(0, "unsubscribed")
        fut: "asyncio.Future[None]" = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            await asyncio.wait_for(asyncio.shield(fut), timeout)
        finally:
            if fut in self._waiters:
                self._waiters.remove(fut)

    def unsubscribe(self) -> None:
        """Stop receiving publications. The subscription object is finished after this."""
        if self._state == "unsubscribed":
            return
        self._client._remove_subscription(self, ClientCode.UNSUBSCRIBE_CALLED, "unsubscribe called")

    async def publish(self, data: Any) -> Dict[str, Any]:
        return await self._client.publish(self.channel, data)

    async def history(self, since: Optional[StreamPosition] = None, limit: Optional[int] = None) -> Dict[str, Any]:
        return await self._client.history(self.channel, since=since, limit=limit)

    async def presence(self) -> Dict[str, Any]:
        return await self._client.presence(self.channel)

    def events(self, kinds: Optional[Set[str]] = None) -> EventStream:
        """Async iterator over this subscription's events (all, or those in ``kinds``); ends after
        ``unsubscribed``."""
        return EventStream(self, kinds, {"unsubscribed"})

    def publications(self) -> EventStream:
        """Async iterator over :class:`~herald.Publication` events; ends when unsubscribed."""
        return EventStream(self, {"publication"}, {"unsubscribed"})

    # ------------------------------------------------------------------------------------------
    # For the client

    @property
    def _sent_alone(self) -> bool:
        """Subscribed one by one (own token, data, tag filter or delta), never in ``connect.subs``."""
        return (
            self._token is not None
            or self._get_token is not None
            or self._data is not None
            or self._tags_filter is not None
            or self._delta is not None
        )

    @property
    def _needs_subscribe(self) -> bool:
        return self._state == "subscribing" and not self._busy and self._retry_handle is None

    def _subscribe_sent(self) -> Optional[StreamPosition]:
        since = self._tracker.since()
        self._state = "subscribing"
        self._sent_since = since
        self._busy = True
        return since

    def _apply_subscribe(self, result: Dict[str, Any]) -> bool:
        """A subscribe reply arrived. Delivers recovered publications; True when a hole was found."""
        asked = self._sent_since
        self._sent_since = None
        # A new server-side subscription: its first live publication comes in full.
        self._delta_base = None
        outcome = self._tracker.apply_subscribe(result, asked)
        self._state = "subscribed"
        resubscribed = self._subscribed_once
        self._subscribed_once = True
        epoch = str(result.get("epoch", ""))
        offset = as_int(result.get("offset"))
        if outcome.recovery_failed and asked is not None:
            self._emit(RecoveryFailed(self.channel, asked, epoch, offset))
        self._emit(
            Subscribed(
                channel=self.channel,
                epoch=epoch,
                offset=offset,
                recoverable=result.get("recoverable") is not False,
                recovered=outcome.recovered,
                resubscribed=resubscribed,
                server_side=False,
                data=result.get("data"),
            )
        )
        for w in self._waiters:
            if not w.done():
                w.set_result(None)
        for pub in outcome.publications:
            if self._state != "subscribed":
                return False
            self._deliver(pub)
        return outcome.gap

    def _apply_publication(self, pub: Dict[str, Any]) -> bool:
        if self._state != "subscribed":
            return False
        if "delta" in pub:
            whole = self._undelta(pub)
            if whole is None:
                return True  # resync: the subscribe with ``since`` recovers it in full
            pub = whole
        else:
            self._delta_base = None  # a plain one (queued with the reply) is no base
        verdict = self._tracker.apply_publication(pub)
        if verdict == "gap":
            return True
        if verdict == "deliver":
            self._backoff.reset()
            self._deliver(pub)
        return False

    def _apply_skip(self, from_: int, to: int) -> bool:
        """The server left ``from_``..``to`` out (backpressure policy): the position moves past them
        and ``skipped`` says so. True when it revealed a hole before them (resync needed)."""
        if self._state != "subscribed":
            return False
        verdict = self._tracker.apply_skip(from_, to)
        if verdict == "gap":
            return True
        if verdict == "deliver":
            # The publication after a skip comes in full: the base held is no longer the one before it.
            self._delta_base = None
            self._emit(Skipped(self.channel, from_, to))
        return False

    def _apply_presence(self, kind: str, info: Dict[str, Any]) -> None:
        if self._state != "subscribed":
            return
        self._emit(Join(self.channel, info) if kind == "join" else Leave(self.channel, info))

    def _resubscribing(self) -> None:
        if self._state == "subscribed":
            self._state = "subscribing"

    def _connection_lost(self) -> None:
        self._busy = False
        self._cancel_retry()
        if self._state == "subscribed":
            self._state = "subscribing"

    def _invalidate_token(self) -> bool:
        if self._get_token is None:
            return False
        self._need_token = True
        return True

    async def _fetch_token(self) -> Optional[str]:
        if self._get_token is None:
            return None
        token = self._get_token(self.channel)
        if inspect.isawaitable(token):
            token = await token
        if not token:
            return None
        self._token = str(token)
        self._need_token = False
        return self._token

    async def _fetch_token_to_subscribe(self) -> Optional[str]:
        self._busy = True
        try:
            return await self._fetch_token()
        finally:
            self._busy = False

    def _retry_later(self, fn: Callable[[], None]) -> None:
        if self._retry_handle is not None:
            return

        def run() -> None:
            self._retry_handle = None
            fn()

        self._retry_handle = asyncio.get_running_loop().call_later(self._backoff.next(), run)

    def _schedule_token_refresh(self, expires_in: float, refresh: Callable[[], None]) -> None:
        self._cancel_refresh()
        if self._get_token is None:
            return
        delay = max(0.0, expires_in - min(10.0, expires_in / 4))

        def run() -> None:
            self._refresh_handle = None
            refresh()

        self._refresh_handle = asyncio.get_running_loop().call_later(delay, run)

    def _client_stopped(self, error: HeraldError) -> None:
        for w in self._waiters:
            if not w.done():
                w.set_exception(error)

    def _report_error(self, error: HeraldError) -> None:
        self._emit(ErrorEvent("subscribe", error, self.channel))

    def _end(self, code: int, reason: str, error: Optional[HeraldError] = None) -> None:
        if self._state == "unsubscribed":
            return
        self._state = "unsubscribed"
        self._cancel_retry()
        self._cancel_refresh()
        self._end_error = error or HeraldError(code, reason)
        if error is not None:
            self._report_error(error)
        for w in self._waiters:
            if not w.done():
                w.set_exception(self._end_error)
        self._emit(Unsubscribed(self.channel, code, reason))

    def _listener_error(self, kind: str, error: BaseException) -> None:
        self._client._report_listener_error(error, self.channel)

    def _undelta(self, pub: Dict[str, Any]) -> Optional[Dict[str, Any]]:
        """A publication in text form made whole: its data parsed, after applying its delta to the
        base held. None when that cannot be done (no base for it, or the delta does not fit): the
        channel must be resynced, which recovers the publication in full."""
        base = self._delta_base
        self._delta_base = None
        text = pub.get("data")
        if not isinstance(text, str):
            return None
        offset = as_int(pub.get("offset"))
        if pub["delta"]:
            if base is None or base[0] + 1 != offset:
                return None
            try:
                text = apply_delta_text(base[1], text)
            except DeltaError:
                return None
        try:
            data = json.loads(text)
        except ValueError:
            return None
        self._delta_base = (offset, text)
        whole = {k: v for k, v in pub.items() if k != "delta"}
        whole["data"] = data
        return whole

    def _deliver(self, pub: Dict[str, Any]) -> None:
        pos = self._tracker.position()
        self._emit(
            Publication(
                channel=self.channel,
                offset=as_int(pub.get("offset")),
                data=pub.get("data"),
                info=pub.get("info"),
                epoch=pos.epoch if pos else None,
                tags=pub.get("tags"),
            )
        )

    def _cancel_retry(self) -> None:
        if self._retry_handle is not None:
            self._retry_handle.cancel()
        self._retry_handle = None

    def _cancel_refresh(self) -> None:
        if self._refresh_handle is not None:
            self._refresh_handle.cancel()
        self._refresh_handle = None

    def __repr__(self) -> str:
        return f"Subscription(channel={self.channel!r}, state={self._state!r})"
