"""The dashboard as an ASGI application: :func:`create_app`.

It builds the :class:`~._dashboard.Dashboard` every page uses (settings, the monitor's readings,
the dead-letter index, the security gate, the audit log, the templates) and the routes of the
pages: ``_overview``, ``_jobsview``, ``_letters`` and ``_schedules``. The monitor reads from the
application's lifespan on, or from its first request when a host application does not pass
its lifespan on; after each reading it refreshes the dead-letter index.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import TYPE_CHECKING

from jinja2 import Environment, FileSystemLoader
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from pipeline._deadletters import LetterIndex
from pipeline._failures import utf8_safe

from ._audit import AuditLog
from ._csrf import cross_site_refusal
from ._dashboard import Dashboard, dashboard_of, read_form, read_new_letters
from ._format import FILTERS, printable
from ._monitor import Monitor
from ._security import Gate, clear_session_cookie, client_address, set_session_cookie

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable

    from starlette.requests import Request

    from pipeline import Settings

_HERE = Path(__file__).parent
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
"""The pages' own files only: no inline script or style, no other origin (a payload or an
error shown on a page that escaping missed could run nothing), no framing, no form posted
elsewhere."""


class _Authenticate(BaseHTTPMiddleware):
    async def dispatch(
        self, request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        response = await self._admitted(request, call_next)
        # Refusals too: every response carries the headers.
        response.headers.setdefault("Content-Security-Policy", CONTENT_SECURITY_POLICY)
        response.headers.setdefault("X-Frame-Options", "DENY")
        response.headers.setdefault("X-Content-Type-Options", "nosniff")
        response.headers.setdefault("Referrer-Policy", "same-origin")
        if not request.url.path.startswith("/static/"):
            # Pages hold payloads, errors and the CSRF token: no copy in a browser's cache
            # (shown again after logging out) or a proxy's (served to someone else).
            response.headers.setdefault("Cache-Control", "no-store")
        return response

    @staticmethod
    async def _admitted(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        """The route's response, or the refusal of a request not admitted."""
        dashboard = dashboard_of(request)
        dashboard.monitor.start()  # mounted in a service whose lifespan does not reach us
        # A POST from another site is refused before its credentials are checked, so that a
        # login another site posts from an operator's browser counts no failure.
        if (cross_site := cross_site_refusal(request)) is not None:
            return cross_site
        who, refusal = dashboard.gate.admit(request)
        if refusal is not None:
            return refusal
        request.state.who = who
        return await call_next(request)


async def _login_page(request: Request) -> Response:
    dashboard = dashboard_of(request)
    request.state.who = None
    if request.method == "GET":
        return dashboard.render(request, "login.html", {"next": request.query_params.get("next")})
    form = await read_form(request)
    token = form.get("token")
    if dashboard.web.token is None or not isinstance(token, str):
        return PlainTextResponse("this dashboard has no token login", status_code=404)
    gate = dashboard.gate
    client = client_address(request)
    if (wait := gate.throttle.retry_after(client)) is not None:
        # Refused unchecked, the right token too: a locked-out guesser learns nothing.
        context = {"next": form.get("next"), "retry_after": wait}
        locked = dashboard.render(request, "login.html", context, status_code=429)
        locked.headers["Retry-After"] = str(wait)
        return locked
    if not gate.token_matches(token):
        gate.throttle.failed(client)
        return dashboard.render(
            request, "login.html", {"next": form.get("next"), "wrong": True}, status_code=401
        )
    target = form.get("next")
    safe = isinstance(target, str) and target.startswith("/") and not target.startswith("//")
    response = RedirectResponse(target if safe and isinstance(target, str) else "/", 303)
    set_session_cookie(request, response, gate)
    return response


async def _logout(request: Request) -> Response:
    """Clear the session cookie, and go to the login page. CSRF-checked, so that another site
    cannot log a user out; allowed read-only, as it changes nothing on Kafka."""
    await dashboard_of(request).checked_form(request)
    response = RedirectResponse("/login", 303)
    clear_session_cookie(request, response)
    return response


async def _healthz(request: Request) -> Response:
    """``ok`` once Kafka was read and while it is; 503 otherwise, before the first reading too
    (it may never come). On the event loop: it only reads what the monitor keeps, and must
    answer while every thread of the pool serves a page waiting for Kafka. Anyone may ask, so
    it does not repeat Kafka's error (broker addresses, principals): the log and the pages,
    behind the login, do."""
    monitor = dashboard_of(request).monitor
    if monitor.problem is not None:
        return PlainTextResponse("kafka: cannot be read", status_code=503)
    if monitor.latest is None:
        return PlainTextResponse("kafka: not read yet", status_code=503)
    return PlainTextResponse("ok")


async def _http_error(request: Request, exc: Exception) -> Response:
    """An :class:`HTTPException` as Starlette answers it, its text sendable: a refusal may
    repeat an error holding a lone surrogate (see :func:`~._format.printable`)."""
    assert isinstance(exc, HTTPException)
    if exc.status_code in (204, 304):
        return Response(status_code=exc.status_code, headers=exc.headers)
    text = utf8_safe(exc.detail)
    return PlainTextResponse(text, status_code=exc.status_code, headers=exc.headers)


def create_app(settings: Settings, *, timeout: float = 10.0) -> Starlette:
    """The dashboard of ``settings.namespace``, configured by ``settings.web``.

    Mount it in an ASGI service, or serve it with ``pipeline web``. It reads Kafka from a
    background thread started with the application's lifespan; ``timeout`` bounds each read.
    """
    from . import _jobsview, _letteractions, _letters, _overview, _schedules

    web = settings.web
    audit = AuditLog(web.audit_log)  # first: it refuses a file it cannot append to
    environment = Environment(
        loader=FileSystemLoader(_HERE / "templates"), autoescape=True, finalize=printable
    )
    environment.filters.update(FILTERS)
    templates = Jinja2Templates(env=environment)
    letters = LetterIndex(settings, timeout=timeout)
    monitor = Monitor(
        settings,
        refresh_s=web.refresh_s,
        history_s=web.history_s,
        timeout=timeout,
        before=lambda timeout: read_new_letters(letters, timeout),
        dead_letters=letters.stats,
    )
    dashboard = Dashboard(settings, monitor, Gate(web), audit, templates, letters)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        monitor.start()
        try:
            yield
        finally:
            monitor.stop()
            letters.close()

    routes: list[BaseRoute] = [
        *_overview.ROUTES,
        *_jobsview.ROUTES,
        *_letters.ROUTES,
        *_letteractions.ROUTES,
        *_schedules.ROUTES,
        Route("/login", _login_page, methods=["GET", "POST"]),
        Route("/logout", _logout, methods=["POST"]),
        Route("/healthz", _healthz),
        Mount("/static", StaticFiles(directory=_HERE / "static"), name="static"),
    ]
    app = Starlette(
        routes=routes,
        middleware=[Middleware(_Authenticate)],
        exception_handlers={HTTPException: _http_error},
        lifespan=lifespan,
    )
    app.state.dashboard = dashboard
    return app
