"""Idempotency keys: verdicts, modes, expiry, the changelog codec, and the stores' restore."""

from __future__ import annotations

import json
import logging
import random
from collections import deque
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from pipeline._dedup import (
    UNCHANGED,
    ChangelogRecord,
    DedupMode,
    DedupNotLoadedError,
    DedupPolicy,
    DedupScope,
    Entry,
    KeyOutcome,
    Verdict,
    changelog_key,
    decode_entry,
    encode_entry,
    split_changelog_key,
    topic_priority,
)
from pipeline._dedupstores import DedupStore, MemoryDedupStore, PartitionTables
from pipeline._deduptable import DedupTable, restore_record
from pipeline._errors import ConfigurationError
from pipeline_worker.route.changelog import (
    DedupRestoreError,
    DedupRestoreTimeoutError,
    KafkaDedupStore,
)

JOB_A = "0190f5c2a1b2c3d4e5f60718293a4b5c"
JOB_B = "0190f5c2a1b2c3d4e5f60718293a4b5d"
HOUR_MS = 3_600_000
COMPLETE = DedupPolicy(DedupMode.UNTIL_COMPLETE, ttl_s=10)
TTL = DedupPolicy(DedupMode.UNTIL_TTL, ttl_s=10)
HIGH_0 = ("ns.jobs.high", 0)


# --- policy --------------------------------------------------------------------------------


def test_policy_defaults_to_until_complete_for_an_hour() -> None:
    policy = DedupPolicy()
    assert policy.mode is DedupMode.UNTIL_COMPLETE
    assert policy.ttl_ms == HOUR_MS


def test_policy_takes_a_mode_by_name() -> None:
    assert DedupPolicy("until_ttl", 1.5).mode is DedupMode.UNTIL_TTL  # type: ignore[arg-type]
    assert DedupPolicy(ttl_s=1.5).ttl_ms == 1500


@pytest.mark.parametrize("ttl_s", [0, -1, float("nan"), float("inf"), 1e16])
def test_policy_refuses_a_ttl_that_is_not_positive_and_finite(ttl_s: float) -> None:
    with pytest.raises(ConfigurationError, match="ttl_s must be positive and finite"):
        DedupPolicy(ttl_s=ttl_s)


def test_policy_names_the_modes_when_given_an_unknown_one() -> None:
    with pytest.raises(ConfigurationError, match="until_complete, until_ttl"):
        DedupPolicy("forever")  # type: ignore[arg-type]


# --- verdicts ------------------------------------------------------------------------------


def test_a_new_key_runs_and_is_claimed_pending_for_the_ttl() -> None:
    table = DedupTable()
    assert table.check("order-1", JOB_A, 1_000, 10_000) is Verdict.RUN
    assert table.get("order-1") == Entry(JOB_A, False, 11_000)
    assert len(table) == 1


def test_another_job_with_a_held_key_is_a_duplicate() -> None:
    table = DedupTable()
    table.check("order-1", JOB_A, 1_000, 10_000)
    assert table.check("order-1", JOB_B, 2_000, 10_000) is Verdict.DUPLICATE
    assert table.get("order-1") == Entry(JOB_A, False, 11_000)


def test_the_same_job_pending_is_a_retry_and_keeps_its_claim() -> None:
    table = DedupTable()
    table.check("order-1", JOB_A, 1_000, 10_000)
    assert table.check("order-1", JOB_A, 5_000, 10_000) is Verdict.RETRY
    assert table.get("order-1") == Entry(JOB_A, False, 11_000)


def test_the_same_job_completed_is_done() -> None:
    table = DedupTable()
    table.check("order-1", JOB_A, 1_000, 10_000)
    table.settle("order-1", JOB_A, KeyOutcome.SUCCEEDED, COMPLETE, 2_000)
    assert table.check("order-1", JOB_A, 3_000, 10_000) is Verdict.DONE


def test_an_expired_entry_counts_as_absent_from_its_expiry_on() -> None:
    table = DedupTable()
    table.check("order-1", JOB_A, 0, 10_000)
    assert table.check("order-1", JOB_B, 9_999, 10_000) is Verdict.DUPLICATE
    assert table.check("order-1", JOB_B, 10_000, 10_000) is Verdict.RUN
    assert table.get("order-1") == Entry(JOB_B, False, 20_000)


def test_the_same_job_after_its_entry_expired_claims_the_key_again() -> None:
    table = DedupTable()
    table.check("order-1", JOB_A, 0, 10_000)
    assert table.check("order-1", JOB_A, 10_000, 10_000) is Verdict.RUN
    assert table.get("order-1") == Entry(JOB_A, False, 20_000)


@pytest.mark.parametrize(
    "other",
    [
        JOB_A.upper(),  # not the canonical hex form: a different id
        "0190f5c2-a1b2-c3d4-e5f6-0718293a4b5c",
        JOB_A[:-1],
        "",
    ],
)
def test_job_ids_are_compared_exactly_whatever_their_form(other: str) -> None:
    table = DedupTable()
    table.check("k", JOB_A, 0, 10_000)
    assert table.check("k", other, 1, 10_000) is Verdict.DUPLICATE
    table.check("k2", other, 0, 10_000)
    assert table.check("k2", other, 1, 10_000) is Verdict.RETRY
    assert table.check("k2", JOB_A, 1, 10_000) is Verdict.DUPLICATE
    assert table.get("k2") == Entry(other, False, 10_000)


@pytest.mark.parametrize("job_id", ["job-é-\u2603", "a" * 200, "\udcff-lone-surrogate"])
def test_any_job_id_round_trips_through_the_table(job_id: str) -> None:
    table = DedupTable()
    table.put("k", Entry(job_id, True, 5_000), 0)
    assert table.get("k") == Entry(job_id, True, 5_000)
    assert table.check("k", job_id, 1, 10_000) is Verdict.DONE


