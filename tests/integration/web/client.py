"""A small HTTP client for the dashboard tests' requests that a browser would not make (a form
sent twice, a POST without its CSRF token), with the browser's cookies when asked."""

from __future__ import annotations

import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Mapping

    from selenium.webdriver.remote.webdriver import WebDriver


@dataclass(frozen=True)
class Answer:
    status: int
    body: str
    headers: Mapping[str, str]


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None


def request(
    url: str,
    *,
    form: Mapping[str, str] | None = None,
    cookies: Mapping[str, str] | None = None,
    headers: Mapping[str, str] | None = None,
) -> Answer:
    """GET ``url``, or POST ``form`` to it; redirects are returned, not followed."""
    data = urllib.parse.urlencode(form).encode() if form is not None else None
    sent = dict(headers or {})
    if cookies:
        sent["Cookie"] = "; ".join(f"{k}={v}" for k, v in cookies.items())
    opener = urllib.request.build_opener(_NoRedirect)
    try:
        with opener.open(urllib.request.Request(url, data=data, headers=sent), timeout=60) as r:
            return Answer(r.status, r.read().decode(), dict(r.headers))
    except urllib.error.HTTPError as exc:
        return Answer(exc.code, exc.read().decode(errors="replace"), dict(exc.headers))


def browser_cookies(driver: WebDriver) -> dict[str, str]:
    return {c["name"]: c["value"] for c in driver.get_cookies()}
