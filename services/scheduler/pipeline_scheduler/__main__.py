"""``python -m pipeline_scheduler``: the same as the ``pipeline-scheduler`` command."""

from . import main

main()
