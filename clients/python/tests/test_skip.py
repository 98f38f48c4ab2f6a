"""The ``skip`` push (docs/protocol.md, server pushes): publications the namespace's backpressure
policy left out. The position moves past them without a resubscribe, ``skipped`` says so; a stale
skip is ignored; a skip past the next offset is a hole, recovered with ``since``. Against a scripted
WebSocket server, plus the bookkeeping and the decoding alone."""

from __future__ import annotations

import asyncio
import json
from typing import Any, List, Optional, Tuple

from websockets.asyncio.server import serve

import herald
from herald.codec import decode_frame
from herald.recovery import StreamTracker
from herald.subscription import Subscription
from support import Recorder, connect_reply, run, until


def _pub(offset: int, channel: str = "c") -> str:
    return json.dumps({"pub": {"channel": channel, "offset": offset, "data": {"n": offset}}})


def _skip(from_: int, to: int, channel: str = "c") -> str:
    return json.dumps({"skip": {"channel": channel, "from": from_, "to": to}})


def test_decode_skip() -> None:
    [ok, bad] = decode_frame(_skip(4, 7) + "\n" + json.dumps({"skip": {"channel": "c", "from": 4}}))
    assert (ok.type, ok.channel, ok.skip_from, ok.skip_to) == ("skip", "c", 4, 7)
    assert bad.type == "invalid"


def test_tracker_skip_moves_ignores_stale_and_finds_holes() -> None:
    t = StreamTracker()
    t.apply_subscribe({"epoch": "e", "offset": 3, "recoverable": True}, None)
    assert t.apply_skip(2, 3) == "duplicate" and t.offset == 3
    assert t.apply_skip(4, 7) == "deliver" and t.offset == 7
    assert t.apply_publication({"offset": 8}) == "deliver"
    assert t.apply_skip(10, 12) == "gap" and t.offset == 8


class _Host:
    def _report_listener_error(self, error: BaseException, channel: Optional[str]) -> None:
        raise error


def test_skip_drops_the_delta_base() -> None:
    sub = Subscription(_Host(), "c", delta="fossil")  # type: ignore[arg-type]
    sub._subscribe_sent()
    sub._apply_subscribe({"epoch": "e", "offset": 4, "recoverable": True, "delta": True})
    assert sub._apply_publication({"offset": 5, "data": '{"a":1}', "delta": False}) is False
    assert sub._delta_base is not None
    assert sub._apply_skip(6, 7) is False
    assert sub._delta_base is None, "the publication after a skip comes in full; no delta base may span it"


async def _serve_one(steps: Any) -> Tuple[Any, List[dict]]:
    """A node whose single connection subscribes ``c`` (fresh, epoch e, offset 0), then runs
    ``steps(ws, recv)``; every command the client sends is kept."""
    rec = Recorder()
    recv = rec.recv

    async def handler(ws: Any) -> None:
        connect = await recv(ws)
        await ws.send(connect_reply(connect))
        sub = await recv(ws)
        assert sub["subscribe"] == {"channel": "c"}
        await ws.send(json.dumps({"id": sub["id"], "subscribe": {"epoch": "e", "offset": 0, "recoverable": True}}))
        await steps(ws, recv)
        await ws.wait_closed()

    return handler, rec.received


def _client_run(steps: Any, check: Any) -> None:
    async def main() -> None:
        handler, received = await _serve_one(steps)
        async with serve(handler, "127.0.0.1", 0) as server:
            port = server.sockets[0].getsockname()[1]
            client = herald.Client(f"ws://127.0.0.1:{port}/ws")
            got: List[int] = []
            skipped: List[Any] = []
            sub = client.subscribe("c", on_publication=lambda p: got.append(p.offset))
            sub.on("skipped", skipped.append)
            client.connect()
            await check(client, sub, got, skipped, received)
            await client.close()

    run(main())


def test_skip_moves_the_position_without_a_resubscribe() -> None:
    async def steps(ws: Any, recv: Any) -> None:
        for o in (1, 2, 3):
            await ws.send(_pub(o))
        await ws.send(_skip(4, 7))
        await ws.send(_pub(8))

    async def check(client: Any, sub: Any, got: List[int], skipped: List[Any], received: List[dict]) -> None:
        await until(lambda: 8 in got, "publication 8 after the skip", 5)
        await asyncio.sleep(0.2)  # room for a wrong unsubscribe/resubscribe to show
        assert got == [1, 2, 3, 8]
        assert [(s.kind, s.channel, s.from_, s.to) for s in skipped] == [("skipped", "c", 4, 7)]
        assert [next(k for k in m if k != "id") for m in received] == ["connect", "subscribe"], "no resubscribe"
        assert sub.position == herald.StreamPosition("e", 8)

    _client_run(steps, check)