# --- settle: every mode and outcome --------------------------------------------------------


def claimed(policy: DedupPolicy, now_ms: int = 1_000) -> DedupTable:
    table = DedupTable()
    assert table.check("order-1", JOB_A, now_ms, policy.ttl_ms) is Verdict.RUN
    return table


def test_until_complete_success_completes_the_key_for_ttl_after_completion() -> None:
    table = claimed(COMPLETE)
    value = table.settle("order-1", JOB_A, KeyOutcome.SUCCEEDED, COMPLETE, 8_000)
    assert value == b'{"j":"%s","c":1,"x":18000}' % JOB_A.encode()
    assert table.get("order-1") == Entry(JOB_A, True, 18_000)
    assert table.check("order-1", JOB_B, 17_999, COMPLETE.ttl_ms) is Verdict.DUPLICATE
    assert table.check("order-1", JOB_B, 18_000, COMPLETE.ttl_ms) is Verdict.RUN


def test_until_complete_retrying_keeps_the_key_pending_and_renews_the_hold() -> None:
    table = claimed(COMPLETE)
    value = table.settle("order-1", JOB_A, KeyOutcome.RETRYING, COMPLETE, 8_000)
    assert value == encode_entry(JOB_A, False, 18_000)
    assert table.get("order-1") == Entry(JOB_A, False, 18_000)
    assert table.check("order-1", JOB_B, 12_000, COMPLETE.ttl_ms) is Verdict.DUPLICATE
    assert table.check("order-1", JOB_A, 12_000, COMPLETE.ttl_ms) is Verdict.RETRY


def test_until_complete_dead_letter_releases_the_key() -> None:
    table = claimed(COMPLETE)
    assert table.settle("order-1", JOB_A, KeyOutcome.DEAD, COMPLETE, 8_000) is None
    assert table.get("order-1") is None
    assert len(table) == 0
    assert table.check("order-1", JOB_B, 8_001, COMPLETE.ttl_ms) is Verdict.RUN


def test_until_ttl_success_completes_the_key_until_ttl_after_the_first_run() -> None:
    table = claimed(TTL)
    value = table.settle("order-1", JOB_A, KeyOutcome.SUCCEEDED, TTL, 8_000)
    assert value == encode_entry(JOB_A, True, 11_000)
    assert table.get("order-1") == Entry(JOB_A, True, 11_000)
    assert table.check("order-1", JOB_B, 11_000, TTL.ttl_ms) is Verdict.RUN


@pytest.mark.parametrize("outcome", [KeyOutcome.RETRYING, KeyOutcome.DEAD])
def test_until_ttl_holds_the_key_pending_until_ttl_whatever_the_failure(
    outcome: KeyOutcome,
) -> None:
    table = claimed(TTL)
    assert table.settle("order-1", JOB_A, outcome, TTL, 8_000) == encode_entry(JOB_A, False, 11_000)
    assert table.get("order-1") == Entry(JOB_A, False, 11_000)
    assert table.check("order-1", JOB_B, 10_999, TTL.ttl_ms) is Verdict.DUPLICATE
    assert table.check("order-1", JOB_B, 11_000, TTL.ttl_ms) is Verdict.RUN


def test_until_ttl_retries_never_move_the_expiry() -> None:
    table = claimed(TTL)
    table.settle("order-1", JOB_A, KeyOutcome.RETRYING, TTL, 4_000)
    assert table.check("order-1", JOB_A, 5_000, TTL.ttl_ms) is Verdict.RETRY
    table.settle("order-1", JOB_A, KeyOutcome.RETRYING, TTL, 9_000)
    assert table.get("order-1") == Entry(JOB_A, False, 11_000)
    assert table.expire(11_000) == ["order-1"]


@pytest.mark.parametrize("policy", [COMPLETE, TTL])
@pytest.mark.parametrize("outcome", list(KeyOutcome))
def test_only_the_job_holding_the_key_changes_it(policy: DedupPolicy, outcome: KeyOutcome) -> None:
    table = claimed(policy)
    assert table.settle("order-1", JOB_B, outcome, policy, 2_000) is UNCHANGED
    assert table.settle("other", JOB_A, outcome, policy, 2_000) is UNCHANGED
    assert table.get("order-1") == Entry(JOB_A, False, 11_000)
    assert table.get("other") is None


@pytest.mark.parametrize("policy", [COMPLETE, TTL])
@pytest.mark.parametrize("outcome", list(KeyOutcome))
def test_a_completed_entry_is_final(policy: DedupPolicy, outcome: KeyOutcome) -> None:
    table = claimed(policy)
    table.settle("order-1", JOB_A, KeyOutcome.SUCCEEDED, policy, 2_000)
    before = table.get("order-1")
    assert table.settle("order-1", JOB_A, outcome, policy, 3_000) is UNCHANGED
    assert table.get("order-1") == before


def test_settling_an_expired_claim_changes_nothing() -> None:
    table = claimed(COMPLETE)
    assert table.settle("order-1", JOB_A, KeyOutcome.SUCCEEDED, COMPLETE, 11_000) is UNCHANGED
    assert table.get("order-1") == Entry(JOB_A, False, 11_000)


# --- put, remove, expire -------------------------------------------------------------------


def test_put_sets_an_entry_and_an_expired_one_removes_the_key() -> None:
    table = DedupTable()
    table.put("k", Entry(JOB_A, False, 5_000), 1_000)
    table.put("k", Entry(JOB_B, True, 9_000), 1_000)
    assert table.get("k") == Entry(JOB_B, True, 9_000)
    table.put("k", Entry(JOB_A, True, 1_000), 1_000)
    assert table.get("k") is None
    table.put("gone", Entry(JOB_A, True, 999), 1_000)
    assert len(table) == 0
    assert table.expire(10_000) == []


