"""The dashboard under test: ``pipeline web`` as a child process, and Debian's Chromium driven
by Selenium through Debian's chromedriver (nothing is downloaded).

Screenshots of each page go to ``$PIPELINE_TEST_ARTIFACTS/web`` (default ``test-artifacts/web``
in the repository, git-ignored).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from ops.browser import WINDOW, ChromiumMissingError, headless_chromium
from ops.webproc import WebProcess, spawn_web

from tests.waiting import wait_for

from ..worker.fixtures import kit, schedulers

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping

    from selenium.webdriver.remote.webdriver import WebDriver

    from pipeline import Settings

__all__ = ["browser", "kit", "schedulers", "screenshot", "web"]

REPO = Path(__file__).resolve().parents[3]
ARTIFACTS = Path(os.environ.get("PIPELINE_TEST_ARTIFACTS", REPO / "test-artifacts")) / "web"


@dataclass
class WebFactory:
    settings: Settings
    log_dir: Path
    started: list[WebProcess] = field(default_factory=list)

    def start(self, *args: str, env: Mapping[str, str] | None = None) -> WebProcess:
        """Start ``pipeline web --port 0 *args`` and wait until it answers."""
        log = self.log_dir / f"web-{len(self.started) + 1}.log"
        server = spawn_web(
            self.settings, log, *args, env={"PIPELINE_WEB__REFRESH_S": "0.5", **(env or {})}
        )
        self.started.append(server)
        exited = server.process.poll
        assert wait_for(lambda: server.listening() or exited() is not None, 60), server.output()
        assert server.url, f"pipeline web exited with {exited()}:\n{server.output()}"
        assert wait_for(lambda: server.answers() or exited() is not None, 60), server.output()
        assert exited() is None, server.output()
        return server


@pytest.fixture
def web(settings: Settings, tmp_path: Path) -> Iterator[WebFactory]:
    factory = WebFactory(settings, tmp_path)
    try:
        yield factory
    finally:
        for server in factory.started:
            server.stop()


@pytest.fixture(scope="session")
def browser() -> Iterator[WebDriver]:
    """Headless Chromium; a missing browser fails the test with how to install it."""
    try:
        driver = headless_chromium()
    except ChromiumMissingError as exc:
        pytest.fail(str(exc))
    try:
        yield driver
    finally:
        driver.quit()


def screenshot(driver: WebDriver, name: str) -> Path:
    """Save the page as ``<artifacts>/web/<name>.png`` (the whole page's height)."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(WINDOW[0], max(WINDOW[1], min(int(height) + 40, 4000)))
    path = ARTIFACTS / f"{name}.png"
    assert driver.save_screenshot(str(path)), f"no screenshot saved at {path}"
    driver.set_window_size(*WINDOW)
    return path
