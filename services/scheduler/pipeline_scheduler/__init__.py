"""``pipeline-scheduler``: releases delayed jobs when due and fires cron schedules.

Run two or more with ``pipeline-scheduler [--app myproject.jobs:app]``: one leads, the others
stand by. Or embed it::

    from pipeline_scheduler import Scheduler
    Scheduler(settings).run()

See docs/scheduler.md for how it works and how to operate it.
"""

from ._cli import main
from ._runtime import Scheduler

__all__ = ["Scheduler", "main"]
