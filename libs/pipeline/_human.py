"""Times, durations and payloads as operators read them, one way for the CLI and the dashboard."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._records import Event


def when(epoch_ms: int | None) -> str | None:
    """Epoch milliseconds as an ISO-8601 UTC time to the second: ``2026-12-02T13:05:09Z``."""
    if epoch_ms is None:
        return None
    try:
        moment = datetime.fromtimestamp(epoch_ms / 1000, tz=UTC)
    except (ValueError, OverflowError, OSError):
        # Past the years a datetime holds (a producer that wrote microseconds, say): the
        # number as it is, rather than no answer at all.
        return f"{epoch_ms} ms since the epoch (out of range)"
    return moment.isoformat(timespec="seconds").replace("+00:00", "Z")


def age(seconds: float | None) -> str | None:
    """A duration: ``4.2s``, ``95s``, ``12m03s``, ``5h20m``, ``3d04h`` (None stays None)."""
    if seconds is None:
        return None
    whole = int(seconds)
    if whole < 120:
        return f"{seconds:.1f}s" if seconds < 10 else f"{whole}s"
    if whole < 7200:
        return f"{whole // 60}m{whole % 60:02d}s"
    if whole < 172800:
        return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
    return f"{whole // 86400}d{whole % 86400 // 3600:02d}h"


PREVIEW_BYTES = 256
"""How much of a binary value :func:`hexdump` shows."""


def bytes_text(data: bytes | None) -> str | None:
    """Printable UTF-8 as it is, anything else as hex."""
    if data is None:
        return None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return f"0x{data.hex()}"
    return text if text.isprintable() else f"0x{data.hex()}"


def hexdump(data: bytes) -> str:
    """The first :data:`PREVIEW_BYTES` of ``data`` as offset, hex and ASCII columns."""
    lines = []
    for at in range(0, min(len(data), PREVIEW_BYTES), 16):
        chunk = data[at : at + 16]
        ascii_ = "".join(chr(b) if 32 <= b < 127 else "." for b in chunk)
        lines.append(f"{at:04x}  {chunk.hex(' '):<47}  {ascii_}")
    if len(data) > PREVIEW_BYTES:
        lines.append(f"... {len(data) - PREVIEW_BYTES} more bytes")
    return "\n".join(lines)


PAYLOAD_PREVIEW_CHARS = 100_000
"""How much of a JSON payload a dead letter's page (``pipeline dlq show``, the dashboard) shows
pretty-printed. The indentation grows with the nesting: a payload of 200 KB nested 900 deep
pretty-prints to 170 MB, and a flat list of 9 MB to 3 million lines."""


def pretty_json(value: object, size: int, more: str = "") -> str:
    """``value`` indented, cut after :data:`PAYLOAD_PREVIEW_CHARS` with a line saying so
    (``size``: the payload's bytes; ``more``: where to see it whole, such as ``--json for
    all``); encoded piece by piece, so the whole is never built."""
    shown: list[str] = []
    length = 0
    for piece in json.JSONEncoder(indent=2, ensure_ascii=False).iterencode(value):
        shown.append(piece)
        length += len(piece)
        if length > PAYLOAD_PREVIEW_CHARS:
            text = "".join(shown)[:PAYLOAD_PREVIEW_CHARS]
            return f"{text}\n… truncated ({size:,} bytes in all{'; ' + more if more else ''})"
    return "".join(shown)


def event_detail(event: Event) -> str | None:
    """What a lifecycle event says besides its kind: progress, duration, its detail text."""
    parts = []
    if event.progress is not None:
        parts.append(f"{event.progress:.0%}")
    if event.duration_ms is not None:
        parts.append(f"{event.duration_ms:.0f} ms")
    if event.detail:
        parts.append(" ".join(event.detail.split()))
    return ", ".join(parts) or None
