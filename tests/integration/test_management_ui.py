"""The management web UI (`/` on the management listener), in a real headless browser
(Debian's chromium through selenium, tests/support/browser.py): log in, watch a queue's
depth follow pika's publishes, purge it, publish from an exchange's page and get the
message from the queue's page, close a pika connection with a reason. Each page's
screenshot goes to a temporary folder, or with STARLIGHT_TEST_SCREENSHOTS=docs to
docs/images/ui-<page>.png (shown in docs/management.md), so that a test run leaves the
checkout as it was.

Proxy-only: RabbitMQ serves a UI of its own."""

from __future__ import annotations

import base64
import os
import tempfile
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pika
import pytest
from selenium import webdriver
from selenium.common.exceptions import (
    NoSuchElementException,
    StaleElementReferenceException,
    TimeoutException,
)
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support import expected_conditions
from selenium.webdriver.support.select import Select
from selenium.webdriver.support.ui import WebDriverWait

from starlight_py.local import ServiceEndpoints
from starlight_py.local.ports import free_port
from tests.integration.conftest import ProxyFactory
from tests.integration.test_management_auth import SECRET, token
from tests.support.browser import find_chromium, screenshot, start_chromium
from tests.support.management_api import Management, closed_by_broker, our_management

IMAGES = (
    Path(__file__).resolve().parents[2] / "docs" / "images"
    if os.environ.get("STARLIGHT_TEST_SCREENSHOTS") == "docs"
    else Path(tempfile.gettempdir()) / "starlight-ui-screenshots"
)
WAIT = 30.0  # s: the page refreshes every 5 s, the connection list lags by about 1 s

# A name with markup and quotes in it: the page must show it as text.
QUEUE = f"ui <i>orders</i> & 'q' \"{uuid.uuid4().hex[:8]}\""
EXCHANGE = f"ui-orders-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def ours(services: ServiceEndpoints) -> Iterator[Management]:
    with our_management(services) as management:
        yield management


@pytest.fixture(scope="module")
def driver(ours: Management) -> Iterator[webdriver.Chrome]:
    find_chromium()
    browser = start_chromium()
    try:
        yield browser
    finally:
        browser.quit()


def log_in(driver: webdriver.Chrome, user: str = "guest", password: str = "guest") -> None:
    """Fill in the login form and send it."""
    login = driver.find_element(By.ID, "login")
    for name, value in (("username", user), ("password", password)):
        field = login.find_element(By.NAME, name)
        field.clear()
        field.send_keys(value)
    login.find_element(By.CSS_SELECTOR, "button[type=submit]").click()


def on_page(driver: webdriver.Chrome, page: str) -> bool:
    return driver.find_element(By.ID, "page").get_attribute("data-page") == page


@pytest.fixture
def ui(ours: Management, driver: webdriver.Chrome) -> webdriver.Chrome:
    """The browser on the UI, logged in."""
    if not driver.current_url.startswith(ours.base):
        driver.get(ours.base + "/")
    if driver.find_element(By.ID, "login").is_displayed():
        log_in(driver)
        until(driver, lambda d: on_page(d, "overview"))
    return driver


@pytest.fixture(scope="module")
def client(ours: Management) -> Iterator[pika.BlockingConnection]:
    connection = pika.BlockingConnection(pika.URLParameters(ours.amqp_url))
    channel = connection.channel()
    channel.exchange_declare(EXCHANGE, "direct")
    channel.queue_declare(QUEUE)
    channel.queue_bind(QUEUE, EXCHANGE, "orders")
    yield connection
    if connection.is_open:
        cleanup = connection.channel()
        cleanup.queue_delete(QUEUE)
        cleanup.exchange_delete(EXCHANGE)
        connection.close()


def until(driver: webdriver.Chrome, condition: Callable[[webdriver.Chrome], Any]) -> Any:
    """WebDriverWait on `condition`, which may meet elements a refresh just replaced."""
    ignored = (StaleElementReferenceException, NoSuchElementException)
    try:
        return WebDriverWait(driver, WAIT, ignored_exceptions=ignored).until(condition)
    except TimeoutException:
        page = driver.execute_script("return document.getElementById('page').innerText")
        status = driver.execute_script("return document.getElementById('status').innerText")
        pytest.fail(f"page never got there; status: {status!r}; page: {page!r}")


def cell(driver: webdriver.Chrome, column: str, **match: str) -> str | None:
    """The text of `column` in the listed row whose cells have the texts in `match`."""
    found = driver.execute_script(
        """
        const [match, column] = arguments;
        for (const row of document.querySelectorAll('#live tbody tr')) {
          const text = (key) => row.querySelector(`td[data-col="${key}"]`)?.textContent;
          if (Object.entries(match).every(([key, value]) => text(key) === value)) {
            return text(column) ?? null;
          }
        }
        return null;
        """,
        match,
        column,
    )
    return None if found is None else str(found)


