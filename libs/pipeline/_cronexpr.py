"""Cron expressions: validation and fire times in a time zone. Pure.

Fire times are computed by croniter in the schedule's time zone (zoneinfo), so daylight-saving
transitions follow croniter's rules. Every search is bounded: an expression whose next fire is
more than :data:`MAX_YEARS_BETWEEN_FIRES` years away (``0 3 30 2 *``: February 30th) has none,
which makes it invalid where a schedule is written and skipped where one is read.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter

from ._errors import ConfigurationError
from ._records import MissedFires

__all__ = [
    "MAX_YEARS_BETWEEN_FIRES",
    "DueFires",
    "due_fires",
    "epoch_ms",
    "fires_between",
    "moment",
    "next_fire_ms",
    "validate_schedule",
]

_RANDOM = re.compile(r"R(\(.*\))?(/.*)?", re.IGNORECASE).fullmatch
"""A field part of croniter's random form: ``R``, ``R(0-10)``, ``R/5``."""
_ONE_VALUE_RANGE = re.compile(r"([0-9a-z]+)-\1(/[0-9]+)?", re.IGNORECASE).fullmatch
"""A range from a value to itself (``9-9``, ``mon-MON/2``): that one value, as cron reads it;
croniter reads it as a range that wraps around the whole field (every value)."""
MAX_YEARS_BETWEEN_FIRES = 10
"""How far ahead a next fire is searched for (a February 29th is at most 8 years away)."""


def _zone(tz: str) -> ZoneInfo:
    if tz == "localtime":
        # A link to /etc/localtime where the tz database ships one (Debian): every scheduler
        # would fire in its own machine's zone, at times (and fire ids) the others disagree on.
        raise ConfigurationError(
            "time zone 'localtime' is the zone of the machine that reads it, which another "
            "scheduler may not share; use an IANA name such as 'Europe/Paris' or 'UTC'"
        )
    try:
        return ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        # OSError: a directory ("America") or an over-long name, as the tz database reports them.
        raise ConfigurationError(
            f"unknown time zone {tz!r}; use an IANA name such as 'Europe/Paris' or 'UTC'"
        ) from None


def validate_schedule(cron: str, tz: str = "UTC", missed: str = MissedFires.SKIP) -> None:
    """Raise :class:`ConfigurationError` unless ``cron``, ``tz`` and ``missed`` are usable."""
    _zone(tz)
    # As it is read (a range from a value to itself as that value): croniter accepts "0-0" in
    # the day or month field, whose reading, 0, it refuses.
    if (
        not isinstance(cron, str)
        or not croniter.is_valid(cron)
        or not croniter.is_valid(_as_cron_reads(cron))
    ):
        raise ConfigurationError(
            f"invalid cron expression {cron!r}: give five fields (minute hour day month weekday),"
            " six with seconds last, or seven with seconds then a year (1970-2099), e.g."
            " '*/5 * * * *', '* * * * * */10' or '0 9 1 1 * 0 2030'"
        )
    if any(_RANDOM(part) for field in cron.split() for part in field.split(",")):
        # croniter draws the value again for every evaluation: the leader's fire times, and
        # with them the fire ids that make a fire happen once, would change from call to call.
        raise ConfigurationError(
            f"cron expression {cron!r} asks for a random value (R): a schedule must fire at "
            "times every scheduler agrees on; pick the value yourself"
        )
    if missed not in {m.value for m in MissedFires}:
        raise ConfigurationError(f"missed must be one of skip, once, all; got {missed!r}")


def epoch_ms(moment: datetime) -> int:
    """``moment`` in epoch milliseconds, rounded up: a fire is never due before its time."""
    return math.ceil(moment.timestamp() * 1000)


def moment(epoch_ms: int, tz: str = "UTC") -> datetime:
    """``epoch_ms`` as an aware datetime in ``tz``; :class:`ConfigurationError` out of range."""
    try:
        return datetime.fromtimestamp(epoch_ms / 1000, tz=UTC).astimezone(_zone(tz))
    except (ValueError, OverflowError, OSError):
        raise ConfigurationError(
            f"time {epoch_ms} ms since the epoch is out of range (years 1 to 9999)"
        ) from None


def _as_cron_reads(cron: str) -> str:
    """``cron`` with every range from a value to itself written as that value (see
    :data:`_ONE_VALUE_RANGE`); the rest as it is."""
    fields = []
    for field in cron.split():
        parts = []
        for part in field.split(","):
            one = _ONE_VALUE_RANGE(part)
            parts.append(one.group(1) if one is not None else part)
        fields.append(",".join(parts))
    return " ".join(fields)


def _iterator(cron: str, start: datetime) -> croniter:
    """croniter over ``cron``; :class:`ConfigurationError` for an expression it refuses (a
    record no validation saw: from another writer, or from a release that let it through)."""
    reads = _as_cron_reads(cron)
    try:
        return croniter(
            reads,
            start,
            max_years_between_matches=MAX_YEARS_BETWEEN_FIRES,
            day_or=_day_or(reads),
        )
    except ValueError as exc:  # croniter's errors about the expression are ValueErrors
        raise ConfigurationError(f"invalid cron expression {cron!r}: {exc}") from None