def test_remove_forgets_a_key_and_its_expiry() -> None:
    table = DedupTable()
    table.check("k", JOB_A, 0, 1_000)
    assert table.remove("k")
    assert not table.remove("k")
    assert table.expire(5_000) == []


def test_expire_returns_keys_in_expiry_order_across_ttls() -> None:
    table = DedupTable()
    table.check("long", JOB_A, 0, 60_000)
    table.check("short", JOB_A, 0, 1_000)
    table.check("middle", JOB_A, 0, 30_000)
    table.check("short-late", JOB_A, 500, 1_000)
    assert table.expire(999) == []
    assert table.expire(1_000) == ["short"]
    assert table.expire(1_499) == []
    assert table.expire(30_000) == ["short-late", "middle"]
    assert len(table) == 1
    assert table.expire(10**12) == ["long"]
    assert len(table) == 0


def test_a_renewed_entry_expires_once_at_its_new_expiry() -> None:
    table = DedupTable()
    table.check("k", JOB_A, 0, 3_000)  # listed in bucket 3
    table.settle("k", JOB_A, KeyOutcome.RETRYING, DedupPolicy(ttl_s=3), 2_500)  # bucket 5
    table.settle("k", JOB_A, KeyOutcome.RETRYING, DedupPolicy(ttl_s=3), 2_600)  # bucket 5 again
    assert table.expire(5_000) == []
    assert table.get("k") == Entry(JOB_A, False, 5_600)
    assert table.expire(5_599) == []
    assert table.expire(5_600) == ["k"]
    assert table.expire(10**9) == []


def test_an_expired_entry_claimed_again_is_not_expired_by_its_old_listing() -> None:
    table = DedupTable()
    table.check("k", JOB_A, 0, 1_000)
    assert table.check("k", JOB_B, 1_500, 1_000) is Verdict.RUN
    assert table.expire(2_000) == []
    assert table.expire(2_500) == ["k"]


def test_restored_entries_expire_in_order_whatever_the_order_they_came_in() -> None:
    table = DedupTable()
    expiries = list(range(1_000, 101_000, 1_000))
    random.Random(7).shuffle(expiries)
    for expires in expiries:
        table.put(f"k{expires}", Entry(JOB_A, True, expires), 0)
    assert table.expire(50_500) == [f"k{e}" for e in range(1_000, 51_000, 1_000)]
    assert len(table) == 50


def test_expiry_matches_a_model_under_random_operations() -> None:
    rand = random.Random(2024)
    table = DedupTable()
    model: dict[str, int] = {}
    now = 0
    for _ in range(20_000):
        now += rand.choice((0, 1, 7, 250, 999))
        key = f"k{rand.randrange(300)}"
        op = rand.random()
        if op < 0.4:
            ttl = rand.choice((1, 500, 1_000, 2_500, 60_000))
            job = rand.choice((JOB_A, JOB_B))
            verdict = table.check(key, job, now, ttl)
            if key not in model or model[key] <= now:
                assert verdict is Verdict.RUN
                model[key] = now + ttl
            else:
                assert verdict is not Verdict.RUN
        elif op < 0.6:
            expires = now + rand.randrange(-2_000, 90_000)
            table.put(key, Entry(JOB_A, False, expires), now)
            if expires > now:
                model[key] = expires
            else:
                model.pop(key, None)
        elif op < 0.65:
            assert table.remove(key) == (model.pop(key, None) is not None)
        else:
            due = sorted(k for k, e in model.items() if e <= now)
            assert sorted(table.expire(now)) == due
            for k in due:
                del model[k]
        assert len(table) == len(model)


# --- codec ---------------------------------------------------------------------------------


def test_changelog_keys_are_priority_slash_key_in_utf8() -> None:
    assert changelog_key("high", "order/1é") == b"high/order/1\xc3\xa9"
    assert split_changelog_key(b"high/order/1\xc3\xa9") == ("high", "order/1é")
    assert split_changelog_key(b"low/") == ("low", "")


@pytest.mark.parametrize("raw", [b"high", b"/order-1", b"", b"\xff/k", b"high\xff/k"])
def test_split_changelog_key_refuses_what_is_not_one(raw: bytes) -> None:
    with pytest.raises(ValueError, match="changelog key"):
        split_changelog_key(raw)


@pytest.mark.parametrize("priority", ["", "a/b"])
def test_changelog_key_refuses_a_priority_it_could_not_split(priority: str) -> None:
    with pytest.raises(ValueError, match="priority"):
        changelog_key(priority, "k")


def test_entries_encode_as_compact_json() -> None:
    assert encode_entry("abc", True, 123) == b'{"j":"abc","c":1,"x":123}'
    assert encode_entry("abc", False, 123) == b'{"j":"abc","c":0,"x":123}'
    assert decode_entry(b'{"j":"abc","c":1,"x":123}') == Entry("abc", True, 123)
    assert decode_entry(b'{"x":5,"j":"\\u00e9","c":0,"future":[]}') == Entry("é", False, 5)
    for entry in (Entry(JOB_A, True, 1_700_000_000_000), Entry("é\u2603", False, 0)):
        assert decode_entry(encode_entry(entry.job_id, entry.completed, entry.expires_at_ms)) == (
            entry
        )


@pytest.mark.parametrize(
    "job_id",
    [JOB_A, "", "abc", 'a"b', "a\\b", "a/b", "\x00", "\x1f", "\x7f", " ~", "é", "\u2028", "\udcff"],
)
def test_entries_encode_as_json_dumps_does_whatever_the_job_id(job_id: str) -> None:
    for completed in (True, False):
        for expires in (0, -5, 1_700_000_000_000):
            assert (
                encode_entry(job_id, completed, expires)
                == json.dumps(
                    {"j": job_id, "c": int(completed), "x": expires}, separators=(",", ":")
                ).encode()
            )


