"""Delta compression (``subscribe(..., delta="fossil")``, docs/protocol.md "Delta compression"): the
Fossil applier on deltas made by the server's Rust crate, a subscription rebuilding live
publications from deltas, the resubscribe with ``since`` that a delta without its base or with a bad
checksum forces (against a scripted WebSocket server), and the real node: deltas on the wire, whole
data for the app, a cut recovered in full, error 108 where the namespace does not allow deltas."""

from __future__ import annotations

import asyncio
import json
from typing import Any, Dict, List, Optional, Tuple

import pytest
from websockets.asyncio.server import serve

import herald
import herald.client
from herald.codec import decode_frame
from herald.fossil import DeltaError, apply_delta, apply_delta_text
from herald.server import HeraldAPI
from herald.subscription import Subscription
from support import Recorder, connect_reply, run, until

BOOK1 = (
    '{"symbol":"HRLD-USD","seq":1,"bids":[{"price":"100.00","size":10},{"price":"99.50","size":20},'
    '{"price":"99.00","size":30}],"note":"é日本"}'
)
BOOK2 = BOOK1.replace('"seq":1', '"seq":2').replace('"size":10', '"size":11')
# fossil_delta::delta(BOOK2, BOOK1) and fossil_delta::delta("[1,2,3]", "short"), as the server makes
# them (the vectors of clients/js/test/unit/fossil.test.ts).
DELTA_1_2 = "2D\nR@0,1:2Z@S,1:11D@10,25Lx3M;"
DELTA_SHORT = "7\n7:[1,2,3]27P8_n;"


# ----------------------------------------------------------------------------------------------
# The applier


def _enc(n: int) -> str:
    """A number in the delta format's base 64."""
    digits = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ_abcdefghijklmnopqrstuvwxyz~"
    out = ""
    while True:
        out = digits[n % 64] + out
        n //= 64
        if n == 0:
            return out


def test_applier_rebuilds_what_the_server_encoded() -> None:
    assert len(BOOK1.encode()) != len(BOOK1), "the vector has multi-byte characters"
    assert apply_delta_text(BOOK1, DELTA_1_2) == BOOK2
    assert apply_delta_text("short", DELTA_SHORT) == "[1,2,3]"
    assert apply_delta(b"short", DELTA_SHORT.encode()) == b"[1,2,3]"


@pytest.mark.parametrize(
    "base, delta",
    [
        (BOOK1.replace("HRLD", "XXXX"), DELTA_1_2),  # another base of the same length: the checksum
        (BOOK1[:40], DELTA_1_2),  # a shorter base: a copy past its end
        (BOOK1, "2D\nR@0,"),  # cut short
        (BOOK1, "zz"),  # no newline after the size
        (BOOK1, "2D\nR?0,"),  # an unknown command
        (BOOK1, "2D\nR@0,1:2Z@S,1:11D@10,25Lx3N;"),  # the checksum off by one
        (BOOK1, "2D\nR@0,1:2Z@S,1:11D@10,"),  # no checksum at the end
        (BOOK1, "3\n3@0,;"),  # a checksum without its number
        ("short", "7\n8:[1,2,3]27P8_n;"),  # an insert past the end of the delta / the output size
        ("short", "6\n7:[1,2,3]27P8_n;"),  # the output larger than announced
        ("", "\n"),  # no size
        ("ab", "2\n1@0,0;"),  # the output shorter than announced
        ("\xff", f"1\n1@0,{_enc(0xC3000000)};"),  # a copy that splits a two-byte character: not UTF-8
    ],
)
def test_applier_refuses_malformed_and_wrong_base_deltas(base: str, delta: str) -> None:
    with pytest.raises(DeltaError):
        apply_delta_text(base, delta)


def test_applier_checksum_covers_a_partial_last_word() -> None:
    # "abcde": one whole word and one byte; made by hand from the format's definition.
    enc = _enc(int.from_bytes(b"abcd", "big") + int.from_bytes(b"e\0\0\0", "big"))
    assert apply_delta_text("abcde", f"5\n5@0,{enc};") == "abcde"
    assert apply_delta_text("xbcde", f"5\n1:a4@1,{enc};") == "abcde"
    with pytest.raises(DeltaError):
        apply_delta_text("abcdf", f"5\n5@0,{enc};")


