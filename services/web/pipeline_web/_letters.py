"""Dead letters (``/dead-letters``): the CLI's filters, a page of letters, a letter's detail,
and replay or discard of one letter or of every letter the filter matches.

The list and its counts come from a :class:`~pipeline._deadletters.LetterIndex` that the
monitor refreshes in the background, so a page or a filter change never reads the whole
``<ns>.dlq``. An action first shows how many letters it will touch and asks to confirm; the
confirmed filter is pinned to the time of that page (``until``), so letters that die after it
are not swept in; a filter of ids alone (a letter's own Replay or Discard) is not, as it names
its letters, and a worker's clock may run ahead of ours.

The index may lag behind the topic (a deep one is read in steps), so the confirmation also
carries a digest of the letters it counted, and the action, which reads the topic again,
acts only if the letters matching now are those: otherwise it asks again, with the count
read from the topic. The action itself is the CLI's (:func:`replay_letters`,
:func:`discard_letters`): it reads the state again after fencing any other replay, so a
letter is replayed once however many times the form is sent.
"""

from __future__ import annotations

import hashlib
import json
import logging
import sys
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING, NamedTuple
from urllib.parse import urlencode

from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.responses import RedirectResponse
from starlette.routing import Route

from pipeline._deadletters import (
    DeadLetterNotFoundError,
    LetterFilter,
    LetterStatus,
    actionable,
    discard_letters,
    leave_empty,
    nothing_to_replay,
    parse_when,
    read_dead_letters,
    replay_letters,
)
from pipeline._errors import PipelineError
from pipeline._human import bytes_text, hexdump
from pipeline._job import PayloadEncoding, now_ms

from ._dashboard import dashboard_of
from ._notices import signed_notice

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

    from starlette.requests import Request
    from starlette.responses import Response

    from pipeline._deadletters import StoredLetter
    from pipeline._records import DeadLetter

    from ._dashboard import Dashboard

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
    return LetterFilter(
        types=_values(fields, "type"),
        reasons=_values(fields, "reason"),
        error=(fields.get("error") or "").strip() or None,
        tenants=_values(fields, "tenant"),
        ids=_values(fields, "id"),
        since=times["since"],
        until=times["until"],
    )


def _whole_number(text: str) -> int | None:
    """``text`` as a non-negative integer, or None: ASCII digits only (``str.isdigit`` also
    takes ``²``, which ``int`` refuses), and few enough that ``int`` takes them."""
    if not (text.isascii() and text.isdigit()) or len(text) > 20:
        return None
    return int(text)


def _page_number(fields: Mapping[str, str]) -> int:
    text = fields.get("page") or "1"
    number = _whole_number(text)
    if number is None:
        raise FilterError(f"page must be a page number, got {text!r}")
    return max(1, number)


def _status(fields: Mapping[str, str]) -> str:
    status = fields.get("status") or "pending"
    if status not in STATUSES:
        raise FilterError(f"status must be one of {', '.join(STATUSES)}, got {status!r}")
    return status


