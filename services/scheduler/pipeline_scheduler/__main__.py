"""``python -m pipeline_scheduler``: the same as the ``pipeline-scheduler`` command."""

from ._cli import main

main(prog_name="pipeline-scheduler")
