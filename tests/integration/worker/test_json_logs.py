"""``PIPELINE_LOG_FORMAT=json``: a real worker writes nothing but JSON objects, one per line."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import pytest

from .harness import enqueue

if TYPE_CHECKING:
    from .fixtures import WorkerKit

pytestmark = pytest.mark.kafka


def test_every_line_of_a_json_logging_worker_is_one_object(kit: WorkerKit) -> None:
    ids = enqueue(kit.producer, "noop", 20)
    doomed = enqueue(kit.producer, "doomed", 1, first=100, fields={"fatal": True})
    worker = kit.workers.start(
        "--burst", "--log-level", "DEBUG", env={"PIPELINE_LOG_FORMAT": "json"}
    )
    assert worker.wait(timeout=120) == 0, worker.log_tail()
    runs = kit.recording.run_counts()
    assert {job_id: runs.get(job_id) for job_id in ids + doomed} == dict.fromkeys(ids + doomed, 1)

    lines = [line for line in worker.log().splitlines() if line.strip()]
    assert len(lines) > 5, worker.log_tail()
    entries = []
    for line in lines:
        entry = json.loads(line)  # a traceback printed outside a line fails here
        assert isinstance(entry, dict), line
        assert {"time", "level", "logger", "pid", "message"} <= entry.keys(), line
        entries.append(entry)
    # The dead job's traceback travels inside its line, with the job's fields beside it.
    [failed] = [e for e in entries if "UnrecoverableError" in str(e.get("exception", ""))]
    assert failed["exception"].startswith("Traceback (most recent call last):")
    assert doomed[0] in json.dumps(failed)
    assert any(e["level"] == "INFO" and e["logger"].startswith("pipeline") for e in entries)
