"""Routes a connection keeps for its publishes: where messages to one (exchange, routing
key) go while the topology stays as it was (gateway/publish/publishing.py's fast path)."""

from __future__ import annotations

from pamqp import commands

from starlight_py.backend.message_codec import encode_properties
from starlight_py.backend.pulsar_client import ProducerHandle
from starlight_py.gateway.publish.pre_acks import StoredCallback
from starlight_py.model.topology import Exchange

# Routes kept per connection, by (exchange, routing key).
MAX_PLANS = 256
# Pulsar property maps kept per route, by the AMQP property bytes.
MAX_PLAN_PROPERTIES = 64


class RoutePlan:
    """Where publishes to one (exchange, routing key) go while the topology stays as it was
    (`version`: the cache's count of changes): one topic, through one producer."""

    __slots__ = (
        "delays",
        "exchange",
        "exchange_name",
        "internal",
        "pre_ack",
        "producer",
        "properties",
        "routing_key",
        "version",
    )

    def __init__(
        self,
        version: int,
        producer: ProducerHandle,
        exchange: Exchange,
        delays: bool,
        exchange_name: str,
        routing_key: str,
        pre_ack: StoredCallback | None = None,
    ) -> None:
        self.version = version
        # Where the ids of stored messages go when some subscription on the topic does
        # not route them (gateway/publish/pre_acks.py); None: every one does.
        self.pre_ack = pre_ack
        self.producer = producer
        self.exchange = exchange
        self.internal = exchange.internal
        self.delays = delays
        self.exchange_name = exchange_name
        self.routing_key = routing_key
        # The Pulsar property maps of this route, by AMQP property bytes (pulsar-client
        # copies a map at each send, so one map serves every message with those bytes).
        self.properties: dict[bytes, dict[str, str]] = {}

    def properties_of(
        self, properties: commands.Basic.Properties, raw_properties: bytes
    ) -> dict[str, str]:
        found = encode_properties(self.exchange_name, self.routing_key, properties, raw_properties)
        if len(raw_properties) <= 1024:
            if len(self.properties) >= MAX_PLAN_PROPERTIES:
                self.properties.clear()
            self.properties[raw_properties] = found
        return found
