"""Applying a Fossil delta (https://fossil-scm.org/home/doc/trunk/www/delta_format.wiki), the format
of Herald's delta compression. Only the applier: the server makes the deltas. A port of
clients/js/src/fossil.ts.

Written here rather than taken from PyPI: the only package, ``fossil-delta``, has had one release
(2017) and ships no wheels (it needs a C compiler at install time), and the applier is small. It
checks the delta's own checksum, so a wrong base cannot go unnoticed."""

from __future__ import annotations

import struct
from typing import Tuple

_DIGITS = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ_abcdefghijklmnopqrstuvwxyz~"
_VALUE = [-1] * 256
for _i, _d in enumerate(_DIGITS):
    _VALUE[_d] = _i


class DeltaError(ValueError):
    """A delta that cannot be applied to the base it was given."""


def _checksum(data: bytes) -> int:
    """Fossil's checksum: the sum of the bytes taken as big-endian 32-bit words (the last one
    padded with zeros on the right), modulo 2**32."""
    padded = data + b"\0" * (-len(data) % 4)
    words: Tuple[int, ...] = struct.unpack(f">{len(padded) // 4}I", padded)
    return sum(words) & 0xFFFFFFFF


def _int(delta: bytes, pos: int) -> Tuple[int, int]:
    """The base-64 number at ``pos`` and the position after it."""
    v = 0
    start = pos
    while pos < len(delta):
        d = _VALUE[delta[pos]]
        if d < 0:
            break
        v = v * 64 + d
        pos += 1
    if pos == start:
        raise DeltaError("delta: number expected")
    return v, pos


def apply_delta(base: bytes, delta: bytes) -> bytes:
    """Apply ``delta`` to ``base``; both and the result are bytes. Raises :class:`DeltaError` when
    it does not fit (malformed, or made from another base: the checksum fails)."""
    size, pos = _int(delta, 0)
    if delta[pos : pos + 1] != b"\n":
        raise DeltaError("delta: size not followed by a newline")
    pos += 1
    # Grown piece by piece and checked against ``size`` at each step, so a bogus size in the header
    # cannot make us allocate it up front.
    out = bytearray()
    while pos < len(delta):
        count, pos = _int(delta, pos)
        op = delta[pos : pos + 1]
        pos += 1
        if op == b"@":
            offset, pos = _int(delta, pos)
            if delta[pos : pos + 1] != b",":
                raise DeltaError("delta: copy without a comma")
            pos += 1
            if len(out) + count > size:
                raise DeltaError("delta: copy past the output size")
            if offset + count > len(base):
                raise DeltaError("delta: copy past the end of the base")
            out += base[offset : offset + count]
        elif op == b":":
            if len(out) + count > size:
                raise DeltaError("delta: insert past the output size")
            if pos + count > len(delta):
                raise DeltaError("delta: insert past the end of the delta")
            out += delta[pos : pos + count]
            pos += count
        elif op == b";":
            if len(out) != size:
                raise DeltaError("delta: output size does not match")
            if count != _checksum(bytes(out)):
                raise DeltaError("delta: bad checksum (not made from this base)")
            return bytes(out)
        else:
            raise DeltaError("delta: unknown command")
    raise DeltaError("delta: unterminated")


def apply_delta_text(base: str, delta: str) -> str:
    """Apply a delta carried as text to a base held as text (both UTF-8 on the wire)."""
    try:
        base_bytes, delta_bytes = base.encode("utf-8"), delta.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate (a ``\ud800`` escape): no UTF-8 text
        raise DeltaError("delta: the base or the delta is not UTF-8 text") from None
    out = apply_delta(base_bytes, delta_bytes)
    try:
        return out.decode("utf-8")
    except UnicodeDecodeError:
        raise DeltaError("delta: the result is not UTF-8") from None
