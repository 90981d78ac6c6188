"""A small client for Pulsar's admin REST API: namespaces, topics, subscriptions, stats.

Synchronous on purpose: these calls are off the hot path, and the gateway runs them in a
worker thread (`trio.to_thread.run_sync`). Every failure is translated to `PulsarAdminError`
(the broker answered with an error) or `BackendUnavailable` (no answer at all).
"""

from __future__ import annotations

import datetime
import http.client
import json
import logging
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import IO, Any
from urllib.parse import quote, unquote_plus

from starlight_py.backend.batch_payload import batch_properties
from starlight_py.backend.broker_auth import BrokerAuth, BrokerAuthError, BrokerClientSettings
from starlight_py.backend.kept_http import MAX_REDIRECTS, KeptConnections
from starlight_py.config import ConfigError, StarlightConfig
from starlight_py.model.counts import QueueFlow
from starlight_py.model.naming import TopicName, quote_path_segment
from starlight_py.model.positions import MessageIdRecord
from starlight_py.units import SECONDS

# Pulsar's MessageId.latest: (Long.MAX_VALUE, Long.MAX_VALUE, partition -1).
_JAVA_LONG_MAX = 2**63 - 1
_LATEST = {
    "ledgerId": _JAVA_LONG_MAX,
    "entryId": _JAVA_LONG_MAX,
    "partitionIndex": -1,
    "batchIndex": -1,
    "isExcluded": False,
}


def split_web_urls(web_url: str) -> list[str]:
    """`brokerWebServiceURL` as a list: one URL, or several separated by commas as Pulsar's
    own admin tools take them (`http://a:8080,b:8080` or `http://a:8080,http://b:8080`; a
    host without a scheme takes the first one's). Raises nothing."""
    parts = [p.strip().rstrip("/") for p in web_url.split(",") if p.strip()]
    if not parts:
        return [web_url.rstrip("/")]
    scheme = parts[0].split("://", 1)[0] if "://" in parts[0] else "http"
    return [p if "://" in p else f"{scheme}://{p}" for p in parts]


class _RedirectKeepingMethod(urllib.request.HTTPRedirectHandler):
    """A broker answers 307 to a topic request when another broker owns the topic. urllib
    follows 307/308 only for GET and HEAD; follow them for PUT and DELETE too, with the same
    method and body, as Pulsar's own admin client does."""

    def redirect_request(
        self,
        req: urllib.request.Request,
        fp: IO[bytes],
        code: int,
        msg: str,
        headers: http.client.HTTPMessage,
        newurl: str,
    ) -> urllib.request.Request | None:
        if code in (307, 308):
            return urllib.request.Request(
                newurl,
                data=req.data,
                headers=dict(req.header_items()),
                origin_req_host=req.origin_req_host,
                unverifiable=True,
                method=req.get_method(),
            )
        return super().redirect_request(req, fp, code, msg, headers, newurl)


log = logging.getLogger("starlight.pulsar")


class BackendUnavailable(Exception):
    """Pulsar could not be reached (connection refused, timeout, TLS handshake failed)."""


class PulsarAuthenticationRefused(BackendUnavailable):
    """Pulsar refused the proxy's own credentials: the proxy is misconfigured (or its
    token expired), so Pulsar is as unusable as if it were down. Never the client's fault."""


class RefusalLog:
    """Logs "Pulsar refused authentication" at ERROR at most once a minute: every client
    operation hits the same refusal, and the log must stay readable."""

    def __init__(self, interval: float = 60 * SECONDS) -> None:
        self.interval = interval
        self._last = -interval

    def report(self, message: str) -> None:
        now = time.monotonic()
        if now - self._last >= self.interval:
            self._last = now
            log.error("%s", message)
        else:
            log.debug("%s", message)


class PulsarAdminError(Exception):
    """Pulsar answered an admin request with an error status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


@dataclass(frozen=True, slots=True)
class SubscriptionStats:
    """One subscription in a topic's stats.

    `backlog` counts every message not acknowledged yet, including the `unacked` ones:
    those the broker has dispatched to a consumer (into its receiver queue, not necessarily
    into the application) and that wait for an acknowledgement.
    """

    backlog: int
    unacked: int
    consumer_names: tuple[str, ...]
    # Delayed messages (x-delayed-message) whose time has not come, as far as the broker
    # tracks them: it indexes a message when its dispatcher reads it, which needs a
    # consumer on the subscription; until then a delayed message counts as ready.
    delayed: int = 0
    # Stored size of the backlog (bodies plus Pulsar metadata and properties); only when
    # asked for (`with_bytes`), else 0.
    backlog_bytes: int = 0
    # How messages flow, as the owning broker counts them since it loaded the topic:
    # into the topic (all its subscriptions share these), out of this subscription to its
    # consumers, acknowledged, and dispatched again. Rates are per second, over the
    # broker's last statsUpdateFrequencyInSecs. Measurements: not part of equality.
    flow: QueueFlow = field(default_factory=QueueFlow, compare=False)

    @property
    def ready(self) -> int:
        """Messages a consumer could be given now: AMQP's message_count."""
        return max(0, self.backlog - self.unacked - self.delayed)

    @property
    def ready_bytes(self) -> int:
        """The ready messages' share of `backlog_bytes` (Pulsar sizes the whole backlog)."""
        if self.backlog <= 0:
            return 0
        return self.backlog_bytes * self.ready // self.backlog


