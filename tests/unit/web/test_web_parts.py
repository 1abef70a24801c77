"""The dashboard's pure parts: the security gate, the dead-letter filter form, the charts."""

from __future__ import annotations

import base64
from typing import Any

import pytest
from pydantic import SecretStr, ValidationError
from starlette.requests import Request

from pipeline import Settings
from pipeline._backlogmodel import GroupMembers, PartitionBacklog, TopicBacklog
from pipeline._deadletters import LetterFilter
from pipeline._status import StatusSnapshot
from pipeline._websettings import WebSettings
from pipeline_web._chart import HEIGHT, WIDTH, rate_chart
from pipeline_web._format import stamp
from pipeline_web._letters import FilterError, parse_filter
from pipeline_web._monitor import measure
from pipeline_web._security import Gate, is_loopback

NOW = 1_800_000_000_000


def _request(
    path: str = "/",
    *,
    client: str = "127.0.0.1",
    headers: dict[str, str] | None = None,
    cookies: dict[str, str] | None = None,
    method: str = "GET",
    query: str = "",
) -> Request:
    given = {"host": "127.0.0.1:8180", **{k.lower(): v for k, v in (headers or {}).items()}}
    raw = [(k.encode(), v.encode()) for k, v in given.items()]
    if cookies:
        raw.append((b"cookie", "; ".join(f"{k}={v}" for k, v in cookies.items()).encode()))
    scope: dict[str, Any] = {
        "type": "http",
        "method": method,
        "path": path,
        "headers": raw,
        "query_string": query.encode(),
        "client": (client, 50000),
    }
    return Request(scope)


def _basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def test_without_credentials_only_loopback_clients_are_served() -> None:
    gate = Gate(WebSettings())
    assert gate.who(_request(client="127.0.0.1")) == "local"
    assert gate.who(_request(client="::1")) == "local"
    assert gate.who(_request(client="10.1.2.3")) is None
    refusal = gate.refusal(_request(client="10.1.2.3"))
    assert refusal is not None
    assert refusal.status_code == 403
    assert is_loopback("localhost")
    assert not is_loopback("0.0.0.0")
    assert not is_loopback(None)


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost:8180", "LocalHost", "[::1]:9000"])
def test_without_credentials_loopback_host_names_are_served(host: str) -> None:
    gate = Gate(WebSettings())
    request = _request("/dead-letters", headers={"Host": host})
    assert gate.refusal(request) is None
    assert gate.who(request) == "local"


@pytest.mark.parametrize("host", ["attacker.example:8180", "127.0.0.1.attacker.example", ""])
def test_without_credentials_another_host_name_is_refused_against_dns_rebinding(
    host: str,
) -> None:
    # A page of attacker.example whose name now resolves to 127.0.0.1 reaches us from
    # loopback, but its requests still name attacker.example.
    gate = Gate(WebSettings())
    for path in ("/dead-letters", "/healthz", "/login"):
        request = _request(path, headers={"Host": host})
        refusal = gate.refusal(request)
        assert refusal is not None
        assert refusal.status_code == 400
        assert b"web.allowed_hosts" in refusal.body
        assert gate.who(request) is None


def test_host_names_can_be_allowed_and_credentials_make_any_host_name_fine() -> None:
    allowed = Gate(WebSettings(allowed_hosts=["dash.internal"]))
    assert allowed.refusal(_request(headers={"Host": "DASH.internal:8180"})) is None
    assert allowed.refusal(_request(headers={"Host": "other.internal"})) is not None
    written_in_capitals = Gate(WebSettings(allowed_hosts=["Dash.Internal"]))
    assert written_in_capitals.refusal(_request(headers={"Host": "dash.internal"})) is None
    with_token = Gate(WebSettings(token=SecretStr("t")))
    request = _request(headers={"Host": "dash.example.com", "Authorization": "Bearer t"})
    assert with_token.refusal(request) is None


def test_a_token_is_accepted_as_a_bearer_header_or_as_the_session_cookie_it_earns() -> None:
    gate = Gate(WebSettings(token=SecretStr("s3cret-token")))
    assert gate.who(_request(headers={"Authorization": "Bearer s3cret-token"})) == "token"
    assert gate.who(_request(headers={"Authorization": "Bearer wrong"})) is None
    assert gate.who(_request()) is None  # loopback is not enough once a token is set
    session = gate.session_value()
    assert "s3cret-token" not in session
    assert gate.who(_request(cookies={"pipeline_session": session})) == "token"
    assert gate.who(_request(cookies={"pipeline_session": "forged"})) is None
    page = gate.refusal(_request("/dead-letters"))
    assert page is not None
    assert page.status_code == 303
    assert page.headers["location"] == "/login?next=/dead-letters"
    filtered = gate.refusal(_request("/dead-letters", query="type=a.b&status=all"))
    assert filtered is not None
    assert filtered.headers["location"] == "/login?next=/dead-letters%3Ftype%3Da.b%26status%3Dall"
    post = gate.refusal(_request("/schedules/x/pause", method="POST"))
    assert post is not None
    assert post.status_code == 401
    assert gate.refusal(_request("/login")) is None
    assert gate.refusal(_request("/static/app.css")) is None


