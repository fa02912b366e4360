"""Debian's headless Chromium driven by selenium, and the page helpers the browser tests share
(tests/integration/test_web_page.py, test_sam3_concept_web.py)."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

WAIT_S = 60


def find_browser() -> tuple[str, str]:
    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    driver = shutil.which("chromedriver") or "/usr/bin/chromedriver"
    if not (Path(chromium).exists() and Path(driver).exists()):
        pytest.fail("chromium / chromedriver missing: run `make browser-tools`")
    return chromium, driver


@contextmanager
def chromium(downloads: Path) -> Iterator[object]:
    """A headless Chromium (selenium WebDriver) that downloads into ``downloads``; its
    console errors are printed when it closes."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    binary, driver = find_browser()
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        options.add_argument(arg)
    options.add_argument("--window-size=1280,800")
    options.add_experimental_option(
        "prefs",
        {"download.default_directory": str(downloads), "download.prompt_for_download": False},
    )
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    chrome = webdriver.Chrome(service=Service(driver), options=options)
    try:
        yield chrome
    finally:
        for entry in chrome.get_log("browser"):
            if entry["level"] == "SEVERE" and "favicon" not in entry["message"]:
                print("browser:", entry["message"])
        chrome.quit()


def js(browser, script: str, *args):
    return browser.execute_script(script, *args)


def wait_for(browser, script: str, what: str, timeout_s: float = WAIT_S):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = js(browser, f"return {script}")
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}; page error: {error_text(browser)!r}")


def error_text(browser) -> str:
    return js(
        browser,
        "return document.getElementById('error').hidden ? '' : "
        "document.getElementById('error-text').textContent",
    )


def open_image(browser, path: Path) -> None:
    before = js(browser, "return annotator.stats.embeds.length + annotator.stats.errors.length")
    browser.find_element("id", "file").send_keys(str(path))
    wait_for(
        browser,
        f"annotator.stats.embeds.length + annotator.stats.errors.length > {before}",
        f"{path.name} to be opened or refused",
    )
