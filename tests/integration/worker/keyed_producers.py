"""Producer processes that enqueue every idempotency key several times, interleaved, and what
the recording says of the keys that ran."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .fixtures import WorkerKit

# One producer process: sends copy c of key i when (i * copies + c) % producers is its number,
# at the default priority or (rotate) at priority c % 4; its jobs take max_ms / 2 to max_ms.
PRODUCER = """
import sys
from pipeline import Pipeline, Priority

number, producers, keys, copies = map(int, sys.argv[1:5])
max_ms, rotate = float(sys.argv[5]), sys.argv[6] == "rotate"
priorities = list(Priority)
app = Pipeline()
for copy in range(copies):
    for i in range(keys):
        if (i * copies + copy) % producers == number:
            payload = {"n": i, "min_ms": max_ms / 2, "max_ms": max_ms}
            options = {"priority": priorities[copy % len(priorities)]} if rotate else {}
            app.enqueue("sleepy", payload, idempotency_key=f"order-{i}", **options)
app.flush(60)
app.close(30)
"""


def start_producers(
    kit: WorkerKit, *, producers: int, keys: int, copies: int, max_ms: float, rotate: bool = False
) -> list[subprocess.Popen[bytes]]:
    """``producers`` processes that send every key ``copies`` times between them (``rotate``:
    copy c at priority c % 4, so each producer sends each key at every priority)."""
    env = kit.workers.environment()
    args = [str(producers), str(keys), str(copies), str(max_ms), "rotate" if rotate else "one"]
    return [
        subprocess.Popen([sys.executable, "-c", PRODUCER, str(n), *args], env=env)
        for n in range(producers)
    ]


def runs_by_key(kit: WorkerKit) -> Counter[int]:
    """How often each key's ``sleepy`` job started."""
    return Counter(e.n for e in kit.recording.starts("sleepy"))


def keys_ran(kit: WorkerKit, keys: int) -> bool:
    """Whether at least ``keys`` distinct keys started."""
    return len(runs_by_key(kit)) >= keys
