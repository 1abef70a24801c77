"""How the pages write times, durations and rates (Jinja filters)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from pipeline import _human as human

if TYPE_CHECKING:
    from collections.abc import Callable


def stamp(ms: int | None) -> str:
    """Epoch milliseconds as UTC, to the millisecond: ``2026-12-02 13:05:09.123``; a time no
    datetime holds (a producer that wrote microseconds, say) as its number."""
    if ms is None:
        return "-"
    try:
        moment = datetime.fromtimestamp(ms / 1000, tz=UTC)
    except (ValueError, OverflowError, OSError):  # the record is foreign; the page still shows
        return str(ms)
    return moment.strftime("%Y-%m-%d %H:%M:%S.") + f"{moment.microsecond // 1000:03d}"


def age(seconds: float | None) -> str:
    return human.age(seconds) or "-"


def per_second(rate: float | None) -> str:
    if rate is None:
        return "n/a"
    return f"{rate:,.0f}/s" if rate >= 100 else f"{rate:.1f}/s"


def count(value: int) -> str:
    return f"{value:,}"


FILTERS: dict[str, Callable[..., Any]] = {
    "stamp": stamp,
    "age": age,
    "per_second": per_second,
    "count": count,
}
