"""librdkafka's log calls are parsed in one place, for the admin clients and the health tracker."""

from __future__ import annotations

import logging

from pipeline._brokerhealth import BrokerHealth
from pipeline._clientlog import LastProblemLog, split_log_call

FMT = "%s [%s] %s"
CALL = ("FAIL", "rdkafka#producer-1", "[thrd:localhost:9/bootstrap]: localhost:9: Connect failed")


def test_a_log_call_gives_its_facility_and_text_without_the_thread() -> None:
    assert split_log_call(FMT, CALL) == ("FAIL", "localhost:9: Connect failed")


def test_a_call_of_another_shape_gives_the_formatted_line() -> None:
    assert split_log_call("plain %s", ("line",)) == ("", "plain line")
    assert split_log_call("100% plain", ()) == ("", "100% plain")


def test_the_last_warning_is_kept_to_explain_a_failure() -> None:
    log = LastProblemLog()
    log.log(logging.DEBUG, FMT, "BROKER", "rdkafka#producer-1", "[thrd:main]: added broker")
    assert log.last_problem is None
    log.log(logging.ERROR, FMT, *CALL)
    assert log.last_problem == "localhost:9: Connect failed"


def test_the_health_tracker_parses_the_same_way() -> None:
    health = BrokerHealth("localhost:9")
    seen: list[tuple[object, ...]] = []
    health.log_line = lambda *line: seen.append(line)  # type: ignore[method-assign]
    health.callbacks("admin")["logger"].log(logging.ERROR, FMT, *CALL)
    assert seen == [("admin", logging.ERROR, *split_log_call(FMT, CALL), None)]
