"""The commands end without the interpreter's finalization, with their exit code.

A Kafka client still alive at exit can crash the finalization or the C library's exit handlers
(see ``pipeline._processend``). That race cannot be forced on purpose, so here an object whose
``__del__`` crashes the process (as a librdkafka thread racing OpenSSL's cleanup does) stands
for it: each command's entry point, run the way its console script runs it, still exits with
its own code, after its ``atexit`` functions ran and with its output flushed.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from pipeline import _processend

ENTRY_POINTS = {
    "pipeline-worker": "from pipeline_worker import main",
    "pipeline-scheduler": "from pipeline_scheduler import main",
    "pipeline": "from pipeline_cli import main",
}
USAGE_ERROR = 2


def run_entry_point(name: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``name *args`` in a process whose finalization would crash (SIGSEGV)."""
    script = textwrap.dedent(
        f"""
        import atexit, ctypes, sys

        class CrashesWhenFinalized:
            def __del__(self):
                ctypes.string_at(0)

        crashes = CrashesWhenFinalized()
        atexit.register(lambda: print("atexit ran", end="", file=sys.stderr))
        sys.argv = [{name!r}, *{list(args)!r}]
        {ENTRY_POINTS[name]}
        print("unflushed", end="")
        main()
        """
    )
    return subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )


@pytest.mark.parametrize("name", sorted(ENTRY_POINTS))
def test_a_command_exits_with_its_code_whatever_finalization_would_do(name: str) -> None:
    helped = run_entry_point(name, "--help")
    assert helped.returncode == 0, helped.stderr
    assert helped.stdout.startswith("unflushed")
    assert "Usage:" in helped.stdout
    assert helped.stderr.endswith("atexit ran")

    wrong = run_entry_point(name, "--no-such-option")
    assert wrong.returncode == USAGE_ERROR, wrong.stderr
    assert "No such option '--no-such-option'" in wrong.stderr
    assert wrong.stderr.endswith("atexit ran")


def test_the_exit_code_is_the_one_the_interpreter_would_give(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert _processend._code_of(SystemExit()) == 0
    assert _processend._code_of(SystemExit(4)) == 4
    assert _processend._code_of(SystemExit(256 + 3)) == 3
    assert _processend._code_of(SystemExit("fenced")) == 1
    assert capsys.readouterr().err == "fenced\n"
