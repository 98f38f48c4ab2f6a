#!/usr/bin/env python3
"""Conformance adapter for the Python SDK (clients/python, import name ``herald``).

It follows the contract in clients/conformance/README.md: commands as JSON lines on stdin, events as
JSON lines on stdout (logs go to stderr). It only translates: every decision (reconnect, backoff,
recovery, refresh) is the SDK's own.
"""

import asyncio
import json
import os
import sys
import time

import herald

T0 = time.monotonic()


def publication_event(channel, ev):
    e = {"event": "publication", "channel": channel, "offset": ev.offset, "epoch": ev.epoch, "data": ev.data}
    if ev.tags is not None:
        e["tags"] = ev.tags
    return e


def out(event):
    line = json.dumps({"t": int((time.monotonic() - T0) * 1000), **event}, separators=(",", ":"))
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


# Self-test only: break the SDK's backoff on purpose (as the JS adapter's CONFORMANCE_MUTANT).
MUTANT = os.environ.get("CONFORMANCE_MUTANT")
if MUTANT == "ignore-after-ms":
    _next = herald.Backoff.next
    herald.Backoff.next = lambda self, floor=None: _next(self, None)
elif MUTANT == "no-backoff":
    herald.Backoff.next = lambda self, floor=None: 0.0


def error_body(e):
    code = getattr(e, "code", None)
    return {"code": code if isinstance(code, int) else -1, "message": str(e)}


def ms(args, key):
    v = args.get(key)
    return None if v is None else v / 1000.0


