"""Replay or discard of one dead letter or of every letter a filter matches (``POST
/dead-letters/replay|discard``), with the list's filters (:mod:`._letters`).

An action first shows how many letters it will touch and asks to confirm; the confirmed filter
is pinned to the time of that page (``until``), so letters that die after it are not swept in;
a filter of ids alone (a letter's own Replay or Discard) is not, as it names its letters, and a
worker's clock may run ahead of ours.

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

from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.responses import RedirectResponse
from starlette.routing import Route

from pipeline._deadletters import (
    LATEST_MS,
    LetterFilter,
    actionable,
    discard_letters,
    leave_empty,
    letters_done,
    nothing_to_replay,
    read_dead_letters,
    replay_letters,
)
from pipeline._errors import PipelineError
from pipeline._job import now_ms

from ._dashboard import dashboard_of
from ._letters import (
    ACTIONS,
    FILTER_FIELDS,
    FilterError,
    parse_filter,
    query_string,
    whole_number,
)
from ._notices import signed_notice

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

    from starlette.requests import Request
    from starlette.responses import Response

    from pipeline._deadletters import StoredLetter

    from ._dashboard import Dashboard

_log = logging.getLogger("pipeline.web")


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
    # Only the matching letters are kept: the whole of a deep topic would not fit in memory.
    matching = read_dead_letters(settings, timeout=30.0, only=letter_filter.matches).letters
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
    at = whole_number(text)
    if at is None or at > LATEST_MS:
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
        acted = await run_in_threadpool(dashboard.monitor.writing, act)
    except CountChangedError as changed:
        previous = whole_number(fields.get("count", ""))
        page.update(count=changed.pending, digest=changed.digest, changed=True, previous=previous)
        return dashboard.render(request, "confirm.html", page)
    except PipelineError as exc:
        done = letters_done(exc)  # in the batches committed before it failed
        dashboard.audit.record(who, f"dlq.{action}", target=target, count=done, outcome=str(exc))
        notice = f"The {action} failed: {exc}"
    else:
        dashboard.audit.record(who, f"dlq.{action}", target=target, count=len(acted.done))
        notice = acted.notice("replayed" if action == "replay" else "discarded")
    if (problem := await _refresh_after(dashboard)) is not None:
        notice = f"{notice} (list not refreshed: {problem})"
    back = query_string(fields, **signed_notice(dashboard.gate, notice))
    return RedirectResponse(f"/dead-letters?{back}", status_code=303)


ROUTES = [Route("/dead-letters/{action:str}", letters_action, methods=["POST"])]
