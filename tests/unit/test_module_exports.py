"""The public surfaces of ``pipeline.testing``, ``pipeline.dedup`` and ``pipeline.outbox`` are their
``__all__``: pinned.

A change here is a change to the contract other people build against (DESIGN section 9): add
names deliberately, and never remove or rename one without a deprecation in the changelog.
Besides the pin, each module must not leak a name of this package it does not export: a public
module-level name missing from ``__all__`` is an imported module, a name from outside the
package (``dataclass``, ``KafkaError``), or a name ``pipeline`` itself already exports.
"""

from __future__ import annotations

import types

import pytest

import pipeline
import pipeline.dedup
import pipeline.outbox
import pipeline.testing

TESTING = {
    "DeadLetterReason",
    "DrainReport",
    "FakeClock",
    "InMemoryTransport",
    "JobResult",
    "JobStatus",
    "SentMessage",
    "StubWorker",
    "run_job",
    "run_job_async",
    "stub_worker",
}

DEDUP = {
    "ChangelogRecord",
    "DedupMode",
    "DedupPolicy",
    "DedupScope",
    "DedupStore",
    "DedupTable",
    "KeyOutcome",
    "MemoryDedupStore",
    "PartitionTables",
    "Verdict",
}

OUTBOX = {
    "DEFAULT_TABLE",
    "DatabaseUnavailableError",
    "Outbox",
    "OutboxRelay",
    "OutboxStatus",
    "RelayOptions",
    "connect",
    "create_table",
    "outbox_status",
    "relay_transactional_id",
}

MODULES = [(pipeline.testing, TESTING), (pipeline.dedup, DEDUP), (pipeline.outbox, OUTBOX)]
IDS = [module.__name__ for module, _ in MODULES]


@pytest.mark.parametrize(("module", "public"), MODULES, ids=IDS)
def test_all_is_pinned(module: types.ModuleType, public: set[str]) -> None:
    assert set(module.__all__) == public
    assert len(module.__all__) == len(public), "no duplicates in __all__"


@pytest.mark.parametrize(("module", "public"), MODULES, ids=IDS)
def test_every_exported_name_exists(module: types.ModuleType, public: set[str]) -> None:
    for name in module.__all__:
        assert getattr(module, name) is not None, name


def _defined_in_this_package(value: object) -> bool:
    owner = getattr(value, "__module__", None)
    return isinstance(owner, str) and (owner == "pipeline" or owner.startswith("pipeline."))


@pytest.mark.parametrize(("module", "public"), MODULES, ids=IDS)
def test_no_public_name_is_left_out_of_all(module: types.ModuleType, public: set[str]) -> None:
    names = {name: value for name, value in vars(module).items() if not name.startswith("_")}
    leaked = {
        name
        for name, value in names.items()
        if name not in module.__all__
        and not isinstance(value, types.ModuleType)
        and _defined_in_this_package(value)
        and name not in pipeline.__all__
    }
    assert leaked == set(), f"export these from {module.__name__}.__all__ or rename them private"


def test_the_dedup_exports_are_the_classes_the_library_uses() -> None:
    from pipeline._dedup import KeyOutcome
    from pipeline._dedupstores import DedupStore, MemoryDedupStore

    assert pipeline.dedup.KeyOutcome is KeyOutcome
    assert pipeline.dedup.DedupStore is DedupStore
    assert pipeline.dedup.MemoryDedupStore is MemoryDedupStore


def test_the_old_dedup_outcome_name_still_works_with_a_deprecation_warning() -> None:
    with pytest.warns(DeprecationWarning, match="KeyOutcome"):
        old = pipeline.dedup.Outcome
    assert old is pipeline.dedup.KeyOutcome


def test_an_unknown_dedup_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="NoSuchName"):
        pipeline.dedup.NoSuchName  # noqa: B018
