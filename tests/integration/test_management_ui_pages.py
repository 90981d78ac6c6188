"""The web UI's charts, Pulsar view, forms and admin pages, in a real headless browser (as
tests/integration/test_management_ui.py, whose helpers and fixtures these are): declare a
queue and an exchange through the forms and bind them; watch the charts fill as pika
publishes and acknowledges, and the queue's Pulsar view list its subscription with its
backlog; add, list and remove a user, a permission and a policy. Screenshots go where that
module puts them (docs/images/ with STARLIGHT_TEST_SCREENSHOTS=docs).

Proxy-only: RabbitMQ serves a UI of its own."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pika
import pytest
from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.select import Select

from tests.integration.test_management_ui import (
    IMAGES,
    cell,
    driver,
    fact,
    go,
    ours,
    row_link,
    submit,
    ui,
    until,
)
from tests.support.browser import screenshot
from tests.support.management_api import Management

__all__ = ["driver", "ours", "ui"]  # fixtures

SUFFIX = uuid.uuid4().hex[:8]
QUEUE = f"ui-form-q-{SUFFIX}"
EXCHANGE = f"ui-form-x-{SUFFIX}"


def fill(driver: webdriver.Chrome, name: str, value: str) -> None:
    """Type `value` into the form field called `name` (after clearing it)."""
    field = driver.find_element(By.NAME, name)
    field.clear()
    field.send_keys(value)


def pick_vhost(driver: webdriver.Chrome, name: str, vhost: str = "/") -> None:
    """Choose `vhost` in a form's vhost select, once the API filled it in."""
    until(driver, lambda d: d.find_elements(By.CSS_SELECTOR, f'select[name="{name}"] option'))
    Select(driver.find_element(By.NAME, name)).select_by_value(vhost)


def output_of(driver: webdriver.Chrome, button: str) -> str:
    """The text of the output of the form whose submit button says `button`."""
    form = driver.find_element(By.XPATH, f'//form[.//button[normalize-space()="{button}"]]')
    return str(form.find_element(By.TAG_NAME, "output").text)


def submit_until(driver: webdriver.Chrome, button: str, done: str) -> None:
    """Submit the form until its output says `done`: again when the proxy answered that
    Pulsar or ZooKeeper did not answer in time (on a loaded machine), as an operator would."""
    submit(driver, button)

    def settled(d: webdriver.Chrome) -> bool:
        text = output_of(d, button)
        if text == done:
            return True
        if "unavailable" in text.lower():
            form = d.find_element(By.XPATH, f'//form[.//button[normalize-space()="{button}"]]')
            d.execute_script(
                "arguments[0].textContent = ''", form.find_element(By.TAG_NAME, "output")
            )
            submit(d, button)
        return False

    until(driver, settled)


def row_button(driver: webdriver.Chrome, text: str, **match: str) -> WebElement:
    """The button saying `text` in the listed row whose cells have the texts in `match`."""
    until(driver, lambda d: cell(d, next(iter(match)), **match) is not None)
    found = driver.execute_script(
        """
        const [match, label] = arguments;
        for (const row of document.querySelectorAll('#live tbody tr')) {
          const text = (key) => row.querySelector(`td[data-col="${key}"]`)?.textContent;
          if (Object.entries(match).every(([key, value]) => text(key) === value)) {
            return [...row.querySelectorAll('button')].find((b) => b.textContent === label);
          }
        }
        """,
        match,
        text,
    )
    assert isinstance(found, WebElement)
    return found


def confirm_alert(driver: webdriver.Chrome) -> None:
    until(driver, lambda d: d.switch_to.alert).accept()


def chart(driver: webdriver.Chrome, name: str, series: str) -> tuple[int, str]:
    """(points drawn, latest value in the legend) of one line of a chart."""
    figure = f'figure[data-chart="{name}"]'
    line = driver.find_element(By.CSS_SELECTOR, f'{figure} g[data-series="{series}"]')
    legend = driver.find_element(By.CSS_SELECTOR, f'{figure} li[data-series="{series}"] strong')
    return int(line.get_attribute("data-points") or 0), str(legend.text)


