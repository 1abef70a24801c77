"""The fixtures of the test kit's pytest plugin, and :class:`StubFactory`, the type of
``pipeline_stub``, for type hints.

The plugin itself is the top-level module ``pipeline_testing_plugin`` (entry point ``pytest11``,
name ``pipeline``): pytest loads it in every run, and a project's own ``pipeline`` package
would hide this one. This module names the same fixtures, for a ``conftest.py`` that lists it
in ``pytest_plugins``.
"""

from __future__ import annotations

from pipeline_testing_plugin import StubFactory, pipeline_clock, pipeline_stub

__all__ = ["StubFactory", "pipeline_clock", "pipeline_stub"]
