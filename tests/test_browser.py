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


COMMITTED = sorted((Path(__file__).parent.parent / "reports").glob("drift-*.html"))


@pytest.mark.parametrize("dashboard", COMMITTED, ids=lambda p: p.name)
def test_a_committed_dashboard_opens_and_its_headline_says_what_it_compares(browser, dashboard):
    """What a user sees first is true: the cards' numbers are whole (passed / all), and a count of
    regressions names the baseline it was counted against."""
    browser.get(dashboard.resolve().as_uri())
    cards = browser.execute_script("return Array.from(document.querySelectorAll('.card')).map(c => c.innerText)")
    passed = next(c for c in cards if c.startswith("cases passed"))
    done, total = (int(n) for n in passed.split()[-3::2])
    assert 0 < total and done <= total, cards
    assert all("against the baseline" in c for c in cards if "regression" in c), cards
    errors = [entry for entry in browser.get_log("browser") if entry["level"] == "SEVERE"]
    assert errors == [], errors
    if dashboard.name == "drift-h200.html":  # the committed H200 baseline's own run: every case passed
        assert done == total, passed