@pytest.fixture(scope="module", autouse=True)
def _delete_what_the_forms_made(ours: Management) -> Iterator[None]:
    yield
    ours.call("DELETE", f"/api/queues/%2F/{QUEUE}")
    ours.call("DELETE", f"/api/exchanges/%2F/{EXCHANGE}")


def test_declare_a_queue_and_an_exchange_and_bind_them_through_the_forms(
    ours: Management, ui: webdriver.Chrome
) -> None:
    driver = ui
    go(driver, "queues")
    pick_vhost(driver, "queue_vhost")
    fill(driver, "queue_name", QUEUE)
    fill(driver, "queue_arguments", '{"x-max-length": 1000}')
    screenshot(driver, IMAGES / "ui-queue-declare.png")
    submit_until(driver, "Add queue", f"Queue {QUEUE} declared.")
    until(driver, lambda d: cell(d, "messages", name=QUEUE) == "0")
    declared = ours.call("GET", f"/api/queues/%2F/{QUEUE}").body
    assert (declared["durable"], declared["arguments"]) == (True, {"x-max-length": 1000})

    # Not JSON: the form says so and sends nothing.
    fill(driver, "queue_name", f"{QUEUE}-bad")
    fill(driver, "queue_arguments", "{oops")
    submit(driver, "Add queue")
    until(driver, lambda d: output_of(d, "Add queue") == "Arguments: not JSON")
    assert ours.call("GET", f"/api/queues/%2F/{QUEUE}-bad").status == 404

    go(driver, "exchanges")
    pick_vhost(driver, "exchange_vhost")
    fill(driver, "exchange_name", EXCHANGE)
    Select(driver.find_element(By.NAME, "exchange_type")).select_by_value("topic")
    submit_until(driver, "Add exchange", f"Exchange {EXCHANGE} declared.")
    until(driver, lambda d: cell(d, "type", name=EXCHANGE) == "topic")

    go(driver, "queues")
    row_link(driver, name=QUEUE).click()
    until(driver, lambda d: d.find_element(By.ID, "title").text == f"Queue {QUEUE}")
    fill(driver, "bind_other", EXCHANGE)
    fill(driver, "bind_routing_key", "orders.#")
    submit_until(driver, "Bind", "Bound.")
    until(driver, lambda d: cell(d, "routing_key", source=EXCHANGE) == "orders.#")
    listed = ours.call("GET", f"/api/exchanges/%2F/{EXCHANGE}/bindings/source").body
    assert [(b["destination"], b["routing_key"]) for b in listed] == [(QUEUE, "orders.#")]

    # From the exchange's page: bind once more, then unbind with the row's button.
    driver.find_element(By.LINK_TEXT, EXCHANGE).click()
    until(driver, lambda d: d.find_element(By.ID, "title").text == f"Exchange {EXCHANGE}")
    fill(driver, "bind_other", QUEUE)
    fill(driver, "bind_routing_key", "extra.*")
    submit_until(driver, "Bind", "Bound.")
    until(driver, lambda d: cell(d, "destination", routing_key="extra.*") == QUEUE)
    row_button(driver, "Unbind", routing_key="extra.*").click()
    confirm_alert(driver)
    until(driver, lambda d: cell(d, "destination", routing_key="extra.*") is None)
    listed = ours.call("GET", f"/api/exchanges/%2F/{EXCHANGE}/bindings/source").body
    assert [b["routing_key"] for b in listed] == ["orders.#"]


