"""How the pages write times, durations and rates (Jinja filters), and any text at all
(:func:`printable`, what the pages' environment finalizes every value it prints with)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from jinja2.filters import do_urlencode

from pipeline import _human as human
from pipeline._failures import utf8_safe

if TYPE_CHECKING:
    from collections.abc import Callable


def printable(value: Any) -> Any:
    """``value`` as a page prints it: text that UTF-8 cannot encode (a lone surrogate, from a
    payload's ``"\\ud83d"`` or an error message) escaped as ``\\ud83d``, so that the page can
    be sent; markup stays markup, anything else is left as it is."""
    if isinstance(value, str) and not value.isascii():
        return type(value)(utf8_safe(value))
    return value


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


def urlencode(value: Any) -> str:
    """Jinja's ``urlencode`` of :func:`printable` text: it encodes to UTF-8 first."""
    return do_urlencode(printable(value))


FILTERS: dict[str, Callable[..., Any]] = {
    "stamp": stamp,
    "age": age,
    "per_second": per_second,
    "count": count,
    "urlencode": urlencode,
}
