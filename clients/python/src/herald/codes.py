"""Numeric codes of the Herald protocol (docs/protocol.md), plus the SDK's own codes.

Kept in one place so the client, the errors and the docs agree. The values match the JS SDK
(clients/js/src/codes.ts) exactly.
"""

from __future__ import annotations


class ErrorCode:
    """Reply error codes (``error.code`` in a command reply)."""

    INTERNAL = 100
    UNAUTHORIZED = 101
    UNKNOWN_NAMESPACE = 102
    PERMISSION_DENIED = 103
    UNKNOWN_METHOD = 104
    ALREADY_SUBSCRIBED = 105
    LIMIT_EXCEEDED = 106
    BAD_REQUEST = 107
    NOT_AVAILABLE = 108
    TOKEN_EXPIRED = 109
    TOO_MANY_REQUESTS = 110
    TEMPORARILY_UNAVAILABLE = 111
    #: The application's backend (a proxy hook) was unreachable or too slow: retry later.
    BACKEND_UNAVAILABLE = 112


class CloseCode:
    """WebSocket close codes the server uses (the ``disconnect`` push repeats them)."""

    SHUTDOWN = 4000
    SLOW_CONSUMER = 4001
    NO_PONG = 4002
    INSUFFICIENT_STATE = 4003
    TOKEN_EXPIRED = 4004
    BACKEND_ERROR = 4005
    BAD_REQUEST = 4500
    UNAUTHORIZED = 4501
    DISCONNECTED_BY_API = 4502
    MESSAGE_TOO_LARGE = 4503
    CONNECTION_LIMIT = 4504
    REFUSED_BY_BACKEND = 4505


class UnsubCode:
    """``unsub`` push codes."""

    #: The server ended the subscription for good (API ``unsubscribe``).
    SERVER = 2000
    #: The node lost the channel's continuity: subscribe again with ``since``.
    RESUBSCRIBE = 4003
    #: The subscription token expired: subscribe again with a new token.
    TOKEN_EXPIRED = 4004


class ClientCode:
    """Codes for things the SDK notices itself (below 1000: never a close or protocol code)."""

    CONNECT_CALLED = 0
    DISCONNECT_CALLED = 1
    #: The socket closed without a Herald close code (network drop, server gone, 1006 ...).
    TRANSPORT_CLOSED = 2
    #: Nothing arrived for ``ping_interval`` + grace: the connection is presumed dead.
    NO_PING = 3
    CONNECT_TIMEOUT = 4
    #: ``get_token`` returned no token: the app says this user may not connect.
    NO_TOKEN = 5
    CONNECT_REJECTED = 6
    TIMEOUT = 7
    #: The connection went away while a command was in flight; its outcome is unknown.
    CONNECTION_LOST = 8
    NOT_CONNECTED = 9
    BAD_FRAME = 10
    ALREADY_SUBSCRIBED = 11
    UNSUBSCRIBE_CALLED = 12


def is_temporary_error(code: int) -> bool:
    """Reply errors worth retrying on their own: the request was fine, the moment was not."""
    return code in (
        ErrorCode.INTERNAL,
        ErrorCode.TOO_MANY_REQUESTS,
        ErrorCode.TEMPORARILY_UNAVAILABLE,
        ErrorCode.BACKEND_UNAVAILABLE,
    )


def should_reconnect(close_code: int) -> bool:
    """The close-code rule: 4500-4999 stay down; anything else (4000-4499, 1000, 1006 ...) retries."""
    return not 4500 <= close_code <= 4999


def should_resubscribe(unsub_code: int) -> bool:
    """``unsub`` codes 4000-4499 mean "subscribe again with since"; anything else ends it."""
    return 4000 <= unsub_code <= 4499
