"""The Herald client: connection state machine, command round trips, reconnect, token refresh, and
routing of pushes to subscriptions. A port of the JS SDK (clients/js/src/client.ts).

States: disconnected -> connecting -> connected, and back to connecting whenever the connection is
lost for a reason that allows a reconnect (close code 4000-4499, network errors, missing pings).
Only ``disconnect()``, a 4500-4999 close or a rejected ``connect`` lead to ``disconnected``.

Everything that reacts to incoming frames runs synchronously, in frame order, in one reader task
per connection: a ``connect`` reply and the publications batched behind it must be applied in
exactly that order, or recovery could deliver out of order. That is why replies go to plain
callbacks, not futures, inside the SDK.

The library never starts or owns an event loop: ``connect()`` uses the running loop, so it works
the same in a script (``asyncio.run``), a notebook (top-level ``await``) or any asyncio app.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import re
import time
from typing import Any, Awaitable, Callable, Dict, List, Optional, Set, Tuple, Union

import websockets
from websockets.asyncio.client import connect as ws_connect

from .backoff import Backoff
from .codec import PONG, ServerMessage, decode_frame, encode_command
from .codes import ClientCode, ErrorCode, UnsubCode, is_temporary_error, should_reconnect, should_resubscribe
from .errors import HeraldConnectionError, HeraldError, HeraldTimeoutError, ReplyError, UsageError
from .events import (
    Connected,
    Connecting,
    Disconnected,
    Emitter,
    ErrorEvent,
    EventStream,
    Join,
    Leave,
    Publication,
    RecoveryFailed,
    Skipped,
    StateChanged,
    StreamPosition,
    Subscribed,
    Unsubscribed,
    as_int,
)
from .subscription import SubTokenGetter, Subscription

log = logging.getLogger("herald")

#: 1 to 255 bytes of [A-Za-z0-9_:.@=/#,-] (docs/protocol.md); all ASCII, so characters = bytes.
CHANNEL_RE = re.compile(r"^[A-Za-z0-9_:.@=/#,\-]{1,255}\Z")

TokenGetter = Callable[[], Union[Optional[str], Awaitable[Optional[str]]]]
ReplyCallback = Callable[[Optional[HeraldError], Any], None]

_WS_CONNECT_PARAMS = set(inspect.signature(ws_connect.__init__).parameters)


class _Conn:
    """One WebSocket connection attempt. Dropped entirely when it ends: a late frame or close from
    an old socket can never touch the current connection's state."""

    def __init__(self) -> None:
        self.ws: Any = None
        self.task: Optional["asyncio.Task[None]"] = None
        self.queue: "asyncio.Queue[Optional[str]]" = asyncio.Queue()
        self.writer: Optional["asyncio.Task[None]"] = None
        self.closed = False

    def send(self, text: str) -> bool:
        if self.ws is None or self.closed:
            return False
        self.queue.put_nowait(text)
        return True

    async def write_loop(self) -> None:
        while True:
            item = await self.queue.get()
            if item is None:
                return
            try:
                await self.ws.send(item)
            except Exception:
                return  # the reader sees the close and reports it

    def abort(self) -> None:
        """Drop the socket at once (no closing handshake: the path may be dead)."""
        self.closed = True
        if self.ws is not None:
            try:
                self.ws.transport.abort()
            except Exception:
                pass
        elif self.task is not None:
            self.task.cancel()
        self.queue.put_nowait(None)

    def close(self, loop: asyncio.AbstractEventLoop, tasks: Set["asyncio.Task[Any]"]) -> None:
        """Close cleanly (code 1000) in the background, bounded by the socket's close_timeout."""
        self.closed = True
        self.queue.put_nowait(None)
        if self.ws is None:
            if self.task is not None:
                self.task.cancel()
            return
        task = loop.create_task(self.ws.close())
        tasks.add(task)
        task.add_done_callback(tasks.discard)


