"""What a failed run of a job leads to: another attempt at a time, or a dead letter. Pure.

The classification (DESIGN section 6), in one place for the worker and for
:mod:`pipeline.testing`: ``Retry`` asks for its own time; an error declared fatal for the job
type, a payload that does not fit the handler or an unknown job type go straight to the
dead-letter topic; anything else is transient and retried after the type's backoff until
``max_attempts`` runs were made, and then dead-lettered (``timeout`` when the last run ran past
its time limit). An exception group is judged by the exceptions it holds, as ``except*`` matches
them: dead at once when any of them would be, else retried when the latest of its members asks.
Where the retry is written (tiers, ``<ns>.deferred``) is the worker's business.
"""

from __future__ import annotations

import hashlib
import math
import traceback
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from ._errors import DecodeError, PayloadValidationError, TimeLimitError, UnknownJobTypeError
from ._job import AttemptError, Job
from ._records import DeadLetterReason
from ._retry import Retry

if TYPE_CHECKING:
    import random

    from ._registry import JobType

MESSAGE_MAX = 2000
"""Error messages longer than this are cut (they travel with every retry of the job)."""
TRACEBACK_MAX = 8192
"""A dead letter keeps at most this many bytes (UTF-8) of its last error's traceback: the tail,
where the frame that raised and the error are."""
_CUT = "...\n"


@dataclass(frozen=True, slots=True)
class FailureVerdict:
    """What one failed run leads to: ``reason`` None is a retry due at ``due_ms``."""

    reason: DeadLetterReason | None
    """The dead-letter reason; None: the job runs again."""
    retryable: bool
    """Whether the error is of a kind that is retried (its attempt history says so)."""
    due_ms: int = 0
    """When the next attempt is due (epoch ms; never before the failure); 0 when dead."""

    @property
    def dead(self) -> bool:
        return self.reason is not None


def judge_failure(
    job: Job,
    job_type: JobType | None,
    error: BaseException | None,
    now_ms: int,
    rand: random.Random | None = None,
) -> FailureVerdict:
    """The verdict on ``job``'s run that failed with ``error`` at ``now_ms``.

    ``job_type`` is the registered type (None: this application has no handler for it, as
    with an :class:`UnknownJobTypeError`); ``rand`` draws the backoff's jitter.
    """
    if job_type is None:
        return FailureVerdict(DeadLetterReason.UNKNOWN_TYPE, False)
    members = group_members(error)
    reason = _dead_at_once(members, job_type.options.fatal)
    if reason is not None:
        return FailureVerdict(reason, False)
    if job.attempt >= attempt_limit(job, job_type):
        if isinstance(error, TimeLimitError):
            return FailureVerdict(DeadLetterReason.TIMEOUT, True)
        return FailureVerdict(DeadLetterReason.MAX_ATTEMPTS, True)
    # Every member's wish is met: the latest time a Retry asks for, and the backoff's when
    # something else failed (or a Retry left the time to it).
    dues: list[int] = []
    backoff = error is None
    for member in members:
        if isinstance(member, BaseExceptionGroup):
            continue
        due = member.due_ms(now_ms) if isinstance(member, Retry) else None
        if due is None:
            backoff = True
        else:
            dues.append(due)
    if backoff:
        delay_s = job_type.options.backoff.delay_s(job.attempt, rand)
        dues.append(now_ms + math.ceil(delay_s * 1000))  # never early: rounded up
    return FailureVerdict(None, True, max([*dues, now_ms]))


def _dead_at_once(
    members: list[BaseException], fatal: tuple[type[BaseException], ...]
) -> DeadLetterReason | None:
    """The reason the error made of ``members`` is dead-lettered without a retry, if it is:
    any member decides, in the order one error is judged in."""
    if any(isinstance(member, UnknownJobTypeError) for member in members):
        return DeadLetterReason.UNKNOWN_TYPE
    if any(isinstance(member, (PayloadValidationError, DecodeError)) for member in members):
        return DeadLetterReason.VALIDATION_ERROR
    if fatal and any(_is_fatal(member, fatal) for member in members):
        return DeadLetterReason.FATAL_ERROR
    return None


def group_members(error: BaseException | None) -> list[BaseException]:
    """``error`` and, when it is an exception group, every exception nested in it, nested
    groups included; ``[]`` for no error."""
    if error is None:
        return []
    members = [error]
    for member in members:  # grows while it is walked: a group's members are walked too
        if isinstance(member, BaseExceptionGroup):
            members.extend(member.exceptions)
    return members


