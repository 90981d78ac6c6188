"""A real headless browser for the web UI's tests: Debian's `chromium` driven by selenium
through Debian's `chromedriver` (selenium's own driver download and playwright's browsers
are not needed). When they are missing and we run as root with apt-get, `find_chromium`
installs the packages (about 20 s, once); otherwise it fails saying what to install."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
PACKAGES = ("chromium", "chromium-driver")
INSTALL_HINT = f"install them: apt-get install -y {' '.join(PACKAGES)}"
APT_TIMEOUT = 900  # s


def _present() -> bool:
    return all(os.access(path, os.X_OK) for path in (CHROMIUM, CHROMEDRIVER))


def find_chromium() -> None:
    """Make sure chromium and chromedriver are installed; pytest.fail when they cannot be."""
    if _present():
        return
    apt_get = shutil.which("apt-get")
    if apt_get is None or os.geteuid() != 0:
        pytest.fail(
            f"{CHROMIUM} and {CHROMEDRIVER} are missing (not root with apt-get to fix "
            f"it): {INSTALL_HINT}"
        )
    environment = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for argv in ([apt_get, "update"], [apt_get, "install", "-y", *PACKAGES]):
        result = subprocess.run(
            argv, capture_output=True, text=True, env=environment, timeout=APT_TIMEOUT, check=False
        )
        if result.returncode != 0:
            tail = "\n".join((result.stdout + result.stderr).splitlines()[-15:])
            pytest.fail(f"`{' '.join(argv)}` exited with {result.returncode}: {tail}")
    if not _present():
        pytest.fail(f"apt-get ran but {CHROMIUM} or {CHROMEDRIVER} is still missing")


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