def test_every_character_encodes_as_json_dumps_writes_it() -> None:
    for code in range(0x800):
        job_id = f"a{chr(code)}b"
        assert (
            encode_entry(job_id, True, 7)
            == json.dumps({"j": job_id, "c": 1, "x": 7}, separators=(",", ":")).encode()
        )


@pytest.mark.parametrize(
    "raw",
    [
        encode_entry(JOB_A, True, 9_000),
        encode_entry(JOB_A, False, 9_000),
        encode_entry(JOB_A, True, 500),  # expired at restore
        encode_entry(JOB_A, True, -1),
        encode_entry(JOB_A.upper(), True, 9_000),
        encode_entry("job-é", False, 9_000),
        b'{"x":9000,"j":"' + JOB_A.encode() + b'","c":1}',
        b'{"j":"' + JOB_A.encode() + b'","c":1,"x":09000}',
        b'{"j":"' + JOB_A.encode() + b'","c":1,"x":9000.0}',
        b'{"j":"' + JOB_A.encode() + b'","c":1,"x":9000} ',
        b'{"j":"' + JOB_A.encode() + b'","c":2,"x":9000}',
        b'{"j":"' + JOB_A.encode()[:-1] + b'","c":1,"x":9000}',
        b"{}",
        b"\xff",
    ],
)
def test_restore_of_a_changelog_value_is_put_of_its_decoded_entry(raw: bytes) -> None:
    def fold(table: DedupTable, how: str) -> tuple[Any, ...]:
        table.check("held", JOB_B, 0, 3_000)
        try:
            if how == "restore":
                table.restore("k", raw, 1_000)
                table.restore("held", raw, 1_000)
            else:
                table.put("k", decode_entry(raw), 1_000)
                table.put("held", decode_entry(raw), 1_000)
        except ValueError:
            return ("refused",)
        return table.get("k"), table.get("held"), len(table), table.expire(20_000)

    assert fold(DedupTable(), "restore") == fold(DedupTable(), "put")


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"\xff\xfe",
        b"not json",
        b"[]",
        b'"text"',
        b'{"j":"a","c":1}',
        b'{"j":1,"c":1,"x":5}',
        b'{"j":"a","c":2,"x":5}',
        b'{"j":"a","c":true,"x":5}',
        b'{"j":"a","c":1,"x":"5"}',
        b'{"j":"a","c":1,"x":5.5}',
        b'{"j":"a","c":1,"x":false}',
        b'{"j":"a","c":1,"x":2305843009213693952}',  # past what an entry holds (2**61)
        b'{"j":"a","c":1,"x":' + b"[" * 100_000 + b"]" * 100_000 + b"}",  # too deep for json
    ],
)
def test_decode_entry_refuses_what_is_not_an_entry(raw: bytes) -> None:
    with pytest.raises(ValueError, match="changelog value"):
        decode_entry(raw)


def test_the_priority_of_a_topic_is_its_last_part() -> None:
    assert topic_priority("ns.jobs.high") == "high"
    assert topic_priority("a.b.c.jobs.low") == "low"


def test_restore_record_folds_into_the_table_of_its_priority() -> None:
    high, low = DedupTable(), DedupTable()
    tables = {"high": high, "low": low}
    assert restore_record(tables, b"high/k", encode_entry(JOB_A, True, 9_000), 1_000)
    assert not restore_record(tables, b"default/k", encode_entry(JOB_A, True, 9_000), 1_000)
    assert high.get("k") == Entry(JOB_A, True, 9_000)
    assert low.get("k") is None
    assert restore_record(tables, b"high/k", None, 1_000)
    assert high.get("k") is None
    with pytest.raises(ValueError, match="without a key"):
        restore_record(tables, None, None, 1_000)
    with pytest.raises(ValueError, match="changelog value"):
        restore_record(tables, b"low/k", b"{}", 1_000)
    # A value as the worker writes them, but for its expiry: refused (the restore counts and
    # skips it) rather than an error that stopped every partition of the load.
    past = b'{"j":"' + JOB_A.encode() + b'","c":1,"x":2305843009213693952}'
    with pytest.raises(ValueError, match="out of range"):
        restore_record(tables, b"low/k", past, 1_000)


# --- stores --------------------------------------------------------------------------------


def test_partition_tables_turn_changes_into_changelog_records() -> None:
    tables = PartitionTables(scope=DedupScope.PRIORITY)
    with pytest.raises(DedupNotLoadedError, match=r"ns\.jobs\.high\[0\] is not loaded"):
        tables.check(HIGH_0, "k", JOB_A, policy=COMPLETE, now_ms=0)
    tables.install(HIGH_0, DedupTable())
    tables.install(("ns.jobs.low", 3), DedupTable())
    assert tables.check(HIGH_0, "k", JOB_A, policy=COMPLETE, now_ms=0) is Verdict.RUN
    assert tables.settle(HIGH_0, "k", JOB_B, KeyOutcome.SUCCEEDED, policy=COMPLETE, now_ms=1) == ()
    assert tables.settle(HIGH_0, "k", JOB_A, KeyOutcome.SUCCEEDED, policy=COMPLETE, now_ms=1) == (
        ChangelogRecord(0, b"high/k", encode_entry(JOB_A, True, 10_001)),
    )
    tables.check(("ns.jobs.low", 3), "k", JOB_B, policy=COMPLETE, now_ms=0)
    assert tables.settle(
        ("ns.jobs.low", 3), "k", JOB_B, KeyOutcome.DEAD, policy=COMPLETE, now_ms=1
    ) == (ChangelogRecord(3, b"low/k", None),)
    tables.check(("ns.jobs.low", 3), "j", JOB_B, policy=COMPLETE, now_ms=0)
    assert tables.expire(10_000) == [ChangelogRecord(3, b"low/j", None)]
    assert tables.expire(10_001) == [ChangelogRecord(0, b"high/k", None)]
    tables.drop(HIGH_0)
    with pytest.raises(DedupNotLoadedError):
        tables.table(HIGH_0)


