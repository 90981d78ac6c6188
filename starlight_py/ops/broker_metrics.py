"""Pulsar's own per-subscription metrics, read from a broker's Prometheus page (`/metrics/`
on its web port) in one request: the backlog, delayed and unacknowledged messages, consumers
and rates of every subscription the broker serves. The queue metrics (ops/queue_metrics.py)
are made from them, so a scrape never costs a stats call per queue.

Pure: `parse_subscription_metrics` takes the page's text. Only the lines of the few metric
names wanted are looked at (a prefix test per line), so a page of 10,000 subscriptions is
parsed in a fraction of a second."""

from __future__ import annotations

from dataclasses import dataclass

# Pulsar's metric name -> SubscriptionSample field.
WANTED = {
    "pulsar_subscription_back_log": "backlog",
    "pulsar_subscription_delayed": "delayed",
    "pulsar_subscription_unacked_messages": "unacked",
    "pulsar_subscription_consumers_count": "consumers",
    "pulsar_subscription_msg_rate_out": "rate_out",
    "pulsar_subscription_msg_ack_rate": "ack_rate",
}
_PREFIX = "pulsar_subscription_"


@dataclass
class SubscriptionSample:
    """One subscription as the broker reported it (messages, or messages per second)."""

    backlog: float = 0.0
    delayed: float = 0.0
    unacked: float = 0.0
    consumers: float = 0.0
    rate_out: float = 0.0
    ack_rate: float = 0.0


def parse_subscription_metrics(text: str) -> dict[tuple[str, str], SubscriptionSample]:
    """Samples by (topic, subscription), topic as Pulsar names it
    (`persistent://tenant/namespace/local`). Lines it cannot read are skipped."""
    samples: dict[tuple[str, str], SubscriptionSample] = {}
    for line in text.splitlines():
        if not line.startswith(_PREFIX):
            continue
        brace = line.find("{")
        if brace < 0:
            continue
        field = WANTED.get(line[:brace])
        if field is None:
            continue
        end = line.rfind("}")
        if end < brace:
            continue
        labels = _labels(line[brace + 1 : end])
        topic = labels.get("topic")
        subscription = labels.get("subscription")
        if topic is None or subscription is None:
            continue
        parts = line[end + 1 :].split()
        if not parts:
            continue
        try:
            value = float(parts[0])
        except ValueError:
            continue
        key = (topic, subscription)
        sample = samples.get(key)
        if sample is None:
            sample = samples[key] = SubscriptionSample()
        setattr(sample, field, value)
    return samples


def _labels(text: str) -> dict[str, str]:
    """`a="x",b="y\\"z"` -> {"a": "x", "b": 'y"z'} (Prometheus text format escapes)."""
    labels: dict[str, str] = {}
    i, n = 0, len(text)
    while i < n:
        eq = text.find("=", i)
        if eq < 0 or eq + 1 >= n or text[eq + 1] != '"':
            break
        name = text[i:eq].strip().lstrip(",").strip()
        j = eq + 2
        value: list[str] = []
        while j < n and text[j] != '"':
            if text[j] == "\\" and j + 1 < n:
                nxt = text[j + 1]
                value.append("\n" if nxt == "n" else nxt)
                j += 2
            else:
                value.append(text[j])
                j += 1
        labels[name] = "".join(value)
        i = j + 1
        if i < n and text[i] == ",":
            i += 1
    return labels
