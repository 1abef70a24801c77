"""The suite's own clean-up against a real broker: a finished test's namespace topics are
deleted, and no other namespace's."""

from __future__ import annotations

import uuid

from confluent_kafka.admin import AdminClient

from pipeline import Settings
from pipeline._admin import apply_topics
from tests.topicreaper import TopicReaper
from tests.waiting import wait_for


def test_the_topics_of_a_reaped_namespace_are_deleted_and_no_others(
    bootstrap_servers: str,
) -> None:
    reaped, kept = (f"r{uuid.uuid4().hex[:8]}" for _ in range(2))
    # A namespace whose name starts like the reaped one's: only "<namespace>." is its own.
    similar = f"{reaped}x"
    for name in (reaped, kept, similar):
        apply_topics(Settings(bootstrap_servers=bootstrap_servers, namespace=name))
    admin = AdminClient({"bootstrap.servers": bootstrap_servers})

    def topics(name: str) -> set[str]:
        return {t for t in admin.list_topics(timeout=30).topics if t.startswith(f"{name}.")}

    before = {name: topics(name) for name in (reaped, kept, similar)}
    assert all(before.values())
    reaper = TopicReaper(bootstrap_servers)
    try:
        reaper.reap(reaped)
        reaper.close()
        assert reaper.deleted == len(before[reaped])
        assert wait_for(lambda: not topics(reaped), 60), topics(reaped)
        assert topics(kept) == before[kept]
        assert topics(similar) == before[similar]
    finally:
        cleanup = TopicReaper(bootstrap_servers)
        cleanup.reap(kept)
        cleanup.reap(similar)
        cleanup.close()