def test_charts_fill_and_the_pulsar_view_lists_the_subscription(
    ours: Management, ui: webdriver.Chrome
) -> None:
    driver = ui
    connection = pika.BlockingConnection(pika.URLParameters(ours.amqp_url))
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        go(driver, "queues")
        row_link(driver, name=QUEUE).click()
        until(driver, lambda d: d.find_element(By.ID, "title").text == f"Queue {QUEUE}")
        # Spread over a few of the page's 5 s refreshes, so that the lines have points.
        for i in range(30):
            channel.basic_publish(EXCHANGE, f"orders.{i}", f"order {i}".encode())
            time.sleep(0.4)
        for _ in range(10):
            until(driver, lambda _: channel.basic_get(QUEUE, auto_ack=False)[0])
        channel.basic_ack(multiple=True)

        until(driver, lambda d: fact(d, "ready") == "20")
        until(driver, lambda d: chart(d, "lengths", "ready")[1] == "20")
        until(driver, lambda d: chart(d, "lengths", "ready")[0] >= 3)
        assert chart(driver, "rates", "publish")[0] >= 3
        # The subscription behind the binding, with the backlog Pulsar counts.
        until(driver, lambda d: cell(d, "backlog", exchange=EXCHANGE) == "20")
        assert cell(driver, "state", exchange=EXCHANGE) == "active"
        assert cell(driver, "routing_keys", exchange=EXCHANGE) == "orders.#"
        view = ours.call("GET", f"/api/queues/%2F/{QUEUE}/pulsar").body
        owners = {t["owner_broker"] for t in view["topics"]}
        assert all(owner.startswith("pulsar://") for owner in owners)
        shown = driver.find_element(By.CSS_SELECTOR, ".pulsar-topics").text
        assert all(owner in shown for owner in owners)
        screenshot(driver, IMAGES / "ui-queue-charts.png")

        go(driver, "overview")
        until(driver, lambda d: int(chart(d, "lengths", "ready")[1] or 0) >= 20)

        def flowing(d: webdriver.Chrome) -> bool:
            """Publish two and take one on each look, until Pulsar's rates show it."""
            for i in range(2):
                channel.basic_publish(EXCHANGE, f"orders.more.{i}", b"more")
            method, _, _ = channel.basic_get(QUEUE, auto_ack=False)
            if method is not None:
                channel.basic_ack(method.delivery_tag)
            points, publish_rate = chart(d, "rates", "publish")
            return points >= 3 and publish_rate != "0.0/s"

        until(driver, flowing)
        assert chart(driver, "lengths", "ready")[0] >= 3
        screenshot(driver, IMAGES / "ui-overview-charts.png")
    finally:
        connection.close()


def test_users_permissions_and_policies_pages(ours: Management, ui: webdriver.Chrome) -> None:
    driver = ui
    user = f"ui-user-{SUFFIX}"
    go(driver, "users")
    fill(driver, "user_name", user)
    fill(driver, "user_password", "secret")
    fill(driver, "user_tags", "management, monitoring")
    submit(driver, "Add user")
    until(driver, lambda d: cell(d, "tags", name=user) == "management, monitoring")
    assert cell(driver, "password", name=user) == "sha256"
    screenshot(driver, IMAGES / "ui-users.png")

    go(driver, "permissions")
    fill(driver, "permission_user", user)
    pick_vhost(driver, "permission_vhost")
    fill(driver, "read", "^orders")
    submit(driver, "Set permission")
    until(driver, lambda d: cell(d, "read", user=user, vhost="/") == "^orders")
    assert cell(driver, "configure", user=user, vhost="/") == ".*"
    screenshot(driver, IMAGES / "ui-permissions.png")
    row_button(driver, "Clear", user=user, vhost="/").click()
    confirm_alert(driver)
    until(driver, lambda d: cell(d, "read", user=user, vhost="/") is None)
    assert ours.call("GET", f"/api/permissions/%2F/{user}").status == 404

    policy = f"ui-policy-{SUFFIX}"
    go(driver, "policies")
    pick_vhost(driver, "policy_vhost")
    fill(driver, "policy_name", policy)
    fill(driver, "policy_pattern", f"^{QUEUE}$")
    fill(driver, "policy_definition", '{"max-length": 500}')
    submit(driver, "Add policy")
    until(driver, lambda d: cell(d, "definition", name=policy) == '{"max-length":500}')
    assert cell(driver, "apply_to", name=policy) == "queues"
    screenshot(driver, IMAGES / "ui-policies.png")
    # The queue's page names the policy that applies to it.
    go(driver, "queues")
    row_link(driver, name=QUEUE).click()
    until(driver, lambda d: fact(d, "policy") == policy)
    go(driver, "policies")
    row_button(driver, "Delete", name=policy).click()
    confirm_alert(driver)
    until(driver, lambda d: cell(d, "name", name=policy) is None)

    go(driver, "users")
    row_button(driver, "Delete", name=user).click()
    confirm_alert(driver)
    until(driver, lambda d: cell(d, "name", name=user) is None)
    assert ours.call("GET", f"/api/users/{user}").status == 404
