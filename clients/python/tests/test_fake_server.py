"""The client against a scripted WebSocket server (a mock of the node, from the ``websockets``
package): ping/pong, dead-connection detection, ``after_ms`` as a reconnect floor, token refresh,
a refused connect and permanent close codes."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any, Awaitable, Callable, List

from websockets.asyncio.server import serve

import herald
from support import Recorder, connect_reply, run, until


class FakeNode(Recorder):
    """Accepts connections; ``script(ws, connect_cmd, n)`` runs each one (n counts from 0)."""

    def __init__(self, script: Callable[[Any, dict, int], Awaitable[None]]) -> None:
        super().__init__()
        self.script = script
        self.accepts: List[float] = []

    async def handler(self, ws: Any) -> None:
        n = len(self.accepts)
        self.accepts.append(time.monotonic())
        first = await self.recv(ws)
        await self.script(ws, first, n)


def test_pong_and_dead_connection_detection() -> None:
    async def main() -> None:
        pongs: List[str] = []

        async def script(ws: Any, cmd: dict, n: int) -> None:
            await ws.send(connect_reply(cmd, client=f"c{n}", ping_interval=1))
            if n == 0:
                await ws.send("{}")
                pongs.append(await ws.recv())
                await ws.wait_closed()  # then silence: no pings, no close
            else:
                await ws.wait_closed()

        node = FakeNode(script)
        async with serve(node.handler, "127.0.0.1", 0) as server:
            port = server.sockets[0].getsockname()[1]
            client = herald.Client(f"ws://127.0.0.1:{port}/ws", ping_grace=0.5, min_reconnect_delay=0.05, max_reconnect_delay=0.1)
            lost: List[Any] = []
            client.on("connecting", lost.append)
            client.connect()
            await client.ready(5)
            await until(lambda: pongs == ["{}"], "the pong")
            t0 = time.monotonic()
            await until(lambda: len(node.accepts) == 2, "a reconnect after the silence", 5)
            assert time.monotonic() - t0 >= 1.0, "not before ping_interval + grace"
            assert [e.code for e in lost] == [0, herald.ClientCode.NO_PING]
            client.disconnect()

    run(main())


def test_after_ms_is_a_floor_and_permanent_close_stops() -> None:
    async def main() -> None:
        async def script(ws: Any, cmd: dict, n: int) -> None:
            await ws.send(connect_reply(cmd, client=f"c{n}"))
            if n == 0:
                await ws.send(json.dumps({"disconnect": {"code": 4000, "reason": "drain", "reconnect": True, "after_ms": 600}}))
                await ws.close(4000, "drain")
            elif n == 1:
                await ws.close(4502, "disconnected by the API")
            else:
                await ws.wait_closed()

        node = FakeNode(script)
        async with serve(node.handler, "127.0.0.1", 0) as server:
            port = server.sockets[0].getsockname()[1]
            client = herald.Client(f"ws://127.0.0.1:{port}/ws", min_reconnect_delay=0.01, max_reconnect_delay=0.02)
            events: List[Any] = []
            for kind in ("connecting", "connected", "disconnected"):
                client.on(kind, events.append)
            client.connect()
            await until(lambda: client.state == "disconnected", "the final stop")
            assert len(node.accepts) == 2
            assert node.accepts[1] - node.accepts[0] >= 0.6, "reconnected before after_ms"
            await asyncio.sleep(0.3)
            assert len(node.accepts) == 2, "no attempt after a 4502"
            kinds = [(e.kind, getattr(e, "code", None)) for e in events]
            assert kinds == [
                ("connecting", 0), ("connected", None), ("connecting", 4000), ("connected", None), ("disconnected", 4502)
            ]

    run(main())


def test_token_refresh_sends_refresh_before_expiry() -> None:
    async def main() -> None:
        tokens = iter(["t1", "t2", "t3"])
        refreshed: List[dict] = []

        async def script(ws: Any, cmd: dict, n: int) -> None:
            assert cmd["connect"]["token"] == "t1"
            await ws.send(connect_reply(cmd, expires_in=2))
            msg = await node.recv(ws)
            refreshed.append(msg)
            await ws.send(json.dumps({"id": msg["id"], "refresh": {"expires_in": 3600}}))
            await ws.wait_closed()

        async def get_token() -> str:
            return next(tokens)

        node = FakeNode(script)
        async with serve(node.handler, "127.0.0.1", 0) as server:
            port = server.sockets[0].getsockname()[1]
            client = herald.Client(f"ws://127.0.0.1:{port}/ws", get_token=get_token)
            client.connect()
            await client.ready(5)
            t0 = time.monotonic()
            await until(lambda: refreshed, "the refresh command", 3)
            assert time.monotonic() - t0 < 2, "refresh must come before the token expires"
            assert refreshed[0]["refresh"] == {"token": "t2"}
            assert len(node.accepts) == 1 and client.state == "connected"
            await client.close()

    run(main())


def test_refused_connect_stops_and_temporary_error_retries() -> None:
    async def main() -> None:
        async def script(ws: Any, cmd: dict, n: int) -> None:
            if n == 0:
                await ws.send(json.dumps({"id": cmd["id"], "error": {"code": 111, "message": "try later"}}))
                await ws.wait_closed()
            else:
                await ws.send(json.dumps({"id": cmd["id"], "error": {"code": 101, "message": "unauthorized"}}))
                await ws.close(4501, "unauthorized")

        node = FakeNode(script)
        async with serve(node.handler, "127.0.0.1", 0) as server:
            port = server.sockets[0].getsockname()[1]
            client = herald.Client(f"ws://127.0.0.1:{port}/ws", min_reconnect_delay=0.01, max_reconnect_delay=0.02)
            stops: List[Any] = []
            client.on("disconnected", stops.append)
            client.connect()
            await until(lambda: stops, "the final stop")
            assert [s.code for s in stops] == [101]
            assert len(node.accepts) == 2
            with_call = asyncio.ensure_future(client.publish("c", 1))
            try:
                await with_call
            except herald.HeraldConnectionError as e:
                assert e.code == herald.ClientCode.NOT_CONNECTED
            else:
                raise AssertionError("publish on a stopped client must fail")

    run(main())