def _query_string(fields: Mapping[str, str], **changes: object) -> str:
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
    )
    context.update(
        status=status,
        found=found,
        page_number=page,
        pages=max(1, -(-found.total // size)),
        query=lambda **changes: _query_string(fields, **changes),
        filter_values={k: fields[k] for k in FILTER_FIELDS if fields.get(k)},
        filtered=not letter_filter.empty,
        indexing=not index.caught_up,
        indexed=len(index),
    )
    return dashboard.render(request, "letters.html", context)


def _payload_text(letter: DeadLetter) -> str | None:
    job = letter.job
    if job is None:
        return None
    if job.payload_encoding is PayloadEncoding.JSON:
        try:
            return json.dumps(json.loads(job.payload), indent=2, ensure_ascii=False)
        except ValueError:
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


# --- actions ------------------------------------------------------------------------------------


def _pinned(letter_filter: LetterFilter, at: int) -> LetterFilter:
    """The filter limited to letters dead before ``at`` (the confirmation page's time)."""
    until = at if letter_filter.until is None else min(letter_filter.until, at)
    return replace(letter_filter, until=until)


def _names_letters(letter_filter: LetterFilter) -> bool:
    """Whether the filter is ids alone: pinning it adds nothing but the risk of missing a
    letter whose worker's clock runs ahead of the dashboard's."""
    return bool(letter_filter.ids) and letter_filter == LetterFilter(ids=letter_filter.ids)


def _filter_json(letter_filter: LetterFilter) -> dict[str, object]:
    """The criteria that are set, for the audit log."""
    names = ("types", "reasons", "error", "since", "until", "tenants", "ids")
    return {name: value for name in names if (value := getattr(letter_filter, name))}


def letters_digest(letters: Iterable[StoredLetter]) -> str:
    """Which letters a confirmation counted, in a form field: a digest of the ids of every
    letter the filter matched, whatever its status, so that letters replayed or discarded
    meanwhile (skipped by the action) do not change it, and letters it did not count do."""
    ids = sorted(s.letter.id for s in letters)
    return hashlib.sha256(json.dumps(ids).encode()).hexdigest()[:32]


def _todo(action: str, letters: list[StoredLetter]) -> tuple[list[StoredLetter], int, int]:
    """What ``action`` acts on of ``letters``, as the CLI picks it: the pending ones (a
    replay leaves those holding nothing to send), how many it skips as already replayed or
    discarded, and how many a replay leaves."""
    todo, skipped = actionable(letters)
    empty: list[StoredLetter] = []
    if action == "replay":
        todo, empty = leave_empty(todo, skipped)
    return todo, sum(skipped.values()), len(empty)


def _counted(dashboard: Dashboard, action: str, letter_filter: LetterFilter) -> tuple[int, str]:
    """How many letters of the index ``letter_filter`` matches ``action`` would act on, and
    the digest of every letter it matches (one query, so that both come from the same
    refresh)."""
    found = dashboard.letters.query(
        letter_filter, status="all", limit=sys.maxsize, newest_first=False
    )
    return len(_todo(action, found.letters)[0]), letters_digest(found.letters)


class CountChangedError(Exception):
    """The letters the filter matches on the topic are not those the confirmation counted
    (the index had not read them yet, or some died since): nothing was done."""

    def __init__(self, action: str, matching: list[StoredLetter]) -> None:
        super().__init__("the dead letters matching the filter changed since they were counted")
        self.pending = len(_todo(action, matching)[0])
        self.digest = letters_digest(matching)


class ActionReport(NamedTuple):
    """What an action did: the letters acted on, how many were skipped as already replayed
    or discarded, and how many a replay left as they hold nothing to replay."""

    done: list[StoredLetter]
    skipped: int
    empty: int = 0

    def notice(self, verb: str) -> str:
        done = len(self.done)
        text = f"{done} dead letter{'' if done == 1 else 's'} {verb}"
        if self.skipped:
            text += f"; {self.skipped} already replayed or discarded were left alone"
        if self.empty:
            text += f"; {nothing_to_replay(self.empty)}"
        return f"{text}."


def _act(
    dashboard: Dashboard,
    action: str,
    letter_filter: LetterFilter,
    confirmed: str | None,
    who: str,
    reset: bool,
) -> ActionReport:
    """Run ``action`` on the pending letters ``letter_filter`` matches, as the CLI does, if
    the letters it matches are those of the digest ``confirmed`` (else raise
    :class:`CountChangedError`)."""
    settings = dashboard.settings
    # Read again, not taken from the index: the index may not have read every letter yet.
    matching = read_dead_letters(settings, timeout=30.0).select(letter_filter)
    if letters_digest(matching) != confirmed:
        raise CountChangedError(action, matching)
    todo, skipped, empty = _todo(action, matching)
    if not todo:
        return ActionReport([], skipped, empty)
    by = f"{who} (pipeline web)"
    if action == "replay":
        report = replay_letters(settings, todo, reset_attempts=reset, by=by, timeout=30.0)
    else:
        report = discard_letters(settings, todo, by=by, timeout=30.0)
    return ActionReport(
        report.done, skipped + sum(report.skipped.values()), empty + len(report.empty)
    )


def _pin_time(fields: Mapping[str, str]) -> int:
    text = fields.get("at", "")
    at = _whole_number(text)
    if at is None:
        raise HTTPException(400, f"'at' must be epoch milliseconds, got {text!r}")
    return at


async def _refresh_after(dashboard: Dashboard) -> str | None:
    """Read the action's own records into the index, so that the list shows them; why that
    failed, if it did: the action ran all the same, and the answer must say what it did."""
    try:
        await run_in_threadpool(dashboard.read_new_letters, 10.0)
    except PipelineError as exc:
        return str(exc)
    except Exception as exc:  # a bug must not hide the action's outcome; it is logged
        _log.exception("refreshing the dead letters after an action failed")
        return f"{type(exc).__name__}: {exc}"
    return None


def _confirmation(
    action: str, fields: Mapping[str, str], at: int, pinned: bool
) -> dict[str, object]:
    """What a confirmation page shows but the count."""
    return {
        "page": "dead-letters",
        "action": action,
        "at": at,
        "pinned": pinned,
        "fields": {k: v for k, v in fields.items() if k in FILTER_FIELDS and v},
        "reset_attempts": fields.get("reset_attempts") == "1",
    }


async def letters_action(request: Request) -> Response:
    """Step one (no ``confirm``): count what the filter matches in the index and ask. Step
    two: act on the pending letters matching the filter as of that count (``at``), if they
    are those counted (``digest``); if not, ask again with the count read from the topic."""
    dashboard = dashboard_of(request)
    action = request.path_params["action"]
    if action not in ACTIONS:
        raise HTTPException(404, f"no dead-letter action {action!r}")
    form = await dashboard.action_form(request)
    fields = {k: v for k, v in form.items() if isinstance(v, str)}
    confirmed = fields.get("confirm") == "yes"
    at = _pin_time(fields) if confirmed else now_ms()
    try:
        letter_filter = parse_filter(fields, now=at)
    except FilterError as exc:
        raise HTTPException(400, str(exc)) from None
    pinned = not _names_letters(letter_filter)
    if pinned:
        letter_filter = _pinned(letter_filter, at)
    page = _confirmation(action, fields, at, pinned)
    if not confirmed:
        # A new filter scans the whole index: off the event loop, which serves every page.
        count, digest = await run_in_threadpool(_counted, dashboard, action, letter_filter)
        index = dashboard.letters
        page.update(count=count, digest=digest, indexing=not index.caught_up, indexed=len(index))
        return dashboard.render(request, "confirm.html", page)
    who = request.state.who
    target = _filter_json(letter_filter)
    reset = fields.get("reset_attempts") == "1"
    act = partial(_act, dashboard, action, letter_filter, fields.get("digest"), who, reset)
    try:
        acted = await run_in_threadpool(dashboard.monitor.guarded, act)
    except CountChangedError as changed:
        previous = _whole_number(fields.get("count", ""))
        page.update(count=changed.pending, digest=changed.digest, changed=True, previous=previous)
        return dashboard.render(request, "confirm.html", page)
    except PipelineError as exc:
        dashboard.audit.record(who, f"dlq.{action}", target=target, count=0, outcome=str(exc))
        notice = f"The {action} failed: {exc}"
    else:
        dashboard.audit.record(who, f"dlq.{action}", target=target, count=len(acted.done))
        notice = acted.notice("replayed" if action == "replay" else "discarded")
    if (problem := await _refresh_after(dashboard)) is not None:
        notice = f"{notice} (list not refreshed: {problem})"
    back = _query_string(fields, **signed_notice(dashboard.gate, notice))
    return RedirectResponse(f"/dead-letters?{back}", status_code=303)


ROUTES = [
    Route("/dead-letters", letters_page),
    Route("/dead-letters/{action:str}", letters_action, methods=["POST"]),
    Route("/dead-letters/{ident:str}", letter_page),
]