# ----------------------------------------------------------------------------------------------
# A subscription with delta compression (no client behind it)


class _Host:
    """What the subscription calls on its client in these paths: nothing but listener errors."""

    def _report_listener_error(self, error: BaseException, channel: Optional[str]) -> None:
        raise error


def subscribed() -> Tuple[Subscription, List[Tuple[int, Any]]]:
    sub = Subscription(_Host(), "book", delta="fossil")  # type: ignore[arg-type]
    got: List[Tuple[int, Any]] = []
    sub.on("publication", lambda p: got.append((p.offset, p.data)))
    sub._subscribe_sent()
    sub._apply_subscribe({"epoch": "e", "offset": 4, "recoverable": True, "delta": True})
    return sub, got


def test_delta_subscription_is_sent_alone_and_refuses_other_types() -> None:
    sub = Subscription(_Host(), "book", delta="fossil")  # type: ignore[arg-type]
    assert sub._sent_alone and sub._delta == "fossil"
    assert not Subscription(_Host(), "book")._sent_alone  # type: ignore[arg-type]
    with pytest.raises(herald.UsageError):
        herald.Client("ws://127.0.0.1:1/ws").subscribe("book", delta="xdelta")


def test_subscription_parses_full_text_and_applies_deltas_to_the_text_it_holds() -> None:
    # The codec keeps the flag (and the text) of a publication in text form.
    [msg] = decode_frame(json.dumps({"pub": {"channel": "book", "offset": 5, "data": BOOK1, "delta": False}}))
    assert msg.pub == {"offset": 5, "data": BOOK1, "delta": False}
    sub, got = subscribed()
    assert sub._apply_publication(msg.pub) is False
    assert sub._apply_publication({"offset": 6, "data": DELTA_1_2, "delta": True}) is False
    assert got == [(5, json.loads(BOOK1)), (6, json.loads(BOOK2))]
    assert sub.position == herald.StreamPosition("e", 6)


def test_subscription_keeps_tags_of_a_publication_in_text_form() -> None:
    sub, _ = subscribed()
    pubs: List[Any] = []
    sub.on("publication", pubs.append)
    sub._apply_publication({"offset": 5, "data": BOOK1, "delta": False, "tags": {"k": "v"}})
    assert pubs[0].tags == {"k": "v"} and pubs[0].data == json.loads(BOOK1)


def test_subscription_resyncs_on_a_delta_without_base_or_that_does_not_apply() -> None:
    first, got1 = subscribed()
    assert first._apply_publication({"offset": 5, "data": DELTA_1_2, "delta": True}) is True
    assert got1 == [] and first.position == herald.StreamPosition("e", 4)

    second, got2 = subscribed()
    other = BOOK1.replace("HRLD", "XXXX")
    assert second._apply_publication({"offset": 5, "data": other, "delta": False}) is False
    assert second._apply_publication({"offset": 6, "data": DELTA_1_2, "delta": True}) is True
    assert got2 == [(5, json.loads(other))] and second.position == herald.StreamPosition("e", 5)

    # A plain publication (queued with the reply) leaves no base behind it.
    third, _ = subscribed()
    assert third._apply_publication({"offset": 5, "data": json.loads(BOOK1)}) is False
    assert third._apply_publication({"offset": 6, "data": DELTA_1_2, "delta": True}) is True

    # A base for another offset than the one before the delta's.
    fourth, _ = subscribed()
    fourth._apply_publication({"offset": 5, "data": BOOK1, "delta": False})
    assert fourth._apply_publication({"offset": 7, "data": DELTA_1_2, "delta": True}) is True

    # A new subscribe drops the base: the first live publication after it comes in full.
    fifth, _ = subscribed()
    fifth._apply_publication({"offset": 5, "data": BOOK1, "delta": False})
    fifth._subscribe_sent()
    fifth._apply_subscribe({"epoch": "e", "offset": 5, "recoverable": True, "recovered": True, "publications": []})
    assert fifth._apply_publication({"offset": 6, "data": DELTA_1_2, "delta": True}) is True

    # Text that is no JSON.
    sixth, _ = subscribed()
    assert sixth._apply_publication({"offset": 5, "data": "{not json", "delta": False}) is True


# ----------------------------------------------------------------------------------------------
# The client against a scripted node: a delta it cannot apply makes it resubscribe with since