def _is_fatal(error: BaseException, fatal: tuple[type[BaseException], ...]) -> bool:
    """Whether ``fatal`` names ``error``'s class or a base of it.

    An explicit Retry never is, even when ``fatal`` names a base class of it. A group is judged
    by its members, as ``except*`` matches (``fatal=(Exception,)`` does not make a group of
    Retry requests fatal), unless ``fatal`` names a group class (``ExceptionGroup``) itself.
    """
    if isinstance(error, Retry):
        return False
    if isinstance(error, BaseExceptionGroup):
        return any(issubclass(cls, BaseExceptionGroup) and isinstance(error, cls) for cls in fatal)
    return isinstance(error, fatal)


def failed_job(
    job: Job, verdict: FailureVerdict, error: BaseException | None, now_ms: int, worker: str
) -> Job:
    """The job as its move writes it: the next attempt (its error appended to the history,
    due at the verdict's time), or the job the dead letter carries (an unknown type's job as
    it came, any other with its last error appended)."""
    if verdict.reason is DeadLetterReason.UNKNOWN_TYPE:
        return job
    failed = with_attempt_error(job, error, verdict.retryable, now_ms, worker)
    if verdict.dead:
        return failed
    return replace(failed, attempt=job.attempt + 1, not_before=verdict.due_ms)


def with_attempt_error(
    job: Job, error: BaseException | None, retryable: bool, now_ms: int, worker: str
) -> Job:
    """``job`` with this attempt's error appended to its history."""
    entry = AttemptError(
        attempt=job.attempt,
        at=now_ms,
        error_class=qualified_name(error),
        message=describe_error(error),
        retryable=retryable,
        traceback_digest=traceback_digest(error),
        worker=worker,
    )
    return replace(job, errors=[*job.errors, entry])


def attempt_limit(job: Job, job_type: JobType | None) -> int:
    """How many runs ``job`` may have in all: the smaller of its envelope's ``max_attempts``
    and its type's declared one.

    The envelope always carries a number (the schema's default is 5), so a producer that does
    not know the type's options (another language, ``pipeline enqueue`` without ``--app``)
    writes one that says nothing. Both are limits, so the stricter one holds: a job never runs
    more often than its type allows, and a producer may still ask for fewer runs.
    """
    declared = job_type.options.max_attempts if job_type is not None else None
    if declared is not None and declared < job.max_attempts:
        return declared
    return job.max_attempts


def qualified_name(error: BaseException | None) -> str:
    """``module.QualName`` of the error's class (``"None"`` for no error)."""
    if error is None:
        return "None"
    cls = type(error)
    return f"{cls.__module__}.{cls.__qualname__}"


def describe_error(error: BaseException | None) -> str:
    """The error's message (its class name when it has none), cut at :data:`MESSAGE_MAX`, with
    what UTF-8 cannot carry (lone surrogates) escaped. An error whose ``str()`` raises is
    described by its class name: the job must still move."""
    if error is None:
        return ""
    try:
        text = str(error)
    except Exception:
        text = f"<{type(error).__name__}: str() failed>"
    return utf8_safe(cut_text(text or type(error).__name__, MESSAGE_MAX))


def utf8_safe(text: str) -> str:
    """``text`` with what UTF-8 cannot encode (lone surrogates, as ``os.fsdecode`` makes of
    bytes that are not UTF-8) escaped as ``\\udcff``: every string of a move is UTF-8."""
    if text.isascii():
        return text
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def cut_text(text: str, limit: int) -> str:
    """``text``, or its first ``limit - 1`` characters and an ellipsis when it is longer."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def traceback_digest(error: BaseException | None) -> str | None:
    """12 hex digits naming where an error came from (files, functions, lines; no values), so
    that identical failures group together in ``pipeline dlq ls``."""
    if error is None or error.__traceback__ is None:
        return None
    frames = traceback.extract_tb(error.__traceback__)
    shape = "|".join(f"{f.filename}:{f.name}:{f.lineno}" for f in frames)
    shape += f"|{qualified_name(error)}"
    return hashlib.sha1(shape.encode(), usedforsecurity=False).hexdigest()[:12]


def traceback_text(error: BaseException | None, limit: int = TRACEBACK_MAX) -> str | None:
    """The traceback of ``error`` (with its causes) as text, at most ``limit`` bytes of UTF-8:
    its tail, after ``...`` and a newline when cut. None for an error that was never raised."""
    if error is None or error.__traceback__ is None:
        return None
    text = "".join(traceback.format_exception(error))
    data = text.encode("utf-8", "backslashreplace")
    if len(data) <= limit:
        return data.decode("utf-8")
    tail = data[len(data) - (limit - len(_CUT)) :]
    return _CUT + tail.decode("utf-8", "ignore")  # a character cut in two is dropped