@dataclass(frozen=True, slots=True)
class TopicStats:
    """One topic's stats: what it stores (every subscription's backlog shares it, and
    retention may keep more) and its subscriptions by name."""

    storage_size: int  # bytes
    producers: int
    subscriptions: dict[str, SubscriptionStats] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class PeekedMessage:
    """A message seen through the admin API without consuming it. A batch entry is seen
    whole: `properties` are then its first message's and `batch` has every message's (its
    messages acknowledged by index included: the peek does not say which)."""

    message_id: str  # "ledger:entry"
    publish_time_ms: int
    properties: dict[str, str]
    batch: tuple[dict[str, str], ...] = ()

    def each_message_properties(self) -> tuple[dict[str, str], ...]:
        """The properties of every message the peek saw: one, or a batch's."""
        return self.batch or (self.properties,)


# A topic whose bundle is moving (split, unloaded, its broker gone) has no owner for a
# moment: Pulsar answers 412 "Can't find owner for topic" or 503. A read (GET) is asked
# again for up to this long, waiting a little longer each time.
MOVING_TOPIC_RETRY_SECONDS = 5.0
_MOVING_TOPIC_FIRST_WAIT = 0.05
_MOVING_TOPIC_LONGEST_WAIT = 0.5

BACKLOG_PLUGIN_PATH = "/starlight/backlog"  # local/broker_plugin/MessageBacklogPlugin.java


def _backlog(stats: dict[str, Any], name: str, in_messages: dict[str, int] | None) -> int:
    """A subscription's backlog: in messages when the plugin counted it, else Pulsar's
    msgBacklog (entries)."""
    if in_messages is not None and name in in_messages:
        return in_messages[name]
    return int(stats.get("msgBacklog", 0))


