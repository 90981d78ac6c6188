"""The starlight-backlog broker plugin's packaging and the admin client's use of it, with a
stand-in HTTP server for the broker (the plugin itself runs in the integration tests'
Pulsar: tests/integration/test_flow_batching.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

from starlight_py.backend.batching_support import (
    BATCH_INDEX_ACKS,
    CURSOR_CLOSE_TO_METADATA_STORE,
    batching_caveat,
    batching_refusal,
)
from starlight_py.backend.pulsar_admin import PulsarAdmin
from starlight_py.local.backlog_plugin import (
    INDEX_INTERCEPTOR,
    PLUGIN_NAME,
    backlog_plugin_settings,
    build_nar,
    plugin_broker_settings,
    plugin_fingerprint,
    plugin_sources,
)
from starlight_py.local.errors import LocalInfraError
from starlight_py.local.pulsar_cluster import broker_conf
from starlight_py.model.namespaces import NamespaceName
from starlight_py.model.naming import TopicName
from tests.support.stand_in_http import JsonHandler, serving

TOPIC = TopicName(NamespaceName("public", "default"), "orders")


def test_the_sources_ship_with_the_package_and_name_the_plugin_class() -> None:
    sources = plugin_sources()
    assert set(sources) == {
        "MessageBacklogServlet.java",
        "MessageBacklogPlugin.java",
        "additional_servlet.yml",
    }
    descriptor = sources["additional_servlet.yml"].decode()
    assert f"name: {PLUGIN_NAME}" in descriptor
    assert "additionalServletClass: io.starlight.broker.MessageBacklogPlugin" in descriptor


def test_a_build_is_reused_only_for_the_same_sources_and_distribution(tmp_path: Path) -> None:
    sources = plugin_sources()
    one = plugin_fingerprint(sources, tmp_path / "pulsar-a")
    assert plugin_fingerprint(dict(sources), tmp_path / "pulsar-a") == one
    assert plugin_fingerprint(sources, tmp_path / "pulsar-b") != one
    changed = {**sources, "MessageBacklogPlugin.java": sources["MessageBacklogPlugin.java"] + b" "}
    assert plugin_fingerprint(changed, tmp_path / "pulsar-a") != one


def test_broker_settings_load_the_plugin_and_index_every_entry(tmp_path: Path) -> None:
    conf = broker_conf(
        "additionalServlets=\n",
        broker_port=1,
        web_port=2,
        zookeeper="127.0.0.1:2181",
        bookies=1,
        extra_properties=plugin_broker_settings(tmp_path),
    )
    assert f"additionalServlets={PLUGIN_NAME}" in conf.splitlines()
    assert f"additionalServletDirectory={tmp_path}" in conf.splitlines()
    assert f"brokerEntryMetadataInterceptors={INDEX_INTERCEPTOR}" in conf.splitlines()


def test_building_against_a_folder_that_is_no_pulsar_distribution_says_so(
    tmp_path: Path,
) -> None:
    with pytest.raises(LocalInfraError, match="not an unpacked Apache Pulsar binary"):
        build_nar(plugin_sources(), tmp_path, tmp_path)


class Broker(JsonHandler):
    """Answers topic stats in entries and, when `plugin` is set, the plugin's counts."""

    plugin: dict[str, int] | None = None
    plugin_status = 200
    settings: dict[str, str] | None = None  # the runtime configuration (None: 403)

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        if url.path == "/admin/v2/brokers/configuration/runtime":
            if self.settings is None:
                self.answer(403, {"reason": "Only super-user can access this"})
            else:
                self.answer(200, self.settings)
        elif url.path.endswith("/stats"):
            self.answer(200, {"subscriptions": {"q1": {"msgBacklog": 2}, "q2": {"msgBacklog": 1}}})
        elif url.path == "/starlight/backlog" and self.plugin is not None:
            topic = parse_qs(url.query).get("topic", [""])[0]
            if not topic:
                self.answer(400, {"error": "GET backlog?topic=..."})
            elif self.plugin_status != 200:
                self.answer(self.plugin_status, {"error": "no index"})
            else:
                assert topic == str(TOPIC)
                self.answer(200, {"subscriptions": self.plugin})
        else:
            self.answer(404, {})


@pytest.fixture
def broker() -> Iterator[tuple[type[Broker], str]]:
    handler = type("ThisBroker", (Broker,), {})
    with serving(handler) as url:
        yield handler, url


def test_without_the_plugin_backlogs_are_pulsars_entries(
    broker: tuple[type[Broker], str],
) -> None:
    _, url = broker
    admin = PulsarAdmin(url, timeout=2)
    assert not admin.has_message_backlogs()
    admin.message_backlogs = True  # even if asked to: nothing answers, entries it is
    assert {k: s.backlog for k, s in admin.subscription_stats(TOPIC).items()} == {"q1": 2, "q2": 1}


