"""Dead letters (``/dead-letters``): the CLI's filters, a page of letters and a letter's detail;
replay and discard are :mod:`._letteractions`'.

The list and its counts come from a :class:`~pipeline._deadletters.LetterIndex` that the
monitor refreshes in the background, so a page or a filter change never reads the whole
``<ns>.dlq``. The list pages by position: its links carry the place of the last (first) letter
shown, and the next page lists the letters older (newer) than it, so letters that die, or leave
the status asked for, while an operator pages do not shift the pages (``page=N`` links, by
count, still work).
"""

from __future__ import annotations

import logging
import re
from typing import TYPE_CHECKING
from urllib.parse import urlencode

from starlette.exceptions import HTTPException
from starlette.routing import Route

from pipeline._deadletters import (
    EARLIEST_MS,
    LATEST_MS,
    DeadLetterNotFoundError,
    LetterFilter,
    LetterKey,
    LetterStatus,
    letter_order,
    parse_when,
)
from pipeline._errors import PipelineError
from pipeline._human import bytes_text, hexdump, pretty_json
from pipeline._job import PayloadEncoding
from pipeline._jsonpayload import read_json
from pipeline._records import DeadLetterReason

from ._dashboard import dashboard_of

if TYPE_CHECKING:
    from collections.abc import Mapping

    from starlette.requests import Request
    from starlette.responses import Response

    from pipeline._deadletters import LetterPage, StoredLetter
    from pipeline._records import DeadLetter


_log = logging.getLogger("pipeline.web")

FILTER_FIELDS = ("type", "reason", "error", "tenant", "id", "since", "until")
STATUSES = ("pending", "replayed", "discarded", "all")
ACTIONS = ("replay", "discard")


# --- the filter, from a query string or a form ---------------------------------------------------


class FilterError(ValueError):
    """A filter field the operator typed cannot be used; the message says why."""


MAX_ALTERNATIVES = 20
"""Comma-separated values a filter field takes at most. Each is tried on every dead letter
of the index while its lock is held: thousands (a long query string) would hold up every
page and the index's refresh for minutes."""


def _values(fields: Mapping[str, str], name: str) -> tuple[str, ...]:
    """Comma-separated alternatives, as the CLI's repeatable options (each once)."""
    text = fields.get(name) or ""
    values = tuple(dict.fromkeys(v.strip() for v in text.split(",") if v.strip()))
    if len(values) > MAX_ALTERNATIVES:
        raise FilterError(
            f"{name}: at most {MAX_ALTERNATIVES} comma-separated values, got {len(values)}"
        )
    return values


def parse_filter(fields: Mapping[str, str], now: int | None = None) -> LetterFilter:
    """The :class:`LetterFilter` of a query string or form; raises :class:`FilterError`."""
    times: dict[str, int | None] = {}
    for name in ("since", "until"):
        text = (fields.get(name) or "").strip()
        try:
            times[name] = parse_when(text, now=now) if text else None
        except ValueError as exc:
            raise FilterError(f"{name}: {exc}") from None
        except OverflowError:  # a duration of 400 digits, say
            raise FilterError(f"{name}: {text!r} is out of range") from None
        value = times[name]
        if value is not None and not EARLIEST_MS <= value <= LATEST_MS:
            raise FilterError(f"{name}: {text!r} is out of range (the years 1 to 9999)")
    since, until = times["since"], times["until"]
    if since is not None and until is not None and since >= until:
        raise FilterError("since must be before until")
    reasons = tuple(reason.strip().lower() for reason in _values(fields, "reason"))
    if unknown := [reason for reason in reasons if reason not in _REASONS]:
        raise FilterError(f"reason: {unknown[0]!r} is none of {', '.join(sorted(_REASONS))}")
    return LetterFilter(
        types=_values(fields, "type"),
        reasons=reasons,
        error=(fields.get("error") or "").strip() or None,
        tenants=_values(fields, "tenant"),
        ids=_values(fields, "id"),
        since=since,
        until=until,
    )


_REASONS = frozenset(reason.value for reason in DeadLetterReason)
"""What ``reason`` may be: a misspelt one matched nothing, and a replay said "nothing to
replay"."""


def whole_number(text: str) -> int | None:
    """``text`` as a non-negative integer, or None: ASCII digits only (``str.isdigit`` also
    takes ``²``, which ``int`` refuses), and few enough that ``int`` takes them."""
    if not (text.isascii() and text.isdigit()) or len(text) > 20:
        return None
    return int(text)


def _page_number(fields: Mapping[str, str]) -> int:
    text = fields.get("page") or "1"
    number = whole_number(text)
    if number is None:
        raise FilterError(f"page must be a page number, got {text!r}")
    return max(1, number)