def _pub(offset: int, data: Any, delta: Optional[bool]) -> str:
    p: Dict[str, Any] = {"channel": "book", "offset": offset, "data": data}
    if delta is not None:
        p["delta"] = delta
    return json.dumps({"pub": p})


@pytest.mark.parametrize("case", ["no base", "bad checksum"])
def test_client_resubscribes_with_since_when_a_delta_does_not_apply(case: str) -> None:
    async def main() -> None:
        recv = Recorder().recv

        async def handler(ws: Any) -> None:
            connect = await recv(ws)
            assert "subs" not in connect["connect"], "a delta subscription is never in connect.subs"
            await ws.send(connect_reply(connect))
            sub = await recv(ws)
            assert sub["subscribe"] == {"channel": "book", "delta": "fossil"}
            await ws.send(json.dumps({"id": sub["id"], "subscribe": {"epoch": "e", "offset": 4, "recoverable": True, "delta": True}}))
            if case == "no base":
                await ws.send(_pub(5, DELTA_1_2, True))  # a delta with nothing before it
            else:
                await ws.send(_pub(5, BOOK1, False))
                await ws.send(_pub(6, DELTA_1_2.replace("3M;", "3N;"), True))  # checksum off by one
            unsub = await recv(ws)
            assert unsub["unsubscribe"] == {"channel": "book"}
            await ws.send(json.dumps({"id": unsub["id"], "unsubscribe": {}}))
            again = await recv(ws)
            since = 4 if case == "no base" else 5
            assert again["subscribe"] == {"channel": "book", "since": {"epoch": "e", "offset": since}, "delta": "fossil"}
            recovered = [{"offset": 5, "data": json.loads(BOOK1)}, {"offset": 6, "data": json.loads(BOOK2)}][since - 4 :]
            await ws.send(
                json.dumps({"id": again["id"], "subscribe": {
                    "epoch": "e", "offset": 6, "recoverable": True, "recovered": True, "delta": True, "publications": recovered,
                }})
            )
            # Live again: the first in full, then a delta against it.
            book3 = BOOK2.replace('"seq":2', '"seq":3')
            await ws.send(_pub(7, BOOK2, False))
            await ws.send(_pub(8, json.loads(book3), None))  # plain: keeps no base
            await ws.wait_closed()

        async with serve(handler, "127.0.0.1", 0) as server:
            port = server.sockets[0].getsockname()[1]
            client = herald.Client(f"ws://127.0.0.1:{port}/ws")
            got: List[Tuple[int, Any]] = []
            subs: List[Any] = []
            sub = client.subscribe("book", delta="fossil", on_publication=lambda p: got.append((p.offset, p.data)))
            sub.on("subscribed", subs.append)
            client.connect()
            await until(lambda: len(got) == 4, "the publications, recovered in full after the resubscribe", 5)
            assert got == [
                (5, json.loads(BOOK1)),
                (6, json.loads(BOOK2)),
                (7, json.loads(BOOK2)),
                (8, json.loads(BOOK2.replace('"seq":2', '"seq":3'))),
            ]
            assert [(s.recovered, s.resubscribed) for s in subs] == [(False, False), (True, True)]
            await client.close()

    run(main())


# ----------------------------------------------------------------------------------------------
# The real node (namespace ``deltas`` sets allow_delta, conftest.py)


def book(seq: int) -> Dict[str, Any]:
    """A ~2 KB order book; each ``seq`` changes a few fields."""

    def level(side: int, i: int) -> Dict[str, Any]:
        return {"price": f"{100 + side * 2 - i // 10}.{(i * 7) % 100:02d}", "size": 1000 + seq if i == seq % 20 else 10 * (i + 1), "orders": i % 7 + 1}

    return {"symbol": "HRLD-USD", "seq": seq, "ts": 1_700_000_000_000 + seq * 250,
            "bids": [level(0, i) for i in range(25)], "asks": [level(1, i) for i in range(25)]}


def count_wire(monkeypatch: pytest.MonkeyPatch) -> Dict[str, int]:
    """Counts the live publications that came as deltas and in full text form (a spy on the client's
    frame decoding that changes nothing), so the test fails if no delta was on the wire."""
    wire = {"deltas": 0, "fulls": 0}

    def spy(text: str) -> Any:
        msgs = decode_frame(text)
        for m in msgs:
            if m.type == "pub" and m.pub is not None and "delta" in m.pub:
                wire["deltas" if m.pub["delta"] else "fulls"] += 1
        return msgs

    monkeypatch.setattr(herald.client, "decode_frame", spy)
    return wire


