"""The Pulsar binary-protocol adapter (pulsar-client): producers and consumers behind small
handles, pulsar exceptions translated here and nowhere else.

Blocking calls (creating producers and consumers, closing them, `receive`) are made from
worker threads by the gateway. Callbacks (`send_async` results, message listeners) run on
pulsar-client's threads and must only hand their data to the trio bridge.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pulsar

from starlight_py.backend.broker_auth import BrokerAuthError, BrokerClientSettings
from starlight_py.backend.pulsar_admin import (
    BackendUnavailable,
    PulsarAuthenticationRefused,
    RefusalLog,
)
from starlight_py.config import ConfigError, StarlightConfig
from starlight_py.model.naming import TopicName
from starlight_py.model.positions import MessageIdRecord

log = logging.getLogger("starlight.pulsar")


class BackendError(Exception):
    """Pulsar refused an operation (producer or consumer creation, a send)."""


@dataclass(frozen=True, slots=True)
class ReceivedMessage:
    """What the gateway needs of a Pulsar message (taken on the listener thread)."""

    raw: Any  # the pulsar.Message, kept for acknowledge / negative_acknowledge
    body: bytes
    properties: dict[str, str]
    position: MessageIdRecord
    redelivery_count: int
    topic_local: str
    publish_time_ms: int = 0  # the broker's publish timestamp (epoch ms), for message TTLs


def _position(message_id: Any) -> MessageIdRecord:
    return MessageIdRecord(
        message_id.ledger_id(),
        message_id.entry_id(),
        message_id.batch_index(),
        message_id.partition(),
    )


def received(message: Any) -> ReceivedMessage:
    topic = str(message.topic_name())
    return ReceivedMessage(
        message,
        message.data(),
        message.properties(),
        _position(message.message_id()),
        message.redelivery_count(),
        topic.rsplit("/", 1)[-1],
        message.publish_timestamp(),
    )


_OK = pulsar.Result.Ok
_QUEUE_FULL = pulsar.Result.ProducerQueueIsFull


SendCallback = Callable[[bool, str], None]
Listener = Callable[["ConsumerHandle", ReceivedMessage], None]


class ProducerHandle:
    """A producer with its own count of sends in flight: pulsar-client reports a full queue
    through the send callback, which is too late to hold the publisher back, so the gateway
    asks `has_room()` before sending and waits while it is False."""

    def __init__(self, producer: Any, capacity: int) -> None:
        self._producer = producer
        self._capacity = capacity
        self._in_flight = 0
        self._lock = threading.Lock()

    @property
    def idle(self) -> bool:
        """No send is waiting for its receipt."""
        with self._lock:
            return self._in_flight == 0

    def has_room(self) -> bool:
        with self._lock:
            return self._in_flight < self._capacity

    def send_async(
        self,
        body: bytes,
        properties: dict[str, str],
        done: SendCallback,
        deliver_after_ms: int = 0,
    ) -> bool:
        """Queue a send; `done(ok, error)` runs on a pulsar thread. False when the producer
        is full (nothing was sent; wait until `has_room()` and send again).

        `deliver_after_ms` > 0 uses Pulsar's delayed delivery: the broker hands the message
        to the (Shared) subscriptions' consumers only after that long."""
        full: list[bool] = []  # not an Event: this runs for every message

        def callback(result: Any, _message_id: Any) -> None:
            with self._lock:
                self._in_flight -= 1
            if result == _QUEUE_FULL:
                full.append(True)  # reported synchronously by send_async: the caller retries
                return
            ok = result == _OK
            done(ok, "" if ok else str(result))

        delay: dict[str, Any] = {}
        if deliver_after_ms > 0:
            delay["deliver_after"] = timedelta(milliseconds=deliver_after_ms)
        with self._lock:
            self._in_flight += 1
        try:
            self._producer.send_async(body, callback, properties=properties, **delay)
        except pulsar.ProducerQueueIsFull:
            with self._lock:
                self._in_flight -= 1
            return False
        except pulsar.PulsarException as e:
            with self._lock:
                self._in_flight -= 1
            done(False, str(e))
        return not full

    def flush(self) -> None:
        """Block until every send so far is written (or failed)."""
        try:
            self._producer.flush()
        except pulsar.PulsarException as e:
            log.debug("flushing producer: %s", e)

    def close(self) -> None:
        try:
            self._producer.close()
        except pulsar.PulsarException as e:
            log.debug("closing producer: %s", e)


