"""Brute-force protection: failed logins per client address, the lockout (429 with
Retry-After), and the bounded table. Time is a fake clock, so that a lockout ends without
waiting."""

from __future__ import annotations

import base64
import functools
from typing import TYPE_CHECKING

import pytest
from starlette.testclient import TestClient

from pipeline_web._throttle import LOCKOUT_S, MAX_FAILURES, WINDOW_S, LoginThrottle, client_key

from .conftest import FakeClock, MakeDashboard

if TYPE_CHECKING:
    from collections.abc import Callable

    from starlette.applications import Starlette

    from pipeline_web._dashboard import Dashboard

TOKEN = "s3cret-token"
PASSWORD = "pa55word"


# --- the throttle -------------------------------------------------------------------------------


def test_the_failure_that_reaches_the_limit_locks_the_address_out_for_the_lockout() -> None:
    clock = FakeClock()
    throttle = LoginThrottle(max_failures=3, window_s=60, lockout_s=120, clock=clock)
    for _ in range(2):
        throttle.failed("10.0.0.7")
    assert throttle.retry_after("10.0.0.7") is None
    throttle.failed("10.0.0.7")
    assert throttle.retry_after("10.0.0.7") == 120
    assert throttle.retry_after("10.0.0.8") is None  # another address is not affected
    clock.now += 119.5
    assert throttle.retry_after("10.0.0.7") == 1  # whole seconds, rounded up
    clock.now += 0.5
    assert throttle.retry_after("10.0.0.7") is None
    throttle.failed("10.0.0.7")  # the count starts again after a lockout
    assert throttle.retry_after("10.0.0.7") is None


def test_failures_older_than_the_window_do_not_count() -> None:
    clock = FakeClock()
    throttle = LoginThrottle(max_failures=3, window_s=60, lockout_s=120, clock=clock)
    throttle.failed("10.0.0.7")
    throttle.failed("10.0.0.7")
    clock.now += 60  # those two are out of the window now
    throttle.failed("10.0.0.7")
    throttle.failed("10.0.0.7")
    assert throttle.retry_after("10.0.0.7") is None
    throttle.failed("10.0.0.7")
    assert throttle.retry_after("10.0.0.7") == 120


def test_an_ipv6_client_counts_by_its_network_and_a_mapped_ipv4_as_the_ipv4() -> None:
    assert (
        client_key("2001:db8:1:2::1") == client_key("2001:db8:1:2:ffff::9") == ("2001:db8:1:2::/64")
    )
    assert client_key("2001:db8:1:3::1") != client_key("2001:db8:1:2::1")
    assert client_key("::ffff:10.0.0.7") == "10.0.0.7"
    assert client_key("testclient") == "testclient"
    assert client_key(None) == "unknown"
    throttle = LoginThrottle(max_failures=2, clock=FakeClock())
    throttle.failed("2001:db8:1:2::1")
    throttle.failed("2001:db8:1:2::2")
    assert throttle.retry_after("2001:db8:1:2::3") == LOCKOUT_S


def test_an_attacker_cycling_addresses_does_not_grow_the_table_past_its_bound() -> None:
    clock = FakeClock()
    throttle = LoginThrottle(max_failures=2, max_clients=100, clock=clock)
    for n in range(5000):
        throttle.failed(f"10.{n // 65536}.{n // 256 % 256}.{n % 256}")
    assert len(throttle) == 100
    # Addresses whose failures left the window are dropped as others fail.
    clock.now += WINDOW_S
    throttle.failed("192.0.2.1")
    assert len(throttle) == 1