def test_live_deltas_on_the_wire_whole_data_for_the_app(node: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    api = HeraldAPI(node.http, node.api_key)
    wire = count_wire(monkeypatch)

    async def main() -> None:
        async with herald.Client(node.ws) as client:
            got: List[Any] = []
            sub = client.subscribe("deltas:book1", delta="fossil", on_publication=lambda p: got.append(p.data))
            await sub.ready(5)
            loop = asyncio.get_running_loop()
            for seq in range(1, 21):
                await loop.run_in_executor(None, api.publish, "deltas:book1", book(seq))
            await until(lambda: len(got) == 20, "twenty publications through the SDK")
            assert got == [book(s) for s in range(1, 21)]
            assert wire == {"fulls": 1, "deltas": 19}
            # History is plain.
            hist = await client.history("deltas:book1", limit=2)
            assert [p["data"] for p in hist["publications"]][-1] == book(20)

    run(main())


class CutProxy:
    """A TCP forwarder to the node that can cut its connections and refuse new ones until restored,
    so that the publications made meanwhile are surely missed (and then recovered)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.down = False
        self.writers: List[asyncio.StreamWriter] = []
        self.server: Optional[asyncio.AbstractServer] = None

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        return f"ws://127.0.0.1:{self.server.sockets[0].getsockname()[1]}/ws"

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.down:
            writer.transport.abort()
            return
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.port)
        self.writers += [writer, up_writer]

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except OSError:
                pass
            finally:
                dst.transport.abort()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    def cut(self) -> None:
        self.down = True
        for w in self.writers:
            w.transport.abort()
        self.writers.clear()

    async def stop(self) -> None:
        self.cut()
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()


def test_live_cut_recovers_in_full_then_deltas_resume(node: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    api = HeraldAPI(node.http, node.api_key)
    wire = count_wire(monkeypatch)

    async def main() -> None:
        proxy = CutProxy(node.port)
        client = herald.Client(await proxy.start(), min_reconnect_delay=0.05, max_reconnect_delay=0.2)
        client.connect()
        await client.ready(5)
        got: List[Any] = []
        subs: List[Any] = []
        failed: List[Any] = []
        sub = client.subscribe("deltas:book2", delta="fossil", on_publication=lambda p: got.append(p.data))
        sub.on("subscribed", subs.append)
        sub.on("recovery_failed", failed.append)
        await sub.ready(5)
        loop = asyncio.get_running_loop()
        for seq in range(1, 4):
            await loop.run_in_executor(None, api.publish, "deltas:book2", book(seq))
        await until(lambda: len(got) == 3, "three publications before the cut")
        proxy.cut()
        await until(lambda: client.state != "connected", "the client to notice the cut")
        for seq in range(4, 7):
            await loop.run_in_executor(None, api.publish, "deltas:book2", book(seq))
        proxy.down = False
        await until(lambda: len(got) == 6, "the missed publications recovered")
        for seq in range(7, 10):
            await loop.run_in_executor(None, api.publish, "deltas:book2", book(seq))
        await until(lambda: len(got) == 9, "live publications after the recovery")
        assert got == [book(s) for s in range(1, 10)]
        assert [s.recovered for s in subs] == [False, True] and failed == []
        # Before the cut one full and two deltas; 4-6 recovered plain; then one full and two deltas.
        assert wire == {"fulls": 2, "deltas": 4}
        await client.close()
        await proxy.stop()

    run(main())


def test_live_namespace_without_allow_delta_refuses_with_108(node: Any) -> None:
    async def main() -> None:
        async with herald.Client(node.ws) as client:
            sub = client.subscribe("py-no-delta", delta="fossil")
            ends: List[Any] = []
            sub.on("unsubscribed", ends.append)
            with pytest.raises(herald.ReplyError) as e:
                await sub.ready(5)
            assert e.value.code == herald.ErrorCode.NOT_AVAILABLE == 108
            assert sub.state == "unsubscribed" and [u.code for u in ends] == [108]

    run(main())
