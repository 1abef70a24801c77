"""The dashboard in headless Chromium against a real Kafka, with a worker and a scheduler
running: what an operator sees on each page, and what the actions do to the jobs."""

from __future__ import annotations

import functools
import json
import re
import urllib.parse
from typing import TYPE_CHECKING

import pytest
from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
from selenium.webdriver.common.by import By

from pipeline._admin import apply_topics
from pipeline._deadletters import LetterStatus, read_dead_letters
from pipeline._eventlog import job_history
from pipeline._schedule import make_schedule
from pipeline._scheduleops import trigger_idempotency_key
from pipeline._scheduletable import publish_schedules, read_schedule_records
from tests.waiting import wait_for

from ..test_dlq_cli import email_letter, write_letters
from ..worker.fixtures import with_retry_tiers
from ..worker.harness import enqueue, wait_joined
from .client import browser_cookies, request
from .conftest import screenshot

if TYPE_CHECKING:
    from pathlib import Path

    from ops.webproc import WebProcess
    from selenium.webdriver.remote.webdriver import WebDriver

    from pipeline import Settings

    from ..scheduler.conftest import SchedulerFactory
    from ..worker.fixtures import WorkerKit
    from .conftest import WebFactory

pytestmark = pytest.mark.kafka

RETRY_DELAYS = [0.5, 2.0]
WORKER_ENV = {
    "PIPELINE_TOPICS__RETRY_DELAYS_S": json.dumps(RETRY_DELAYS),
    "PIPELINE_EVENTS": "all",
    "PIPELINE_WORKER__HEARTBEAT_INTERVAL_S": "0.5",
}


@pytest.fixture
def settings(bootstrap_servers: str, namespace: str) -> Settings:
    return with_retry_tiers(bootstrap_servers, namespace, RETRY_DELAYS)


def _text(driver: WebDriver, css: str) -> str:
    """The text of the first element matching ``css`` ("" while the page is being replaced)."""
    try:
        return str(driver.find_element(By.CSS_SELECTOR, css).text)
    except (NoSuchElementException, StaleElementReferenceException):
        return ""


def _shows(driver: WebDriver, css: str, wanted: str) -> bool:
    """Whether an element matching ``css`` holds ``wanted`` (False while the page changes)."""
    try:
        return any(wanted in e.text for e in driver.find_elements(By.CSS_SELECTOR, css))
    except StaleElementReferenceException:
        return False


def _hidden_fields(driver: WebDriver, form_css: str) -> dict[str, str]:
    """The hidden inputs of the first form matching ``form_css``: what a resubmit sends."""
    inputs = driver.find_elements(By.CSS_SELECTOR, f"{form_css} input[type=hidden]")
    return {str(e.get_attribute("name")): str(e.get_attribute("value")) for e in inputs}


def _see_the_backlog(kit: WorkerKit, server: WebProcess, browser: WebDriver) -> None:
    """The overview shows a backlog built up while no worker runs."""
    enqueue(kit.producer, "noop", 40, priority="low")
    browser.get(server.url)
    low = kit.topics.jobs("low")

    def backlog_shown() -> bool:
        return _text(browser, f'tr[data-topic="{low}"] .backlog-count') == "40"

    assert wait_for(backlog_shown, 30), server.output()  # the page refreshes itself
    screenshot(browser, "overview")


def _look_a_job_up(server: WebProcess, browser: WebDriver, job_id: str) -> None:
    """The job page shows the retries and the dead letter of a job that failed twice."""
    browser.get(server.url + "jobs")
    browser.find_element(By.ID, "job-id").send_keys(job_id)
    browser.find_element(By.CSS_SELECTOR, "form.lookup button").click()
    shown = wait_for(lambda: _shows(browser, "#job-state", "dead (pending)"), 30)
    assert shown, browser.find_element(By.TAG_NAME, "body").text
    steps = [e.text for e in browser.find_elements(By.CSS_SELECTOR, "ol.timeline .what")]
    assert steps.count("retried") == 1, steps
    assert steps.count("started") == 2, steps
    assert "dead-lettered (max_attempts)" in steps, steps
    assert "attempt 1 fails on purpose" in _text(browser, "ol.timeline")
    screenshot(browser, "job")