class Adapter:
    def __init__(self):
        self.client = None
        self.subs = {}
        self.tokens = []
        self.token_index = 0

    def make_client(self, a):
        self.tokens = a.get("tokens") or []
        opts = {}
        for key, name in (
            ("min_reconnect_delay_ms", "min_reconnect_delay"),
            ("max_reconnect_delay_ms", "max_reconnect_delay"),
            ("timeout_ms", "timeout"),
            ("ping_grace_ms", "ping_grace"),
        ):
            if a.get(key) is not None:
                opts[name] = ms(a, key)
        if a.get("token") is not None:
            opts["token"] = a["token"]
        if self.tokens:

            def get_token():
                i = min(self.token_index, len(self.tokens) - 1)
                self.token_index += 1
                out({"event": "token_requested", "index": i})
                return self.tokens[i]

            opts["get_token"] = get_token
        c = herald.Client(a["url"], **opts)

        def on_connecting(ev):
            # code 0: connect() was called; anything else: the connection was lost and it retries.
            if ev.code != 0:
                out({"event": "disconnected", "code": ev.code, "reconnect": True})

        c.on("connecting", on_connecting)
        c.on("disconnected", lambda ev: out({"event": "disconnected", "code": ev.code, "reconnect": False}))
        c.on("connected", lambda ev: out({"event": "connected", "client": ev.client}))

        def on_error(ev):
            e = {"event": "error", "type": ev.type, "code": error_body(ev.error)["code"]}
            if ev.channel is not None:
                e["channel"] = ev.channel
            out(e)

        c.on("error", on_error)
        # Server-side subscriptions: the client's own events.
        c.on("recovery_failed", lambda ev: out({"event": "recovery_failed", "channel": ev.channel, "since": ev.since.to_json()}))
        c.on(
            "subscribed",
            lambda ev: out(
                {
                    "event": "subscribed",
                    "channel": ev.channel,
                    "server_side": True,
                    "epoch": ev.epoch,
                    "offset": ev.offset,
                    "recovered": ev.recovered is True,
                    "resubscribed": ev.resubscribed,
                }
            ),
        )
        c.on(
            "publication",
            lambda ev: out(publication_event(ev.channel, ev)),
        )
        c.on("unsubscribed", lambda ev: out({"event": "unsubscribed", "channel": ev.channel, "code": ev.code}))
        c.on("join", lambda ev: out({"event": "join", "channel": ev.channel, "user": ev.info.get("user")}))
        c.on("leave", lambda ev: out({"event": "leave", "channel": ev.channel, "user": ev.info.get("user")}))
        return c

    def subscribe(self, a):
        channel = a["channel"]
        since = a.get("since")
        sub = self.client.subscribe(
            channel,
            since=herald.StreamPosition(since["epoch"], since["offset"]) if since else None,
            tags_filter=a.get("tf"),
            delta=a.get("delta"),
        )
        self.subs[channel] = sub
        sub.on(
            "subscribed",
            lambda ev: out(
                {
                    "event": "subscribed",
                    "channel": channel,
                    "server_side": False,
                    "epoch": ev.epoch,
                    "offset": ev.offset,
                    "recovered": ev.recovered is True,
                    "resubscribed": ev.resubscribed,
                }
            ),
        )
        sub.on(
            "publication",
            lambda ev: out(publication_event(channel, ev)),
        )
        sub.on("recovery_failed", lambda ev: out({"event": "recovery_failed", "channel": channel, "since": ev.since.to_json()}))

        def on_unsubscribed(ev):
            self.subs.pop(channel, None)
            out({"event": "unsubscribed", "channel": channel, "code": ev.code})

        sub.on("unsubscribed", on_unsubscribed)
        sub.on("join", lambda ev: out({"event": "join", "channel": channel, "user": ev.info.get("user")}))
        sub.on("leave", lambda ev: out({"event": "leave", "channel": channel, "user": ev.info.get("user")}))
        sub.on("error", lambda ev: out({"event": "error", "type": "subscribe", "channel": channel, "code": error_body(ev.error)["code"]}))

    async def run(self, cmd):
        a = cmd.get("args") or {}
        name = cmd.get("cmd")
        c = self.client
        if name == "connect":
            if c is None:
                self.client = c = self.make_client(a)
            c.connect()
            return {}
        if name == "subscribe":
            self.subscribe(a)
            return {}
        if name == "unsubscribe":
            sub = self.subs.get(a["channel"])
            if sub is not None:
                sub.unsubscribe()
            return {}
        if name == "publish":
            return await c.publish(a["channel"], a.get("data"))
        if name == "history":
            since = a.get("since")
            return await c.history(
                a["channel"], since=herald.StreamPosition(since["epoch"], since["offset"]) if since else None, limit=a.get("limit")
            )
        if name == "presence":
            return await c.presence(a["channel"])
        if name == "rpc":
            return {"data": await c.rpc(a["method"], a.get("data"))}
        if name == "disconnect":
            c.disconnect()
            return {}
        err = herald.HeraldError(-2, f"unknown command {name}")
        raise err

    async def handle(self, cmd):
        try:
            result = await self.run(cmd)
            out({"event": "result", "id": cmd.get("id"), "ok": True, "result": result if result is not None else {}})
        except Exception as e:
            out({"event": "result", "id": cmd.get("id"), "ok": False, "error": error_body(e)})


async def main():
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    adapter = Adapter()
    tasks = set()
    out({"event": "ready", "sdk": "python"})
    while True:
        line = await reader.readline()
        if not line:
            break  # stdin closed
        line = line.strip()
        if not line:
            continue
        try:
            cmd = json.loads(line)
        except ValueError:
            out({"event": "result", "id": None, "ok": False, "error": {"code": -3, "message": "bad JSON"}})
            continue
        if cmd.get("cmd") == "exit":
            if adapter.client is not None:
                await asyncio.wait_for(adapter.client.close(), 2)
            out({"event": "result", "id": cmd.get("id"), "ok": True, "result": {}})
            return
        task = loop.create_task(adapter.handle(cmd))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    if adapter.client is not None:
        await asyncio.wait_for(adapter.client.close(), 2)


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except (asyncio.TimeoutError, KeyboardInterrupt):
        pass