class ConsumerHandle:
    """One Pulsar consumer on one binding subscription."""

    def __init__(self, topic: TopicName, subscription: str) -> None:
        self.topic = topic
        self.subscription = subscription
        self._consumer: Any = None
        self.paused = False
        self._closed = False
        self._close_lock = threading.Lock()

    def acknowledge(self, message: ReceivedMessage) -> None:
        try:
            self._consumer.acknowledge(message.raw)
        except pulsar.PulsarException as e:
            # The consumer closed meanwhile: the broker redelivers; at-least-once holds.
            log.debug("acknowledge failed: %s", e)

    def negative_acknowledge(self, message: ReceivedMessage) -> None:
        try:
            self._consumer.negative_acknowledge(message.raw)
        except pulsar.PulsarException as e:
            log.debug("negative acknowledge failed: %s", e)

    def pause(self) -> None:
        if not self.paused:
            self.paused = True
            self._consumer.pause_message_listener()

    def resume(self) -> None:
        if self.paused:
            self.paused = False
            self._consumer.resume_message_listener()

    def receive(self, timeout: float) -> ReceivedMessage | None:
        """Blocking; None when nothing arrived within `timeout` seconds."""
        try:
            return received(self._consumer.receive(timeout_millis=max(1, int(timeout * 1000))))
        except pulsar.Timeout:
            return None
        except pulsar.PulsarException as e:
            raise BackendError(f"receive from {self.topic}: {e}") from e

    def close(self) -> None:
        """Blocking. Unacknowledged messages go back to the subscription at once. Closing
        twice (a cancel racing a server-side cancel, on two worker threads) does nothing."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        try:
            self._consumer.close()
        except pulsar.PulsarException as e:
            log.debug("closing consumer: %s", e)
        except ValueError as e:
            # pulsar-client's own bookkeeping (Client._consumers.remove) of a consumer it
            # already forgot: the consumer is closed all the same.
            log.debug("closing consumer: %s", e)


# What a timeout on the binary protocol may mean: the broker drops a connection whose
# credentials it refuses without saying why, and pulsar-client retries until it times out.
_TIMEOUT_HINT = (
    "Pulsar did not answer in time (down, or refusing the proxy's credentials or TLS: "
    "check brokerClientAuthenticationParameters and brokerClientTrustCertsFilePath)"
)


def _client_security(settings: BrokerClientSettings) -> dict[str, Any]:
    """pulsar.Client keyword arguments for TLS trust and the proxy's credentials."""
    options: dict[str, Any] = {
        "tls_allow_insecure_connection": settings.allow_insecure,
        "tls_validate_hostname": settings.validate_hostname and not settings.allow_insecure,
    }
    if settings.trust_certs_file:
        options["tls_trust_certs_file_path"] = settings.trust_certs_file
    auth = settings.auth
    if auth.method == "tls":
        options["authentication"] = pulsar.AuthenticationTLS(auth.cert_file, auth.key_file)
    elif auth.method == "token" and auth.token_file:
        options["authentication"] = pulsar.AuthenticationToken(_token_supplier(settings))
    elif auth.method == "token":
        options["authentication"] = pulsar.AuthenticationToken(auth.token)
    return options


def _token_supplier(settings: BrokerClientSettings) -> Callable[[], str]:
    """Reads the token file each time pulsar-client (re)connects, so a rotated token is
    used without a restart. Runs on a pulsar thread: it must not raise."""
    refusals = RefusalLog()

    def supply() -> str:
        try:
            return settings.auth.current_token()
        except BrokerAuthError as e:
            refusals.report(f"cannot authenticate to Pulsar: {e}")
            return ""

    return supply