def _replay_one_tenant(
    kit: WorkerKit, server: WebProcess, browser: WebDriver, acme: list[str], other: list[str]
) -> None:
    """Filter the dead letters by tenant, replay every match after a count and a
    confirmation: exactly those jobs run once more; the same confirmation again does nothing."""
    browser.get(server.url + "dead-letters")
    assert wait_for(lambda: "5" in _text(browser, "#match-count"), 30)
    screenshot(browser, "dead-letters")
    tenant = browser.find_element(By.NAME, "tenant")
    tenant.send_keys("acme")
    tenant.submit()
    assert wait_for(lambda: _text(browser, "#match-count").startswith("3 "), 30)
    assert len(browser.find_elements(By.CSS_SELECTOR, "tr.letter")) == 3
    browser.find_element(By.XPATH, "//button[starts-with(., 'Replay every')]").click()
    assert wait_for(lambda: _shows(browser, "h1", "Replay 3 dead letters?"), 30)
    screenshot(browser, "dead-letters-confirm")
    confirmation = _hidden_fields(browser, "form.actions")
    browser.find_element(By.ID, "confirm").click()
    assert wait_for(lambda: _shows(browser, ".notice", "3 dead letters replayed"), 60)
    assert wait_for(lambda: kit.recording.all_finished(acme), 60)

    again = request(
        server.url + "dead-letters/replay", form=confirmation, cookies=browser_cookies(browser)
    )
    assert again.status == 303, again.body
    assert "0+dead+letters+replayed" in again.headers["location"]
    status = {s.letter.job_id: s.status for s in read_dead_letters(kit.settings).letters}
    assert {status[j] for j in acme} == {LetterStatus.REPLAYED}
    assert {status[j] for j in other} == {LetterStatus.PENDING}
    runs = kit.recording.run_counts()
    assert {j: runs[j] for j in acme} == dict.fromkeys(acme, 3)  # 2 failed + the replay
    assert {j: runs[j] for j in other} == dict.fromkeys(other, 2)
    assert not kit.recording.finished_ids.intersection(other)

    # A pending letter's page: its payload, both attempts' errors, its traceback.
    browser.get(server.url + f"dead-letters/{other[0]}")
    assert wait_for(lambda: _text(browser, "#letter-status").startswith("pending"), 30)
    assert '"failures": 2' in _text(browser, "#payload")
    attempts = _text(browser, "table.attempts")
    assert "attempt 1 fails on purpose" in attempts
    assert "attempt 2 fails on purpose" in attempts
    assert "RuntimeError" in _text(browser, "#traceback")
    screenshot(browser, "dead-letter")


def _fire_a_schedule(kit: WorkerKit, server: WebProcess, browser: WebDriver) -> None:
    """Trigger now runs one job; the same form sent again enqueues a duplicate the workers
    drop. Pause shows the schedule as paused."""
    schedule = make_schedule("nightly", cron="0 3 * * *", job_type="noop", payload={"n": 999})
    publish_schedules(kit.settings, [schedule])
    browser.get(server.url + "schedules")
    assert wait_for(lambda: _shows(browser, "tr.schedule", "nightly"), 30)
    screenshot(browser, "schedules")
    trigger = _hidden_fields(browser, "form[action='/schedules/trigger?name=nightly']")
    browser.find_element(By.XPATH, "//button[.='Trigger now']").click()
    assert wait_for(lambda: _shows(browser, ".notice", "triggered: job"), 30)

    def fired() -> list[str]:
        return [s.key for s in kit.recording.starts("noop") if s.n == 999]

    assert wait_for(lambda: len(fired()) == 1, 60)
    assert fired() == [trigger_idempotency_key("nightly", int(trigger["at"]))]
    twice = request(
        server.url + "schedules/trigger?name=nightly",
        form=trigger,
        cookies=browser_cookies(browser),
    )
    assert twice.status == 303, twice.body
    notice = urllib.parse.parse_qs(urllib.parse.urlsplit(twice.headers["location"]).query)
    duplicate = re.search(r"job (\w+) enqueued", notice["notice"][0])
    assert duplicate is not None, notice

    def deduplicated() -> bool:
        history = job_history(kit.settings, duplicate.group(1), timeout=20)
        return "deduplicated" in [e.kind for e in history.events]

    assert wait_for(deduplicated, 60)
    assert len(fired()) == 1

    browser.find_element(By.XPATH, "//tr[@data-name='nightly']//button[.='Pause']").click()
    assert wait_for(lambda: _shows(browser, "tr.schedule .state", "paused"), 30)


