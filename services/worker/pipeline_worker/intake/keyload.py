"""Restores of idempotency keys, on a helper thread: the consumer thread polls meanwhile.

A restore reads the changelog for up to ``dedup_restore_timeout_s``. Run on the consumer thread,
one that could not finish (a ``<ns>.dedup`` partition without a leader, a transaction left open
there) held every partition of the worker for that long at each try: no poll, no commit, no
move written, no revocation answered. So one restore at a time runs on a thread of its own;
the consumer thread starts it (with no transaction of ours open: see ``intake.consumer``), waits
for it a moment (most take milliseconds: their partitions resume in that turn), else asks at
each turn whether it is done, and takes its keys then. The partitions it restores stay
paused until they are read back whole (:mod:`.assignment`), so nothing runs earlier than before.

The Kafka store's load is staged (:meth:`..route.changelog.KafkaDedupStore.restoring`): the
partitions that join a table held already, and the install of the tables read, happen on the
consumer thread; only the read runs on the helper. Any other store's ``load`` runs whole on the
helper thread, beside ``unload`` of other partitions from the consumer thread and the calls of
the event loop (see :class:`pipeline.dedup.DedupStore`).

A partition given up while its restore runs is unloaded only once the restore ended (calls for
one partition never overlap), and its keys are not taken: a partition assigned again meanwhile
is another :class:`.._work.PartitionState`, restored anew after that. A restore whose
partitions were all given up is cancelled (the Kafka store's read ends within a poll): the
restores of the partitions assigned since wait for it, and its keys would be dropped.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, wait
from typing import TYPE_CHECKING

from pipeline._dedup import Where
from pipeline._dedupstores import DedupStore
from pipeline._ratelog import RateLimitedLog

from ..route.changelog import ChangelogSetupError, KafkaDedupStore

if TYPE_CHECKING:
    from .._work import PartitionState

_log = logging.getLogger("pipeline.worker.consumer")

KEYS_RETRY_S = 1.0
"""How long after a failed restore of idempotency keys the next one is tried, at first."""
INLINE_WAIT_S = 0.25
"""How long the consumer thread waits for a restore it started before it lets it go on alone."""
KEYS_RETRY_MAX_S = 30.0
"""The longest wait between tries: it doubles from :data:`KEYS_RETRY_S` at each failure."""


class _Run:
    """One restore on its helper thread: the partitions it restores, and how it ends."""

    def __init__(
        self,
        states: Sequence[PartitionState],
        work: Callable[[], None],
        install: Callable[[Sequence[Where]], None],
        cancel: Callable[[], None],
    ) -> None:
        self.states = list(states)
        self.wheres = {(s.topic, s.partition) for s in states}
        self.given_up: set[PartitionState] = set()
        """Those of :attr:`states` given up since it started: once all are, it is cancelled."""
        self.install = install
        """Takes the keys read for the partitions named (on the consumer thread)."""
        self.cancel = cancel
        self.started = time.monotonic()
        self.future: Future[None] = Future()
        thread = threading.Thread(target=self._main, args=(work,), daemon=True)
        thread.name = "pipeline-dedup-restore"
        thread.start()

    def _main(self, work: Callable[[], None]) -> None:
        try:
            work()
        except BaseException as exc:
            self.future.set_exception(exc)
        else:
            self.future.set_result(None)


class KeyLoad:
    """The restores of newly assigned partitions' keys, one at a time on a helper thread.

    ``owned(state)``: whether ``state`` is still the assignment of its partition.
    """

    def __init__(self, dedup: DedupStore, owned: Callable[[PartitionState], bool]) -> None:
        self._dedup = dedup
        self._owned = owned
        self._run: _Run | None = None
        self._ready: set[PartitionState] = set()
        """Partitions whose keys are restored, not handed over yet (see :meth:`done_with`)."""
        self._retry_at = 0.0
        self._delay = KEYS_RETRY_S
        self._warnings = RateLimitedLog(_log, interval_s=60.0)

    def due(self, states: Sequence[PartitionState]) -> bool:
        """Whether :meth:`ready` may change anything for ``states``: not while a restore runs,
        nor between a failed one and the next try, unless some of them are restored."""
        if self._run is not None:
            return self._run.future.done()
        return time.monotonic() >= self._retry_at or any(s in self._ready for s in states)

    @property
    def ended(self) -> bool:
        """Whether a restore ended that :meth:`collect` has not taken yet."""
        return self._run is not None and self._run.future.done()

    def ready(self, states: Sequence[PartitionState]) -> list[PartitionState]:
        """Those of ``states`` whose keys are restored; starts a restore of the others unless
        one runs or waits for its next try (:meth:`collect` first)."""
        now = time.monotonic()
        need = [s for s in states if s not in self._ready]
        if need and self._run is None and now >= self._retry_at:
            self._start(need)
            run = self._run
            if run is not None:
                # Most restores take milliseconds: waited for here, the partitions resume in
                # this turn, as when the restore ran on this thread (a turn later, librdkafka
                # may hold their first fetch back for a second). A longer one goes on alone.
                wait([run.future], timeout=INLINE_WAIT_S)
                self.collect()
        return [s for s in states if s in self._ready]

    def done_with(self, states: Sequence[PartitionState]) -> None:
        """``states`` are read back: forget them here."""
        self._ready.difference_update(states)

    def unload(self, states: Sequence[PartitionState]) -> None:
        """Unload ``states`` (given up), or once the restore running for them has ended."""
        self._ready.difference_update(states)
        wheres = [(s.topic, s.partition) for s in states]
        run = self._run
        if run is not None:
            wheres = [w for w in wheres if w not in run.wheres]
            run.given_up.update(s for s in states if s in run.states)
            if len(run.given_up) == len(run.states):
                # Nothing it reads is wanted now, and the restores of the partitions assigned
                # next wait for it (one runs at a time): the Kafka store's read ends soon.
                run.cancel()
        if wheres:
            self._dedup.unload(wheres)

    def close(self) -> None:
        """The consumer closes: a restore still running is not waited for (the Kafka store's
        ends soon; another store's within its own bounds, on its daemon thread)."""
        if self._run is not None:
            self._run.cancel()
            self._run = None

    def _start(self, states: list[PartitionState]) -> None:
        wheres = [(s.topic, s.partition) for s in states]
        dedup = self._dedup
        if isinstance(dedup, KafkaDedupStore):
            try:
                restoring = dedup.restoring(wheres)  # joins held tables here, on this thread
            except Exception as exc:
                self._failed(states, exc, time.monotonic())
                return
            self._run = _Run(states, restoring.read, restoring.install, restoring.cancel)
        else:
            self._run = _Run(states, lambda: dedup.load(wheres), _nothing, _nothing)

    def collect(self) -> None:
        """Take the keys of a restore that ended, for the partitions still ours, and unload
        the others. Raises :class:`ChangelogSetupError` (the worker stops: nothing to wait
        for)."""
        now = time.monotonic()
        run = self._run
        if run is None or not run.future.done():
            return
        self._run = None
        owned = [s for s in run.states if self._owned(s)]
        gone = [(s.topic, s.partition) for s in run.states if not self._owned(s)]
        try:
            try:
                run.future.result()
            finally:
                if gone:
                    self._dedup.unload(gone)  # deferred from their revocation (see unload)
        except Exception as exc:
            if owned:
                self._failed(run.states, exc, now)
            # else given up whole (cancelled, see unload): no failure, and no wait for the next
            return
        run.install([(s.topic, s.partition) for s in owned])
        self._ready.update(owned)
        self._retry_at, self._delay = 0.0, KEYS_RETRY_S
        seconds = now - run.started
        if seconds >= 1.0:
            _log.info("idempotency keys restored", extra={"seconds": round(seconds, 1)})

    def _failed(self, states: Sequence[PartitionState], exc: Exception, now: float) -> None:
        """A restore failed: tried again after a wait that doubles at each failure."""
        if isinstance(exc, ChangelogSetupError):
            raise exc  # nothing to wait for: the worker stops and says what to create or allow
        self._warnings.warning(
            "keys",
            "could not restore the idempotency keys of %s, retrying in %gs: %s",
            _describe(states),
            self._delay,
            exc,
        )
        self._retry_at = now + self._delay
        self._delay = min(self._delay * 2, KEYS_RETRY_MAX_S)


def _nothing(*_: object) -> None:
    return None


def _describe(states: Sequence[PartitionState]) -> str:
    return ", ".join(f"{s.topic}[{s.partition}]" for s in states)