class PulsarAdmin:
    """Admin REST calls against `web_url` (e.g. http://127.0.0.1:8080, or https:// with
    `settings` giving the trusted CAs and the proxy's credentials)."""

    def __init__(
        self,
        web_url: str,
        timeout: float = 10 * SECONDS,
        *,
        settings: BrokerClientSettings | None = None,
    ) -> None:
        """Raises BrokerAuthError when a CA, certificate or key file of `settings` cannot
        be loaded."""
        self.web_urls = split_web_urls(web_url)
        self._current = 0
        self.timeout = timeout
        self._auth = settings.auth if settings is not None else BrokerAuth()
        handlers: list[urllib.request.BaseHandler] = [_RedirectKeepingMethod()]
        if settings is not None and self.web_url.startswith("https:"):
            handlers.append(urllib.request.HTTPSHandler(context=settings.ssl_context()))
        self._opener = urllib.request.build_opener(*handlers)
        self._kept = KeptConnections(
            settings.ssl_context()
            if settings is not None and self.web_url.startswith("https:")
            else None
        )
        self._refusals = RefusalLog()
        # Backlogs in messages from the brokers' starlight-backlog plugin instead of
        # Pulsar's msgBacklog, which counts entries (set with producer batching when the
        # brokers have the plugin: has_message_backlogs()); None: ask the broker at the
        # first count whether it has the plugin.
        self.message_backlogs: bool | None = False
        # Whether `subscription_counts` can ask the plugin (None: not known yet).
        self._counts_plugin: bool | None = None

    @property
    def web_url(self) -> str:
        """The admin URL in use: the first of `web_urls` that answered last."""
        return self.web_urls[self._current]

    @classmethod
    def from_config(cls, config: StarlightConfig) -> PulsarAdmin:
        """The admin client of the proxy's configuration (TLS URL, trust and credentials
        when configured). Raises ConfigError when a CA, certificate or key file is unusable."""
        settings = BrokerClientSettings.from_config(config)
        try:
            return cls(settings.web_url, settings=settings)
        except BrokerAuthError as e:
            raise ConfigError(e.key, str(e)) from e

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self._auth.method == "token":
            try:
                headers["Authorization"] = f"Bearer {self._auth.current_token()}"
            except BrokerAuthError as e:
                self._refusals.report(f"cannot authenticate to Pulsar: {e}")
                raise BackendUnavailable(f"cannot authenticate to Pulsar: {e}") from e
        return headers

    def _request(self, method: str, path: str, body: Any = None) -> Any:
        status, _, payload = self._exchange(method, path, body)
        try:
            return json.loads(payload) if payload else None
        except ValueError as e:
            raise PulsarAdminError(status, f"{method} {path} answered with no JSON") from e

    def _exchange(
        self, method: str, path: str, body: Any = None
    ) -> tuple[int, http.client.HTTPMessage, bytes]:
        """One call: (status, response headers, body). Raises PulsarAdminError,
        PulsarAuthenticationRefused, BackendUnavailable."""
        data = None if body is None else json.dumps(body).encode("utf-8")
        if method != "GET":
            return self._exchange_any_broker(method, path, data)
        deadline = time.monotonic() + MOVING_TOPIC_RETRY_SECONDS
        wait = _MOVING_TOPIC_FIRST_WAIT
        while True:
            try:
                return self._exchange_any_broker(method, path, data)
            except PulsarAdminError as e:
                if not topic_moving(e) or time.monotonic() + wait > deadline:
                    raise
            time.sleep(wait)
            wait = min(wait * 2, _MOVING_TOPIC_LONGEST_WAIT)

    def _exchange_any_broker(
        self, method: str, path: str, data: bytes | None
    ) -> tuple[int, http.client.HTTPMessage, bytes]:
        # With several brokers' URLs, one that does not answer (a broker down) hands the
        # call to the next; the one that answered is tried first next time.
        for attempt in range(len(self.web_urls)):
            try:
                return self._exchange_once(method, path, data)
            except PulsarAuthenticationRefused:
                raise  # the proxy's credentials, not the broker, are at fault
            except BackendUnavailable:
                if attempt == len(self.web_urls) - 1:
                    raise
                self._current = (self._current + 1) % len(self.web_urls)
        raise AssertionError("unreachable")

    def _exchange_once(
        self, method: str, path: str, data: bytes | None
    ) -> tuple[int, http.client.HTTPMessage, bytes]:
        if method == "GET":
            return self._get_kept(path)
        request = urllib.request.Request(
            self.web_url + path, data=data, method=method, headers=self._headers()
        )
        try:
            with self._opener.open(request, timeout=self.timeout) as response:
                status = response.status
                headers = response.headers
                payload = response.read()
        except urllib.error.HTTPError as e:
            if e.code == 401:
                message = (
                    f"Pulsar refused authentication: HTTP 401 {_reason(e)} from {self.web_url} "
                    f"(the proxy sent {self._auth.describe()}; check "
                    "brokerClientAuthenticationPlugin and brokerClientAuthenticationParameters)"
                )
                self._refusals.report(message)
                raise PulsarAuthenticationRefused(message) from e
            raise PulsarAdminError(e.code, _reason(e)) from e
        except urllib.error.URLError as e:
            if isinstance(e.reason, ssl.SSLError):
                raise BackendUnavailable(
                    f"TLS handshake with the Pulsar admin API at {self.web_url} failed: "
                    f"{e.reason} (check brokerClientTrustCertsFilePath and the URL's host name)"
                ) from e
            raise BackendUnavailable(f"Pulsar admin API at {self.web_url} unreachable: {e}") from e
        except (OSError, http.client.HTTPException) as e:
            raise BackendUnavailable(f"Pulsar admin API at {self.web_url} unreachable: {e}") from e
        return status, headers, payload

    def _get_kept(self, path: str) -> tuple[int, http.client.HTTPMessage, bytes]:
        """A GET over a kept connection (backend/kept_http.py), its answer judged as
        `_exchange_once` judges urllib's."""
        try:
            answer = self._kept.get(self.web_url + path, self._headers(), self.timeout)
        except ssl.SSLError as e:
            raise BackendUnavailable(
                f"TLS handshake with the Pulsar admin API at {self.web_url} failed: "
                f"{e} (check brokerClientTrustCertsFilePath and the URL's host name)"
            ) from e
        except (OSError, http.client.HTTPException) as e:
            raise BackendUnavailable(f"Pulsar admin API at {self.web_url} unreachable: {e}") from e
        if answer.status == 401:
            reason = _reason_in(answer.body, "Unauthorized")
            message = (
                f"Pulsar refused authentication: HTTP 401 {reason} "
                f"from {self.web_url} (the proxy sent {self._auth.describe()}; check "
                "brokerClientAuthenticationPlugin and brokerClientAuthenticationParameters)"
            )
            self._refusals.report(message)
            raise PulsarAuthenticationRefused(message)
        if 300 <= answer.status < 400:
            raise PulsarAdminError(
                answer.status, f"redirected more than {MAX_REDIRECTS} times (a topic moving?)"
            )
        if answer.status >= 400:
            reason = http.client.responses.get(answer.status, "error")
            raise PulsarAdminError(answer.status, _reason_in(answer.body, reason))
        return answer.status, answer.headers, answer.body

    def clusters(self) -> list[str]:
        result: list[str] = self._request("GET", "/admin/v2/clusters")
        return result

    def brokers(self) -> list[str]:
        """The web addresses (`host:port`) of every broker of every cluster."""
        found: list[str] = []
        for cluster in self.clusters():
            listed = self._request("GET", f"/admin/v2/brokers/{urllib.parse.quote(cluster)}")
            found.extend(str(b) for b in listed or [])
        return found

    def broker_topic_stats(self) -> list[Any]:
        """Every broker's stats of all its topics (`/admin/v2/broker-stats/topics`, computed
        by the broker every statsUpdateFrequencyInSecs): one request each. With one broker,
        the admin URL's (its advertised address may not be reachable from here). Raises
        PulsarAdminError, BackendUnavailable."""
        path = "/admin/v2/broker-stats/topics"
        brokers = self.brokers()
        if len(brokers) <= 1:
            return [self._request("GET", path)]
        scheme = self.web_url.split("://", 1)[0]
        answers = []
        for broker in brokers:
            request = urllib.request.Request(
                f"{scheme}://{broker}{path}", method="GET", headers=self._headers()
            )
            try:
                with self._opener.open(request, timeout=self.timeout) as response:
                    answers.append(json.loads(response.read()))
            except (OSError, http.client.HTTPException, ValueError) as e:
                raise BackendUnavailable(f"topic stats of Pulsar broker {broker}: {e}") from e
        return answers

    def broker_setting(self, name: str) -> str | None:
        """A setting of the broker answering (its runtime configuration); None when it
        does not list it. Raises PulsarAdminError (403: the proxy's role is no super-user)
        or BackendUnavailable."""
        values = self._request("GET", "/admin/v2/brokers/configuration/runtime")
        value = values.get(name) if isinstance(values, dict) else None
        return None if value is None else str(value)

    def broker_setting_shown(self, name: str) -> str:
        """`broker_setting` as a start-up warning shows it: "unknown (why)" when it cannot
        be read. Raises nothing."""
        try:
            return str(self.broker_setting(name))
        except (PulsarAdminError, BackendUnavailable) as e:
            return f"unknown ({e})"

    def namespaces(self, tenant: str) -> list[str]:
        """Namespaces of a tenant as `tenant/ns`; PulsarAdminError 404 when the tenant is
        missing."""
        result: list[str] = self._request("GET", f"/admin/v2/namespaces/{quote(tenant)}")
        return result

    def namespace_exists(self, tenant: str, namespace: str) -> bool:
        try:
            return f"{tenant}/{namespace}" in self.namespaces(tenant)
        except PulsarAdminError as e:
            if e.status == 404:
                return False
            raise

    def create_tenant(self, tenant: str) -> None:
        """Create a tenant allowed on every cluster; an existing tenant is not an error."""
        body = {"allowedClusters": self.clusters(), "adminRoles": []}
        try:
            self._request("PUT", f"/admin/v2/tenants/{quote(tenant)}", body)
        except PulsarAdminError as e:
            if e.status != 409:
                raise

    def create_namespace(self, tenant: str, namespace: str) -> None:
        """Create a namespace (and its tenant when missing); existing ones are not errors."""
        try:
            self._request("PUT", f"/admin/v2/namespaces/{quote(tenant)}/{quote(namespace)}")
        except PulsarAdminError as e:
            if e.status == 409:
                return
            if e.status != 404:
                raise
            self.create_tenant(tenant)
            try:
                self._request("PUT", f"/admin/v2/namespaces/{quote(tenant)}/{quote(namespace)}")
            except PulsarAdminError as again:
                if again.status != 409:
                    raise

    def create_topic(self, topic: TopicName) -> bool:
        """Create a non-partitioned topic; False when it already existed.

        Raises PulsarAdminError (404: no such namespace) or BackendUnavailable.
        """
        try:
            self._request("PUT", f"/admin/v2/{topic.rest_path}")
        except PulsarAdminError as e:
            if e.status == 409:
                return False
            raise
        return True

    def topic_owner(self, topic: TopicName) -> str:
        """The broker that owns `topic` now (its `pulsar://host:port`), loading it if no
        broker has. Raises PulsarAdminError or BackendUnavailable."""
        answer = self._request("GET", f"/lookup/v2/topic/{topic.rest_path}")
        return str(answer.get("brokerUrl", "")) if isinstance(answer, dict) else ""

    def topic_bundle(self, topic: TopicName) -> str:
        """The namespace bundle holding `topic` (`0x00000000_0x40000000`). Raises
        PulsarAdminError or BackendUnavailable."""
        _, _, payload = self._exchange("GET", f"/lookup/v2/topic/{topic.rest_path}/bundle")
        return payload.decode("utf-8", "replace").strip().strip('"')

    def unload_topic(self, topic: TopicName) -> None:
        """Have the owner close `topic`; the next lookup may give it to another broker
        (producers and consumers reconnect). Raises PulsarAdminError or BackendUnavailable."""
        self._request("PUT", f"/admin/v2/{topic.rest_path}/unload")

    def split_bundle(self, namespace: str, bundle: str, unload: bool = True) -> None:
        """Split a namespace bundle in two (`namespace` as `tenant/ns`); with `unload`, its
        topics are unloaded and looked up again. Raises PulsarAdminError or
        BackendUnavailable."""
        self._request(
            "PUT",
            f"/admin/v2/namespaces/{namespace}/{quote(bundle)}/split?unload={_flag(unload)}",
        )

    def bundle_count(self, namespace: str) -> int:
        """How many bundles `namespace` (`tenant/ns`) has. Raises PulsarAdminError or
        BackendUnavailable."""
        answer = self._request("GET", f"/admin/v2/namespaces/{namespace}/bundles")
        return int(answer.get("numBundles", 0)) if isinstance(answer, dict) else 0

    def delete_topic(self, topic: TopicName, force: bool = True) -> bool:
        """Delete a topic (with `force`, even with producers, consumers or subscriptions);
        False when it did not exist. Raises PulsarAdminError or BackendUnavailable."""
        try:
            self._request("DELETE", f"/admin/v2/{topic.rest_path}?force={_flag(force)}")
        except PulsarAdminError as e:
            if e.status == 404:
                return False
            raise
        return True

    def skip_all(self, topic: TopicName, subscription: str) -> None:
        """Acknowledge everything in a subscription's backlog (queue.purge). A missing topic or
        subscription is not an error. Raises PulsarAdminError or BackendUnavailable."""
        self._subscription_action(topic, subscription, "skip_all")

    def expire_messages(self, topic: TopicName, subscription: str, older_than: int) -> None:
        """Acknowledge the messages of a subscription published more than `older_than`
        seconds ago (Pulsar's expireMessages; a queue's x-message-ttl). A missing topic or
        subscription is not an error, nor a subscription with (almost) nothing to expire
        (Pulsar answers 409 "subscription almost catch up" then). Raises PulsarAdminError or
        BackendUnavailable."""
        try:
            self._subscription_action(topic, subscription, f"expireMessages/{max(0, older_than)}")
        except PulsarAdminError as e:
            if e.status != 409:
                raise

    def skip_messages(self, topic: TopicName, subscription: str, count: int) -> None:
        """Acknowledge the `count` oldest messages of a subscription's backlog (a stream past
        its x-max-length-bytes). A missing topic or subscription is not an error. Raises
        PulsarAdminError or BackendUnavailable."""
        if count > 0:
            self._subscription_action(topic, subscription, f"skip/{count}")

    def _subscription_action(self, topic: TopicName, subscription: str, action: str) -> None:
        path = f"/admin/v2/{topic.rest_path}/subscription/{quote_path_segment(subscription)}"
        try:
            self._request("POST", f"{path}/{action}")
        except PulsarAdminError as e:
            if e.status != 404:
                raise

    def create_subscription(self, topic: TopicName, subscription: str) -> bool:
        """Create a durable subscription at the topic's latest position (a message sent
        before does not count, one sent after does), creating the topic when needed;
        False when the subscription already existed (its cursor is left where it is).

        Raises PulsarAdminError (404: no such namespace) or BackendUnavailable.
        """
        path = f"/admin/v2/{topic.rest_path}/subscription/{quote_path_segment(subscription)}"
        try:
            self._request("PUT", path, _LATEST)
        except PulsarAdminError as e:
            if e.status == 409:
                return False
            # 412 "Topic does not exist and cannot be auto-created": the namespace forbids
            # auto-creation, so create the topic explicitly and try once more.
            if e.status != 412:
                raise
            self.create_topic(topic)
            try:
                self._request("PUT", path, _LATEST)
            except PulsarAdminError as again:
                if again.status == 409:
                    return False
                raise
        return True

    def delete_subscription(self, topic: TopicName, subscription: str, force: bool = True) -> bool:
        """Delete a subscription (with `force`, disconnecting its consumers); False when it
        (or its topic, or its namespace) did not exist.

        Raises PulsarAdminError (412: consumers connected and not `force`) or
        BackendUnavailable.
        """
        path = (
            f"/admin/v2/{topic.rest_path}/subscription/{quote_path_segment(subscription)}"
            f"?force={_flag(force)}"
        )
        try:
            self._request("DELETE", path)
        except PulsarAdminError as e:
            if e.status == 404:
                return False
            raise
        return True

    def drop_subscription(
        self, topic: TopicName, subscription: str, owns_topic: bool, force: bool = False
    ) -> None:
        """Delete a retired subscription, and with `owns_topic` its topic too (a binding's
        own topic, which nothing else reads). Not forced, the topic goes first: Pulsar
        deletes a topic's subscriptions with it when no client is attached, so the usual
        case is one request. A topic a producer still holds is refused (412); its
        subscription is deleted then, and the 412 raised, for the topic to be tried again
        later. A forced subscription deletion disconnects its consumers; the topic is never
        forced (a producer on it would make it again). Raises PulsarAdminError (412: clients
        attached) or BackendUnavailable."""
        if owns_topic and not force:
            try:
                self.delete_topic(topic, force=False)
                return
            except PulsarAdminError as e:
                if e.status != 412:
                    raise
                self.delete_subscription(topic, subscription, force=False)
                raise
        self.delete_subscription(topic, subscription, force=force)
        if owns_topic:
            self.delete_topic(topic, force=False)

    def last_message_id(self, topic: TopicName) -> MessageIdRecord | None:
        """The id of the last message written to the topic; None when it has none yet or
        does not exist.

        The broker answers a topic that never had a message with its current ledger and
        entry -1 (`{"ledgerId": 3, "entryId": -1, ...}`); after an unload it keeps
        answering the last written entry of the previous ledger, so an empty current
        ledger does not hide older messages. Raises PulsarAdminError or BackendUnavailable.
        """
        try:
            answer = self._request("GET", f"/admin/v2/{topic.rest_path}/lastMessageId")
        except PulsarAdminError as e:
            if e.status == 404:
                return None
            raise
        try:
            record = MessageIdRecord(
                ledger_id=int(answer["ledgerId"]),
                entry_id=int(answer["entryId"]),
                batch_index=int(answer.get("batchIndex", -1)),
                partition=int(answer.get("partitionIndex", -1)),
            )
        except (TypeError, KeyError, ValueError, AttributeError) as e:
            raise PulsarAdminError(200, f"unexpected lastMessageId answer {answer!r}") from e
        if record.ledger_id < 0 or record.entry_id < 0:
            return None
        return record

    def has_message_backlogs(self) -> bool:
        """Whether the broker answering serves the starlight-backlog plugin
        (docs/operations.md#what-pulsar-needs). Raises BackendUnavailable."""
        try:
            self._exchange("GET", f"{BACKLOG_PLUGIN_PATH}?topic=")
        except PulsarAdminError as e:
            return e.status == 400  # the plugin's answer to a request without a topic
        return False

    def message_backlog_counts(self, topic: TopicName) -> dict[str, int] | None:
        """Each subscription's backlog in messages (batch-aware: a batch entry counts its
        messages, less those acknowledged by index), from the brokers' starlight-backlog
        plugin; empty when the topic does not exist, None when the plugin cannot count it
        (entries written before the brokers gave them an index). Raises PulsarAdminError
        or BackendUnavailable."""
        answer = self._plugin_counts(topic)
        if not answer:
            return None if answer is None else {}  # cannot count / no such topic
        try:
            return {str(k): int(v) for k, v in answer["subscriptions"].items()}
        except (TypeError, KeyError, ValueError, AttributeError) as e:
            raise PulsarAdminError(200, f"unexpected backlog answer for {topic}") from e

    def _plugin_counts(self, topic: TopicName) -> dict[str, Any] | None:
        """The plugin's answer for the topic; empty when the topic does not exist, None when
        the plugin cannot count it (an entry without an index)."""
        path = f"{BACKLOG_PLUGIN_PATH}?topic={quote(str(topic), safe='')}"
        try:
            answer = self._request("GET", path)
        except PulsarAdminError as e:
            if e.status == 404:
                return {}
            if e.status == 409:
                log.debug("no message backlog for %s: %s", topic, e)
                return None
            raise
        if not isinstance(answer, dict) or not answer:
            raise PulsarAdminError(200, f"unexpected backlog answer for {topic}")
        return answer

    def subscription_counts(self, topic: TopicName) -> dict[str, SubscriptionStats] | None:
        """Each subscription's backlog in messages, unacknowledged and delayed messages
        (what basic.get counts with) in one request to the starlight-backlog plugin, which
        costs the broker a fraction of its stats endpoint; empty when the topic does not
        exist. The flow figures and consumer names are left out. None when the plugin is
        missing, older than these counts, or cannot count the topic: `subscription_stats`
        answers then. Raises PulsarAdminError or BackendUnavailable."""
        if self._counts_plugin is None:
            self._counts_plugin = bool(self.message_backlogs) or self.has_message_backlogs()
        if not self._counts_plugin:
            return None
        try:
            answer = self._plugin_counts(topic)
        except PulsarAdminError as e:
            # The plugin failed on this topic (say, while it moves between brokers): the
            # stats endpoint answers instead, as for a count in entries.
            log.debug("counts of %s from the stats: the backlog plugin failed (%s)", topic, e)
            return None
        if not answer:
            return None if answer is None else {}  # cannot count / no such topic
        try:
            details = answer.get("details")
            if not isinstance(details, dict):
                self._counts_plugin = False  # a plugin of an earlier version
                return None
            return {
                str(name): SubscriptionStats(
                    backlog=int(backlog),
                    unacked=int(details[name]["unacked"]),
                    consumer_names=(),
                    delayed=int(details[name]["delayed"]),
                )
                for name, backlog in answer["subscriptions"].items()
            }
        except (TypeError, KeyError, ValueError, AttributeError) as e:
            raise PulsarAdminError(200, f"unexpected backlog answer for {topic}") from e

    def _message_backlogs_or_none(self, topic: TopicName) -> dict[str, int] | None:
        try:
            return self.message_backlog_counts(topic)
        except PulsarAdminError as e:
            log.warning(
                "counting %s's backlog in entries: the backlog plugin failed (%s)", topic, e
            )
            return None

    def subscription_stats(
        self, topic: TopicName, with_bytes: bool = False
    ) -> dict[str, SubscriptionStats]:
        """Backlog, unacknowledged count and consumers of each subscription of the topic
        (`with_bytes`: and the backlog's stored size, which costs the broker more); empty
        when the topic does not exist. Raises PulsarAdminError or BackendUnavailable.
        """
        stats = self.topic_stats(topic, with_bytes)
        return {} if stats is None else stats.subscriptions

    def topic_stats(self, topic: TopicName, with_bytes: bool = False) -> TopicStats | None:
        """The topic's stored size and producers, and `subscription_stats`; None when the
        topic does not exist. Raises PulsarAdminError or BackendUnavailable."""
        query = "?subscriptionBacklogSize=true" if with_bytes else ""
        try:
            answer = self._request("GET", f"/admin/v2/{topic.rest_path}/stats{query}")
        except PulsarAdminError as e:
            if e.status == 404:
                return None
            raise
        if self.message_backlogs is None:
            self.message_backlogs = self.has_message_backlogs()
        in_messages = self._message_backlogs_or_none(topic) if self.message_backlogs else None
        try:
            subscriptions = {
                name: SubscriptionStats(
                    backlog=_backlog(stats, name, in_messages),
                    unacked=int(stats.get("unackedMessages", 0)),
                    delayed=int(stats.get("msgDelayed", 0)),
                    backlog_bytes=max(0, int(stats.get("backlogSize", 0))) if with_bytes else 0,
                    consumer_names=tuple(
                        str(consumer.get("consumerName", ""))
                        for consumer in stats.get("consumers", [])
                    ),
                    flow=QueueFlow(
                        published=int(answer.get("msgInCounter", 0)),
                        publish_rate=float(answer.get("msgRateIn", 0.0)),
                        delivered=int(stats.get("msgOutCounter", 0)),
                        deliver_rate=float(stats.get("msgRateOut", 0.0)),
                        ack_rate=float(stats.get("messageAckRate", 0.0)),
                        redeliver_rate=float(stats.get("msgRateRedeliver", 0.0)),
                    ),
                )
                for name, stats in answer.get("subscriptions", {}).items()
            }
            return TopicStats(
                storage_size=max(0, int(answer.get("storageSize", 0))),
                producers=len(answer.get("publishers", [])),
                subscriptions=subscriptions,
            )
        except (TypeError, ValueError, AttributeError) as e:
            raise PulsarAdminError(200, f"unexpected stats answer for {topic}") from e

    def peek_head(self, topic: TopicName, subscription: str) -> PeekedMessage | None:
        """The first message of the subscription's backlog (what a consumer would be given
        first, a message delivered and unacked included), read without taking it; None when
        the backlog, the subscription or the topic is empty or missing. Raises
        PulsarAdminError or BackendUnavailable."""
        path = f"/admin/v2/{topic.rest_path}/subscription/{quote_path_segment(subscription)}"
        try:
            status, headers, body = self._exchange("GET", f"{path}/position/1")
        except PulsarAdminError as e:
            if e.status == 404:
                return None
            raise
        try:
            published = datetime.datetime.fromisoformat(headers["X-Pulsar-publish-time"])
            properties = json.loads(headers.get("X-Pulsar-PROPERTY") or "{}")
            in_batch = headers.get("X-Pulsar-num-batch-message")
            batch = tuple(batch_properties(body, int(in_batch))) if in_batch else ()
            return PeekedMessage(
                str(headers.get("X-Pulsar-Message-ID", "")),
                round(published.timestamp() * 1000),
                batch[0] if batch else {str(k): str(v) for k, v in properties.items()},
                batch,
            )
        except (TypeError, KeyError, ValueError, AttributeError) as e:
            raise PulsarAdminError(status, f"unexpected peek answer for {topic}: {e}") from e

    def get_entry(
        self, topic: TopicName, ledger: int, entry: int
    ) -> tuple[int, http.client.HTTPMessage, bytes]:
        """One stored entry of the topic, as the admin API answers it: (status, headers with
        its metadata, payload). Raises PulsarAdminError (404: no such entry),
        BackendUnavailable."""
        return self._exchange("GET", f"/admin/v2/{topic.rest_path}/ledger/{ledger}/entry/{entry}")

    def ledger_sizes(self, topic: TopicName) -> list[tuple[int, int]]:
        """The topic's ledgers still stored, oldest first, with how many entries each holds
        (the one being written: its entries so far); empty when the topic does not exist.
        Raises PulsarAdminError, BackendUnavailable."""
        try:
            answer = self._request("GET", f"/admin/v2/{topic.rest_path}/internalStats")
        except PulsarAdminError as e:
            if e.status == 404:
                return []
            raise
        try:
            sizes = [
                (int(ledger["ledgerId"]), int(ledger.get("entries", 0)))
                for ledger in answer["ledgers"]
            ]
            if sizes:
                # The ledger being written is listed with 0 entries until it is closed.
                last, entries = sizes[-1]
                sizes[-1] = (last, max(entries, int(answer.get("currentLedgerEntries", 0))))
            return sizes
        except (TypeError, KeyError, ValueError, AttributeError) as e:
            raise PulsarAdminError(200, f"unexpected internalStats answer for {topic}") from e

    def cursor_position(self, topic: TopicName, subscription: str) -> MessageIdRecord | None:
        """The subscription's mark-delete position: every message at or before it is
        acknowledged (messages acknowledged out of order after it do not move it). None
        when the topic or the subscription does not exist.

        `L:-1` (entry -1) is a real answer: nothing of ledger L acknowledged yet, which
        orders before any message of L. Raises PulsarAdminError or BackendUnavailable.
        """
        try:
            answer = self._request("GET", f"/admin/v2/{topic.rest_path}/internalStats")
        except PulsarAdminError as e:
            if e.status == 404:
                return None
            raise
        try:
            # Cursors are named by the managed ledger, which stores the subscription name
            # URL-encoded the Java way (`~` as %7E, space as +): decode the keys.
            cursors = {unquote_plus(name): cursor for name, cursor in answer["cursors"].items()}
            cursor = cursors.get(subscription)
            if cursor is None:
                return None
            return MessageIdRecord.parse_position(str(cursor["markDeletePosition"]))
        except (TypeError, KeyError, ValueError, AttributeError) as e:
            raise PulsarAdminError(200, f"unexpected internalStats answer for {topic}") from e


def _flag(value: bool) -> str:
    return "true" if value else "false"


def topic_moving(error: PulsarAdminError) -> bool:
    """Whether Pulsar refused because the topic has no owner for the moment (its bundle is
    being split or unloaded), or its brokers sent the request back and forth meanwhile:
    asking again shortly after works."""
    if error.status in (503, 307, 308):
        return True
    return error.status == 412 and "owner" in str(error).lower()


def _reason(error: urllib.error.HTTPError) -> str:
    try:
        return _reason_in(error.read(), str(error.reason))
    except OSError:
        return str(error.reason)


def _reason_in(body: bytes, fallback: str) -> str:
    """The `reason` of Pulsar's JSON error answer, else `fallback`."""
    try:
        answer = json.loads(body or b"{}")
    except ValueError:
        return fallback
    if isinstance(answer, dict) and "reason" in answer:
        return str(answer["reason"])
    return fallback
