"""A live in-memory index of ``<ns>.dlq`` and ``<ns>.dlq-state``, for a dashboard.

Reading both topics to their ends on every request (what ``pipeline dlq`` does) takes seconds
with 100,000 dead letters. :class:`LetterIndex` reads each record once: the first
:meth:`~LetterIndex.refresh` reads everything, each later one only the records committed since
(it keeps its consumer and its positions), and folds them in with :func:`fold_states`.
:meth:`~LetterIndex.query` filters with :class:`LetterFilter` and pages in memory, by count or
from a letter's position.

It keeps a *summary* of each dead letter (see :mod:`._summary`), about 1.7 KB against about
10 KB for the whole letters that ``read_dead_letters`` holds (docs/benchmarks.md has the
figures). :meth:`~LetterIndex.get` reads one whole letter back from ``<ns>.dlq`` by its position.
States are held only for letters on ``<ns>.dlq`` (the compacted ``<ns>.dlq-state`` keeps them
all): a letter below its partition's low watermark (deleted) leaves with its state, and a state
no letter claims is dropped once a later refresh read ``<ns>.dlq`` to its end. A topic deleted
and created again (its id changed, see :mod:`._topicids`, or its offsets went back) is read
again from its start, without what the index held of it.

Threads: one thread refreshes (say, every second, in the background) while any number of
request threads call :meth:`~LetterIndex.query`, :meth:`~LetterIndex.counts`,
:meth:`~LetterIndex.get` and ``len()``. A refresh waits for Kafka without holding the index's
lock and takes it only to fold in what it read, so a query sees each refresh whole or not at all
and never waits for Kafka. Queries hold the lock while they scan. :meth:`~LetterIndex.get`
reads with a second consumer of its own, so it does not wait for a refresh either. What the
methods return are copies: a later refresh does not change them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Literal

from .._codec import DeadLetterCodec
from .._errors import PipelineError
from .._job import now_ms
from .._settings import Settings
from .._topics import TopicNames
from ._filters import LetterFilter
from ._matches import MatchCache
from ._ranges import bounded, where_to_start
from ._reader import _keyed, _Reader, decode_letter
from ._state import (
    DeadLetterSnapshot,
    LetterKey,
    LetterState,
    LetterStatus,
    StoredLetter,
    fold_states,
    letter_order,
)
from ._stats import DlqStats, dlq_stats
from ._summary import SharedStrings, summary_of
from ._topicids import TopicIds, renewed

if TYPE_CHECKING:
    from collections.abc import Iterable

    from confluent_kafka import Message

ALL: Literal["all"] = "all"
"""``status=ALL``: every dead letter, whatever its status."""
INDEX_STEP = 20_000
"""Dead letters one refresh of a reader that goes in steps (the dashboard, the exporter) reads
at most: a deep ``<ns>.dlq`` is read in steps, each kept, each well within a timeout."""
StatusChoice = LetterStatus | Literal["pending", "replayed", "discarded", "all"]
# Read-ahead of the refreshing consumer: enough to keep decoding busy. A bigger one (64 MB by
# default) stays in the process's resident set after the first refresh, freed but not returned.
_PREFETCH_KB = 8192


@dataclass(frozen=True, slots=True)
class LetterPage:
    """One page of a query: the summaries of its letters (see :class:`LetterIndex`), how many
    match in all (for the status asked for), and how many match the filter in each status.
    ``offset``: how many of the letters that match come before this page in its order."""

    letters: list[StoredLetter]
    total: int
    by_status: dict[str, int]
    offset: int
    limit: int

    @property
    def has_previous(self) -> bool:
        """Whether letters that match come before this page in its order."""
        return self.offset > 0

    @property
    def has_next(self) -> bool:
        """Whether letters that match come after this page in its order."""
        return self.offset + len(self.letters) < self.total


@dataclass(frozen=True, slots=True)
class Refreshed:
    """What one :meth:`LetterIndex.refresh` read: new dead letters, state records, records that
    are not dead letters; dead letters and states dropped as retention deleted the letters."""

    letters: int
    states: int
    undecodable: int
    expired: int
    seconds: float
    states_dropped: int = 0


def _status(status: str) -> LetterStatus | None:
    if status == ALL:
        return None
    try:
        return LetterStatus(status)
    except ValueError:
        known = ", ".join([*LetterStatus, ALL])
        raise ValueError(f"unknown status {status!r}; one of {known}") from None


class LetterIndex:
    """``<ns>.dlq`` with the state of each dead letter, in memory, refreshed on demand.

    ``timeout``: the default of :meth:`refresh` and :meth:`get`. Use it as a context manager,
    or call :meth:`close`, to close its Kafka consumers.
    """

    def __init__(self, settings: Settings, *, timeout: float = 30.0) -> None:
        self.settings = settings
        self.timeout = timeout
        self._names = TopicNames(settings.namespace)
        self._codec = DeadLetterCodec()
        self._share = SharedStrings()
        # Guarded by _refresh_lock: the refreshing consumer and where it is.
        self._refresh_lock = threading.Lock()
        self._reader: _Reader | None = _Reader(settings, timeout, prefetch_kb=_PREFETCH_KB)
        self._next: dict[tuple[str, int], int] = {}
        self._low: dict[int, int] = {}
        self._ids = TopicIds(settings)
        self._seen_ids: dict[str, str] = {}  # topic -> its id at the last refresh
        # Guarded by _fetch_lock: the consumer of get().
        self._fetch_lock = threading.Lock()
        self._fetcher: _Reader | None = None
        # Guarded by _lock: what queries read.
        self._lock = threading.Lock()
        self._letters: list[StoredLetter] = []  # oldest first (letter_order)
        self._by_id: dict[str, StoredLetter] = {}
        self._states: dict[str, LetterState] = {}
        # Keys of _states with no letter held, read by an earlier refresh: dropped by the next
        # refresh that reads to the end of <ns>.dlq (their letters, if on it, are then held).
        self._orphans: set[str] = set()
        self._undecodable = 0
        self._refreshed_at: int | None = None
        self._caught_up = False
        self._cache = MatchCache()
        self._closed = False

    @property
    def topic(self) -> str:
        return self._names.dlq

    @property
    def undecodable(self) -> int:
        """Records of ``<ns>.dlq`` read so far that are not dead letters (left out)."""
        return self._undecodable

    @property
    def refreshed_at(self) -> int | None:
        """When the last refresh started reading (epoch ms; what it shows is at least as
        recent), or None before the first one."""
        return self._refreshed_at

    @property
    def caught_up(self) -> bool:
        """Whether the last refresh read to the end of the topics (not stopped by its limit)."""
        return self._caught_up

    def __len__(self) -> int:
        return len(self._letters)

    # --- refreshing ---------------------------------------------------------------------

    def refresh(self, timeout: float | None = None, *, limit: int | None = None) -> Refreshed:
        """Read the records committed since the last refresh (everything the first time) and
        fold them in. Raises :class:`KafkaUnavailableError` when Kafka does not answer within
        ``timeout`` seconds and :class:`ConfigurationError` when the topics do not exist; the
        index is then as it was, and the next refresh reads the same records again.

        ``limit`` bounds the dead letters read by this call (spread over the partitions), so
        that a deep topic is read in steps that each fit a timeout, and queries see the
        letters read so far; :attr:`caught_up` says whether the last refresh reached the end.
        """
        dlq, dlq_state = self._names.dlq, self._names.dlq_state
        with self._refresh_lock:
            reader = self._open_reader()
            began, stamp = time.perf_counter(), now_ms()
            wait = self.timeout if timeout is None else timeout
            reader.restart_clock(wait)
            # Before the offsets: a topic recreated after this is told by the next refresh.
            ids = self._ids.read((dlq, dlq_state), wait)
            changed = renewed(self._seen_ids, ids)
            marks = reader.watermarks(dlq, dlq_state)
            starts, recreated = where_to_start(marks, self._next, self._low, dlq, changed)
            new: list[StoredLetter] = []
            undecodable = 0

            def keep(message: Message) -> bool:
                nonlocal undecodable
                if message.topic() == dlq_state:
                    return True  # state records are small: folded after the read
                letter = decode_letter(self._codec, message)
                if letter is None:
                    undecodable += 1
                else:
                    position = (message.partition() or 0, message.offset() or 0)
                    new.append(StoredLetter(summary_of(letter, self._share), *position))
                return False

            ends = bounded(marks, starts, dlq, limit)
            read = reader.read_ranges((dlq, dlq_state), starts, ends, keep)
            lows = {p: low for (topic, p), (low, _) in marks.items() if topic == dlq}
            with self._lock:
                states_gone = self._forget_states() if dlq_state in changed else 0
                expired, dropped = self._forget(recreated, lows)
                more, dropped_too = self._expire(lows)
                expired, dropped = expired + more, dropped + dropped_too + states_gone
                added, orphans = self._fold(new, read[dlq_state])
                if ends == marks:  # read to the end: older orphans have no letter on the topic
                    dropped += self._drop_states(self._orphans)
                    self._orphans = orphans
                else:
                    self._orphans |= orphans
                self._undecodable += undecodable
                self._refreshed_at = stamp
                if expired or added or dropped or read[dlq_state]:
                    self._cache.clear()
            self._next = {where: high for where, (_, high) in ends.items()}
            self._seen_ids.update(ids)
            self._caught_up = ends == marks
            seconds = time.perf_counter() - began
            return Refreshed(added, len(read[dlq_state]), undecodable, expired, seconds, dropped)

    def _open_reader(self) -> _Reader:
        if self._reader is None:
            raise PipelineError("the dead-letter index is closed")
        return self._reader

    def _forget(self, partitions: set[int], lows: dict[int, int]) -> tuple[int, int]:
        """Drop the letters of ``partitions`` of a topic deleted and created again (and their
        states): how many of each. They are on no topic any more; kept, they were counted,
        listed and offered for replay for good."""
        if not partitions:
            return 0, 0
        for partition in partitions:
            self._low[partition] = lows.get(partition, 0)
        return self._keep(lambda s: s.partition not in partitions)

    def _forget_states(self) -> int:
        """Drop every state, those of a ``<ns>.dlq-state`` deleted and created again (read
        again from its start): how many."""
        for stored in self._letters:
            stored.state = None
        self._orphans.clear()
        dropped = len(self._states)
        self._states.clear()
        return dropped

    def _keep(self, kept_if: Callable[[StoredLetter], bool]) -> tuple[int, int]:
        """Keep the letters ``kept_if`` says, dropping the others and their states: how many
        of each were dropped."""
        kept = [s for s in self._letters if kept_if(s)]
        expired = len(self._letters) - len(kept)
        if not expired:
            return 0, 0
        gone = self._by_id.keys() - {s.letter.id for s in kept}
        self._letters = kept
        self._by_id = {s.letter.id: s for s in kept}
        self._share.clear()  # strings of letters gone are not kept alive
        return expired, self._drop_states(gone)

    def _expire(self, lows: dict[int, int]) -> tuple[int, int]:
        """Drop the letters that retention deleted (below their partition's low watermark),
        and their states: how many of each."""
        moved = {p: low for p, low in lows.items() if low > self._low.get(p, 0)}
        self._low.update(moved)
        if not moved:
            return 0, 0
        return self._keep(lambda s: s.offset >= moved.get(s.partition, 0))

    def _drop_states(self, keys: Iterable[str]) -> int:
        return sum(self._states.pop(key, None) is not None for key in keys)

    def _fold(self, new: list[StoredLetter], records: list[Message]) -> tuple[int, set[str]]:
        """Fold in new letters and state records: how many letters were added, and the keys
        of the states read now that no letter held has (the index's new orphans)."""
        keyed = list(_keyed(records))
        fold_states(keyed, into=self._states)
        orphans: set[str] = set()
        for key in {key for key, _ in keyed}:
            self._orphans.discard(key)
            if (stored := self._by_id.get(key)) is not None:
                stored.state = self._states.get(key)
            elif key in self._states:
                orphans.add(key)  # its letter not read yet, or deleted before it was
        added: list[StoredLetter] = []
        for stored in new:
            if stored.letter.id in self._by_id:  # written twice (a producer's retry)
                continue
            self._orphans.discard(stored.letter.id)
            orphans.discard(stored.letter.id)
            stored.state = self._states.get(stored.letter.id)
            self._by_id[stored.letter.id] = stored
            added.append(stored)
        added.sort(key=letter_order)
        in_order = not self._letters or not added
        in_order = in_order or letter_order(self._letters[-1]) <= letter_order(added[0])
        self._letters += added
        if not in_order:
            self._letters.sort(key=letter_order)  # two sorted runs: merged in linear time
        return len(added), orphans

    # --- reading ------------------------------------------------------------------------

    def query(
        self,
        letter_filter: LetterFilter | None = None,
        *,
        status: StatusChoice = LetterStatus.PENDING,
        offset: int = 0,
        limit: int = 50,
        newest_first: bool = True,
        before: LetterKey | None = None,
        after: LetterKey | None = None,
    ) -> LetterPage:
        """The letters matching ``letter_filter`` in ``status`` (``"all"``: any), sorted by
        ``dead_at`` (:func:`letter_order`, newest first unless told otherwise), from
        ``offset``, at most ``limit``. The letters are summaries (see :class:`LetterIndex`);
        :meth:`get` reads one whole.

        ``before`` (or ``after``), the :func:`letter_order` of a letter (say, the last one a
        page showed), pages by position rather than by count: only the letters strictly older
        (newer) than it, the nearest to it first, ``offset`` counted from it. Paging so shows
        each letter once, however many letters die, or leave the status asked for, between
        two pages; counted offsets shift with them."""
        if offset < 0 or limit < 0:
            raise ValueError(f"offset and limit must not be negative (got {offset}, {limit})")
        if before is not None and after is not None:
            raise ValueError("give before or after, not both")
        wanted = _status(status)
        chosen = letter_filter or LetterFilter()
        with self._lock:
            matches = self._cache.matches(self._letters, chosen, wanted)
            page, ahead = matches.window(
                offset=offset, limit=limit, newest_first=newest_first, before=before, after=after
            )
            letters = [replace(s) for s in page]
            total = len(matches.letters)
            return LetterPage(letters, total, dict(matches.by_status), ahead, limit)

    def stats(self, timeout: float | None = None) -> DlqStats:
        """:func:`dlq_stats` of the letters held (as of the last refresh); ``timeout`` is
        ignored (it makes this a :data:`~pipeline._backlog.DeadLetterCounter`)."""
        with self._lock:
            return dlq_stats(DeadLetterSnapshot(self.topic, self._letters, self._undecodable))

    def counts(self, letter_filter: LetterFilter | None = None) -> dict[str, int]:
        """How many letters match ``letter_filter``, by status (every status named)."""
        with self._lock:
            return dict(
                self._cache.matches(self._letters, letter_filter or LetterFilter(), None).by_status
            )

    def get(self, ident: str, *, timeout: float | None = None) -> StoredLetter:
        """The whole dead letter with id ``ident``, or the only one holding job ``ident``
        (as ``pipeline dlq show``), read back from ``<ns>.dlq``, with its state. Raises
        :class:`DeadLetterNotFoundError` for an unknown or ambiguous id."""
        with self._lock:
            summary = DeadLetterSnapshot(self.topic, self._letters).find(ident)
            partition, offset, state = summary.partition, summary.offset, summary.state
        with self._fetch_lock:
            if self._closed:
                raise PipelineError("the dead-letter index is closed")
            if self._fetcher is None:
                self._fetcher = _Reader(self.settings, self.timeout, prefetch_kb=1024)
            self._fetcher.restart_clock(self.timeout if timeout is None else timeout)
            message = self._fetcher.fetch(self.topic, partition, offset)
        letter = decode_letter(self._codec, message)
        if letter is None or letter.id != summary.letter.id:
            raise PipelineError(f"{self.topic}[{partition}]@{offset} no longer holds {ident}")
        return StoredLetter(letter, partition, offset, state)

    # --- closing ------------------------------------------------------------------------

    def close(self) -> None:
        """Close the Kafka consumers (waits for a refresh or a get under way). Idempotent."""
        with self._refresh_lock:
            self._ids.close()
            if self._reader is not None:
                self._reader.close()
                self._reader = None
        with self._fetch_lock:
            self._closed = True
            if self._fetcher is not None:
                self._fetcher.close()
                self._fetcher = None

    def __enter__(self) -> LetterIndex:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
