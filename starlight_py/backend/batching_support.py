"""Whether the brokers can take the proxy's Pulsar producer batching (pulsarProducerBatching):
RabbitMQ semantics stay exact with batch entries only when the brokers

- acknowledge a batch's messages one by one (`acknowledgmentAtBatchIndexLevelEnabled`):
  without it, acknowledging one message of a batch is not recorded until every message of
  it is, so a message acknowledged alone comes back after a reconnect;
- count backlogs in messages (the starlight-backlog plugin): Pulsar's own stats count
  entries, and queue counts and length limits (x-max-length) would count a batch as one.

docs/operations.md#what-pulsar-needs says how to give the brokers both.

One more setting keeps those acknowledgements across a topic reload (an unload, a bundle
move, a broker restart) in more cases: `batching_caveat` says when the brokers lack it.
"""

from __future__ import annotations

from starlight_py.backend.pulsar_admin import BackendUnavailable, PulsarAdmin, PulsarAdminError

BATCH_INDEX_ACKS = "acknowledgmentAtBatchIndexLevelEnabled"
# Where a subscription's cursor goes when its topic closes cleanly. Pulsar 4.0.8 restores
# batch-index acknowledgements from its cursor ledger but not from the metadata store
# (apache/pulsar#14982, fixed by apache/pulsar#26474 in later releases); -1 sends every clean
# close to the ledger, whenever the cursor has one (its position moved since the topic was
# loaded). Measured in docs/performance.md.
CURSOR_CLOSE_TO_METADATA_STORE = "managedLedgerMaxUnackedRangesToPersistInMetadataStore"
CURSOR_CLOSE_TO_LEDGER = "-1"


def batching_refusal(admin: PulsarAdmin) -> str | None:
    """Why batching must stay off with the brokers `admin` talks to, or None when they have
    what it needs; in that case `admin` counts backlogs through the plugin from now on.
    Blocking (two admin requests)."""
    try:
        value = admin.broker_setting(BATCH_INDEX_ACKS)
    except (PulsarAdminError, BackendUnavailable) as e:
        return (
            f"the broker's {BATCH_INDEX_ACKS} cannot be read ({e}; the proxy's Pulsar role "
            "needs to read the broker configuration)"
        )
    if value != "true":
        return f"the broker has {BATCH_INDEX_ACKS}={value} (set it to true on every broker)"
    try:
        found = admin.has_message_backlogs()
    except BackendUnavailable as e:
        return f"the broker cannot be asked for the starlight-backlog plugin ({e})"
    if not found:
        return (
            "the brokers lack the starlight-backlog plugin, without which queue counts and "
            "length limits would count a batch as one message (`starlight-proxy "
            "broker-plugin` builds it)"
        )
    admin.message_backlogs = True
    return None


def batching_caveat(admin: PulsarAdmin) -> str | None:
    """What batching cannot keep exact with these brokers although they take it (a warning,
    not a refusal), or None. Blocking (one admin request)."""
    value = admin.broker_setting_shown(CURSOR_CLOSE_TO_METADATA_STORE)
    if value == CURSOR_CLOSE_TO_LEDGER:
        return None
    return (
        f"the broker has {CURSOR_CLOSE_TO_METADATA_STORE}={value}: when a topic reloads "
        "(unload, bundle move, broker restart), messages acknowledged one by one in a batch "
        "entry still partly unacknowledged are delivered again (set it to "
        f"{CURSOR_CLOSE_TO_LEDGER} on every broker)"
    )
