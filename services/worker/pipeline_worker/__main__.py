"""``python -m pipeline_worker``: the same as the ``pipeline-worker`` command."""

from . import main

main()