def test_under_the_namespace_scope_partition_p_of_every_priority_shares_one_table() -> None:
    tables = PartitionTables()
    high, low, low_1 = HIGH_0, ("ns.jobs.low", 0), ("ns.jobs.low", 1)
    tables.install(high, DedupTable())
    assert tables.join(low)
    assert not tables.join(low_1), "partition 1 has no table yet"
    tables.install(low_1, DedupTable())
    assert tables.check(high, "k", JOB_A, policy=COMPLETE, now_ms=0) is Verdict.RUN
    assert tables.check(low, "k", JOB_B, policy=COMPLETE, now_ms=0) is Verdict.DUPLICATE
    assert tables.check(low_1, "k", JOB_B, policy=COMPLETE, now_ms=0) is Verdict.RUN
    assert tables.settle(low, "k", JOB_A, KeyOutcome.SUCCEEDED, policy=COMPLETE, now_ms=1) == (
        ChangelogRecord(0, b"*/k", encode_entry(JOB_A, True, 10_001)),
    )
    assert tables.expire(10_001) == [
        ChangelogRecord(0, b"*/k", None),
        ChangelogRecord(1, b"*/k", None),
    ]
    tables.drop(high)
    assert tables.check(low, "j", JOB_A, policy=COMPLETE, now_ms=0) is Verdict.RUN
    tables.drop(low)
    with pytest.raises(DedupNotLoadedError):
        tables.table(low)
    with pytest.raises(DedupNotLoadedError):
        tables.table(high)


def test_checks_see_the_table_installed_last_and_none_once_it_is_dropped() -> None:
    """The tables remember which table a partition's checks use: a table installed again (a
    new restore) or dropped must not leave them on the old one."""
    tables = PartitionTables()
    tables.install(HIGH_0, DedupTable())
    assert tables.check(HIGH_0, "k", JOB_A, policy=COMPLETE, now_ms=0) is Verdict.RUN
    assert tables.check(HIGH_0, "k", JOB_B, policy=COMPLETE, now_ms=0) is Verdict.DUPLICATE
    tables.install(HIGH_0, DedupTable())  # restored afresh: the claim is not in it
    assert tables.check(HIGH_0, "k", JOB_B, policy=COMPLETE, now_ms=0) is Verdict.RUN
    assert tables.settle(HIGH_0, "k", JOB_B, KeyOutcome.SUCCEEDED, policy=COMPLETE, now_ms=1)
    tables.drop(HIGH_0)
    with pytest.raises(DedupNotLoadedError):
        tables.check(HIGH_0, "k", JOB_A, policy=COMPLETE, now_ms=2)
    with pytest.raises(DedupNotLoadedError):
        tables.settle(HIGH_0, "k", JOB_B, KeyOutcome.SUCCEEDED, policy=COMPLETE, now_ms=2)


def test_restore_record_reads_the_records_of_either_scope() -> None:
    shared = DedupTable()
    assert restore_record({"*": shared}, b"*/k", encode_entry(JOB_A, False, 9_000), 1_000)
    # A record of the per-priority scope (before an upgrade) counts for every priority.
    assert restore_record({"*": shared}, b"low/j", encode_entry(JOB_B, True, 9_000), 1_000)
    assert shared.get("k") == Entry(JOB_A, False, 9_000)
    assert shared.get("j") == Entry(JOB_B, True, 9_000)
    high, low = DedupTable(), DedupTable()
    assert restore_record({"high": high, "low": low}, b"*/k", encode_entry(JOB_A, True, 9_000), 0)
    assert high.get("k") == low.get("k") == Entry(JOB_A, True, 9_000)
    assert restore_record({"high": high, "low": low}, b"*/k", None, 0)
    assert high.get("k") is None
    assert low.get("k") is None


def test_memory_store_keeps_its_state_across_load_and_unload_and_writes_no_changelog() -> None:
    store = MemoryDedupStore(scope=DedupScope.PRIORITY)
    assert isinstance(store, DedupStore)
    store.load([HIGH_0])
    assert store.check(HIGH_0, "k", JOB_A, policy=COMPLETE, now_ms=0) is Verdict.RUN
    assert store.check(HIGH_0, "k", JOB_B, policy=COMPLETE, now_ms=1) is Verdict.DUPLICATE
    assert store.settle(HIGH_0, "k", JOB_A, KeyOutcome.SUCCEEDED, policy=COMPLETE, now_ms=2) == ()
    store.unload([HIGH_0])
    store.load([HIGH_0])
    assert store.check(HIGH_0, "k", JOB_A, policy=COMPLETE, now_ms=3) is Verdict.DONE
    assert store.check(("ns.jobs.low", 0), "k", JOB_B, policy=COMPLETE, now_ms=3) is Verdict.RUN
    assert store.size == 2
    assert list(store.expire(10_002)) == []
    assert store.size == 1
    assert store.table(HIGH_0).get("k") is None
    assert len(store.table(("ns.jobs.low", 0))) == 1
    shared = MemoryDedupStore()
    assert shared.check(HIGH_0, "k", JOB_A, policy=COMPLETE, now_ms=0) is Verdict.RUN
    assert shared.check(("ns.jobs.low", 0), "k", JOB_B, policy=COMPLETE, now_ms=0) is (
        Verdict.DUPLICATE
    ), "the namespace scope (the default) holds a key for every priority"


# --- the Kafka store's restore, against a fake consumer ------------------------------------

CHANGELOG = "ns.dedup"
NOW = 1_000_000


class FakeMessage:
    def __init__(
        self,
        partition: int,
        offset: int,
        key: bytes | None = None,
        value: bytes | None = None,
        error: KafkaError | None = None,
    ) -> None:
        self._partition, self._offset, self._key, self._value = partition, offset, key, value
        self._error = error

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def key(self) -> bytes | None:
        return self._key

    def value(self) -> bytes | None:
        return self._value

    def error(self) -> KafkaError | None:
        return self._error


