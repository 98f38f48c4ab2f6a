"""Typed errors. Every error the SDK raises or reports is a :class:`HeraldError` with a numeric
``code``: a reply code (100-112, or an application code 1000-1999 from a proxy hook), a close code
(4000-4999) or a :class:`~herald.codes.ClientCode` (< 1000)."""

from __future__ import annotations

from typing import Optional

from .codes import ClientCode, is_temporary_error


class HeraldError(Exception):
    """Base class of every Herald error."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    def __repr__(self) -> str:
        return f"{type(self).__name__}(code={self.code}, message={self.message!r})"


class ReplyError(HeraldError):
    """The server answered a command with ``{"error": {code, message}}``."""

    @property
    def temporary(self) -> bool:
        """Worth retrying later (100, 110, 111, 112)."""
        return is_temporary_error(self.code)


class HeraldTimeoutError(HeraldError):
    """A command got no reply in time. Its effect on the server is unknown."""

    def __init__(self, message: str = "timed out waiting for a reply") -> None:
        super().__init__(ClientCode.TIMEOUT, message)


class HeraldConnectionError(HeraldError):
    """The connection closed while a command was in flight, or the client was disconnected.

    ``close_code`` is the code the connection ended with, when there was one.
    """

    def __init__(self, code: int, message: str, close_code: Optional[int] = None) -> None:
        super().__init__(code, message)
        self.close_code = close_code


class UsageError(HeraldError):
    """Misuse of the API (subscribing twice, a bad channel name ...)."""


class ApiError(HeraldError):
    """The server HTTP API answered with an error (``herald.server``); ``status`` is the HTTP status."""

    def __init__(self, code: int, message: str, status: int) -> None:
        super().__init__(code, message)
        self.status = status