def row_link(driver: webdriver.Chrome, **match: str) -> WebElement:
    """The link in the `name` cell of the row matching `match` (once it is listed)."""
    until(driver, lambda d: cell(d, "name", **match) is not None)
    found = driver.execute_script(
        """
        const [match] = arguments;
        for (const row of document.querySelectorAll('#live tbody tr')) {
          const text = (key) => row.querySelector(`td[data-col="${key}"]`)?.textContent;
          if (Object.entries(match).every(([key, value]) => text(key) === value)) {
            return row.querySelector('td[data-col="name"] a');
          }
        }
        """,
        match,
    )
    assert isinstance(found, WebElement)
    return found


def fact(driver: webdriver.Chrome, key: str) -> str:
    return str(driver.find_element(By.CSS_SELECTOR, f'#live dd[data-col="{key}"]').text)


def go(driver: webdriver.Chrome, tab: str) -> None:
    driver.find_element(By.CSS_SELECTOR, f'#tabs a[data-tab="{tab}"]').click()
    until(driver, lambda d: on_page(d, tab))


def submit(driver: webdriver.Chrome, button: str, *, confirm: bool = False) -> None:
    driver.find_element(By.XPATH, f'//form//button[normalize-space()="{button}"]').click()
    if confirm:
        until(driver, expected_conditions.alert_is_present()).accept()


def got_payload(driver: webdriver.Chrome) -> str | None:
    """The first message's payload the queue page shows, once it shows one. A basic.get on a
    new channel (as each management get is) waits a moment for Pulsar's first message and
    answers get-empty if it is late (under load): "Queue is empty." is retried."""
    shown = driver.find_element(By.ID, "messages").text
    if shown == "Queue is empty.":
        submit(driver, "Get message(s)")
        return None
    payloads = driver.find_elements(By.CSS_SELECTOR, "#messages pre.payload")
    return str(payloads[0].text) if payloads else None


def basic_get(channel: Any) -> Any:
    """pika's basic.get: (method, properties, body), or None on get-empty (see got_payload)."""
    method, properties, body = channel.basic_get(QUEUE, auto_ack=True)
    return None if method is None else (method, properties, body)


def test_the_page_and_its_files_are_served_without_a_login(ours: Management) -> None:
    expected = {
        "/": "text/html; charset=utf-8",
        "/ui/app.js": "text/javascript; charset=utf-8",
        "/ui/style.css": "text/css; charset=utf-8",
    }
    for path, content_type in expected.items():
        with urllib.request.urlopen(ours.base + path, timeout=10) as answer:
            assert (answer.status, answer.headers["content-type"]) == (200, content_type)
            assert "script-src 'self'" in answer.headers["content-security-policy"]
            assert answer.read()
    # Anything else is still the API's, behind its login.
    assert ours.call("GET", "/ui/missing.js", auth=("", "")).status == 404
    assert ours.call("GET", "/api/overview", auth=("", "")).status == 401


def test_log_in_and_see_the_overview_and_vhosts(
    ours: Management, driver: webdriver.Chrome, client: pika.BlockingConnection
) -> None:
    driver.get(ours.base + "/")
    driver.execute_script("sessionStorage.clear()")
    driver.refresh()
    until(driver, expected_conditions.visibility_of_element_located((By.ID, "login")))
    screenshot(driver, IMAGES / "ui-login.png")
    log_in(driver)
    until(driver, lambda d: on_page(d, "overview"))
    until(driver, lambda d: (cell(d, "queues") or "0") != "0")
    assert driver.find_element(By.ID, "who").text == "User: guest"
    screenshot(driver, IMAGES / "ui-overview.png")

    go(driver, "vhosts")
    assert until(driver, lambda d: cell(d, "namespace", name="/")) == "public/default"
    screenshot(driver, IMAGES / "ui-vhosts.png")