def test_basic_credentials_are_checked_and_ask_the_browser_for_them() -> None:
    gate = Gate(WebSettings(username="ops", password=SecretStr("pa55")))
    assert gate.who(_request(headers=_basic("ops", "pa55"))) == "ops"
    assert gate.who(_request(headers=_basic("ops", "wrong"))) is None
    assert gate.who(_request(headers={"Authorization": "Basic !!!"})) is None
    assert gate.who(_request(headers={"Authorization": "Basic \u00e9"})) is None  # not ASCII
    refusal = gate.refusal(_request())
    assert refusal is not None
    assert refusal.status_code == 401
    assert refusal.headers["www-authenticate"].startswith("Basic")


def test_basic_credentials_go_together_and_secrets_stay_out_of_the_settings_repr() -> None:
    with pytest.raises(ValidationError, match="go together"):
        WebSettings(username="ops")
    settings = Settings(web={"token": "t0ps3cret", "username": "a", "password": "p4ss"})
    assert "t0ps3cret" not in repr(settings)
    assert "p4ss" not in repr(settings)
    assert settings.web.auth_enabled


def test_the_filter_form_reads_as_the_cli_options() -> None:
    found = parse_filter(
        {
            "type": "email.*, report.build",
            "reason": "max_attempts",
            "error": " timeout ",
            "tenant": "acme",
            "since": "2h",
            "until": "2028-01-01T00:00:00Z",
            "id": "",
        },
        now=NOW,
    )
    assert found == LetterFilter(
        types=("email.*", "report.build"),
        reasons=("max_attempts",),
        error="timeout",
        tenants=("acme",),
        since=NOW - 2 * 3600 * 1000,
        until=1_830_297_600_000,
    )
    assert parse_filter({}).empty
    with pytest.raises(FilterError, match="since: 'yesterday' is neither"):
        parse_filter({"since": "yesterday"})


def test_a_time_out_of_range_is_written_as_its_number() -> None:
    assert stamp(1_767_225_600_123) == "2026-01-01 00:00:00.123"
    assert stamp(NOW * 1000) == str(NOW * 1000)  # a producer that wrote microseconds
    assert stamp(-(10**20)) == str(-(10**20))
    assert stamp(None) == "-"


def test_times_out_of_range_are_filter_errors() -> None:
    with pytest.raises(FilterError, match=r"since: .* out of range"):
        parse_filter({"since": "9" * 400 + "s"}, now=NOW)
    with pytest.raises(FilterError, match=r"until: .* out of range"):
        parse_filter({"until": "9" * 400 + "w"}, now=NOW)


def _snapshot(at: int, end: int, committed: int) -> StatusSnapshot:
    topic = TopicBacklog(
        "ns.jobs.high", "ns.workers", (PartitionBacklog(0, 0, end, committed, None),)
    )
    nobody = GroupMembers("g", "EMPTY", ())
    return StatusSnapshot("ns", at, (topic,), (), (), nobody, nobody, 0, ())


def test_rates_come_from_two_readings_and_draw_within_the_chart() -> None:
    first = measure(None, _snapshot(NOW, 100, 100))
    assert first.rates == {}
    second = measure(first.snapshot, _snapshot(NOW + 2000, 300, 150))
    third = measure(second.snapshot, _snapshot(NOW + 4000, 300, 300))
    assert second.rates["ns.jobs.high"].rate_in == 100
    assert second.rates["ns.jobs.high"].rate_out == 25
    assert third.rates["ns.jobs.high"].rate_out == 75

    chart = rate_chart([first, second, third], "ns.jobs.high")
    assert chart.peak == 100
    assert chart.seconds == 2
    points = [tuple(map(float, p.split(","))) for p in chart.points_in.split()]
    assert points[0] == (0.0, 1.0)  # the peak at the top
    assert points[-1] == (WIDTH, HEIGHT - 1)  # no jobs in: the bottom
    assert rate_chart([first], "ns.jobs.high").empty


def test_pipeline_web_refuses_another_address_without_credentials() -> None:
    from click.testing import CliRunner

    from pipeline_cli._main import cli

    result = CliRunner().invoke(cli, ["web", "--host", "0.0.0.0", "--port", "0"])
    assert result.exit_code == 2, result.output
    assert "refusing to serve 0.0.0.0 without credentials" in result.output
    assert "PIPELINE_WEB__TOKEN" in result.output


@pytest.mark.parametrize(
    "credentials",
    [
        {"token": ""},
        {"token": "  "},
        {"username": "ops", "password": ""},
        {"username": "", "password": "pa55"},
    ],
)
def test_empty_credentials_are_refused_rather_than_opening_the_dashboard(
    credentials: dict[str, str],
) -> None:
    # PIPELINE_WEB__TOKEN=$(cat /run/secrets/dash) with the file missing is an empty token: it
    # must not count as credentials, or `--host 0.0.0.0` serves anyone sending "Bearer ".
    with pytest.raises(ValidationError, match="must not be empty"):
        WebSettings.model_validate(credentials)


def test_pipeline_web_does_not_serve_with_an_empty_token(monkeypatch: pytest.MonkeyPatch) -> None:
    import uvicorn
    from click.testing import CliRunner

    from pipeline_cli._main import cli

    def serve(*args: object, **kwargs: object) -> None:
        raise AssertionError("pipeline web served with an empty token")

    monkeypatch.setattr(uvicorn.Server, "run", serve)
    result = CliRunner().invoke(
        cli, ["web", "--host", "0.0.0.0", "--port", "0"], env={"PIPELINE_WEB__TOKEN": ""}
    )
    assert result.exit_code == 2, result.output
    assert "must not be empty" in result.output