def test_with_the_plugin_backlogs_are_messages(broker: tuple[type[Broker], str]) -> None:
    handler, url = broker
    handler.plugin = {"q1": 25, "q2": 7}
    admin = PulsarAdmin(url, timeout=2)
    assert admin.has_message_backlogs()
    assert {k: s.backlog for k, s in admin.subscription_stats(TOPIC).items()} == {"q1": 2, "q2": 1}
    admin.message_backlogs = True
    assert {k: s.backlog for k, s in admin.subscription_stats(TOPIC).items()} == {"q1": 25, "q2": 7}


def test_a_subscription_the_plugin_does_not_list_keeps_its_entries(
    broker: tuple[type[Broker], str],
) -> None:
    handler, url = broker
    handler.plugin = {"q1": 25}  # q2 created between the two calls
    admin = PulsarAdmin(url, timeout=2)
    admin.message_backlogs = True
    assert {k: s.backlog for k, s in admin.subscription_stats(TOPIC).items()} == {"q1": 25, "q2": 1}


@pytest.mark.parametrize("status", [409, 500])
def test_entries_without_an_index_or_a_failing_plugin_fall_back_to_entries(
    broker: tuple[type[Broker], str], status: int
) -> None:
    handler, url = broker
    handler.plugin = {"q1": 25}
    handler.plugin_status = status
    admin = PulsarAdmin(url, timeout=2)
    admin.message_backlogs = True
    assert {k: s.backlog for k, s in admin.subscription_stats(TOPIC).items()} == {"q1": 2, "q2": 1}


def test_left_to_ask_the_admin_client_uses_the_plugin_when_the_broker_has_it(
    broker: tuple[type[Broker], str],
) -> None:
    handler, url = broker
    admin = PulsarAdmin(url, timeout=2)
    admin.message_backlogs = None  # starlight-admin's setting
    assert {k: s.backlog for k, s in admin.subscription_stats(TOPIC).items()} == {"q1": 2, "q2": 1}
    assert admin.message_backlogs is False  # asked once
    handler.plugin = {"q1": 25, "q2": 7}
    admin.message_backlogs = None
    assert {k: s.backlog for k, s in admin.subscription_stats(TOPIC).items()} == {"q1": 25, "q2": 7}
    assert admin.message_backlogs is True


def test_a_broker_starts_without_the_plugin_when_it_cannot_be_built(tmp_path: Path) -> None:
    said: list[str] = []
    assert backlog_plugin_settings(tmp_path / "not-pulsar", said.append) == {}
    assert len(said) == 1
    assert "without the starlight-backlog plugin" in said[0]
    assert "not an unpacked Apache Pulsar binary distribution" in said[0]


def test_batching_needs_batch_index_acks_and_the_plugin(
    broker: tuple[type[Broker], str],
) -> None:
    handler, url = broker
    admin = PulsarAdmin(url, timeout=2)
    refusal = batching_refusal(admin)
    assert refusal is not None and "cannot be read" in refusal  # 403: not a super-user
    handler.settings = {BATCH_INDEX_ACKS: "false"}
    assert batching_refusal(admin) == (
        f"the broker has {BATCH_INDEX_ACKS}=false (set it to true on every broker)"
    )
    handler.settings = {BATCH_INDEX_ACKS: "true"}
    refusal = batching_refusal(admin)
    assert refusal is not None and "lack the starlight-backlog plugin" in refusal
    assert admin.message_backlogs is False
    handler.plugin = {}
    assert batching_refusal(admin) is None
    assert admin.message_backlogs is True  # counts through the plugin from now on


def test_batching_warns_of_brokers_that_close_cursors_to_the_metadata_store(
    broker: tuple[type[Broker], str],
) -> None:
    """Pulsar 4.0.8 forgets batch-index acknowledgements of a cursor closed to the metadata
    store: with the broker's default (1000) a topic reload brings acknowledged messages back."""
    handler, url = broker
    admin = PulsarAdmin(url, timeout=2)
    caveat = batching_caveat(admin)
    assert caveat is not None and "unknown" in caveat  # 403: the setting cannot be read
    handler.settings = {CURSOR_CLOSE_TO_METADATA_STORE: "1000"}
    assert batching_caveat(admin) == (
        f"the broker has {CURSOR_CLOSE_TO_METADATA_STORE}=1000: when a topic reloads (unload, "
        "bundle move, broker restart), messages acknowledged one by one in a batch entry "
        "still partly unacknowledged are delivered again (set it to -1 on every broker)"
    )
    handler.settings = {CURSOR_CLOSE_TO_METADATA_STORE: "-1"}
    assert batching_caveat(admin) is None