def test_a_queue_s_depth_purge_publish_and_get(
    ui: webdriver.Chrome, client: pika.BlockingConnection
) -> None:
    driver = ui
    go(driver, "queues")
    assert until(driver, lambda d: cell(d, "messages", name=QUEUE)) == "0"
    # The name is shown as text: its markup made no element.
    assert driver.find_elements(By.CSS_SELECTOR, "#live td i") == []

    channel = client.channel()
    channel.confirm_delivery()
    for i in range(3):
        channel.basic_publish(EXCHANGE, "orders", f"order {i}".encode())
    until(driver, lambda d: cell(d, "messages", name=QUEUE) == "3")
    assert cell(driver, "ready", name=QUEUE) == "3"
    screenshot(driver, IMAGES / "ui-queues.png")

    row_link(driver, name=QUEUE).click()
    until(driver, lambda d: d.find_element(By.ID, "title").text == f"Queue {QUEUE}")
    until(driver, lambda d: fact(d, "messages") == "3")
    submit(driver, "Purge messages", confirm=True)
    until(driver, lambda d: "Queue purged." in d.find_element(By.ID, "actions").text)
    until(driver, lambda d: fact(d, "messages") == "0")

    go(driver, "exchanges")
    row_link(driver, name=EXCHANGE, vhost="/").click()
    until(driver, lambda d: d.find_element(By.ID, "title").text == f"Exchange {EXCHANGE}")
    actions = driver.find_element(By.ID, "actions")
    actions.find_element(By.NAME, "routing_key").send_keys("nobody")
    actions.find_element(By.NAME, "payload").send_keys("lost")
    submit(driver, "Publish message")
    until(driver, lambda d: "Message published, but not routed." in actions.text)
    routing_key = actions.find_element(By.NAME, "routing_key")
    routing_key.clear()
    routing_key.send_keys("orders")
    payload = actions.find_element(By.NAME, "payload")
    payload.clear()
    payload.send_keys("hello from the UI")
    Select(actions.find_element(By.NAME, "delivery_mode")).select_by_value("2")
    submit(driver, "Publish message")
    until(
        driver, lambda d: actions.find_element(By.TAG_NAME, "output").text == "Message published."
    )
    until(driver, lambda d: cell(d, "destination") == QUEUE)
    screenshot(driver, IMAGES / "ui-exchange.png")

    go(driver, "queues")
    until(driver, lambda d: cell(d, "messages", name=QUEUE) == "1")
    row_link(driver, name=QUEUE).click()
    until(driver, lambda d: fact(d, "messages") == "1")
    Select(driver.find_element(By.NAME, "ackmode")).select_by_value("reject_requeue_true")
    submit(driver, "Get message(s)")
    assert until(driver, got_payload) == "hello from the UI"
    assert "delivery_mode" in driver.find_element(By.ID, "messages").text
    screenshot(driver, IMAGES / "ui-queue.png")

    # Requeued: pika gets it, redelivered.
    method, properties, body = until(driver, lambda _: basic_get(channel))
    assert (body, method.redelivered, properties.delivery_mode) == (b"hello from the UI", True, 2)


def test_close_a_connection_with_a_reason(ours: Management, ui: webdriver.Chrome) -> None:
    driver = ui
    label = f"ui-test-{uuid.uuid4().hex[:8]}"
    parameters = pika.URLParameters(ours.amqp_url)
    parameters.client_properties = {"connection_name": label}
    victim = pika.BlockingConnection(parameters)
    try:
        go(driver, "connections")
        row_link(driver, client=label)
        screenshot(driver, IMAGES / "ui-connections.png")
        row_link(driver, client=label).click()
        until(driver, lambda d: fact(d, "client") == label)
        screenshot(driver, IMAGES / "ui-connection.png")
        reason = driver.find_element(By.NAME, "reason")
        reason.clear()
        reason.send_keys("closed from the web UI")
        submit(driver, "Force close", confirm=True)
        until(
            driver,
            lambda d: on_page(d, "connections"),
        )
        assert closed_by_broker(victim) == (320, "CONNECTION_FORCED - closed from the web UI")
        until(driver, lambda d: cell(d, "client", client=label) is None)
    finally:
        if victim.is_open:
            victim.close()


def test_delete_a_queue_from_its_page(
    ours: Management, ui: webdriver.Chrome, client: pika.BlockingConnection
) -> None:
    driver = ui
    name = f"ui-doomed-{uuid.uuid4().hex[:8]}"
    client.channel().queue_declare(name)
    go(driver, "queues")
    row_link(driver, name=name).click()
    until(driver, lambda d: d.find_element(By.ID, "title").text == f"Queue {name}")
    submit(driver, "Delete queue", confirm=True)
    until(driver, lambda d: on_page(d, "queues"))
    assert ours.call("GET", f"/api/queues/%2F/{name}").status == 404


def test_a_bad_token_is_refused_in_the_page_and_a_good_one_logs_in(
    start_proxy: ProxyFactory, driver: webdriver.Chrome
) -> None:
    """With authentication on, the password is a token; a refused login says so in the page
    (the browser shows no login prompt of its own) and the form stays."""
    port = free_port()
    start_proxy(
        authenticationEnabled="true",
        authenticationProviders="token",
        tokenSecretKey="data:;base64," + base64.b64encode(SECRET).decode(),
        managementListener=f"http://127.0.0.1:{port}",
        managementAdministrators="ops",
    )
    driver.get(f"http://127.0.0.1:{port}/")
    driver.execute_script("sessionStorage.clear()")
    driver.refresh()
    until(driver, expected_conditions.visibility_of_element_located((By.ID, "login")))
    log_in(driver, "ops", "not-a-token")
    until(driver, lambda d: "Login failed" in d.find_element(By.ID, "status").text)
    assert driver.find_element(By.ID, "login").is_displayed()
    assert not driver.find_element(By.ID, "page").is_displayed()

    log_in(driver, "anyone", token("ops"))
    until(driver, lambda d: on_page(d, "overview"))
    assert driver.find_element(By.ID, "who").text == "User: ops"
    driver.find_element(By.ID, "logout").click()
    until(driver, lambda d: d.find_element(By.ID, "login").is_displayed())
    assert driver.execute_script("return sessionStorage.length") == 0
