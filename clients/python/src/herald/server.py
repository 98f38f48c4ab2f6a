"""Server-side helpers: the Herald HTTP API and token minting (docs/protocol.md, "Server HTTP API"
and "Tokens"). Standard library only.

``HeraldAPI`` is synchronous (``urllib``); ``AsyncHeraldAPI`` runs the same calls in a worker
thread, for asyncio apps. Tokens are HS256 JWTs signed with the server's ``token_hmac_secret``.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import hashlib
import hmac
import json
import time
import urllib.error
import urllib.request
from typing import Any, Dict, Optional, Sequence

from .errors import ApiError

__all__ = [
    "AsyncHeraldAPI",
    "HeraldAPI",
    "connection_token",
    "subscription_token",
    "encode_jwt",
]


def _b64url(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def encode_jwt(claims: Dict[str, Any], secret: str) -> str:
    """An HS256 JWT with these claims (``{"alg": "HS256", "typ": "JWT"}`` header)."""
    if not isinstance(secret, (str, bytes)) or not secret:
        raise ValueError("a non-empty HMAC secret is required to sign a token")
    key = secret.encode("utf-8") if isinstance(secret, str) else secret
    head = _b64url(json.dumps({"alg": "HS256", "typ": "JWT"}, separators=(",", ":")).encode())
    body = _b64url(json.dumps(claims, separators=(",", ":")).encode())
    sig = hmac.new(key, f"{head}.{body}".encode("ascii"), hashlib.sha256).digest()
    return f"{head}.{body}.{_b64url(sig)}"


def _common(
    claims: Dict[str, Any],
    expires_in: Optional[float],
    audience: Optional[str],
    issuer: Optional[str],
) -> None:
    if expires_in is not None:
        claims["exp"] = int(time.time() + expires_in)
    if audience is not None:
        claims["aud"] = audience
    if issuer is not None:
        claims["iss"] = issuer


def connection_token(
    secret: str,
    user: str = "",
    *,
    expires_in: Optional[float] = None,
    channels: Optional[Sequence[str]] = None,
    info: Optional[Dict[str, Any]] = None,
    audience: Optional[str] = None,
    issuer: Optional[str] = None,
) -> str:
    """A connection token: ``sub`` (the user, ``""`` anonymous), ``exp`` (``expires_in`` seconds
    from now; none: it never expires), ``channels`` (subscribed by the server at connect), ``info``
    (shown in presence and publications), and ``aud``/``iss`` when the server requires them."""
    if not isinstance(user, str):
        raise TypeError("user must be a string")
    claims: Dict[str, Any] = {"sub": user}
    if channels is not None:
        if isinstance(channels, str):
            raise TypeError("channels must be a list of channel names, not a string")
        claims["channels"] = list(channels)
    if info is not None:
        claims["info"] = info
    _common(claims, expires_in, audience, issuer)
    return encode_jwt(claims, secret)


def subscription_token(
    secret: str,
    user: str,
    channel: str,
    *,
    expires_in: Optional[float] = None,
    audience: Optional[str] = None,
    issuer: Optional[str] = None,
) -> str:
    """A subscription token for one channel: ``sub``, ``channel``, ``exp``."""
    if not isinstance(channel, str) or not channel:
        raise ValueError("channel must be a non-empty string")
    claims: Dict[str, Any] = {"sub": user, "channel": channel}
    _common(claims, expires_in, audience, issuer)
    return encode_jwt(claims, secret)


class HeraldAPI:
    """The server HTTP API (``POST /api/...``, ``Authorization: Bearer <api_key>``).

    :param base_url: the node's HTTP base URL, e.g. ``http://127.0.0.1:8000``.
    :param api_key: the API key (``None``: no header; a ``--dev`` node without a key accepts that).
    :param timeout: seconds per request.

    Errors raise :class:`herald.ApiError` with the protocol's ``code`` and the HTTP ``status``
    (network failures: ``code`` 0, ``status`` 0). The API key never appears in an error.
    """

    def __init__(self, base_url: str, api_key: Optional[str] = None, *, timeout: float = 10.0) -> None:
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must be an http:// or https:// URL, got {base_url!r}")
        self.base_url = base_url.rstrip("/")
        self._api_key = api_key
        self.timeout = timeout

    def __repr__(self) -> str:
        return f"HeraldAPI({self.base_url!r})"

    def request(self, method: str, path: str, body: Optional[Dict[str, Any]] = None) -> Any:
        """Any API call; returns the decoded JSON answer."""
        data = None if body is None else json.dumps(body).encode("utf-8")
        req = urllib.request.Request(self.base_url + path, data=data, method=method)
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        if self._api_key:
            req.add_header("Authorization", f"Bearer {self._api_key}")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as e:
            raw = e.read()
            code, message = 0, f"HTTP {e.code}"
            try:
                err = json.loads(raw)["error"]
                code, message = int(err.get("code", 0)), str(err.get("message", message))
            except Exception:
                pass
            raise ApiError(code, f"{method} {path}: {message}", e.code) from None
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", e)
            raise ApiError(0, f"{method} {path}: {reason}", 0) from None
        if not raw:
            return {}
        try:
            return json.loads(raw)
        except ValueError:
            raise ApiError(0, f"{method} {path}: the answer is not JSON", 200) from None

    @staticmethod
    def _object(answer: Any) -> Dict[str, Any]:
        if not isinstance(answer, dict):
            raise ApiError(0, "the answer is not a JSON object", 200)
        return answer

    def publish(self, channel: str, data: Any, *, idempotency_key: Optional[str] = None) -> Dict[str, Any]:
        """Publish to a channel: ``{"epoch", "offset"}``."""
        body: Dict[str, Any] = {"channel": channel, "data": data}
        if idempotency_key is not None:
            body["idempotency_key"] = idempotency_key
        return self._object(self.request("POST", "/api/publish", body))

    def broadcast(
        self, channels: Sequence[str], data: Any, *, idempotency_key: Optional[str] = None
    ) -> Dict[str, Any]:
        """Publish to many channels: ``{"results": [...], "published", "failed"}``. Retrying with
        the same ``idempotency_key`` publishes only the channels that failed."""
        if isinstance(channels, str):
            raise TypeError("channels must be a list of channel names, not a string")
        body: Dict[str, Any] = {"channels": list(channels), "data": data}
        if idempotency_key is not None:
            body["idempotency_key"] = idempotency_key
        return self._object(self.request("POST", "/api/broadcast", body))

    def history(
        self, channel: str, *, since: Optional[Dict[str, Any]] = None, limit: Optional[int] = None
    ) -> Dict[str, Any]:
        body: Dict[str, Any] = {"channel": channel}
        if since is not None:
            body["since"] = since.to_json() if hasattr(since, "to_json") else since
        if limit is not None:
            body["limit"] = limit
        return self._object(self.request("POST", "/api/history", body))

    def presence(self, channel: str) -> Dict[str, Any]:
        return self._object(self.request("POST", "/api/presence", {"channel": channel}))

    def disconnect(self, *, user: Optional[str] = None, client: Optional[str] = None, code: Optional[int] = None) -> Dict[str, Any]:
        """Disconnect a user's connections or one client (close 4502 unless ``code`` says else)."""
        if (user is None) == (client is None):
            raise ValueError("give exactly one of user or client")
        body: Dict[str, Any] = {"user": user} if user is not None else {"client": client}
        if code is not None:
            body["code"] = code
        return self._object(self.request("POST", "/api/disconnect", body))

    def subscribe(self, user: str, channel: str) -> Dict[str, Any]:
        """Subscribe every connection of ``user`` to ``channel`` (a server-side subscription)."""
        return self._object(self.request("POST", "/api/subscribe", {"user": user, "channel": channel}))

    def unsubscribe(self, user: str, channel: str) -> Dict[str, Any]:
        return self._object(self.request("POST", "/api/unsubscribe", {"user": user, "channel": channel}))

    def channels(self) -> Dict[str, Any]:
        return self._object(self.request("GET", "/api/channels"))

    def info(self) -> Dict[str, Any]:
        return self._object(self.request("GET", "/api/info"))