def test_stale_skip_is_ignored() -> None:
    async def steps(ws: Any, recv: Any) -> None:
        for o in (1, 2, 3):
            await ws.send(_pub(o))
        await ws.send(_skip(2, 3))  # stale: all at or behind the position
        await ws.send(_pub(4))
        await ws.send(_skip(5, 6))  # then a real one, so the stale one is seen to be ignored, not all
        await ws.send(_skip(5, 6))  # the same again: stale now
        await ws.send(_pub(7))

    async def check(client: Any, sub: Any, got: List[int], skipped: List[Any], received: List[dict]) -> None:
        await until(lambda: 7 in got, "publication 7", 5)
        await asyncio.sleep(0.2)
        assert got == [1, 2, 3, 4, 7]
        assert [(s.from_, s.to) for s in skipped] == [(5, 6)], "one skipped event: the stale ones say nothing"
        assert len(received) == 2, "no resubscribe"
        assert sub.position == herald.StreamPosition("e", 7)

    _client_run(steps, check)


def test_skip_past_the_next_offset_is_a_hole_recovered_with_since() -> None:
    async def steps(ws: Any, recv: Any) -> None:
        for o in (1, 2):
            await ws.send(_pub(o))
        await ws.send(_skip(5, 7))  # 3 and 4 never came: a hole before the skip
        unsub = await recv(ws)
        assert unsub["unsubscribe"] == {"channel": "c"}
        await ws.send(json.dumps({"id": unsub["id"], "unsubscribe": {}}))
        again = await recv(ws)
        assert again["subscribe"] == {"channel": "c", "since": {"epoch": "e", "offset": 2}}
        recovered = [{"offset": o, "data": {"n": o}} for o in (3, 4)]
        await ws.send(json.dumps({"id": again["id"], "subscribe": {
            "epoch": "e", "offset": 4, "recoverable": True, "recovered": True, "publications": recovered,
        }}))
        await ws.send(_pub(5))

    async def check(client: Any, sub: Any, got: List[int], skipped: List[Any], received: List[dict]) -> None:
        await until(lambda: 5 in got, "publication 5 after the recovery", 5)
        assert got == [1, 2, 3, 4, 5] and skipped == []
        assert [next(k for k in m if k != "id") for m in received] == ["connect", "subscribe", "unsubscribe", "subscribe"]

    _client_run(steps, check)


def test_server_side_skip_moves_the_position_a_reconnect_recovers_from() -> None:
    async def main() -> None:
        rec = Recorder()
        connects = rec.received

        async def handler(ws: Any) -> None:
            connect = await rec.recv(ws)
            await ws.send(connect_reply(connect))
            if len(connects) == 1:
                await ws.send(json.dumps({"subscribe": {"channel": "s", "epoch": "e", "offset": 2, "recoverable": True}}))
                await ws.send(_pub(3, "s"))
                await ws.send(_skip(1, 3, "s"))  # stale: ignored
                await ws.send(_skip(4, 9, "s"))
                await ws.send(_skip(5, 9, "x"))  # no such subscription: ignored
                await ws.close(3000, "cut")  # the client reconnects
            else:
                await ws.wait_closed()

        async with serve(handler, "127.0.0.1", 0) as server:
            port = server.sockets[0].getsockname()[1]
            client = herald.Client(f"ws://127.0.0.1:{port}/ws", min_reconnect_delay=0.01, max_reconnect_delay=0.05)
            skipped: List[Any] = []
            got: List[int] = []
            client.on("skipped", skipped.append)
            client.on("publication", lambda p: got.append(p.offset))
            client.connect()
            await until(lambda: len(connects) == 2, "the reconnect", 5)
            assert got == [3]
            assert [(s.channel, s.from_, s.to) for s in skipped] == [("s", 4, 9)]
            assert connects[1]["connect"]["subs"] == {"s": {"since": {"epoch": "e", "offset": 9}}}
            await client.close()

    run(main())