_POSITION = re.compile(r"(-?[0-9]{1,20})\.([0-9]{1,10})\.([0-9]{1,20})")


def position_of(stored: StoredLetter) -> str:
    """Where a letter is in the list (its :func:`letter_order`), as a pager link carries it:
    ``dead_at.partition.offset``."""
    return ".".join(str(n) for n in letter_order(stored))


def _position(fields: Mapping[str, str], name: str) -> LetterKey | None:
    text = fields.get(name)
    if not text:
        return None
    found = _POSITION.fullmatch(text)
    if found is None:
        raise FilterError(f"{name} must be a letter's position (dead_at.partition.offset)")
    dead_at, partition, offset = found.groups()
    return int(dead_at), int(partition), int(offset)


def _status(fields: Mapping[str, str]) -> str:
    status = fields.get("status") or "pending"
    if status not in STATUSES:
        raise FilterError(f"status must be one of {', '.join(STATUSES)}, got {status!r}")
    return status


def query_string(fields: Mapping[str, str], **changes: object) -> str:
    kept = {k: v for k, v in fields.items() if k in (*FILTER_FIELDS, "status") and v}
    kept.update({k: str(v) for k, v in changes.items() if v is not None})
    return urlencode(kept)


# --- pages --------------------------------------------------------------------------------------


def letters_page(request: Request) -> Response:
    dashboard = dashboard_of(request)
    fields = dict(request.query_params)
    size = dashboard.web.page_size
    context: dict[str, object] = {"page": "dead-letters", "fields": fields, "statuses": STATUSES}
    try:
        page = _page_number(fields)
        before, after = _position(fields, "before"), _position(fields, "after")
        if sum(bool(fields.get(name)) for name in ("page", "before", "after")) > 1:
            raise FilterError("give one of page, before and after")
        letter_filter = parse_filter(fields)
        status = _status(fields)
    except FilterError as exc:
        context["error"] = str(exc)
        return dashboard.render(request, "letters.html", context, status_code=400)
    index = dashboard.letters
    found = index.query(
        letter_filter,
        status="all" if status == "all" else LetterStatus(status),
        offset=(page - 1) * size,
        limit=size,
        before=before,
        after=after,
    )
    newer, older = _pager(found, fields)
    context.update(
        status=status,
        found=found,
        newer=newer,
        older=older,
        filter_values={k: fields[k] for k in FILTER_FIELDS if fields.get(k)},
        filtered=not letter_filter.empty,
        indexing=not index.caught_up,
        indexed=len(index),
    )
    return dashboard.render(request, "letters.html", context)


def _pager(found: LetterPage, fields: Mapping[str, str]) -> tuple[str | None, str | None]:
    """The query strings of the links to the newer and the older page (None: none): the
    letters newer than the first one shown, older than the last. An empty page (its letters
    left, or a link's page number is past the end) links to the first page."""
    newest = position_of(found.letters[0]) if found.letters else None
    oldest = position_of(found.letters[-1]) if found.letters else None
    newer = older = None
    if found.has_previous:
        newer = query_string(fields, after=newest)
    if found.has_next:
        older = query_string(fields, before=oldest)
    return newer, older


def _payload_text(letter: DeadLetter) -> str | None:
    job = letter.job
    if job is None:
        return None
    if job.payload_encoding is PayloadEncoding.JSON:
        try:
            return pretty_json(read_json(job.payload), len(job.payload))
        except (ValueError, RecursionError):  # not JSON, or too deep to write out again
            pass
    return hexdump(job.payload)


def letter_page(request: Request) -> Response:
    dashboard = dashboard_of(request)
    ident = request.path_params["ident"]
    try:
        stored = dashboard.monitor.guarded(lambda: dashboard.letters.get(ident, timeout=10.0))
    except DeadLetterNotFoundError as exc:
        raise HTTPException(404, str(exc)) from None
    except PipelineError as exc:  # Kafka unreachable, or the letter left the topic
        raise HTTPException(503, str(exc)) from None
    letter = stored.letter
    context = {
        "page": "dead-letters",
        "stored": stored,
        "letter": letter,
        "payload": _payload_text(letter),
        "raw_value": hexdump(letter.raw_value) if letter.raw_value is not None else None,
        "raw_key": bytes_text(letter.raw_key),
        "raw_headers": {k: bytes_text(v) for k, v in letter.raw_headers.items()},
    }
    return dashboard.render(request, "letter.html", context)


ROUTES = [
    Route("/dead-letters", letters_page),
    Route("/dead-letters/{ident:str}", letter_page),
]
