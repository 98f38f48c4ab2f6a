"""Herald's Python SDK (asyncio): a client for Herald's WebSocket protocol (``herald.Client``) and
server-side helpers (``herald.server``: the HTTP API and token minting)."""

from .backoff import Backoff
from .client import Client
from .codes import ClientCode, CloseCode, ErrorCode, UnsubCode, should_reconnect, should_resubscribe
from .errors import (
    ApiError,
    HeraldConnectionError,
    HeraldError,
    HeraldTimeoutError,
    ReplyError,
    UsageError,
)
from .events import (
    Connected,
    Connecting,
    Disconnected,
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
)
from .subscription import Subscription

__version__ = "0.1.0"

__all__ = [
    "ApiError",
    "Backoff",
    "Client",
    "ClientCode",
    "CloseCode",
    "Connected",
    "Connecting",
    "Disconnected",
    "ErrorCode",
    "ErrorEvent",
    "EventStream",
    "HeraldConnectionError",
    "HeraldError",
    "HeraldTimeoutError",
    "Join",
    "Leave",
    "Publication",
    "RecoveryFailed",
    "ReplyError",
    "Skipped",
    "StateChanged",
    "StreamPosition",
    "Subscribed",
    "Subscription",
    "UnsubCode",
    "UsageError",
    "should_reconnect",
    "should_resubscribe",
]