class AsyncHeraldAPI:
    """:class:`HeraldAPI` for asyncio: the same methods, awaitable (each runs in a worker thread)."""

    def __init__(self, base_url: str, api_key: Optional[str] = None, *, timeout: float = 10.0) -> None:
        self.sync = HeraldAPI(base_url, api_key, timeout=timeout)

    async def _run(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, functools.partial(fn, *args, **kwargs))

    async def request(self, method: str, path: str, body: Optional[Dict[str, Any]] = None) -> Any:
        return await self._run(self.sync.request, method, path, body)

    async def publish(self, channel: str, data: Any, *, idempotency_key: Optional[str] = None) -> Dict[str, Any]:
        r: Dict[str, Any] = await self._run(self.sync.publish, channel, data, idempotency_key=idempotency_key)
        return r

    async def broadcast(self, channels: Sequence[str], data: Any, *, idempotency_key: Optional[str] = None) -> Dict[str, Any]:
        r: Dict[str, Any] = await self._run(self.sync.broadcast, channels, data, idempotency_key=idempotency_key)
        return r

    async def history(self, channel: str, *, since: Optional[Dict[str, Any]] = None, limit: Optional[int] = None) -> Dict[str, Any]:
        r: Dict[str, Any] = await self._run(self.sync.history, channel, since=since, limit=limit)
        return r

    async def presence(self, channel: str) -> Dict[str, Any]:
        r: Dict[str, Any] = await self._run(self.sync.presence, channel)
        return r

    async def disconnect(self, *, user: Optional[str] = None, client: Optional[str] = None, code: Optional[int] = None) -> Dict[str, Any]:
        r: Dict[str, Any] = await self._run(self.sync.disconnect, user=user, client=client, code=code)
        return r

    async def subscribe(self, user: str, channel: str) -> Dict[str, Any]:
        r: Dict[str, Any] = await self._run(self.sync.subscribe, user, channel)
        return r

    async def unsubscribe(self, user: str, channel: str) -> Dict[str, Any]:
        r: Dict[str, Any] = await self._run(self.sync.unsubscribe, user, channel)
        return r

    async def channels(self) -> Dict[str, Any]:
        r: Dict[str, Any] = await self._run(self.sync.channels)
        return r

    async def info(self) -> Dict[str, Any]:
        r: Dict[str, Any] = await self._run(self.sync.info)
        return r