class FakeConsumer:
    """A changelog: records by partition, with the end each shows and where its EOF comes."""

    def __init__(self, conf: dict[str, Any]) -> None:
        self.conf = conf
        self.records: dict[int, list[tuple[bytes | None, bytes | None]]] = {}
        self.ends: dict[int, int] = {}
        """High watermarks, when more than the records (a commit marker, aborted records)."""
        self.eof_at: dict[int, int | None] = {}
        """Where a partition's EOF event comes, if not at its end (None: never)."""
        self.watermark_error: KafkaError | None = None
        self.watermark_errors_left: int | None = None
        """How many watermark requests fail with ``watermark_error`` (None: all of them)."""
        self.assigned: list[tuple[str, int, int]] = []
        self.queue: deque[FakeMessage] = deque()
        self.batches: list[int] = []
        self.closed = False

    def add(self, partition: int, key: bytes | None, value: bytes | None) -> None:
        self.records.setdefault(partition, []).append((key, value))

    def get_watermark_offsets(self, tp: TopicPartition, timeout: float) -> tuple[int, int]:
        assert tp.topic == CHANGELOG
        if self.watermark_error is not None and self.watermark_errors_left != 0:
            if self.watermark_errors_left is not None:
                self.watermark_errors_left -= 1
            raise KafkaException(self.watermark_error)
        p = tp.partition
        return 0, self.ends.get(p, len(self.records.get(p, ())))

    def assign(self, tps: list[TopicPartition]) -> None:
        for tp in tps:
            self.assigned.append((tp.topic, tp.partition, tp.offset))
            records = self.records.get(tp.partition, [])
            for offset, (key, value) in enumerate(records):
                self.queue.append(FakeMessage(tp.partition, offset, key, value))
            eof = self.eof_at.get(tp.partition, self.ends.get(tp.partition, len(records)))
            if eof is not None:
                eof_error = KafkaError(KafkaError._PARTITION_EOF)
                self.queue.append(FakeMessage(tp.partition, eof, error=eof_error))

    def consume(self, num_messages: int, timeout: float) -> list[FakeMessage]:
        batch = [self.queue.popleft() for _ in range(min(num_messages, len(self.queue)))]
        self.batches.append(len(batch))
        return batch

    def close(self) -> None:
        self.closed = True


def kafka_store(consumer: FakeConsumer, scope: DedupScope = DedupScope.PRIORITY) -> KafkaDedupStore:
    def factory(conf: dict[str, Any]) -> FakeConsumer:
        consumer.conf = conf
        return consumer

    return KafkaDedupStore(
        CHANGELOG,
        {
            "bootstrap.servers": "kafka:9092",
            "isolation.level": "read_uncommitted",
            "auto.offset.reset": "latest",
        },
        scope=scope,
        consumer_factory=factory,  # type: ignore[arg-type]
        clock=lambda: NOW,
    )


def live(job_id: str, completed: bool = True) -> bytes:
    return encode_entry(job_id, completed, NOW + HOUR_MS)


def test_kafka_store_is_a_dedup_store() -> None:
    assert isinstance(kafka_store(FakeConsumer({})), DedupStore)


def test_load_restores_committed_live_keys_of_the_loaded_priorities(
    caplog: pytest.LogCaptureFixture,
) -> None:
    consumer = FakeConsumer({})
    consumer.add(0, b"high/latest-wins", live(JOB_A, completed=False))
    consumer.add(0, b"high/latest-wins", live(JOB_B))
    consumer.add(0, b"high/tombstoned", live(JOB_A))
    consumer.add(0, b"high/tombstoned", None)
    consumer.add(0, b"high/expired", encode_entry(JOB_A, True, NOW))
    consumer.add(0, b"low/other-priority", live(JOB_A))
    consumer.add(0, b"high/malformed", b"{not json")
    consumer.add(0, b"no-priority", live(JOB_A))
    consumer.add(0, None, live(JOB_A))
    consumer.add(0, b"default/pending", live(JOB_A, completed=False))
    consumer.add(1, b"high/on-one", live(JOB_B))
    consumer.add(2, b"high/not-loaded", live(JOB_B))
    consumer.ends[1] = 3  # two aborted records and a marker: EOF comes at 3
    store = kafka_store(consumer)

    with caplog.at_level(logging.WARNING, logger="pipeline.worker.dedup"):
        store.load([HIGH_0, ("ns.jobs.default", 0), ("ns.jobs.high", 1)])

    high = store.table(HIGH_0)
    assert high.get("latest-wins") == Entry(JOB_B, True, NOW + HOUR_MS)
    assert high.get("tombstoned") is None
    assert high.get("expired") is None
    assert high.get("malformed") is None
    assert len(high) == 1
    default = store.table(("ns.jobs.default", 0))
    assert default.get("pending") == Entry(JOB_A, False, NOW + HOUR_MS)
    assert len(default) == 1
    assert store.table(("ns.jobs.high", 1)).get("on-one") == Entry(JOB_B, True, NOW + HOUR_MS)
    assert [(t, p) for t, p, _ in consumer.assigned] == [(CHANGELOG, 0), (CHANGELOG, 1)]
    assert {offset for _, _, offset in consumer.assigned} == {-2}  # OFFSET_BEGINNING
    assert consumer.closed
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "skipped 3 malformed record(s) of ns.dedup" in warnings[0].getMessage()
    assert "partition 0 offset 6" in warnings[0].getMessage()
    assert store.check(HIGH_0, "latest-wins", JOB_B, policy=COMPLETE, now_ms=NOW) is Verdict.DONE
    assert store.check(HIGH_0, "latest-wins", JOB_A, policy=COMPLETE, now_ms=NOW) is (
        Verdict.DUPLICATE
    )


