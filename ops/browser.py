"""Headless Chromium driven by Selenium, from the system's packages (Debian's ``chromium`` and
``chromium-driver``): nothing is downloaded. The dashboard's tests and its benchmark use it."""

from __future__ import annotations

import shutil
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from selenium.webdriver.remote.webdriver import WebDriver

INSTALL_HINT = "apt-get install chromium chromium-driver"
WINDOW = (1280, 900)


class ChromiumMissingError(RuntimeError):
    """Chromium or its driver is not installed."""


def headless_chromium() -> WebDriver:
    """A new headless Chromium session with a 1280x900 window; the caller quits it."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver_path = shutil.which("chromedriver")
    if chromium is None or driver_path is None:
        raise ChromiumMissingError(f"Chromium and its driver are needed: {INSTALL_HINT}")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for argument in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        f"--window-size={WINDOW[0]},{WINDOW[1]}",
    ):
        options.add_argument(argument)
    return webdriver.Chrome(options=options, service=Service(executable_path=driver_path))
