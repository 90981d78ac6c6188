"""A real headless browser for the web UI's tests: Debian's `chromium` driven by selenium
through Debian's `chromedriver` (selenium's own driver download and playwright's browsers
are not needed). When they are missing and we run as root with apt-get, `find_chromium`
installs the packages (about 20 s, once); otherwise it fails saying what to install."""

from __future__ import annotations

from pathlib import Path

from selenium import webdriver
from selenium.webdriver.chrome.service import Service

from tests.support.debian_packages import ensure_installed

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
PACKAGES = ("chromium", "chromium-driver")


def find_chromium() -> None:
    """Make sure chromium and chromedriver are installed; pytest.fail when they cannot be."""
    ensure_installed((CHROMIUM, CHROMEDRIVER), PACKAGES)


def start_chromium(width: int = 1280, height: int = 900) -> webdriver.Chrome:
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in (
        "--headless=new",
        "--no-sandbox",  # root in a container has no user namespaces for the sandbox
        "--disable-dev-shm-usage",
        "--disable-gpu",
        f"--window-size={width},{height}",
    ):
        options.add_argument(argument)
    return webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))


def screenshot(driver: webdriver.Chrome, path: Path, width: int = 1280) -> None:
    """The whole page (the window fitted to its height) as a PNG at `path`."""
    driver.set_window_size(width, 600)  # scrollHeight is at least the window's height
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(width, max(600, min(int(height) + 140, 4000)))
    path.parent.mkdir(parents=True, exist_ok=True)
    driver.save_screenshot(str(path))
