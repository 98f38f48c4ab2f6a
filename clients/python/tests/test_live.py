"""Tests against a real herald node (the ``node`` fixture): the README's quick start, the client's
calls and events, minted tokens, and the HTTP API helpers."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Awaitable, Callable, List

import pytest

import herald
from herald.server import AsyncHeraldAPI, HeraldAPI, connection_token, subscription_token

README = Path(__file__).resolve().parents[1] / "README.md"


def run(coro: Awaitable[Any], timeout: float = 20) -> Any:
    """Every async test is bounded: it fails with a TimeoutError instead of hanging."""
    return asyncio.run(asyncio.wait_for(coro, timeout))


async def wait_for(pred: Callable[[], Any], what: str, timeout: float = 5) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0.02)


def test_readme_quick_start_works_as_written(node: Any) -> None:
    text = README.read_text()
    m = re.search(r"## Quick start.*?```python\n(.*?)```", text, re.S)
    assert m, "README has a Quick start python block"
    code = m.group(1)
    assert len(code.strip().splitlines()) <= 5
    assert "127.0.0.1:8000" in code
    code = code.replace("127.0.0.1:8000", f"127.0.0.1:{node.port}")
    api = HeraldAPI(node.http, node.api_key)
    proc = subprocess.Popen([sys.executable, "-u", "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 10
        while api.channels()["channels"].get("news", {}).get("subscribers", 0) < 1:
            assert proc.poll() is None, f"quick start exited: {proc.stderr.read() if proc.stderr else ''}"
            assert time.monotonic() < deadline, "quick start never subscribed to news"
            time.sleep(0.05)
        api.publish("news", {"text": "hello"})
        out, _ = _read_line(proc, 10)
        assert out.strip() == "{'text': 'hello'}"
    finally:
        proc.kill()
        proc.wait(timeout=5)


def _read_line(proc: "subprocess.Popen[str]", timeout: float) -> Any:
    import selectors

    sel = selectors.DefaultSelector()
    assert proc.stdout is not None
    sel.register(proc.stdout, selectors.EVENT_READ)
    if not sel.select(timeout):
        raise AssertionError(f"no output from the quick start within {timeout} s")
    return proc.stdout.readline(), None


def test_subscribe_publish_history_presence_and_errors(node: Any) -> None:
    api = AsyncHeraldAPI(node.http, node.api_key)

    async def main() -> None:
        async with herald.Client(node.ws, min_reconnect_delay=0.05, max_reconnect_delay=0.2) as client:
            assert client.state == "connected" and client.client_id
            sub = client.subscribe("py-room")
            events = sub.events()
            await sub.ready(5)
            for n in (1, 2, 3):
                await api.publish("py-room", {"n": n})
            r = await client.publish("py-room", {"n": 4})
            assert r["offset"] == 4 and r["epoch"]
            got: List[Any] = []
            async for ev in events:
                if ev.kind == "publication":
                    got.append((ev.offset, ev.data))
                    if len(got) == 4:
                        break
            assert got == [(1, {"n": 1}), (2, {"n": 2}), (3, {"n": 3}), (4, {"n": 4})]
            h = await client.history("py-room", limit=2)
            assert [p["data"] for p in h["publications"]] == [{"n": 3}, {"n": 4}]
            p = await client.presence("py-room")
            assert client.client_id in p["clients"]
            with pytest.raises(herald.ReplyError) as e:
                await client.history("bad name!")
            assert e.value.code == herald.ErrorCode.BAD_REQUEST and not e.value.temporary
            with pytest.raises(herald.ReplyError) as e:
                await client.rpc("anything")
            assert e.value.code == herald.ErrorCode.NOT_AVAILABLE
            assert sub.position is not None and sub.position.offset == 4
            sub.unsubscribe()
            assert sub.state == "unsubscribed"
        assert client.state == "disconnected"

    run(main())


def test_minted_connection_token_is_accepted(node: Any) -> None:
    api = HeraldAPI(node.http, node.api_key)

    async def main() -> None:
        token = connection_token(node.secret, "alice", expires_in=60, info={"name": "Alice"})
        async with herald.Client(node.ws, token=token) as client:
            sub = client.subscribe("chat:lobby")  # namespace "chat" needs an authenticated user
            await sub.ready(5)
            clients = (await asyncio.get_running_loop().run_in_executor(None, api.presence, "chat:lobby"))["clients"]
            assert clients[client.client_id]["user"] == "alice"
            r = await client.publish("chat:lobby", "hi")
            assert r["offset"] >= 1

    run(main())


def test_token_with_wrong_secret_or_expired_is_refused(node: Any) -> None:
    async def main(token: str, code: int) -> None:
        client = herald.Client(node.ws, token=token, min_reconnect_delay=0.05)
        stops: List[Any] = []
        client.on("disconnected", stops.append)
        client.connect()
        with pytest.raises(herald.HeraldConnectionError) as e:
            await client.ready(5)
        assert e.value.code == code
        await asyncio.sleep(0.3)
        assert client.state == "disconnected" and [d.code for d in stops] == [code], "one final stop, no retry"
        await client.close()

    run(main(connection_token("wrong-secret", "mallory"), herald.ErrorCode.UNAUTHORIZED))
    run(main(connection_token(node.secret, "late", expires_in=-30), herald.ErrorCode.TOKEN_EXPIRED))


def test_minted_subscription_token_and_channels_claim(node: Any) -> None:
    async def main() -> None:
        token = connection_token(node.secret, "carol", channels=["granted-py"])
        client = herald.Client(node.ws, token=token)
        server_side = client.events({"subscribed"})
        client.connect()
        ev = await server_side.__anext__()
        assert ev.channel == "granted-py" and ev.server_side
        refused = client.subscribe("private:doc")  # namespace "private" needs a subscription token
        with pytest.raises(herald.HeraldError) as e:
            await refused.ready(5)
        assert e.value.code == herald.ErrorCode.PERMISSION_DENIED
        ok = client.subscribe("private:doc2", token=subscription_token(node.secret, "carol", "private:doc2", expires_in=60))
        await ok.ready(5)
        other = client.subscribe("private:doc3", token=subscription_token("wrong", "carol", "private:doc3"))
        with pytest.raises(herald.HeraldError):
            await other.ready(5)
        await client.close()

    run(main())


def test_api_helpers_against_the_server(node: Any) -> None:
    api = HeraldAPI(node.http, node.api_key)
    r1 = api.broadcast(["py-b1", "py-b2"], {"x": 1}, idempotency_key="py-key-1")
    assert r1["published"] == 2 and r1["failed"] == 0
    r2 = api.broadcast(["py-b1", "py-b2"], {"x": 1}, idempotency_key="py-key-1")
    assert [r["offset"] for r in r2["results"]] == [r["offset"] for r in r1["results"]], "the retry published nothing new"
    assert api.history("py-b1")["offset"] == 1
    p = api.publish("py-b1", 2, idempotency_key="py-key-2")
    assert p["offset"] == 2
    assert [x["data"] for x in api.history("py-b1", since={"epoch": p["epoch"], "offset": 1})["publications"]] == [2]
    with pytest.raises(herald.ApiError) as e:
        HeraldAPI(node.http, "not-the-key").publish("py-b1", 1)
    assert e.value.status == 401 and e.value.code == herald.ErrorCode.UNAUTHORIZED
    assert "not-the-key" not in str(e.value)
    with pytest.raises(herald.ApiError) as e:
        api.publish("py-b1", 1, idempotency_key="has space")
    assert e.value.status == 400 and e.value.code == herald.ErrorCode.BAD_REQUEST
    with pytest.raises(herald.ApiError) as e:
        HeraldAPI(f"http://127.0.0.1:{_closed_port()}").info()
    assert e.value.status == 0

    async def main() -> None:
        token = connection_token(node.secret, "dave")
        client = herald.Client(node.ws, token=token, min_reconnect_delay=0.05)
        events: List[Any] = []
        for kind in ("subscribed", "publication", "unsubscribed", "disconnected", "connecting"):
            client.on(kind, events.append)
        client.connect()
        await client.ready(5)
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, api.subscribe, "dave", "py-srv")
        await wait_for(lambda: any(e.kind == "subscribed" for e in events), "the server-side subscribe")
        await loop.run_in_executor(None, api.publish, "py-srv", "one")
        await wait_for(lambda: any(e.kind == "publication" for e in events), "the server-side publication")
        presence = await loop.run_in_executor(None, api.presence, "py-srv")
        assert any(c["user"] == "dave" for c in presence["clients"].values())
        await loop.run_in_executor(None, api.unsubscribe, "dave", "py-srv")
        await wait_for(lambda: any(e.kind == "unsubscribed" for e in events), "the unsub push")
        await loop.run_in_executor(None, lambda: api.disconnect(user="dave"))
        await wait_for(lambda: client.state == "disconnected", "the API disconnect")
        kinds = [(e.kind, getattr(e, "code", None)) for e in events]
        assert ("unsubscribed", 2000) in kinds
        assert kinds[-1] == ("disconnected", herald.CloseCode.DISCONNECTED_BY_API)
        assert not any(k == "connecting" and c != 0 for k, c in kinds), "4502 must not retry"
        await client.close()

    run(main())


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_reconnects_and_recovers_after_the_node_drops_it(node: Any) -> None:
    """A 4000-range close from the server API (code 4003 via disconnect) makes the client reconnect
    and recover what it missed."""
    api = HeraldAPI(node.http, node.api_key)

    async def main() -> None:
        client = herald.Client(node.ws, min_reconnect_delay=0.05, max_reconnect_delay=0.2)
        client.connect()
        await client.ready(5)
        got: List[Any] = []
        sub = client.subscribe("py-recover", on_publication=lambda p: got.append(p.data))
        subscribed: List[Any] = []
        sub.on("subscribed", subscribed.append)
        await sub.ready(5)
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, api.publish, "py-recover", 1)
        await wait_for(lambda: got == [1], "publication 1")
        first = client.client_id
        await loop.run_in_executor(None, lambda: api.disconnect(client=first, code=4003))
        await wait_for(lambda: client.state != "connected" or client.client_id != first, "the drop")
        await loop.run_in_executor(None, api.publish, "py-recover", 2)
        await wait_for(lambda: client.state == "connected" and client.client_id != first, "the reconnect")
        await loop.run_in_executor(None, api.publish, "py-recover", 3)
        await wait_for(lambda: got == [1, 2, 3], "recovered and live publications", 5)
        assert [s.recovered for s in subscribed] == [False, True]
        await client.close()

    run(main())


def test_large_messages_over_a_compressed_connection(node: Any) -> None:
    """The fixture's node has compression on: websockets negotiates permessage-deflate with it,
    and large publications (compressed by the server) arrive intact, both ways."""
    api = HeraldAPI(node.http, node.api_key)
    big = {"text": "herald " * 3000, "n": list(range(500))}

    async def main() -> None:
        async with herald.Client(node.ws) as client:
            sub = client.subscribe("py-big")
            pubs = sub.publications()
            await sub.ready(5)
            await asyncio.get_running_loop().run_in_executor(None, api.publish, "py-big", big)
            await client.publish("py-big", big)
            got = [await pubs.__anext__(), await pubs.__anext__()]
            assert [p.data for p in got] == [big, big] and [p.offset for p in got] == [1, 2]

    run(main())


def test_runs_on_the_callers_loop_cell_by_cell(node: Any) -> None:
    """As in a notebook: the caller owns the loop and runs one step ("cell") at a time; the client
    starts no loop of its own and keeps its state between steps."""
    api = HeraldAPI(node.http, node.api_key)
    loop = asyncio.new_event_loop()
    try:

        async def cell1() -> herald.Client:
            c = herald.Client(node.ws)
            c.connect()
            return c

        client = loop.run_until_complete(asyncio.wait_for(cell1(), 5))
        loop.run_until_complete(asyncio.wait_for(client.ready(), 5))
        got: List[Any] = []

        async def cell3() -> herald.Subscription:
            s = client.subscribe("py-cells", on_publication=lambda p: got.append(p.data))
            await s.ready(5)
            return s

        loop.run_until_complete(asyncio.wait_for(cell3(), 5))
        api.publish("py-cells", "x")

        async def cell4() -> None:
            await wait_for(lambda: got == ["x"], "the publication")

        loop.run_until_complete(asyncio.wait_for(cell4(), 5))
        loop.run_until_complete(asyncio.wait_for(client.close(), 5))
        assert client.state == "disconnected"
    finally:
        loop.close()
