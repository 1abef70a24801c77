"""Who may use the dashboard: a token (header or login page), basic credentials, read-only
mode; secrets are never rendered or logged."""

from __future__ import annotations

import base64
from typing import TYPE_CHECKING

import pytest
from selenium.webdriver.common.by import By

from pipeline._admin import apply_topics
from pipeline._schedule import make_schedule
from pipeline._scheduletable import publish_schedules
from pipeline_web._throttle import MAX_FAILURES
from tests.waiting import wait_for

from .client import browser_cookies, request
from .conftest import screenshot

if TYPE_CHECKING:
    from selenium.webdriver.remote.webdriver import WebDriver

    from pipeline import Settings

    from .conftest import WebFactory

pytestmark = pytest.mark.kafka

TOKEN = "t0k3n-that-must-never-show"
PASSWORD = "pa55word-that-must-never-show"


def test_with_a_token_nothing_is_served_without_it(
    settings: Settings, web: WebFactory, browser: WebDriver
) -> None:
    apply_topics(settings)
    server = web.start(env={"PIPELINE_WEB__TOKEN": TOKEN})

    page = request(server.url + "dead-letters")
    assert page.status == 303
    assert page.headers["location"] == "/login?next=/dead-letters"
    post = request(server.url + "schedules/x/pause", form={"csrf": "x"})
    assert post.status == 401
    bearer = request(server.url, headers={"Authorization": f"Bearer {TOKEN}"})
    assert bearer.status == 200
    wrong = request(server.url, headers={"Authorization": "Bearer guess"})
    assert wrong.status == 303

    browser.delete_all_cookies()
    browser.get(server.url + "dead-letters")
    assert browser.current_url.endswith("/login?next=/dead-letters")
    screenshot(browser, "login")
    browser.find_element(By.ID, "token").send_keys("guess")
    browser.find_element(By.ID, "token").submit()
    assert wait_for(lambda: "That token is wrong" in browser.page_source, 30)
    browser.find_element(By.ID, "token").send_keys(TOKEN)
    browser.find_element(By.ID, "token").submit()
    assert wait_for(lambda: browser.current_url.endswith("/dead-letters"), 30)
    assert "token" in browser.find_element(By.CSS_SELECTOR, "header .who").text
    session = browser_cookies(browser)["pipeline_session"]
    assert TOKEN not in session

    for path in ("", "workers", "jobs?id=x", "dead-letters", "schedules"):
        browser.get(server.url + path)
        assert TOKEN not in browser.page_source
    server.stop()
    assert TOKEN not in server.output()


def test_basic_credentials_and_read_only_mode(
    settings: Settings, web: WebFactory, browser: WebDriver
) -> None:
    apply_topics(settings)
    publish_schedules(settings, [make_schedule("hourly", cron="0 * * * *", job_type="noop")])
    server = web.start(
        "--read-only",
        env={"PIPELINE_WEB__USERNAME": "ops", "PIPELINE_WEB__PASSWORD": PASSWORD},
    )
    anonymous = request(server.url)
    assert anonymous.status == 401
    assert anonymous.headers["www-authenticate"].startswith("Basic")
    credentials = base64.b64encode(f"ops:{PASSWORD}".encode()).decode()
    basic = {"Authorization": f"Basic {credentials}"}
    page = request(server.url + "schedules", headers=basic)
    assert page.status == 200
    assert "hourly" in page.body
    assert "read-only" in page.body
    assert '<form method="post"' not in page.body  # no action is offered
    assert PASSWORD not in page.body
    letters = request(server.url + "dead-letters", headers=basic)
    assert letters.status == 200
    assert '<form method="post"' not in letters.body

    # Even a well-formed action with its CSRF token is refused.
    csrf = page.headers["set-cookie"].split("pipeline_csrf=", 1)[1].split(";", 1)[0]
    refused = request(
        server.url + "schedules/hourly/pause",
        form={"csrf": csrf},
        cookies={"pipeline_csrf": csrf},
        headers=basic,
    )
    assert refused.status == 403
    assert "read-only" in refused.body
    server.stop()
    assert PASSWORD not in server.output()


def test_guessing_the_token_is_refused_for_a_while_after_too_many_failures(
    settings: Settings, web: WebFactory
) -> None:
    apply_topics(settings)
    server = web.start(env={"PIPELINE_WEB__TOKEN": TOKEN})
    for n in range(MAX_FAILURES):
        wrong = request(server.url + "login", form={"token": f"guess-{n}", "next": "/"})
        assert wrong.status == 401, (n, wrong.body)
    for token in ("guess", TOKEN):  # not even checked any more
        locked = request(server.url + "login", form={"token": token, "next": "/"})
        assert locked.status == 429, locked.body
        assert int(locked.headers["retry-after"]) > 0
        assert "Too many failed logins" in locked.body
    bearer = request(server.url, headers={"Authorization": f"Bearer {TOKEN}"})
    assert bearer.status == 429