class PulsarBackend:
    """One pulsar-client Client per proxy process."""

    def __init__(
        self,
        service_url: str,
        producer_max_pending: int = 5000,
        *,
        settings: BrokerClientSettings | None = None,
    ) -> None:
        self.service_url = service_url
        self.producer_max_pending = producer_max_pending
        security = _client_security(settings) if settings is not None else {}
        self._refusals = RefusalLog()
        self._client = pulsar.Client(
            service_url,
            operation_timeout_seconds=10,
            io_threads=1,
            message_listener_threads=1,
            # pulsar-client's own logger at Warn: with a Python logger it takes the GIL for
            # every DEBUG line it considers, which cost a quarter to a half of the proxy's
            # CPU per message (docs/performance.md).
            logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn),
            **security,
        )

    @classmethod
    def from_config(cls, config: StarlightConfig) -> PulsarBackend:
        """The client of the proxy's configuration (TLS URL, trust and credentials when
        configured); logs how it connects, never a secret. Raises ConfigError when the
        configured certificate files cannot be used."""
        settings = BrokerClientSettings.from_config(config)
        log.info("Pulsar connection: %s", settings.describe())
        try:
            return cls(settings.service_url, config.producer_max_pending, settings=settings)
        except (pulsar.PulsarException, ValueError) as e:
            raise ConfigError("brokerClientAuthenticationParameters", str(e)) from e

    def _unusable(self, what: str, e: Exception) -> BackendUnavailable:
        """The exception for a failed create/subscribe that means Pulsar cannot be used."""
        if isinstance(e, pulsar.AuthenticationError):
            message = f"Pulsar refused authentication: {what}: {e}"
            self._refusals.report(message)
            return PulsarAuthenticationRefused(message)
        if isinstance(e, pulsar.Timeout):
            return BackendUnavailable(f"{what}: {_TIMEOUT_HINT}")
        return BackendUnavailable(f"{what}: {e}")

    def create_producer(self, topic: TopicName) -> ProducerHandle:
        """Blocking. Raises BackendUnavailable or BackendError."""
        try:
            producer = self._client.create_producer(
                str(topic),
                block_if_queue_full=False,
                max_pending_messages=self.producer_max_pending + 1,
                # No batching: a batch is one Pulsar entry, so a negative ack of one message
                # would redeliver the whole batch and stats would count entries, not messages.
                batching_enabled=False,
                send_timeout_millis=30000,
            )
        except (pulsar.Timeout, pulsar.ConnectError, pulsar.AuthenticationError) as e:
            raise self._unusable(f"cannot create a producer on {topic}", e) from e
        except pulsar.PulsarException as e:
            raise BackendError(f"cannot create a producer on {topic}: {e}") from e
        # Leave the client's own queue a margin above our limit, so it never reports full.
        return ProducerHandle(producer, max(1, self.producer_max_pending - 1))

    def subscribe(
        self,
        topic: TopicName,
        subscription: str,
        consumer_name: str,
        receiver_queue_size: int,
        listener: Listener | None,
    ) -> ConsumerHandle:
        """Blocking: a Shared consumer on an existing binding subscription. With a
        `listener`, messages are pushed to it (on a pulsar thread); without, use receive().
        Raises BackendUnavailable or BackendError."""
        handle = ConsumerHandle(topic, subscription)
        kwargs: dict[str, Any] = {}
        if listener is not None:
            kwargs["message_listener"] = lambda _consumer, message: listener(
                handle, received(message)
            )
        try:
            handle._consumer = self._client.subscribe(
                str(topic),
                subscription,
                consumer_type=pulsar.ConsumerType.Shared,
                receiver_queue_size=max(1, receiver_queue_size),
                consumer_name=consumer_name,
                negative_ack_redelivery_delay_ms=100,
                initial_position=pulsar.InitialPosition.Latest,
                **kwargs,
            )
        except (pulsar.Timeout, pulsar.ConnectError, pulsar.AuthenticationError) as e:
            raise self._unusable(f"cannot consume from {topic}", e) from e
        except pulsar.PulsarException as e:
            raise BackendError(f"cannot consume from {topic}: {e}") from e
        return handle

    def drain_subscription(self, topic: TopicName, subscription: str, consumer_name: str) -> int:
        """Blocking: acknowledge every message the broker will hand out on `subscription`
        (its ready messages: those delivered to other consumers are not handed out) and
        return how many. Used by queue.purge when skip_all would drop unacked ones too."""
        handle = self.subscribe(topic, subscription, consumer_name, 100, None)
        drained = 0
        try:
            while (message := handle.receive(0.2)) is not None:
                handle.acknowledge(message)
                drained += 1
        finally:
            handle.close()
        return drained

    def close(self) -> None:
        try:
            self._client.close()
        except pulsar.PulsarException as e:
            log.debug("closing the Pulsar client: %s", e)
