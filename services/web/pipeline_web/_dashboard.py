"""What every page of the dashboard shares: :class:`Dashboard`, found on the application as
``request.app.state.dashboard`` (:func:`dashboard_of`)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from starlette.exceptions import HTTPException

from pipeline._deadletters import INDEX_STEP, LetterFilter, LetterIndex

from ._csrf import CSRF_FIELD, csrf_matches, csrf_token, set_csrf_cookie
from ._notices import notice_of
from ._security import SESSION_COOKIE

if TYPE_CHECKING:
    from starlette.datastructures import FormData
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.templating import Jinja2Templates

    from pipeline import Settings
    from pipeline._deadletters import StoredLetter
    from pipeline._websettings import WebSettings

    from ._audit import AuditLog
    from ._monitor import Monitor
    from ._security import Gate


def read_new_letters(letters: LetterIndex, timeout: float) -> None:
    """Fold into ``letters`` the dead letters and states written since its last reading (one
    step of a deep topic at most); raises what :meth:`LetterIndex.refresh` raises."""
    letters.refresh(timeout, limit=INDEX_STEP)


JOB_LOOKUPS = 2
"""Job lookups (``/jobs?id=``) one dashboard process runs at once; another is answered 503."""


@dataclass
class Dashboard:
    """Everything the pages share."""

    settings: Settings
    monitor: Monitor
    gate: Gate
    audit: AuditLog
    templates: Jinja2Templates
    letters: LetterIndex
    lookups: threading.BoundedSemaphore = field(
        default_factory=lambda: threading.BoundedSemaphore(JOB_LOOKUPS)
    )
    """Job lookups running: each reads ``<ns>.events`` to its end (see :mod:`._jobsview`)."""

    @property
    def web(self) -> WebSettings:
        return self.settings.web

    def read_new_letters(self, timeout: float) -> None:
        """:func:`read_new_letters` for a page: at once :class:`KafkaDownError` when the monitor
        finds Kafka unreachable (see :meth:`Monitor.guarded`)."""
        self.monitor.guarded(lambda: read_new_letters(self.letters, timeout))

    def letters_of_job(self, job_id: str, timeout: float) -> list[StoredLetter]:
        """The dead letters of job ``job_id`` (summaries, oldest first), from the index read
        up to now first: a job dead-lettered a moment ago shows its letter."""
        self.read_new_letters(timeout)
        matching = LetterFilter(ids=(job_id,))
        page = self.letters.query(matching, status="all", limit=1000, newest_first=False)
        return [s for s in page.letters if s.letter.job_id == job_id]

    def render(
        self, request: Request, template: str, context: dict[str, Any], status_code: int = 200
    ) -> Response:
        """A page, with what every page shows (the user, the CSRF token, Kafka's state to a
        logged-in user)."""
        base = {
            "request": request,
            "settings": self.settings,
            "read_only": self.web.read_only,
            "who": request.state.who,
            "csrf_field": CSRF_FIELD,
            "csrf": csrf_token(request, self.gate),
            # A browser logged in at /login can log out; a bearer header or basic credentials
            # are the client's to stop sending.
            "session": self.gate.session_valid(request.cookies.get(SESSION_COOKIE)),
            # Kafka's error names brokers and principals: not for the login page's strangers.
            "problem": self.monitor.problem if request.state.who is not None else None,
            "letters_problem": (
                self.monitor.letters_problem if request.state.who is not None else None
            ),
            "notice": notice_of(self.gate, request.query_params),
        }
        response = self.templates.TemplateResponse(
            request, template, {**base, **context}, status_code=status_code
        )
        set_csrf_cookie(request, response)
        return response

    async def action_form(self, request: Request) -> FormData:
        """The form of an action POST, once it passed the read-only and CSRF checks."""
        if self.web.read_only:
            raise HTTPException(403, "this dashboard is read-only (web.read_only)")
        return await self.checked_form(request)

    async def checked_form(self, request: Request) -> FormData:
        """The form of a POST, once it passed the CSRF check (the middleware already refused
        one from another site: see ``_csrf``)."""
        form = await read_form(request)
        submitted = form.get(CSRF_FIELD)
        if not csrf_matches(request, submitted if isinstance(submitted, str) else None, self.gate):
            raise HTTPException(
                403, "the form's CSRF token is missing or wrong: reload the page and try again"
            )
        return form


URLENCODED = "application/x-www-form-urlencoded"
MAX_FORM_BYTES = 64 * 1024
"""The largest form body a POST may declare (``Content-Length``); a larger one is refused with
413 before any of it is read. The dashboard's forms hold a filter and a few hidden fields."""
MAX_FORM_FIELDS = 64
MAX_FIELD_BYTES = 16 * 1024
"""What a form body without a ``Content-Length`` (chunked) may hold: the parser refuses with
400 the field past either bound, so it reads ``MAX_FORM_FIELDS * MAX_FIELD_BYTES`` at most."""


async def read_form(request: Request) -> FormData:
    """The form of a POST, bounded: ``/login`` and ``/logout`` read it before any login.

    Only a URL-encoded form, the only kind the dashboard's pages send (or none: an empty form,
    nothing read): a multipart one may carry file parts, which the parser writes to disk
    whatever their size."""
    kind = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if kind not in ("", URLENCODED):
        raise HTTPException(415, f"a form is read as {URLENCODED} only")
    declared = request.headers.get("content-length", "")
    digits = declared.isascii() and declared.isdigit()
    if digits and (len(declared) > 12 or int(declared) > MAX_FORM_BYTES):
        raise HTTPException(413, f"a form of at most {MAX_FORM_BYTES} bytes is read")
    return await request.form(max_fields=MAX_FORM_FIELDS, max_part_size=MAX_FIELD_BYTES)


def dashboard_of(request: Request) -> Dashboard:
    dashboard: Dashboard = request.app.state.dashboard
    return dashboard