def test_an_operator_sees_the_backlog_looks_a_job_up_replays_letters_and_fires_a_schedule(
    kit: WorkerKit,
    schedulers: SchedulerFactory,
    web: WebFactory,
    browser: WebDriver,
    tmp_path: Path,
) -> None:
    audit = tmp_path / "audit.jsonl"
    server = web.start(env={"PIPELINE_WEB__AUDIT_LOG": str(audit)})
    browser.delete_all_cookies()
    _see_the_backlog(kit, server, browser)

    # A worker and a scheduler; jobs of two tenants that fail twice and are dead-lettered.
    worker = kit.workers.start("--concurrency", "4", env=WORKER_ENV)
    schedulers.start()
    wait_joined(kit.settings, f"{kit.settings.namespace}.workers", [worker])
    failing = {"failures": 2}
    acme = enqueue(kit.producer, "flaky", 3, fields=failing, max_attempts=2, tenant="acme")
    other = enqueue(
        kit.producer, "flaky", 2, first=10, fields=failing, max_attempts=2, tenant="other"
    )
    assert wait_for(lambda: len(read_dead_letters(kit.settings).letters) == 5, 60), (
        worker.log_tail()
    )
    assert wait_for(lambda: kit.recording.count("S", "noop") == 40, 60), worker.log_tail()

    browser.get(server.url + "workers")
    assert wait_for(lambda: _shows(browser, "tr.worker", worker.client_id), 30)
    assert wait_for(lambda: _text(browser, "tr.worker .in-flight").endswith("/ 4"), 30)
    screenshot(browser, "workers")

    _look_a_job_up(server, browser, acme[0])
    _replay_one_tenant(kit, server, browser, acme, other)
    browser.get(server.url)  # with a worker, a leader, rates and two letters pending
    assert wait_for(lambda: _text(browser, "#dead-letters-pending") == "2", 30)
    assert wait_for(lambda: "scheduler leader (" in _text(browser, ".tiles"), 30)
    screenshot(browser, "overview-running")
    _fire_a_schedule(kit, server, browser)

    # Every action is in the audit log, with who did it and how many it touched.
    entries = [json.loads(line) for line in audit.read_text().splitlines()]
    actions = [(e["who"], e["action"], e["count"]) for e in entries]
    assert actions == [
        ("local", "dlq.replay", 3),
        ("local", "dlq.replay", 0),
        ("local", "schedule.trigger", 1),
        ("local", "schedule.trigger", 1),
        ("local", "schedule.pause", 1),
    ], entries
    assert entries[0]["target"]["tenants"] == ["acme"]
    assert worker.alive(), worker.log_tail()


def test_a_job_page_shows_a_letter_written_since_the_last_background_reading(
    settings: Settings, web: WebFactory
) -> None:
    """The job page reads what was dead-lettered since the index's last reading: with
    readings an hour apart, a letter written after the first one is shown at once."""
    apply_topics(settings)
    server = web.start(env={"PIPELINE_WEB__REFRESH_S": "3600"})
    first_read = 'id="dead-letters-pending">0</span>'
    assert wait_for(lambda: first_read in request(server.url).body, 30), server.output()
    letter = email_letter(settings, 1)
    write_letters(settings, [letter])
    page = request(server.url + f"jobs?id={letter.job_id}")
    assert page.status == 200, page.body
    assert "dead-lettered (max_attempts)" in page.body, page.body


def test_an_action_without_its_csrf_token_is_refused(
    kit: WorkerKit, web: WebFactory, browser: WebDriver
) -> None:
    schedule = make_schedule("hourly", cron="0 * * * *", job_type="noop")
    publish_schedules(kit.settings, [schedule])
    server = web.start()
    browser.delete_all_cookies()
    browser.get(server.url + "schedules")
    assert wait_for(lambda: _shows(browser, "tr.schedule", "hourly"), 30)
    cookies = browser_cookies(browser)
    url = server.url + "schedules/hourly/pause"

    missing = request(url, form={}, cookies=cookies)
    wrong = request(url, form={"csrf": "not-the-token"}, cookies=cookies)
    no_cookie = request(url, form={"csrf": cookies["pipeline_csrf"]})

    for answer in (missing, wrong, no_cookie):
        assert answer.status == 403, answer.body
        assert "CSRF token" in answer.body
    browser.refresh()
    assert _text(browser, "tr.schedule .state") == "active"
    accepted = request(url, form={"csrf": cookies["pipeline_csrf"]}, cookies=cookies)
    assert accepted.status == 303, accepted.body


def test_schedules_named_dot_and_dot_dot_are_paused_and_triggered_from_the_page(
    settings: Settings, web: WebFactory, browser: WebDriver
) -> None:
    """Chromium removes "." and ".." segments from a form's URL (percent-encoded too): the
    page's forms name the schedule in the query, which it leaves alone."""
    apply_topics(settings)
    names = (".", "..", "nightly")
    schedules = [make_schedule(n, cron="0 3 * * *", job_type="noop") for n in names]
    publish_schedules(settings, schedules)
    server = web.start()
    browser.delete_all_cookies()
    browser.get(server.url + "schedules")
    rows = "tr.schedule"
    assert wait_for(lambda: len(browser.find_elements(By.CSS_SELECTOR, rows)) == 3, 30)
    for name in (".", ".."):
        browser.find_element(By.XPATH, f"//tr[@data-name='{name}']//button[.='Pause']").click()
        paused = functools.partial(_shows, browser, "#notice", f"Schedule {name} paused")
        assert wait_for(paused, 30)
    browser.find_element(By.XPATH, "//tr[@data-name='..']//button[.='Trigger now']").click()
    assert wait_for(lambda: _shows(browser, "#notice", "Schedule .. triggered: job"), 30)
    records = read_schedule_records(settings, timeout=20)
    enabled = {n: r.schedule.enabled for n, r in records.items() if r.schedule is not None}
    assert enabled == {".": False, "..": False, "nightly": True}
