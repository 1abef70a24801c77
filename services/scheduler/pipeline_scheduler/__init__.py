"""``pipeline-scheduler``: releases delayed jobs when due and fires cron schedules.

Run two or more with ``pipeline-scheduler [--app myproject.jobs:app]``: one leads, the others
stand by. Or embed it::

    from pipeline_scheduler import Scheduler
    Scheduler(settings).run()

See docs/scheduler.md for how it works and how to operate it.
"""

from ._runtime import Scheduler

__all__ = ["Scheduler", "main"]


def main() -> None:
    """The ``pipeline-scheduler`` command (``pipeline-scheduler --help``). The process ends
    without the interpreter's finalization (see :mod:`pipeline._processend`)."""
    from pipeline._processend import run_then_end

    from ._cli import main as command

    run_then_end(lambda: command(prog_name="pipeline-scheduler"))
