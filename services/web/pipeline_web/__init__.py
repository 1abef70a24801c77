"""The pipeline dashboard: queues, workers, jobs, dead letters and schedules, in a browser.

``pipeline web`` serves it; :func:`create_app` returns the ASGI application to mount in a
service of your own. It reads and writes Kafka through the library only. See docs/web.md.
"""

from __future__ import annotations

from ._app import create_app
from ._security import is_loopback

__all__ = ["create_app", "is_loopback"]
