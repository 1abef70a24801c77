"""The rebalance benchmark's variants and its pause measure."""

from __future__ import annotations

import json
from typing import Any

from ops.bench.rebalance import VARIANTS, _longest_gap

from pipeline import Settings
from pipeline.dedup import DedupScope
from pipeline_worker.intake.config import consumer_config
from pipeline_worker.intake.groupproto import copartitioning_problem, incremental


def test_the_variants_are_the_protocols_and_assignors_they_name() -> None:
    seen = {}
    for name, env in VARIANTS.items():
        worker: dict[str, Any] = {"group_protocol": env["PIPELINE_WORKER__GROUP_PROTOCOL"]}
        if "PIPELINE_WORKER__KAFKA_CONSUMER" in env:
            worker["kafka_consumer"] = json.loads(env["PIPELINE_WORKER__KAFKA_CONSUMER"])
        if "PIPELINE_WORKER__DEDUP_SCOPE" in env:
            worker["dedup_scope"] = env["PIPELINE_WORKER__DEDUP_SCOPE"]
        settings = Settings(worker=worker)
        conf = consumer_config(settings, "g")
        # A worker would refuse to start otherwise (see intake.groupproto).
        scoped = settings.worker.dedup_scope is DedupScope.PRIORITY
        assert scoped or copartitioning_problem(conf) is None, name
        assignor = conf.get("group.remote.assignor", conf.get("partition.assignment.strategy"))
        seen[name] = (conf["group.protocol"], assignor, not incremental(conf))
    assert seen["classic, cooperative-sticky"] == ("classic", "cooperative-sticky", False)
    assert seen["classic, range"] == ("classic", "range", True)
    assert seen["consumer (KIP-848), range"] == ("consumer", "range", False)


def test_the_longest_gap_counts_from_the_last_start_before_the_window_to_its_end() -> None:
    ms = 1_000_000
    starts = [0, 100 * ms, 150 * ms, 900 * ms, 950 * ms]
    # From 100 ms (the last start before 120 ms) to 150, then 150 to 900: 750 ms.
    assert _longest_gap(starts, 120 * ms, 1000 * ms) == 0.75
    # Nothing started inside: the whole window, from the last start before it.
    assert _longest_gap(starts, 200 * ms, 300 * ms) == 0.15
    assert _longest_gap([], 0, 500 * ms) == 0.5