def _day_or(cron: str) -> bool:
    """Whether a day matches by its day of the month *or* of the week, as cron reads two
    restricted day fields; one that starts with ``*`` (``*/2`` too) restricts nothing, so the
    other alone decides, where croniter would fire on either (every other day, plus Mondays)."""
    fields = cron.split()
    if len(fields) < 5:
        return True
    return not (fields[2].startswith(("*", "?")) or fields[4].startswith(("*", "?")))


def _fires(cron: str, tz: str, after_ms: int) -> Iterator[int]:
    """Fire times strictly after ``after_ms``, oldest first, until none is found in reach."""
    it = _iterator(cron, moment(after_ms, tz))
    while True:
        try:
            fire: datetime = it.get_next(datetime)
        except (ValueError, OverflowError):
            # None in reach (CroniterBadDateError is a ValueError), or past the year 9999.
            return
        yield epoch_ms(fire)


def next_fire_ms(cron: str, tz: str, after_ms: int) -> int:
    """The first fire strictly after ``after_ms`` (epoch ms), evaluated in time zone ``tz``.

    Raises :class:`ConfigurationError` when there is none within the bounded search.
    """
    for fire in _fires(cron, tz, after_ms):
        return fire
    after = moment(after_ms, "UTC").isoformat(timespec="seconds")
    raise ConfigurationError(
        f"cron expression {cron!r} never fires in the {MAX_YEARS_BETWEEN_FIRES} years after "
        f"{after} (a date that does not exist, such as February 30th?); fix the expression"
    )


def _fires_before(cron: str, tz: str, before_ms: int) -> Iterator[int]:
    """Fire times strictly before ``before_ms``, newest first, until none is found in reach."""
    it = _iterator(cron, moment(before_ms, tz))
    while True:
        try:
            fire: datetime = it.get_prev(datetime)
        except (ValueError, OverflowError):  # as in _fires
            return
        yield epoch_ms(fire)


SCAN_BEFORE_JUMP = 1000
"""Fires stepped through one by one before :func:`fires_between` jumps to the newest ones."""


def fires_between(cron: str, tz: str, after_ms: int, until_ms: int, limit: int) -> list[int]:
    """Fire times in ``(after_ms, until_ms]``, oldest first, at most ``limit`` (the newest).

    The cost is bounded by ``limit``, not by the length of the interval: a schedule last fired
    long ago (a scheduler down for months, a ``created_at`` of 0 from some writer) would
    otherwise cost one step per fire since then.
    """
    fires: list[int] = []
    for steps, fire in enumerate(_fires(cron, tz, after_ms)):
        if fire > until_ms:
            break
        fires.append(fire)
        if len(fires) > limit:
            del fires[0]
        if steps == limit + SCAN_BEFORE_JUMP:
            # Far behind: start again from the fire just before the newest ``limit``. When
            # that fire is not ahead (fewer than ``limit`` fires are left), the newest
            # ``limit`` include some already kept: go on stepping, at most ``limit`` more.
            for back, bound in enumerate(_fires_before(cron, tz, until_ms + 1)):
                if back == limit:
                    if bound > fire:
                        return fires_between(cron, tz, bound, until_ms, limit)
                    break
    return fires


@dataclass(frozen=True, slots=True)
class DueFires:
    """What one step of the leader does for one schedule (see :func:`due_fires`)."""

    fires: list[int]
    """The fire times to enqueue now, oldest first."""
    last_ms: int
    """The last fire handled once they are (the newest fire, or missed fire skipped)."""
    until_ms: int | None
    """None: the schedule is caught up. Else the fires after ``last_ms`` up to this time are
    still to be enqueued, at the next steps, however old they are by then."""


def due_fires(
    cron: str,
    tz: str,
    last_fire_ms: int,
    now: int,
    missed: str,
    *,
    grace_ms: int = 0,
    limit: int = 1000,
    until_ms: int | None = None,
) -> DueFires:
    """The fires to enqueue now, given the last fire done: the missed-fire policy, at most
    ``limit`` fires per call.

    Fires in ``(last_fire_ms, now]`` are due. Those at most ``grace_ms`` old are late, not
    missed: every one fires (a failover takes seconds). Older ones are missed and follow the
    policy: ``skip`` drops them, ``once`` fires the newest missed one alone, ``all`` fires each
    (at most ``limit``, the newest). What is kept is every fire after some time, so it is
    enqueued oldest first, ``limit`` at a time: when more are left, ``until_ms`` says up to
    where, and the caller passes it back (with the new last fire) at the next step, which goes
    on from there, whatever ``now`` is by then (never beyond it). The cost of a call is bounded
    by ``limit``, not by the number of fires due.
    """
    start = last_fire_ms
    end = now if until_ms is None else min(until_ms, now)
    if end <= last_fire_ms or until_ms is None:  # no catch-up goes on: apply the policy
        end = now
        keep = {str(MissedFires.SKIP): 0, str(MissedFires.ONCE): 1}.get(missed, limit)
        lost = fires_between(cron, tz, last_fire_ms, now - grace_ms - 1, keep + 1)
        if len(lost) > keep:
            start = lost[-keep - 1]  # the missed fire before those kept, or the newest one
    fires: list[int] = []
    for fire in _fires(cron, tz, start):
        if fire > end:
            break
        if len(fires) == limit:
            return DueFires(fires, fires[-1], end)
        fires.append(fire)
    return DueFires(fires, fires[-1] if fires else start, None)
