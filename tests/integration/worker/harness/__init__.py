"""Helpers for tests that run real ``pipeline-worker`` processes against a real Kafka.

* :class:`Recording` reads what the handlers of ``apps/recording.py`` wrote (one start and one
  end line per run), incrementally, so tests can wait for "N jobs started" without sleeping.
* :class:`WorkerLauncher` starts worker processes with the right environment, captures their
  output for failure messages and kills whatever still runs at teardown.
* :class:`GroupOffsets` reads the worker group's committed offsets and the end offsets without
  joining the group; :class:`CommitAuditor` checks, while workers run, that no committed offset
  ever passes a job that has not finished.
"""

from tests.waiting import wait_for

from .kafka import (
    CommitAuditor,
    GroupOffsets,
    GroupSnapshot,
    auditing,
    describe_group,
    enqueue,
    wait_joined,
)
from .processes import (
    RECORDING_APP,
    REPO_ROOT,
    WorkerLauncher,
    WorkerProcess,
    wait_until,
)
from .runs import Recording, RunEvent, TopicPartitionKey, check_ran

__all__ = [
    "RECORDING_APP",
    "REPO_ROOT",
    "CommitAuditor",
    "GroupOffsets",
    "GroupSnapshot",
    "Recording",
    "RunEvent",
    "TopicPartitionKey",
    "WorkerLauncher",
    "WorkerProcess",
    "auditing",
    "check_ran",
    "describe_group",
    "enqueue",
    "wait_for",
    "wait_joined",
    "wait_until",
]