class Client(Emitter):
    """A Herald client.

    :param url: the WebSocket URL, e.g. ``ws://127.0.0.1:8000/ws``.
    :param token: a connection token (JWT).
    :param get_token: called (sync or async) for a token: on the first connect when ``token`` is not
        given, before the token expires (the SDK then sends ``refresh``), and after the server
        closed with 4004 or answered 109. Return ``None`` or ``""`` to refuse: the client stops.
    :param data: sent as ``connect.data`` on every connect (a callable is called per connect).
    :param min_reconnect_delay, max_reconnect_delay: backoff window bounds in seconds (0.5, 20).
    :param timeout: seconds for ``connect`` and every command (10).
    :param ping_grace: seconds past the server's ``ping_interval`` after which a silent connection
        counts as dead (10).
    :param random: a source of randomness in [0, 1) for jitter (tests).
    :param websocket_options: extra keyword arguments for ``websockets.asyncio.client.connect``.
    """

    def __init__(
        self,
        url: str,
        *,
        token: Optional[str] = None,
        get_token: Optional[TokenGetter] = None,
        data: Any = None,
        name: Optional[str] = None,
        version: Optional[str] = None,
        min_reconnect_delay: float = 0.5,
        max_reconnect_delay: float = 20.0,
        timeout: float = 10.0,
        ping_grace: float = 10.0,
        random: Optional[Callable[[], float]] = None,
        websocket_options: Optional[Dict[str, Any]] = None,
    ) -> None:
        super().__init__()
        if not isinstance(url, str) or not url.startswith(("ws://", "wss://")):
            raise UsageError(ErrorCode.BAD_REQUEST, f"url must be a ws:// or wss:// URL, got {url!r}")
        self.url = url
        self._token = token
        self._get_token = get_token
        self._need_token = token is None
        self._data = data
        self._name = name
        self._version = version
        self._timeout = float(timeout)
        self._ping_grace = float(ping_grace)
        self._backoff = Backoff(min_reconnect_delay, max_reconnect_delay, random=random)
        self._ws_options = dict(websocket_options or {})

        self._state = "disconnected"
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._conn: Optional[_Conn] = None
        self._subs: Dict[str, Subscription] = {}
        self._server_subs: Set[str] = set()
        self._server_positions: Dict[str, StreamPosition] = {}
        self._pending: Dict[int, Tuple[ReplyCallback, asyncio.TimerHandle]] = {}
        self._waiters: List[Tuple[Callable[[], None], Callable[[HeraldError], None], asyncio.TimerHandle]] = []
        self._next_id = 1
        self._attempt_seq = 0
        self._disconnect_push: Optional[ServerMessage] = None
        self._client_id: Optional[str] = None
        self._ping_interval = 0.0
        self._last_seen = 0.0
        self._ping_handle: Optional[asyncio.TimerHandle] = None
        self._connect_handle: Optional[asyncio.TimerHandle] = None
        self._reconnect_handle: Optional[asyncio.TimerHandle] = None
        self._refresh_handle: Optional[asyncio.TimerHandle] = None
        self._bg: Set["asyncio.Task[Any]"] = set()

    # ------------------------------------------------------------------------------------------
    # Public API

    @property
    def state(self) -> str:
        """``disconnected``, ``connecting`` or ``connected``."""
        return self._state

    @property
    def client_id(self) -> Optional[str]:
        """The server's id for the current connection, once connected."""
        return self._client_id

    def connect(self) -> None:
        """Start connecting (and keep reconnecting) until :meth:`disconnect`. Idempotent. Must be
        called with an event loop running; returns at once (``await ready()`` to wait)."""
        if self._state != "disconnected":
            return
        self._loop = asyncio.get_running_loop()
        self._backoff.reset()
        self._set_state("connecting")
        self._emit(Connecting(ClientCode.CONNECT_CALLED, "connect called"))
        self._spawn(self._start_attempt())

    def disconnect(self) -> None:
        """Close the connection and stop reconnecting. Subscriptions stay registered: a later
        :meth:`connect` restores and recovers them."""
        if self._state == "disconnected":
            return
        self._stop(ClientCode.DISCONNECT_CALLED, "disconnect called")

    async def close(self) -> None:
        """:meth:`disconnect`, then wait (bounded) until the socket and background tasks are done."""
        self.disconnect()
        tasks = [t for t in self._bg if t is not asyncio.current_task()]
        if tasks:
            await asyncio.wait(tasks, timeout=max(1.0, self._timeout))

    async def ready(self, timeout: Optional[float] = None) -> None:
        """Wait until connected; raises :class:`HeraldConnectionError` if the client stops first
        and :class:`asyncio.TimeoutError` after ``timeout`` seconds."""
        if self._state == "connected":
            return
        if self._state == "disconnected":
            raise HeraldConnectionError(ClientCode.NOT_CONNECTED, "client is disconnected")
        fut: "asyncio.Future[None]" = asyncio.get_running_loop().create_future()

        def on_connected(_: Any) -> None:
            if not fut.done():
                fut.set_result(None)

        def on_disconnected(ev: Disconnected) -> None:
            if not fut.done():
                fut.set_exception(HeraldConnectionError(ev.code, ev.reason))

        off_c = self.on("connected", on_connected)
        off_d = self.on("disconnected", on_disconnected)
        try:
            await asyncio.wait_for(fut, timeout)
        finally:
            off_c()
            off_d()

    async def __aenter__(self) -> "Client":
        self.connect()
        try:
            await self.ready(self._timeout)
        except BaseException:
            await self.close()
            raise
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    def subscribe(
        self,
        channel: str,
        *,
        since: Optional[StreamPosition] = None,
        token: Optional[str] = None,
        get_token: Optional[SubTokenGetter] = None,
        data: Any = None,
        tags_filter: Optional[Dict[str, Any]] = None,
        delta: Optional[str] = None,
        on_publication: Optional[Callable[[Publication], Any]] = None,
    ) -> Subscription:
        """Subscribe to a channel. Returns at once; the subscribe is sent when connected (in the
        ``connect`` command itself when connecting) and restored with recovery after every reconnect.

        :param since: resume from a position stored earlier (``sub.position``).
        :param token: a subscription token; ``get_token(channel)`` fetches one (and fresh ones
            before it expires, sent with ``sub_refresh``).
        :param data: sent with every ``subscribe`` of this channel (for the subscribe proxy).
        :param tags_filter: deliver only publications whose tags match this filter, live and in
            recovery (sent as ``tf``; docs/protocol.md, "Tags and tag filters"), e.g.
            ``{"key": "kind", "cmp": "eq", "val": "a"}``. The namespace must set
            ``allow_tags_filter`` (else the subscribe fails with 108; a malformed filter with 107).
            Offsets then have holes where the filter left publications out, which are no gaps.
        :param delta: ``"fossil"`` asks for delta compression: after the first live publication,
            each one comes as a Fossil delta against the previous one and the SDK rebuilds it
            (docs/protocol.md, "Delta compression"). The namespace must set ``allow_delta`` (else
            the subscribe fails with 108). Recovered publications and history come in full.
        :param on_publication: shorthand for ``sub.on("publication", ...)``.
        """
        if not isinstance(channel, str) or not CHANNEL_RE.match(channel):
            raise UsageError(ErrorCode.BAD_REQUEST, f"invalid channel name: {channel!r}")
        if channel in self._subs:
            raise UsageError(ClientCode.ALREADY_SUBSCRIBED, f"already subscribed to {channel}")
        if since is not None and not isinstance(since, StreamPosition):
            since = StreamPosition(str(since["epoch"]), int(since["offset"]))
        if tags_filter is not None and not isinstance(tags_filter, dict):
            raise UsageError(ErrorCode.BAD_REQUEST, "tags_filter must be a dict (a filter node)")
        if delta is not None and delta != "fossil":
            raise UsageError(ErrorCode.BAD_REQUEST, f'delta must be "fossil" (the only type), not {delta!r}')
        sub = Subscription(
            self,
            channel,
            since=since,
            token=token,
            get_token=get_token,
            data=data,
            tags_filter=tags_filter,
            delta=delta,
        )
        if on_publication is not None:
            sub.on("publication", on_publication)
        self._subs[channel] = sub
        if self._state == "connected":
            self._send_subscribe(sub)
        return sub

    def get_subscription(self, channel: str) -> Optional[Subscription]:
        return self._subs.get(channel)

    def subscriptions(self) -> List[Subscription]:
        return list(self._subs.values())

    async def publish(self, channel: str, data: Any) -> Dict[str, Any]:
        """Publish (where the namespace allows clients to). Returns ``{"epoch", "offset"}``."""
        r: Dict[str, Any] = await self.call("publish", {"channel": channel, "data": data})
        return r

    async def history(
        self, channel: str, *, since: Optional[StreamPosition] = None, limit: Optional[int] = None
    ) -> Dict[str, Any]:
        """A channel's history: ``{"epoch", "offset", "publications"}``."""
        params: Dict[str, Any] = {"channel": channel}
        if since is not None:
            params["since"] = since.to_json() if isinstance(since, StreamPosition) else since
        if limit is not None:
            params["limit"] = limit
        r: Dict[str, Any] = await self.call("history", params)
        return r

    async def presence(self, channel: str) -> Dict[str, Any]:
        """Who is subscribed now: ``{"clients": {client: {"user", "info"?}}}``."""
        r: Dict[str, Any] = await self.call("presence", {"channel": channel})
        return r

    async def rpc(self, method: str, data: Any = None) -> Any:
        """Call the application's backend through the server's RPC proxy; returns its ``data``.
        Raises :class:`ReplyError`: 108 without an RPC proxy, 112 when the backend is unreachable,
        1000-1999 for the backend's own errors."""
        params: Dict[str, Any] = {"method": method}
        if data is not None:
            params["data"] = data
        r = await self.call("rpc", params)
        return r.get("data") if isinstance(r, dict) else None

    async def call(self, method: str, params: Dict[str, Any]) -> Any:
        """Send any command and await its result. Waits while connecting (up to ``timeout``);
        raises at once when disconnected."""
        loop = asyncio.get_running_loop()
        fut: "asyncio.Future[Any]" = loop.create_future()

        def cb(err: Optional[HeraldError], result: Any) -> None:
            if fut.done():
                return
            if err is not None:
                fut.set_exception(err)
            else:
                fut.set_result(result)

        def run() -> None:
            self._request(method, params, cb)

        if self._state == "connected":
            run()
        elif self._state == "connecting":
            waiter: Any = None

            def expire() -> None:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)
                cb(HeraldTimeoutError(f"timed out waiting for a connection to send {method}"), None)

            waiter = (run, lambda e: cb(e, None), loop.call_later(self._timeout, expire))
            self._waiters.append(waiter)
        else:
            raise HeraldConnectionError(ClientCode.NOT_CONNECTED, "client is disconnected; call connect() first")
        return await fut

    def events(self, kinds: Optional[Set[str]] = None) -> EventStream:
        """An async iterator over the client's events (all, or those in ``kinds``). It ends after
        the final ``disconnected`` event."""
        return EventStream(self, kinds, {"disconnected"})

    # ------------------------------------------------------------------------------------------
    # Connection attempts

    def _spawn(self, coro: Any) -> "asyncio.Task[Any]":
        assert self._loop is not None
        task = self._loop.create_task(coro)
        self._bg.add(task)
        task.add_done_callback(self._bg.discard)
        return task

    async def _start_attempt(self) -> None:
        self._clear("_reconnect_handle")
        self._attempt_seq += 1
        attempt = self._attempt_seq
        if self._get_token is not None and (self._need_token or self._token is None):
            try:
                token = self._get_token()
                if inspect.isawaitable(token):
                    token = await token
            except Exception as e:
                if attempt != self._attempt_seq or self._state != "connecting":
                    return
                self._report_error("token", HeraldError(ClientCode.NO_TOKEN, f"get_token failed: {e}"))
                self._schedule_reconnect()
                return
            if attempt != self._attempt_seq or self._state != "connecting":
                return
            if not token:
                self._stop(ClientCode.NO_TOKEN, "get_token returned no token")
                return
            self._token = str(token)
            self._need_token = False

        conn = _Conn()
        conn.task = asyncio.current_task()
        self._conn = conn
        self._disconnect_push = None
        self._connect_handle = self._loop.call_later(  # type: ignore[union-attr]
            self._timeout, self._abort, ClientCode.CONNECT_TIMEOUT, "connect timed out"
        )
        opts: Dict[str, Any] = {
            "open_timeout": self._timeout,
            "ping_interval": None,  # liveness is the protocol's own ping (server `{}` every ping_interval)
            "close_timeout": 2,
            "max_size": 64 * 1024 * 1024,
        }
        if "proxy" in _WS_CONNECT_PARAMS:
            opts["proxy"] = None
        opts.update(self._ws_options)
        try:
            ws = await ws_connect(self.url, **opts)
        except asyncio.CancelledError:
            return  # aborted (timeout) or stopped meanwhile; whoever did it has handled the state
        except Exception as e:
            if self._conn is conn:
                self._conn = None
                log.debug("herald: connection attempt failed: %s", e)
                self._connection_lost(ClientCode.TRANSPORT_CLOSED, f"connection failed: {type(e).__name__}")
            return
        if self._conn is not conn:
            try:
                ws.transport.abort()
            except Exception:
                pass
            return
        conn.ws = ws
        conn.writer = self._spawn(conn.write_loop())
        self._send_connect()
        try:
            async for message in ws:
                if self._conn is not conn:
                    break
                if isinstance(message, (bytes, bytearray, memoryview)):
                    message = bytes(message).decode("utf-8", "replace")
                self._on_frame(message)
        except asyncio.CancelledError:
            raise
        except websockets.ConnectionClosed:
            pass
        except Exception as e:  # pragma: no cover - defensive: a bug must not wedge the client
            log.debug("herald: reader failed: %r", e)
            if self._conn is conn:
                self._abort(ClientCode.TRANSPORT_CLOSED, f"reader failed: {type(e).__name__}")
                return
        conn.queue.put_nowait(None)
        if self._conn is not conn:
            return
        self._conn = None
        code = ws.close_code if ws.close_code is not None else 1006
        reason = ws.close_reason or ""
        self._connection_lost(code, reason)

    def _send_connect(self) -> None:
        subs: Dict[str, Dict[str, Any]] = {}
        included: List[Subscription] = []
        for sub in self._subs.values():
            if sub._sent_alone:
                continue
            since = sub._subscribe_sent()
            subs[sub.channel] = {"since": since.to_json()} if since else {}
            included.append(sub)
        for channel, pos in self._server_positions.items():
            if channel not in subs:
                subs[channel] = {"since": pos.to_json()}
        params: Dict[str, Any] = {}
        if self._token is not None:
            params["token"] = self._token
        if self._name is not None:
            params["name"] = self._name
        if self._version is not None:
            params["version"] = self._version
        data = self._data() if callable(self._data) else self._data
        if data is not None:
            params["data"] = data
        if subs:
            params["subs"] = subs
        self._request("connect", params, lambda err, r: self._on_connect_reply(err, r, included))

    def _on_connect_reply(self, err: Optional[HeraldError], r: Any, included: List[Subscription]) -> None:
        self._clear("_connect_handle")
        for sub in included:
            sub._busy = False
        if err is not None:
            if isinstance(err, ReplyError):
                self._report_error("connect", err)
                if err.code == ErrorCode.TOKEN_EXPIRED and self._get_token is not None:
                    self._need_token = True
                    self._abort(err.code, err.message)
                elif is_temporary_error(err.code):
                    self._abort(err.code, err.message)
                else:
                    self._stop(err.code, err.message)
            elif isinstance(err, HeraldTimeoutError):
                self._abort(ClientCode.CONNECT_TIMEOUT, "connect timed out")
            return
        r = r if isinstance(r, dict) else {}
        self._backoff.reset()
        self._client_id = r.get("client")
        pi = r.get("ping_interval")
        self._ping_interval = float(pi) if isinstance(pi, (int, float)) and pi > 0 else 0.0
        self._last_seen = time.monotonic()
        self._arm_ping_watch()
        exp = r.get("expires_in")
        if isinstance(exp, (int, float)) and exp > 0:
            self._schedule_refresh(float(exp))
        self._set_state("connected")
        self._emit(
            Connected(
                client=str(r.get("client", "")),
                node=str(r.get("node", "")),
                ping_interval=float(pi) if isinstance(pi, (int, float)) else 0.0,
                expires_in=exp,
                data=r.get("data"),
            )
        )
        if self._state != "connected":
            return
        results: Dict[str, Any] = r.get("subs") if isinstance(r.get("subs"), dict) else {}
        requested = {s.channel for s in included}
        for channel in list(self._server_positions):
            res = results.get(channel)
            if not isinstance(res, dict) or "error" in res:
                del self._server_positions[channel]
        for channel, res in results.items():
            if channel in requested or not isinstance(res, dict) or "error" in res:
                continue
            if channel in self._subs:
                continue  # ours, but sent alone: its own subscribe reply follows
            self._server_subs.add(channel)
            epoch = str(res.get("epoch", ""))
            offset = as_int(res.get("offset"))
            held = self._server_positions.get(channel)
            recovered = res.get("recovered")
            if recovered is not True or held is None or held.epoch != epoch:
                self._server_positions[channel] = StreamPosition(epoch, offset)
            if held is not None and recovered is not True:
                self._emit(RecoveryFailed(channel, held, epoch, offset, server_side=True))
            self._emit(
                Subscribed(
                    channel=channel,
                    epoch=epoch,
                    offset=offset,
                    recoverable=res.get("recoverable") is not False,
                    recovered=recovered if isinstance(recovered, bool) else None,
                    resubscribed=held is not None,
                    server_side=True,
                    data=res.get("data"),
                )
            )
            if self._state != "connected":
                return
            if recovered is True:
                for pub in res.get("publications") or []:
                    if isinstance(pub, dict):
                        self._server_publication(channel, pub)
                pos = self._server_positions.get(channel)
                if pos is not None and pos.offset < offset:
                    self._server_positions[channel] = StreamPosition(pos.epoch, offset)
        if self._state != "connected":
            return
        for sub in included:
            if self._subs.get(sub.channel) is not sub or self._state != "connected":
                continue
            res = results.get(sub.channel)
            if not isinstance(res, dict):
                self._send_subscribe(sub)
            elif "error" in res:
                e = res["error"] if isinstance(res["error"], dict) else {}
                self._on_subscribe_error(sub, ReplyError(int(e.get("code", 0)), str(e.get("message", ""))))
            else:
                self._apply_subscribe(sub, res)
        for sub in list(self._subs.values()):
            if self._state != "connected":
                break
            if sub._needs_subscribe:
                self._send_subscribe(sub)
        waiters, self._waiters = self._waiters, []
        for run, _fail, handle in waiters:
            handle.cancel()
            run()

    def _schedule_reconnect(self, after: Optional[float] = None) -> None:
        self._clear("_reconnect_handle")
        delay = self._backoff.next(after)

        def fire() -> None:
            self._reconnect_handle = None
            if self._state == "connecting":
                self._spawn(self._start_attempt())

        self._reconnect_handle = self._loop.call_later(delay, fire)  # type: ignore[union-attr]

    def _abort(self, code: int, reason: str) -> None:
        """We gave up on the current socket ourselves (no ping, timeout, retryable connect error)."""
        conn = self._conn
        if conn is None:
            return
        self._conn = None
        conn.abort()
        self._connection_lost(code, reason)

    def _connection_lost(self, close_code: int, close_reason: str) -> None:
        push = self._disconnect_push
        self._disconnect_push = None
        # The push and the close frame carry the same code; a proxy may have eaten the close frame's
        # code (1006), so the push wins when the close code is not a Herald one.
        is_herald = 4000 <= close_code <= 4999
        code = close_code if is_herald else (push.code if push is not None else close_code)
        reason = (push.reason if push is not None else "") or close_reason or ("" if is_herald else "transport closed")
        self._teardown(code, reason)
        if self._state == "disconnected":
            return
        if code == 4004:
            self._need_token = True
        reconnect = (push.reconnect if push is not None else True) and should_reconnect(code)
        if not reconnect:
            self._stop(code, reason)
            return
        if self._state != "connecting":
            self._set_state("connecting")
            self._emit(Connecting(code, reason))
        after = push.after_ms / 1000.0 if push is not None and push.after_ms is not None else None
        self._schedule_reconnect(after)

    def _stop(self, code: int, reason: str) -> None:
        """Final stop: close everything, fail what waits, emit ``disconnected``."""
        self._attempt_seq += 1
        conn = self._conn
        self._conn = None
        if conn is not None and self._loop is not None:
            conn.close(self._loop, self._bg)
        self._teardown(code, reason)
        self._clear("_reconnect_handle")
        stopped = HeraldConnectionError(ClientCode.NOT_CONNECTED, f"client disconnected: {reason}", code)
        waiters, self._waiters = self._waiters, []
        for _run, fail, handle in waiters:
            handle.cancel()
            fail(stopped)
        for sub in self._subs.values():
            sub._client_stopped(stopped)
        if self._state == "disconnected":
            return
        self._set_state("disconnected")
        self._emit(Disconnected(code, reason))

    def _teardown(self, code: int, reason: str) -> None:
        self._clear("_connect_handle")
        self._clear("_ping_handle")
        self._clear("_refresh_handle")
        self._client_id = None
        self._server_subs.clear()
        pending = list(self._pending.values())
        self._pending.clear()
        for sub in self._subs.values():
            sub._connection_lost()
        for cb, handle in pending:
            handle.cancel()
            cb(HeraldConnectionError(ClientCode.CONNECTION_LOST, f"connection lost: {reason}", code), None)

    # ------------------------------------------------------------------------------------------
    # Incoming frames

    def _on_frame(self, text: str) -> None:
        self._last_seen = time.monotonic()
        conn = self._conn
        for msg in decode_frame(text):
            if self._conn is not conn:
                return  # a message ended this connection; the rest belongs to a dead one
            self._on_message(msg)

    def _on_message(self, msg: ServerMessage) -> None:
        t = msg.type
        if t == "reply":
            p = self._pending.pop(msg.id, None)
            if p is None:
                return  # a late reply to a command that already timed out
            cb, handle = p
            handle.cancel()
            if msg.error is not None:
                cb(ReplyError(msg.error["code"], msg.error["message"]), None)
            else:
                cb(None, msg.result if msg.result is not None else {})
        elif t == "ping":
            if self._conn is not None:
                self._conn.send(PONG)
        elif t == "pub":
            assert msg.pub is not None
            sub = self._subs.get(msg.channel)
            if sub is None:
                if msg.channel in self._server_subs:
                    self._server_publication(msg.channel, msg.pub)
                return
            if sub._apply_publication(msg.pub):
                self._resync(sub, True)
        elif t in ("join", "leave"):
            info = msg.info or {}
            sub = self._subs.get(msg.channel)
            if sub is not None:
                sub._apply_presence(t, info)
            elif msg.channel in self._server_subs:
                self._emit(Join(msg.channel, info) if t == "join" else Leave(msg.channel, info))
        elif t == "skip":
            sub = self._subs.get(msg.channel)
            if sub is not None:
                if sub._apply_skip(msg.skip_from, msg.skip_to):
                    self._resync(sub, True)
                return
            pos = self._server_positions.get(msg.channel)
            if msg.channel not in self._server_subs or (pos is not None and msg.skip_to <= pos.offset):
                return
            if pos is not None:
                # A later reconnect recovers from past the skip, not the publications it left out.
                self._server_positions[msg.channel] = StreamPosition(pos.epoch, msg.skip_to)
            self._emit(Skipped(msg.channel, msg.skip_from, msg.skip_to))
        elif t == "subscribed":
            if msg.channel in self._subs:
                return
            self._server_subs.add(msg.channel)
            r = msg.result or {}
            epoch = str(r.get("epoch", ""))
            offset = as_int(r.get("offset"))
            self._server_positions[msg.channel] = StreamPosition(epoch, offset)
            self._emit(
                Subscribed(
                    channel=msg.channel,
                    epoch=epoch,
                    offset=offset,
                    recoverable=r.get("recoverable") is not False,
                    recovered=None,
                    server_side=True,
                )
            )
        elif t == "unsub":
            sub = self._subs.get(msg.channel)
            if sub is None:
                self._server_positions.pop(msg.channel, None)
                if msg.channel in self._server_subs:
                    self._server_subs.discard(msg.channel)
                    self._emit(Unsubscribed(msg.channel, msg.code, msg.reason))
                return
            if should_resubscribe(msg.code):
                if msg.code == UnsubCode.TOKEN_EXPIRED:
                    sub._invalidate_token()
                self._resync(sub, False)
            else:
                del self._subs[sub.channel]
                sub._end(msg.code, msg.reason)
        elif t == "disconnect":
            self._disconnect_push = msg  # the close frame that follows ends the connection
        elif t == "invalid":
            self._report_error("protocol", HeraldError(ClientCode.BAD_FRAME, f"bad message from server: {msg.reason}"))

    def _server_publication(self, channel: str, pub: Dict[str, Any]) -> None:
        pos = self._server_positions.get(channel)
        off = as_int(pub.get("offset"))
        if pos is not None and off > 0:
            if off <= pos.offset:
                return  # already delivered (recovered, then live again)
            pos = StreamPosition(pos.epoch, off)
            self._server_positions[channel] = pos
        self._emit(
            Publication(
                channel=channel,
                offset=off,
                data=pub.get("data"),
                info=pub.get("info"),
                epoch=pos.epoch if pos is not None else None,
                tags=pub.get("tags"),
            )
        )

    # ------------------------------------------------------------------------------------------
    # Subscriptions

    def _send_subscribe(self, sub: Subscription) -> None:
        if self._state != "connected" or sub._busy or sub.state == "unsubscribed":
            return
        if sub._need_token:
            self._fetch_subscription_token(sub)
            return
        since = sub._subscribe_sent()
        params: Dict[str, Any] = {"channel": sub.channel}
        if since is not None:
            params["since"] = since.to_json()
        if sub._token is not None:
            params["token"] = sub._token
        if sub._data is not None:
            params["data"] = sub._data
        if sub._tags_filter is not None:
            params["tf"] = sub._tags_filter
        if sub._delta is not None:
            params["delta"] = sub._delta

        def on_reply(err: Optional[HeraldError], result: Any) -> None:
            sub._busy = False
            if self._subs.get(sub.channel) is not sub:
                return
            if err is not None:
                self._on_subscribe_error(sub, err)
            else:
                self._apply_subscribe(sub, result if isinstance(result, dict) else {})

        self._request("subscribe", params, on_reply)

    def _apply_subscribe(self, sub: Subscription, result: Dict[str, Any]) -> None:
        exp = result.get("expires_in")
        if isinstance(exp, (int, float)):
            self._schedule_sub_refresh(sub, float(exp))
        if sub._apply_subscribe(result) and self._subs.get(sub.channel) is sub:
            self._resync(sub, True)

    def _fetch_subscription_token(self, sub: Subscription) -> None:
        async def run() -> None:
            try:
                token = await sub._fetch_token_to_subscribe()
            except Exception as e:
                if self._subs.get(sub.channel) is not sub:
                    return
                err = HeraldError(ClientCode.NO_TOKEN, f"get_token failed: {e}")
                sub._report_error(err)
                self._report_error("subscribe", err, sub.channel)
                self._retry_subscribe(sub, lambda: self._send_subscribe(sub))
                return
            if self._subs.get(sub.channel) is not sub:
                return
            if token is None:
                del self._subs[sub.channel]
                sub._end(ClientCode.NO_TOKEN, "get_token returned no token")
                return
            self._send_subscribe(sub)

        sub._busy = True
        self._spawn(run())

    def _schedule_sub_refresh(self, sub: Subscription, expires_in: float) -> None:
        def refresh() -> None:
            if self._subs.get(sub.channel) is not sub or sub.state != "subscribed":
                return

            async def run() -> None:
                try:
                    token = await sub._fetch_token()
                except Exception as e:
                    sub._invalidate_token()
                    self._report_error("refresh", HeraldError(ClientCode.NO_TOKEN, f"get_token failed: {e}"), sub.channel)
                    return
                if not token or self._subs.get(sub.channel) is not sub or sub.state != "subscribed":
                    return

                def on_reply(err: Optional[HeraldError], result: Any) -> None:
                    if err is not None:
                        if not isinstance(err, HeraldConnectionError):
                            self._report_error("refresh", err, sub.channel)
                        sub._invalidate_token()
                        return
                    exp = result.get("expires_in") if isinstance(result, dict) else None
                    if isinstance(exp, (int, float)):
                        self._schedule_sub_refresh(sub, float(exp))

                self._request("sub_refresh", {"channel": sub.channel, "token": token}, on_reply)

            self._spawn(run())

        sub._schedule_token_refresh(expires_in, refresh)

    def _on_subscribe_error(self, sub: Subscription, err: HeraldError) -> None:
        if isinstance(err, HeraldConnectionError):
            return  # the next connect restores it
        if isinstance(err, ReplyError) and err.code == ErrorCode.TOKEN_EXPIRED and sub._invalidate_token():
            self._retry_subscribe(sub, lambda: self._send_subscribe(sub))
            return
        if isinstance(err, HeraldTimeoutError) or (isinstance(err, ReplyError) and err.temporary):
            sub._report_error(err)
            self._report_error("subscribe", err, sub.channel)
            self._retry_subscribe(sub, lambda: self._send_subscribe(sub))
            return
        self._subs.pop(sub.channel, None)
        self._report_error("subscribe", err, sub.channel)
        sub._end(err.code, err.message, err)

    def _resync(self, sub: Subscription, server_subscribed: bool) -> None:
        """Re-establish a channel from the position held (a hole in the offsets, or a resubscribe
        code). If the server still has us subscribed, unsubscribe first."""
        sub._resubscribing()
        if self._state != "connected" or sub._busy:
            return

        def go() -> None:
            if not server_subscribed:
                self._send_subscribe(sub)
                return
            sub._busy = True

            def on_reply(err: Optional[HeraldError], _: Any) -> None:
                sub._busy = False
                if self._subs.get(sub.channel) is not sub or isinstance(err, HeraldConnectionError):
                    return
                self._send_subscribe(sub)

            self._request("unsubscribe", {"channel": sub.channel}, on_reply)

        self._retry_subscribe(sub, go)

    def _retry_subscribe(self, sub: Subscription, fn: Callable[[], None]) -> None:
        def run() -> None:
            if self._subs.get(sub.channel) is sub and self._state == "connected":
                fn()

        sub._retry_later(run)

    def _remove_subscription(self, sub: Subscription, code: int, reason: str) -> None:
        if self._subs.get(sub.channel) is not sub:
            return
        del self._subs[sub.channel]
        server_knows = self._state == "connected" and (sub.state == "subscribed" or sub._busy)
        sub._end(code, reason)
        if server_knows:
            self._request("unsubscribe", {"channel": sub.channel}, lambda e, r: None)

    # ------------------------------------------------------------------------------------------
    # Commands, pings, token refresh

    def _request(self, method: str, params: Dict[str, Any], cb: ReplyCallback) -> None:
        conn = self._conn
        id_ = self._next_id
        self._next_id += 1
        if conn is None or not conn.send(encode_command(id_, method, params)):
            cb(HeraldConnectionError(ClientCode.CONNECTION_LOST, "not connected"), None)
            return

        def expire() -> None:
            p = self._pending.pop(id_, None)
            if p is not None:
                p[0](HeraldTimeoutError(f"no reply to {method} within {self._timeout} s"), None)

        self._pending[id_] = (cb, self._loop.call_later(self._timeout, expire))  # type: ignore[union-attr]

    def _arm_ping_watch(self) -> None:
        """The server pings every ``ping_interval``; anything received counts as a sign of life."""
        self._clear("_ping_handle")
        if self._ping_interval <= 0:
            return
        limit = self._ping_interval + self._ping_grace
        wait = max(0.0, self._last_seen + limit - time.monotonic())

        def check() -> None:
            self._ping_handle = None
            if self._conn is None:
                return
            if time.monotonic() - self._last_seen >= limit:
                self._abort(ClientCode.NO_PING, "no ping from server")
            else:
                self._arm_ping_watch()

        self._ping_handle = self._loop.call_later(wait, check)  # type: ignore[union-attr]

    def _schedule_refresh(self, expires_in: float) -> None:
        self._clear("_refresh_handle")
        if self._get_token is None:
            return  # a fixed token cannot be refreshed; the server will close with 4004
        # Refresh ahead of expiry: 10 s early, or a quarter of the lifetime for short-lived tokens.
        delay = max(0.0, expires_in - min(10.0, expires_in / 4))

        def fire() -> None:
            self._refresh_handle = None
            self._spawn(self._refresh_token())

        self._refresh_handle = self._loop.call_later(delay, fire)  # type: ignore[union-attr]

    async def _refresh_token(self) -> None:
        conn = self._conn
        if self._get_token is None or conn is None:
            return
        try:
            token = self._get_token()
            if inspect.isawaitable(token):
                token = await token
        except Exception as e:
            self._report_error("refresh", HeraldError(ClientCode.NO_TOKEN, f"get_token failed: {e}"))
            if self._conn is conn:
                self._refresh_handle = self._loop.call_later(  # type: ignore[union-attr]
                    2.0, lambda: self._spawn(self._refresh_token())
                )
            return
        if self._conn is not conn or self._state != "connected":
            if token:
                self._token = str(token)
                self._need_token = False
            return
        if not token:
            self._stop(ClientCode.NO_TOKEN, "get_token returned no token")
            return
        self._token = str(token)

        def on_reply(err: Optional[HeraldError], result: Any) -> None:
            if err is not None:
                if isinstance(err, HeraldConnectionError):
                    return
                self._report_error("refresh", err)
                self._need_token = True
                return
            exp = result.get("expires_in") if isinstance(result, dict) else None
            if isinstance(exp, (int, float)) and exp > 0:
                self._schedule_refresh(float(exp))

        self._request("refresh", {"token": self._token}, on_reply)

    # ------------------------------------------------------------------------------------------
    # Small helpers

    def _set_state(self, new: str) -> None:
        old = self._state
        if old == new:
            return
        self._state = new
        self._emit(StateChanged(old, new))

    def _clear(self, name: str) -> None:
        h = getattr(self, name)
        if h is not None:
            h.cancel()
        setattr(self, name, None)

    def _report_error(self, type_: str, error: BaseException, channel: Optional[str] = None) -> None:
        if self.listener_count("error") > 0 or self._streams:
            self._emit(ErrorEvent(type_, error, channel))  # type: ignore[arg-type]
        elif type_ == "listener":
            log.error("herald: a callback raised", exc_info=error)

    def _report_listener_error(self, error: BaseException, channel: Optional[str] = None) -> None:
        self._report_error("listener", error, channel)

    def _listener_error(self, kind: str, error: BaseException) -> None:
        if kind == "error":
            log.error("herald: an error callback raised", exc_info=error)
        else:
            self._report_error("listener", error)
