"""``pipeline web``: the dashboard (:mod:`pipeline_web`) served by uvicorn.

It listens on 127.0.0.1 unless told otherwise, and refuses any other address while no
credentials are set (``web.token``, or ``web.username`` and ``web.password``).
"""

from __future__ import annotations

import logging
import socket
from typing import TYPE_CHECKING

import click

from pipeline._cliargs import not_empty
from pipeline._logfmt import configure_logging

from ._output import UsageFailure, cli_errors, common_options

if TYPE_CHECKING:
    from pipeline import Settings

_log = logging.getLogger("pipeline.web")


def _listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise UsageFailure(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    sock.listen(128)
    return sock


@click.command()
@click.option(
    "--host",
    default=None,
    callback=not_empty,
    help="Address to listen on [default: $PIPELINE_WEB__HOST, else 127.0.0.1].",
)
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=None,
    help="Port to listen on, 0 for a free one [default: $PIPELINE_WEB__PORT, else 8180].",
)
@click.option(
    "--read-only",
    is_flag=True,
    default=None,
    help="Hide every action (replay, discard, pause, resume, trigger) "
    "[default: $PIPELINE_WEB__READ_ONLY].",
)
@common_options
def web(host: str | None, port: int | None, read_only: bool | None, settings: Settings) -> None:
    """Serve the dashboard: backlog, workers, job lookup, dead letters and schedules.

    Without credentials it serves this machine only. To serve others, set a token
    (PIPELINE_WEB__TOKEN) or basic credentials (PIPELINE_WEB__USERNAME and
    PIPELINE_WEB__PASSWORD) and --host. Every action is audited (see docs/web.md).

    \b
    Examples:
      pipeline web
      PIPELINE_WEB__TOKEN=$(cat token) pipeline web --host 0.0.0.0 --read-only
    """
    try:
        from pipeline_web import create_app
        from pipeline_web._serve import serve
    except ImportError as exc:
        raise click.ClickException(
            f"the dashboard needs the web extra ({exc.name} is missing): "
            "pip install 'kafka-pipeline[web]'"
        ) from None
    from pipeline_web import is_loopback

    changes = {
        key: value
        for key, value in {"host": host, "port": port, "read_only": read_only}.items()
        if value is not None
    }
    with cli_errors():
        web_settings = settings.web.model_validate({**settings.web.model_dump(), **changes})
    if not web_settings.auth_enabled and not is_loopback(web_settings.host):
        raise UsageFailure(
            f"refusing to serve {web_settings.host} without credentials: set PIPELINE_WEB__TOKEN, "
            "or PIPELINE_WEB__USERNAME and PIPELINE_WEB__PASSWORD, or listen on 127.0.0.1"
        )
    settings = settings.model_copy(update={"web": web_settings})
    configure_logging("INFO", settings.log_format)
    with cli_errors():  # web.audit_log that cannot be appended to
        app = create_app(settings)
    sock = _listen(web_settings.host, web_settings.port)
    bound = sock.getsockname()[1]
    shown = f"[{web_settings.host}]" if ":" in web_settings.host else web_settings.host
    click.echo(
        f"dashboard of namespace {settings.namespace!r} at http://{shown}:{bound}/", err=True
    )
    serve(app, sock)  # until SIGINT or SIGTERM, then exit 0