def test_a_locked_address_is_not_forgotten_to_make_room_for_others() -> None:
    """An attacker failing from more addresses than the table holds (an IPv6 /48 holds
    65,536 /64s) must not cycle the locks away: an address not in a full table is refused as
    if locked, until the oldest one held counts nothing any more."""
    clock = FakeClock()
    throttle = LoginThrottle(max_failures=2, window_s=60, lockout_s=120, max_clients=3, clock=clock)
    for address in ("10.0.0.1", "10.0.0.2", "10.0.0.3"):
        throttle.failed(address)
        throttle.failed(address)
    for n in range(1000):
        for _ in range(2):
            throttle.failed(f"2001:db8:0:{n:x}::1")
    assert len(throttle) == 3
    assert throttle.retry_after("10.0.0.1") == 120
    assert throttle.retry_after("2001:db8:0:7::1") == 120  # refused, the table being full
    clock.now += 119.5
    assert throttle.retry_after("2001:db8:0:7::1") == 1
    clock.now += 0.5  # the lockouts are over, and the failures out of the window
    assert throttle.retry_after("10.0.0.1") is None
    assert throttle.retry_after("2001:db8:0:7::1") is None
    throttle.failed("2001:db8:0:7::1")
    assert len(throttle) == 1


def test_an_address_whose_failures_still_count_is_not_forgotten_either() -> None:
    """Forgetting an address with failures in the window (not locked yet) would start its
    count again: guesses without bound, a few at a time."""
    clock = FakeClock()
    throttle = LoginThrottle(max_failures=3, window_s=60, lockout_s=60, max_clients=2, clock=clock)
    throttle.failed("10.0.0.1")
    throttle.failed("10.0.0.1")
    throttle.failed("10.0.0.2")
    throttle.failed("10.0.0.3")  # not held: the table is full
    assert throttle.retry_after("10.0.0.3") == 60
    assert len(throttle) == 2
    throttle.failed("10.0.0.1")  # its third failure within the window
    assert throttle.retry_after("10.0.0.1") == 60


def test_an_address_is_held_for_the_lockout_when_it_outlasts_the_window() -> None:
    clock = FakeClock()
    throttle = LoginThrottle(max_failures=2, window_s=60, lockout_s=600, max_clients=2, clock=clock)
    throttle.failed("10.0.0.1")
    throttle.failed("10.0.0.1")
    clock.now += 61
    throttle.failed("10.0.0.2")
    throttle.failed("10.0.0.3")
    assert throttle.retry_after("10.0.0.1") == 539
    assert throttle.retry_after("10.0.0.3") == 539  # until 10.0.0.1 is forgotten
    clock.now += 539
    assert throttle.retry_after("10.0.0.1") is None
    assert throttle.retry_after("10.0.0.3") is None


# --- through the application --------------------------------------------------------------------


@pytest.fixture
def make_app(make_dashboard: MakeDashboard) -> Callable[..., Starlette]:
    return functools.partial(make_dashboard, "throttle")


def _client(app: Starlette, address: str) -> TestClient:
    return TestClient(
        app, base_url="http://127.0.0.1", client=(address, 50000), follow_redirects=False
    )


def _guess_tokens_at_the_login_page(client: TestClient, times: int) -> None:
    for n in range(times):
        wrong = client.post("/login", data={"token": f"guess-{n}", "next": "/"})
        assert wrong.status_code == 401, (n, wrong.text)
        assert "That token is wrong" in wrong.text


