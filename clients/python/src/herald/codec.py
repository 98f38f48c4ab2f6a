"""Encoding commands and decoding server frames (docs/protocol.md, "Messages").

A frame carries one or more messages separated by ``\\n``. A line that is not valid JSON becomes an
``invalid`` message instead of raising, so one bad line cannot hide the good ones batched with it.
Unknown pushes are classified ``unknown`` and ignored: the protocol may add pushes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

PONG = "{}"


@dataclass
class ServerMessage:
    """One message from the server, classified by ``type``: reply, ping, pub, join, leave, unsub,
    skip, disconnect, subscribed (the server's ``subscribe`` push), unknown, invalid."""

    type: str
    id: int = 0
    result: Any = None
    error: Optional[Dict[str, Any]] = None
    channel: str = ""
    pub: Optional[Dict[str, Any]] = None
    info: Optional[Dict[str, Any]] = None
    code: int = 0
    reason: str = ""
    reconnect: bool = True
    after_ms: Optional[int] = None
    #: A ``skip`` push: the offsets ``skip_from`` to ``skip_to`` were left out.
    skip_from: int = 0
    skip_to: int = 0
    raw: Any = None
    extra: Dict[str, Any] = field(default_factory=dict)


def encode_command(id: int, method: str, params: Dict[str, Any]) -> str:
    return json.dumps({"id": id, method: params}, separators=(",", ":"))


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def decode_frame(text: str) -> List[ServerMessage]:
    out: List[ServerMessage] = []
    for raw_line in text.split("\n"):
        line = raw_line.strip()
        if not line:
            continue
        try:
            value = json.loads(line)
        except ValueError as e:
            out.append(ServerMessage("invalid", reason=str(e), raw=line))
            continue
        out.append(classify(value))
    return out


def classify(value: Any) -> ServerMessage:
    if not isinstance(value, dict):
        return ServerMessage("invalid", reason="message is not a JSON object", raw=value)
    if "id" in value:
        id_ = value["id"]
        if not _is_int(id_) or id_ <= 0:
            return ServerMessage("invalid", reason="reply id is not a positive integer", raw=value)
        err = value.get("error")
        if isinstance(err, dict):
            code = err.get("code")
            msg = err.get("message")
            return ServerMessage(
                "reply",
                id=id_,
                error={"code": code if _is_int(code) else 0, "message": msg if isinstance(msg, str) else ""},
            )
        method = next((k for k in value if k != "id"), None)
        return ServerMessage("reply", id=id_, result={} if method is None else value[method])
    if not value:
        return ServerMessage("ping")
    p = value.get("pub")
    if isinstance(p, dict):
        if not isinstance(p.get("channel"), str):
            return ServerMessage("invalid", reason="pub without channel", raw=value)
        pub: Dict[str, Any] = {"offset": p["offset"] if _is_int(p.get("offset")) else 0, "data": p.get("data")}
        if isinstance(p.get("info"), dict):
            pub["info"] = p["info"]
        if isinstance(p.get("tags"), dict):
            pub["tags"] = p["tags"]
        # Delta compression: ``data`` is then text, the publication's JSON (False) or a Fossil delta
        # from the previous one's (True); the subscription makes it whole.
        if isinstance(p.get("delta"), bool):
            pub["delta"] = p["delta"]
        return ServerMessage("pub", channel=p["channel"], pub=pub)
    for kind in ("join", "leave"):
        body = value.get(kind)
        if isinstance(body, dict):
            if not isinstance(body.get("channel"), str):
                return ServerMessage("invalid", reason=f"{kind} without channel", raw=value)
            info = body.get("info") if isinstance(body.get("info"), dict) else {"user": "", "client": ""}
            return ServerMessage(kind, channel=body["channel"], info=info)
    u = value.get("unsub")
    if isinstance(u, dict):
        if not isinstance(u.get("channel"), str):
            return ServerMessage("invalid", reason="unsub without channel", raw=value)
        return ServerMessage(
            "unsub",
            channel=u["channel"],
            code=u["code"] if _is_int(u.get("code")) else 0,
            reason=u["reason"] if isinstance(u.get("reason"), str) else "",
        )
    k = value.get("skip")
    if isinstance(k, dict):
        if not (isinstance(k.get("channel"), str) and _is_int(k.get("from")) and _is_int(k.get("to"))):
            return ServerMessage("invalid", reason="skip without channel, from or to", raw=value)
        return ServerMessage("skip", channel=k["channel"], skip_from=k["from"], skip_to=k["to"])
    b = value.get("subscribe")
    if isinstance(b, dict):
        if not isinstance(b.get("channel"), str):
            return ServerMessage("invalid", reason="subscribe push without channel", raw=value)
        result = {k: v for k, v in b.items() if k != "channel"}
        return ServerMessage("subscribed", channel=b["channel"], result=result)
    d = value.get("disconnect")
    if isinstance(d, dict):
        code = d["code"] if _is_int(d.get("code")) else 0
        reconnect = d["reconnect"] if isinstance(d.get("reconnect"), bool) else not 4500 <= code <= 4999
        after = d.get("after_ms")
        return ServerMessage(
            "disconnect",
            code=code,
            reason=d["reason"] if isinstance(d.get("reason"), str) else "",
            reconnect=reconnect,
            after_ms=after if isinstance(after, int) and not isinstance(after, bool) and after >= 0 else None,
        )
    return ServerMessage("unknown", raw=value)
