"""The dashboard in a real browser: headless Chromium (Debian's chromium and chromium-driver;
.ci/run installs them) loads the HTML the report wrote, with no console errors, every plot drawn."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

selenium = pytest.importorskip("selenium", reason="selenium is not installed (pip install 'kernel-oracle[test]')")
from selenium import webdriver  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")
pytestmark = [pytest.mark.browser,
              pytest.mark.skipif(not (CHROMIUM and DRIVER),
                                 reason="needs Debian's chromium and chromium-driver (.ci/run installs them)")]


@pytest.fixture(scope="module")
def browser():
    options = webdriver.ChromeOptions()
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1300,2000"):
        options.add_argument(flag)
    options.binary_location = CHROMIUM
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(DRIVER), options=options)
    yield driver
    driver.quit()


def test_dashboard_renders_without_errors(browser, small_report):
    html = Path(small_report["html"])
    browser.get(html.resolve().as_uri())
    assert "kernel-oracle drift" in browser.title
    images = browser.execute_script(
        "return Array.from(document.images).map(i => ({alt: i.alt, complete: i.complete, width: i.naturalWidth}))")
    assert len(images) >= 4, images
    assert all(image["complete"] and image["width"] > 0 for image in images), images
    errors = [entry for entry in browser.get_log("browser") if entry["level"] == "SEVERE"]
    assert errors == [], errors
    # A full-page screenshot beside the HTML, for a person to look at.
    height = browser.execute_script("return document.body.scrollHeight")
    browser.set_window_size(1300, min(height, 16000))
    assert browser.save_screenshot(str(html.with_suffix(".png")))
