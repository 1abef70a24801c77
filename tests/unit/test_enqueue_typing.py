"""``.enqueue`` on a decorated function is type-checked against the handler's parameters.

The check runs mypy on a small file that imports ``pipeline`` as an installed package would be
imported, so it also shows that the package ships ``py.typed`` (without it mypy reports the
import as untyped and checks nothing).
"""

from __future__ import annotations

import re
import textwrap
from typing import TYPE_CHECKING

from mypy import api

if TYPE_CHECKING:
    from pathlib import Path

SOURCE = """
from pipeline import JobContext, Pipeline

app = Pipeline()


@app.job("notify")
def notify(user_id: int, message: str) -> None: ...


@app.job("resize")
def resize(ctx: JobContext, width: int, height: int = 0) -> None: ...


notify.enqueue(user_id=1, message="hi")  # ok
notify.enqueue(1, "hi")  # ok
resize.enqueue(width=3)  # ok
resize.with_options(priority="high").enqueue(width=3, height=4)  # ok
notify.enqueue(user_id="not-an-int", message="hi")  # error: arg-type
notify.enqueue(user_id=1)  # error: call-arg
notify.enqueue(user_id=1, message="hi", colour="red")  # error: call-arg
resize.enqueue(width="wide")  # error: arg-type
resize.with_options(priority="high").enqueue(height=4)  # error: call-arg
"""


PLUGIN_SOURCE = """
from pipeline import JobContext, Pipeline

app = Pipeline()


@app.job("notify")
def notify(user_id: int, ctx: JobContext, message: str = "") -> None: ...


notify.enqueue(user_id=1)  # ok
notify.enqueue(1, "hi")  # ok
notify.with_options(delay=5).enqueue(user_id=1, message="hi")  # ok
notify.enqueue(user_id="1")  # error: arg-type
notify.enqueue(user_id=1, ctx=None)  # error: call-arg
notify.with_options(delay=5).enqueue(message="hi")  # error: call-arg
"""


def test_mypy_checks_enqueue_calls_against_the_handler(tmp_path: Path) -> None:
    _check(tmp_path, SOURCE, "")


def test_the_mypy_plugin_leaves_out_a_ctx_that_is_not_first(tmp_path: Path) -> None:
    _check(tmp_path, PLUGIN_SOURCE, "plugins = pipeline.mypy\n")


def _check(tmp_path: Path, text: str, options: str) -> None:
    """Run mypy on ``text``: its errors must be exactly the lines marked ``# error: CODE``."""
    source = tmp_path / "jobs.py"
    source.write_text(textwrap.dedent(text))
    config = tmp_path / "mypy.ini"
    # Not the project's configuration: no mypy_path to libs/, pipeline is found installed.
    config.write_text("[mypy]\nstrict = True\n" + options)
    stdout, stderr, _ = api.run(
        [
            "--config-file",
            str(config),
            "--cache-dir",
            str(tmp_path / "cache"),
            "--no-error-summary",
            "--hide-error-context",
            "--show-error-codes",
            str(source),
        ]
    )
    assert stderr == ""
    found = {}
    for line in stdout.splitlines():
        if ": note: " in line:
            continue
        match = re.match(r".*jobs\.py:(\d+): error: .*\[([a-z-]+)\]$", line)
        assert match, f"unexpected mypy output: {line}"
        found[int(match[1])] = match[2]
    lines = source.read_text().splitlines()
    expected = {
        number: line.rsplit("error: ", 1)[1]
        for number, line in enumerate(lines, start=1)
        if "# error:" in line
    }
    assert found == expected, stdout
