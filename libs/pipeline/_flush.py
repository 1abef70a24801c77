"""``Pipeline.flush()``: wait for the jobs handed to the producer before the call, and raise
what became of the ones that failed; the exit flush; what a ``with`` block logs."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from . import _exitflush
from ._delivery import _UNKNOWN_ID
from ._errors import EnqueueError, FailedJobs, KafkaUnavailableError, PipelineError
from ._failurelog import MAX_KEPT, FailureLog, Taken
from ._transport import Transport, refusal_of

if TYPE_CHECKING:
    from ._settings import Settings

__all__ = ["FLUSH_STEP_S", "flush", "flush_at_exit", "log_with_block"]

FLUSH_STEP_S = 0.1
"""A flush serves the producer in steps this long, and looks between them whether the jobs it
waits for were answered, or Kafka refused the credentials."""
_log = logging.getLogger("pipeline.producer")


def flush(transport: Transport, log: FailureLog, settings: Settings, timeout: float) -> None:
    """Wait up to ``timeout`` until Kafka answered for every job handed to ``transport`` before
    the call (not the ones other threads send meanwhile); raise the refusal of the credentials,
    the jobs left unanswered, or the failures of those jobs that this thread sent and was not
    told of yet, or that no flush raised yet (:meth:`FailureLog.take`, :func:`failures_error`)."""
    through = log.mark()
    deadline = time.monotonic() + timeout
    left = log.unanswered(through)
    while left:  # served once at least, even with no time to wait
        transport.flush(min(FLUSH_STEP_S, max(0.0, deadline - time.monotonic())))
        left = log.unanswered(through)
        if time.monotonic() >= deadline or refusal_of(transport) is not None:
            break
    refused = refusal_of(transport)
    if refused is not None:
        raise refused
    if left:
        raise KafkaUnavailableError(
            f"{left} job(s) were not acknowledged within {timeout:g}s by Kafka at "
            f"{settings.bootstrap_servers}; is it running? (`pipeline dev up` starts one)"
        )
    taken = log.take(through)
    if taken:
        error, cause = failures_error(taken, settings)
        raise error from cause


def failures_error(taken: Taken, settings: Settings) -> tuple[PipelineError, EnqueueError]:
    """The error a flush raises for ``taken``, and the cause to chain: the error of the job the
    caller most needs to hear of (one whose producer failed for good first), its message
    counting the others, and carrying them all (:class:`FailedJobs`)."""
    failures = taken.failures
    if not failures:  # every one of them was let go
        reason = f"{taken.not_kept} job(s) failed, over the {MAX_KEPT} failures kept"
        error: PipelineError = EnqueueError(_UNKNOWN_ID, reason)
        return _carrying(error, taken), EnqueueError(_UNKNOWN_ID, reason)
    first = next((f for f in failures if f.fatal is not None), failures[0])
    error = first.error(settings)
    others = len(failures) - 1 + taken.not_kept
    if others:
        not_kept = f", {taken.not_kept} of them not kept" if taken.not_kept else ""
        more = f" (and {others} more job(s): its failed_ids names them all{not_kept})"
        error.args = (f"{error.args[0]}{more}", *error.args[1:])
    cause = f" (and {others} more)" if others else ""
    return _carrying(error, taken), EnqueueError(first.job_id, first.reason + cause)


def _carrying(error: PipelineError, taken: Taken) -> PipelineError:
    if isinstance(error, FailedJobs):
        error.failures = tuple(taken.failures)
        error.not_kept = taken.not_kept
    return error


def log_with_block(flush_error: PipelineError, body_error: BaseException) -> None:
    """The flush of a ``with`` block whose body raised ``body_error`` raised ``flush_error``:
    the body's exception is the one to see, but the lost jobs must still be told, each id."""
    ids = flush_error.failed_ids if isinstance(flush_error, FailedJobs) else []
    _log.error(
        "%s (while leaving the with block on %s)%s",
        flush_error,
        type(body_error).__name__,
        f"; failed job ids: {', '.join(ids)}" if len(ids) > 1 else "",
        extra={"job_ids": ids},
    )


def flush_at_exit(app: _exitflush.ExitFlushed, transport: Transport, log: FailureLog) -> None:
    """The interpreter is exiting: flush ``app``'s producer, then report what never reached
    Kafka (what nobody was told of: see :func:`._exitflush.report_lost`)."""
    stop_polling = getattr(transport, "stop_polling", None)
    if stop_polling is not None:  # this flush serves the producer alone from now on
        stop_polling()
    timeout = app.settings.producer.exit_flush_timeout_s
    # The queue length counts librdkafka's pending events too: only jobs are told.
    remaining = min(transport.flush(timeout), log.unanswered())
    refused = refusal_of(transport)
    purge = getattr(transport, "purge", None) if remaining else None
    if purge is not None:
        # Purged jobs get their delivery callbacks, which name them.
        purge()
        transport.flush(0)
    lost = log.unreported()  # those the polling thread logged are told
    _exitflush.report_lost(
        app,
        lost.failures,
        remaining,
        timeout,
        str(refused) if refused is not None else None,
        purged=purge is not None,
        not_kept=lost.not_kept,
    )