def test_a_record_restored_expired_gets_its_tombstone_at_the_next_expiry() -> None:
    # Dropped from memory, its record stayed in the compacted changelog for good: every
    # restore after read it again, and every handover added the keys it let expire.
    consumer = FakeConsumer({})
    consumer.add(0, b"high/expired", encode_entry(JOB_A, True, NOW))
    consumer.add(0, b"high/expired-then-live", encode_entry(JOB_A, True, NOW))
    consumer.add(0, b"high/expired-then-live", live(JOB_B))
    consumer.add(0, b"high/expired-then-claimed", encode_entry(JOB_A, True, NOW))
    store = kafka_store(consumer)
    store.load([HIGH_0])
    assert store.check(HIGH_0, "expired-then-claimed", JOB_B, policy=COMPLETE, now_ms=NOW) is (
        Verdict.RUN
    )
    records = store.expire(NOW + 1)
    assert [(r.key, r.value) for r in records] == [(b"high/expired", None)]
    assert store.expire(NOW + 2) == []  # once


def test_load_sets_what_a_restore_depends_on_over_the_given_options() -> None:
    consumer = FakeConsumer({})
    kafka_store(consumer).load([HIGH_0])
    conf = consumer.conf
    assert conf["bootstrap.servers"] == "kafka:9092"
    assert conf["isolation.level"] == "read_committed"
    assert conf["enable.auto.commit"] is False
    assert conf["enable.partition.eof"] is True
    assert conf["group.id"] == "ns.dedup.restore"
    # Records deleted under the read: from the new start, not the end (keys would be missing).
    assert conf["auto.offset.reset"] == "earliest"
    # Its fetch bounds keep librdkafka's queue small; past them, librdkafka's default pause
    # before the next fetch (1 s) tripled the restore of a million keys.
    assert conf["queued.max.messages.kbytes"] <= 4 * 1024
    assert conf["fetch.queue.backoff.ms"] <= 10


def test_load_of_empty_changelog_partitions_reads_nothing() -> None:
    consumer = FakeConsumer({})
    store = kafka_store(consumer)
    store.load([HIGH_0, ("ns.jobs.low", 1)])
    assert consumer.assigned == []
    assert consumer.batches == []
    assert len(store.table(HIGH_0)) == 0


def test_load_consumes_in_large_batches() -> None:
    consumer = FakeConsumer({})
    for n in range(25_000):
        consumer.add(0, f"high/k{n}".encode(), live(JOB_A))
    store = kafka_store(consumer)
    store.load([HIGH_0])
    assert len(store.table(HIGH_0)) == 25_000
    assert consumer.batches[:3] == [10_000, 10_000, 5_001]


def test_load_keeps_the_table_it_holds_and_reads_again_after_unload() -> None:
    consumer = FakeConsumer({})
    consumer.add(0, b"high/k", live(JOB_A))
    store = kafka_store(consumer)
    store.load([HIGH_0])
    assert store.check(HIGH_0, "claimed", JOB_A, policy=COMPLETE, now_ms=NOW) is Verdict.RUN
    consumer.queue.clear()
    store.load([HIGH_0])
    assert store.table(HIGH_0).get("claimed") is not None, "a claim of a running job was lost"
    store.unload([HIGH_0])
    with pytest.raises(DedupNotLoadedError):
        store.check(HIGH_0, "k", JOB_A, policy=COMPLETE, now_ms=NOW)
    consumer.add(0, b"high/k", live(JOB_A))
    store.load([HIGH_0])
    assert store.table(HIGH_0).get("claimed") is None
    assert store.table(HIGH_0).get("k") is not None


def test_under_the_namespace_scope_one_read_fills_the_table_every_priority_shares() -> None:
    consumer = FakeConsumer({})
    consumer.add(0, b"*/new", live(JOB_A))
    consumer.add(0, b"high/from-before-the-upgrade", live(JOB_B, completed=False))
    consumer.add(1, b"*/on-one", live(JOB_B))
    store = kafka_store(consumer, DedupScope.NAMESPACE)
    store.load([HIGH_0, ("ns.jobs.low", 0)])
    assert [(t, p) for t, p, _ in consumer.assigned] == [(CHANGELOG, 0)]
    table = store.table(("ns.jobs.low", 0))
    assert table is store.table(HIGH_0)
    assert table.get("new") == Entry(JOB_A, True, NOW + HOUR_MS)
    assert table.get("from-before-the-upgrade") == Entry(JOB_B, False, NOW + HOUR_MS)
    assert store.check(("ns.jobs.low", 0), "new", JOB_B, policy=COMPLETE, now_ms=NOW) is (
        Verdict.DUPLICATE
    )
    store.check(HIGH_0, "claimed", JOB_A, policy=COMPLETE, now_ms=NOW)
    store.load([("ns.jobs.default", 0), ("ns.jobs.default", 1)])  # 0 joins, 1 is read
    assert store.table(("ns.jobs.default", 0)).get("claimed") is not None
    assert store.table(("ns.jobs.default", 1)).get("on-one") == Entry(JOB_B, True, NOW + HOUR_MS)
    store.unload([HIGH_0, ("ns.jobs.low", 0)])
    assert store.table(("ns.jobs.default", 0)) is table, "still held by ns.jobs.default"


def test_settle_and_expire_return_records_for_the_changelog_partition() -> None:
    store = kafka_store(FakeConsumer({}))
    store.load([("ns.jobs.high", 2)])
    store.check(("ns.jobs.high", 2), "k", JOB_A, policy=TTL, now_ms=0)
    assert store.settle(("ns.jobs.high", 2), "k", JOB_A, KeyOutcome.DEAD, policy=TTL, now_ms=5) == (
        ChangelogRecord(2, b"high/k", encode_entry(JOB_A, False, 10_000)),
    )
    assert store.expire(10_000) == [ChangelogRecord(2, b"high/k", None)]


