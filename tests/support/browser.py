"""A real headless Chromium driven by selenium, for the console's tests: Debian's `chromium` and
`chromium-driver` (installed by `make test-deps`), never a downloaded browser or driver.

`Console` wraps one browser on one node's console: log in with the token, go to a page, wait for
an element or a text, and save a screenshot when `CONSOLE_SCREENSHOTS` names a directory (the
PNGs in docs/images are taken that way)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException, TimeoutException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.ui import WebDriverWait

CHROMIUM = os.environ.get("CHROMIUM_BINARY", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("CHROMEDRIVER", "/usr/bin/chromedriver")
SCREENSHOTS = os.environ.get("CONSOLE_SCREENSHOTS", "")
WAIT = 20.0


@contextmanager
def headless_chromium() -> Iterator[webdriver.Chrome]:
    """A headless Chromium (quit at the end, which also ends chromedriver)."""
    for path, package in ((CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver")):
        if not (shutil.which(path) or Path(path).is_file()):
            pytest.fail(f"{path} not found: install Debian's {package} (make test-deps)")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in (
        "--headless=new",
        "--no-sandbox",  # runs as root in containers
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1280,860",
        "--no-first-run",
        "--disable-extensions",
        "--disable-background-networking",
        "--lang=en-GB",
    ):
        options.add_argument(argument)
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    try:
        yield driver
    finally:
        driver.quit()


class Console:
    """One browser on the console of the node whose admin API listens on `admin_port`."""

    def __init__(self, driver: webdriver.Chrome, admin_port: int) -> None:
        self.driver = driver
        self.base = f"http://127.0.0.1:{admin_port}/console/"

    def open(self, fragment: str = "") -> None:
        self.driver.get(self.base + fragment)

    def log_in(self, token: str) -> None:
        """Type the token into the token input and press Enter."""
        self.open()
        self.find("token").send_keys(token, Keys.ENTER)

    def go(self, fragment: str) -> None:
        """Show another page of the console (in the same tab, as a link would)."""
        self.driver.execute_script("location.hash = arguments[0]", fragment)

    def find(self, testid: str, within: WebElement | None = None) -> WebElement:
        """The visible element with `data-testid`, once there is one."""
        selector = f"[data-testid='{testid}']"

        def found(_: Any) -> WebElement | bool:
            for el in (within or self.driver).find_elements(By.CSS_SELECTOR, selector):
                if el.is_displayed():
                    return el
            return False

        return self.until(found, f"no visible [data-testid={testid}]")

    def all(self, testid: str) -> list[WebElement]:
        return self.driver.find_elements(By.CSS_SELECTOR, f"[data-testid='{testid}']")

    def text_of(self, testid: str) -> str:
        return self.find(testid).text

    def until(self, condition: Callable[[Any], Any], message: str, timeout: float = WAIT) -> Any:
        """What `condition(driver)` returns once it is truthy (a stale element counts as not
        yet: the pages redraw as answers arrive)."""

        def probe(driver: Any) -> Any:
            try:
                return condition(driver)
            except StaleElementReferenceException:
                return False

        try:
            return WebDriverWait(self.driver, timeout).until(probe)
        except TimeoutException:
            raise AssertionError(f"{message} (page: {self.driver.current_url})") from None

    def wait_text(self, testid: str, check: Callable[[str], bool], what: str) -> str:
        return self.until(
            lambda _: (t := self.find(testid).text) and check(t) and t, f"{testid}: {what}"
        )

    def page_loaded(self, page: str) -> None:
        """Wait until the page named `page` has drawn its first answer."""
        self.until(
            lambda d: d.find_elements(By.CSS_SELECTOR, f"[data-page='{page}'][data-loaded]"),
            f"page {page} did not load",
        )

    def screenshot(self, name: str) -> None:
        """Save the window as <CONSOLE_SCREENSHOTS>/<name>.png (when the variable is set)."""
        if not SCREENSHOTS:
            return
        directory = Path(SCREENSHOTS)
        directory.mkdir(parents=True, exist_ok=True)
        # The whole page, not only the window: grow the window to the page's height meanwhile.
        size = self.driver.get_window_size()
        height = self.driver.execute_script("return document.documentElement.scrollHeight")
        self.driver.set_window_size(size["width"], max(size["height"], height + 140))
        try:
            self.driver.save_screenshot(str(directory / f"{name}.png"))
        finally:
            self.driver.set_window_size(size["width"], size["height"])

    def session_storage(self) -> dict[str, str]:
        return self.driver.execute_script(
            "return Object.fromEntries(Object.entries(sessionStorage))"
        )

    def local_storage(self) -> dict[str, str]:
        return self.driver.execute_script("return Object.fromEntries(Object.entries(localStorage))")