def test_too_many_wrong_tokens_at_the_login_page_lock_that_address_out(
    make_app: Callable[..., Starlette],
) -> None:
    app = make_app(token=TOKEN)
    attacker = _client(app, "10.0.0.7")
    _guess_tokens_at_the_login_page(attacker, MAX_FAILURES)
    for token in ("guess-again", TOKEN):  # the right token too: a guess is not checked
        refused = attacker.post("/login", data={"token": token, "next": "/"})
        assert refused.status_code == 429
        assert 0 < int(refused.headers["retry-after"]) <= LOCKOUT_S
        assert "Too many failed logins" in refused.text
        assert "pipeline_session" not in refused.headers.get("set-cookie", "")
    bearer = attacker.get("/", headers={"Authorization": f"Bearer {TOKEN}"})
    assert bearer.status_code == 429
    # Another address logs in with the right token.
    operator = _client(app, "10.0.0.8")
    answer = operator.post("/login", data={"token": TOKEN, "next": "/dead-letters"})
    assert answer.status_code == 303
    assert answer.headers["location"] == "/dead-letters"
    assert operator.get("/", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200


def test_wrong_bearer_tokens_count_as_failed_logins(make_app: Callable[..., Starlette]) -> None:
    app = make_app(token=TOKEN)
    attacker = _client(app, "10.0.0.7")
    for n in range(MAX_FAILURES):
        # A page asked for with a wrong token goes to the login page; /login itself shows
        # whether the header was accepted, so it counts there too.
        path = "/login" if n % 2 else "/dead-letters"
        attacker.get(path, headers={"Authorization": f"Bearer guess-{n}"})
    refused = attacker.get("/", headers={"Authorization": f"Bearer {TOKEN}"})
    assert refused.status_code == 429
    assert refused.headers["retry-after"]
    assert _client(app, "10.0.0.8").post("/login", data={"token": TOKEN}).status_code == 303


def test_wrong_basic_credentials_lock_the_address_out_but_not_the_user(
    make_app: Callable[..., Starlette],
) -> None:
    app = make_app(username="ops", password=PASSWORD)

    def basic(password: str) -> dict[str, str]:
        encoded = base64.b64encode(f"ops:{password}".encode()).decode()
        return {"Authorization": f"Basic {encoded}"}

    attacker = _client(app, "10.0.0.7")
    for n in range(MAX_FAILURES):
        assert attacker.get("/", headers=basic(f"guess-{n}")).status_code == 401
    refused = attacker.get("/", headers=basic(PASSWORD))
    assert refused.status_code == 429
    assert refused.headers["retry-after"]
    # The user "ops" is not locked: from another address, the right password works.
    assert _client(app, "10.0.0.8").get("/", headers=basic(PASSWORD)).status_code == 200
    # Asking without credentials (a browser's first request) is no failure.
    for _ in range(2 * MAX_FAILURES):
        assert _client(app, "10.0.0.9").get("/").status_code == 401
    assert _client(app, "10.0.0.9").get("/", headers=basic(PASSWORD)).status_code == 200


def test_a_locked_out_address_may_log_in_again_after_the_lockout(
    make_app: Callable[..., Starlette],
) -> None:
    app = make_app(token=TOKEN)
    dashboard: Dashboard = app.state.dashboard
    clock = FakeClock()
    dashboard.gate.throttle.clock = clock
    client = _client(app, "10.0.0.7")
    _guess_tokens_at_the_login_page(client, MAX_FAILURES)
    assert client.post("/login", data={"token": TOKEN}).status_code == 429
    clock.now += LOCKOUT_S
    assert client.post("/login", data={"token": TOKEN}).status_code == 303


def test_while_the_table_is_full_an_address_it_holds_still_logs_in_and_a_new_one_waits(
    make_app: Callable[..., Starlette],
) -> None:
    """An operator whose address the table holds (one mistyped token) logs in while guessers
    fill the table; a new address waits until the table has room; a session goes on."""
    app = make_app(token=TOKEN)
    throttle = app.state.dashboard.gate.throttle
    clock = FakeClock()
    throttle.clock = clock
    throttle.max_clients = 3
    operator = _client(app, "10.0.0.8")
    _guess_tokens_at_the_login_page(operator, 1)
    assert operator.post("/login", data={"token": TOKEN}).status_code == 303
    for n in range(5):  # 2 held and locked, 3 refused
        _guess_tokens_at_the_login_page(_client(app, f"10.0.1.{n}"), 0 if n >= 2 else MAX_FAILURES)
        assert _client(app, f"10.0.1.{n}").post("/login", data={"token": "x"}).status_code == 429
    assert len(throttle) == 3
    newcomer = _client(app, "10.0.0.9")
    refused = newcomer.post("/login", data={"token": TOKEN})
    assert refused.status_code == 429
    assert 0 < int(refused.headers["retry-after"]) <= WINDOW_S
    assert newcomer.get("/", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 429
    again = _client(app, "10.0.0.8")
    assert again.post("/login", data={"token": TOKEN}).status_code == 303
    assert operator.get("/").status_code == 200  # its session
    clock.now += max(WINDOW_S, LOCKOUT_S)
    assert newcomer.post("/login", data={"token": TOKEN}).status_code == 303