def test_a_restore_that_cannot_reach_the_end_times_out_naming_the_partition() -> None:
    consumer = FakeConsumer({})
    consumer.add(1, b"high/k", live(JOB_A))
    consumer.ends[1] = 5  # records 1-4 never come
    consumer.eof_at[1] = None
    store = kafka_store(consumer)
    with pytest.raises(
        DedupRestoreTimeoutError, match=r"partition\(s\) left: 1 \(at offset 1 of 5\)"
    ):
        store.load([("ns.jobs.high", 1)], timeout_s=0.0)
    assert consumer.closed
    with pytest.raises(DedupNotLoadedError):
        store.table(("ns.jobs.high", 1))


def test_an_eof_at_the_end_finishes_a_partition_that_ends_in_aborted_records() -> None:
    consumer = FakeConsumer({})
    consumer.add(0, b"high/k", live(JOB_A))
    consumer.ends[0] = 7
    store = kafka_store(consumer)
    store.load([HIGH_0])
    assert store.table(HIGH_0).get("k") is not None


def test_an_eof_short_of_the_end_does_not_finish_a_partition() -> None:
    consumer = FakeConsumer({})
    consumer.add(0, b"high/k", live(JOB_A))
    consumer.ends[0] = 3
    consumer.eof_at[0] = 2
    with pytest.raises(DedupRestoreTimeoutError, match=r"left: 0 \(at offset 1 of 3\)"):
        kafka_store(consumer).load([HIGH_0], timeout_s=0.0)


def test_a_missing_changelog_partition_is_reported_with_what_to_do() -> None:
    consumer = FakeConsumer({})
    consumer.watermark_error = KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART)
    with pytest.raises(DedupRestoreError, match=r"ns\.dedup partition 0 .*pipeline topics apply"):
        kafka_store(consumer).load([HIGH_0])
    assert consumer.closed
    # The topic missing altogether comes as the same error: the hint says both.
    with pytest.raises(DedupRestoreError, match=r"topic ns\.dedup does not exist, or has fewer"):
        kafka_store(consumer).load([HIGH_0])


def test_a_broker_that_does_not_answer_times_the_restore_out() -> None:
    consumer = FakeConsumer({})
    consumer.watermark_error = KafkaError(KafkaError._TIMED_OUT)
    with pytest.raises(DedupRestoreTimeoutError, match=r"left: 0 \(at offset 0 of unknown\)"):
        kafka_store(consumer).load([HIGH_0], timeout_s=0.3)


def test_a_changelog_partition_unknown_for_a_moment_is_asked_again() -> None:
    """Right after the topic is created the client's metadata may not know it yet."""
    consumer = FakeConsumer({})
    consumer.add(0, b"high/k", live(JOB_A))
    consumer.watermark_error = KafkaError(KafkaError._UNKNOWN_PARTITION)
    consumer.watermark_errors_left = 1
    store = kafka_store(consumer)
    store.load([HIGH_0])
    assert store.table(HIGH_0).get("k") == Entry(JOB_A, True, NOW + HOUR_MS)


def test_a_partition_whose_leader_is_not_ready_yet_is_asked_again() -> None:
    """NOT_LEADER_FOR_PARTITION (a leader just elected, or moving) is retriable: the restore
    asks again instead of failing the worker's assignment."""
    consumer = FakeConsumer({})
    consumer.add(0, b"high/k", live(JOB_A))
    # As librdkafka reports it from a watermark request: without the retriable flag.
    consumer.watermark_error = KafkaError(KafkaError.NOT_LEADER_FOR_PARTITION)
    consumer.watermark_errors_left = 2
    store = kafka_store(consumer)
    store.load([HIGH_0])
    assert consumer.watermark_errors_left == 0
    assert store.table(HIGH_0).get("k") == Entry(JOB_A, True, NOW + HOUR_MS)


def test_load_refuses_two_topics_it_could_not_tell_apart() -> None:
    store = kafka_store(FakeConsumer({}))
    with pytest.raises(ConfigurationError, match=r"end in \.high"):
        store.load([("a.jobs.high", 0), ("b.jobs.high", 0)])


def test_a_restore_whose_second_consumer_cannot_be_made_closes_the_first() -> None:
    """The end-offset consumer was left open (its threads and connections) when the reader
    could not be made, at every attempt of the restore."""
    made: list[FakeConsumer] = []

    def factory(conf: dict[str, Any]) -> FakeConsumer:
        if made:
            raise KafkaException(KafkaError(KafkaError._INVALID_ARG, "no more consumers"))
        made.append(FakeConsumer({}))
        return made[0]

    store = KafkaDedupStore(
        CHANGELOG,
        {"bootstrap.servers": "kafka:9092"},
        consumer_factory=factory,  # type: ignore[arg-type]
        clock=lambda: NOW,
    )
    # librdkafka's refusal to make a client is a settings error naming it (pipeline._newclient).
    with pytest.raises(ConfigurationError, match="no more consumers"):
        store.load([HIGH_0])
    assert [consumer.closed for consumer in made] == [True]


@pytest.mark.parametrize(
    "job_id", [JOB_A, JOB_A.upper(), 'a "quoted" id', "back\\slash", "ünïcode"]
)
def test_a_settled_entry_is_written_as_the_json_of_its_job_id_whatever_the_id(job_id: str) -> None:
    # A hex id is written without the check for characters to escape (the table knows it):
    # any other id is escaped as JSON escapes it.
    table = DedupTable()
    table.check("k", job_id, 1_000, 10_000)
    value = table.settle("k", job_id, KeyOutcome.SUCCEEDED, COMPLETE, 2_000)
    assert isinstance(value, bytes)
    assert json.loads(value) == {"j": job_id, "c": 1, "x": 12_000}
    assert decode_entry(value) == Entry(job_id, True, 12_000)
