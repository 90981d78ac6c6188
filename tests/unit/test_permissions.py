"""Per-vhost permissions: RabbitMQ's regex matching (model/permissions.py), the watched cache
fed by hand (metadata/permissions.py), and the gateway's checks with their reply codes and
texts (gateway/connection/authorization.py). The integration tests run them against real clients
(tests/integration/test_security_permissions.py)."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st
from kazoo.recipe.cache import NodeData, TreeEvent

from starlight_py.amqp.errors import AccessRefused, NotAllowed
from starlight_py.gateway.connection.authorization import ALLOW_ALL, AccessControl
from starlight_py.metadata.permissions import PermissionCache
from starlight_py.metadata.records import Paths, PermissionRecord, encode
from starlight_py.metadata.zookeeper import MetadataUnavailable, ZooKeeperClient
from starlight_py.model.permissions import (
    FULL_PERMISSION,
    NO_PERMISSION,
    Access,
    Permission,
    ResourceKind,
    pattern_matches,
    permission_name,
    refusal_text,
    validate_pattern,
    vhost_refusal_text,
)

PATHS = Paths("/starlight")
QUEUE, EXCHANGE = ResourceKind.QUEUE, ResourceKind.EXCHANGE

# ---- matching ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pattern", "name", "matches"),
    [
        (".*", "anything", True),
        (".*", "", True),
        ("", "anything", False),
        ("", "", False),  # the empty pattern matches nothing, not even the empty name
        ("^$", "", True),
        ("^$", "q", False),
        # Unanchored: a pattern matches anywhere in the name, as in RabbitMQ (re:run).
        ("orders", "orders", True),
        ("orders", "eu.orders.v2", True),
        ("^orders", "eu.orders", False),
        ("orders$", "orders.dlq", False),
        ("^orders$", "orders", True),
        ("^(orders|billing)$", "billing", True),
        ("^(orders|billing)$", "orders-billing", False),
        ("^amq\\.gen-", "amq.gen-AbC", True),
        ("^amq\\.gen-", "amqXgen-AbC", False),
        ("^amq.gen-", "amqXgen-AbC", True),  # an unescaped dot is any character
        ("[0-9]+", "q7", True),
        ("Orders", "orders", False),  # case-sensitive
        ("^é", "é-queue", True),
    ],
)
def test_patterns_match_as_rabbitmq_does(pattern: str, name: str, matches: bool) -> None:
    assert pattern_matches(pattern, name) is matches


@given(st.text(max_size=30))
def test_dot_star_matches_every_name_and_the_empty_pattern_none(name: str) -> None:
    assert pattern_matches(".*", name)
    assert not pattern_matches("", name)
    assert FULL_PERMISSION.allows(Access.READ, QUEUE, name)
    assert not NO_PERMISSION.allows(Access.READ, QUEUE, name)


def test_each_kind_of_access_uses_its_own_pattern() -> None:
    permission = Permission(configure="^c$", write="^w$", read="^r$")
    for access, name in ((Access.CONFIGURE, "c"), (Access.WRITE, "w"), (Access.READ, "r")):
        for other in Access:
            assert permission.allows(other, QUEUE, name) is (other is access)
            assert permission.allows(other, EXCHANGE, name) is (other is access)
        assert permission.pattern(access) == f"^{name}$"


def test_the_default_exchange_is_checked_as_amq_default() -> None:
    assert permission_name(EXCHANGE, "") == "amq.default"
    assert permission_name(QUEUE, "") == ""
    assert permission_name(EXCHANGE, "x") == "x"
    only_default = Permission("", "^amq\\.default$", "")
    assert only_default.allows(Access.WRITE, EXCHANGE, "")
    assert not only_default.allows(Access.WRITE, EXCHANGE, "other")
    assert not Permission("", "^$", "").allows(Access.WRITE, EXCHANGE, "")


@pytest.mark.parametrize("pattern", ["(", "[a-", "*", "a{2,1}", "(?P<x>a)(?P<x>b)", "\\"])
def test_invalid_patterns_are_refused_with_a_clear_message(pattern: str) -> None:
    with pytest.raises(ValueError, match="invalid pattern"):
        validate_pattern(pattern)
    with pytest.raises(ValueError, match="invalid write pattern"):
        Permission(".*", pattern, ".*")
    with pytest.raises(ValueError, match="invalid configure pattern"):
        Permission(pattern, ".*", ".*")
    with pytest.raises(ValueError, match="invalid read pattern"):
        Permission(".*", ".*", pattern)
    with pytest.raises(ValueError, match="invalid pattern"):
        pattern_matches(pattern, "q")


def test_a_pattern_must_be_a_string() -> None:
    with pytest.raises(ValueError, match="must be a string"):
        Permission(".*", None, ".*")  # type: ignore[arg-type]


def test_permissions_are_values() -> None:
    assert Permission(".*", "", "x") == Permission(".*", "", "x")
    assert Permission(".*", "", "x") != Permission(".*", "", "y")
    assert hash(Permission("a", "b", "c")) == hash(Permission("a", "b", "c"))
    assert Permission.from_json(Permission("a", "b", "c").to_json()) == Permission("a", "b", "c")
    assert repr(Permission("a", "b", "c")) == "Permission(configure='a', write='b', read='c')"


def test_rabbitmqs_refusal_texts() -> None:
    assert (
        refusal_text(QUEUE, "q", "/", "u")
        == "access to queue 'q' in vhost '/' refused for user 'u'"
    )
    assert (
        refusal_text(EXCHANGE, "", "/", "u")
        == "access to exchange 'amq.default' in vhost '/' refused for user 'u'"
    )
    assert vhost_refusal_text("/", "x") == "access to vhost '/' refused for user 'x'"


# ---- the watched cache -------------------------------------------------------------------------


@pytest.fixture
def cache() -> Iterator[PermissionCache]:
    # Never started: building a watched tree does not connect (as in test_topology_cache.py).
    zookeeper = ZooKeeperClient("127.0.0.1:1")
    yield PermissionCache(zookeeper, PATHS)
    zookeeper.kazoo.close()


def feed(cache: PermissionCache, kind: int, path: str, data: bytes | None = b"") -> None:
    cache._on_event(TreeEvent.make(kind, NodeData.make(path, data, None)))


def put(cache: PermissionCache, vhost: str, user: str, permission: Permission) -> None:
    data = encode(PermissionRecord(vhost, user, permission))
    feed(cache, TreeEvent.NODE_ADDED, PATHS.permission(vhost, user), data)


def test_the_cache_follows_added_updated_and_removed_permissions(cache: PermissionCache) -> None:
    assert cache.cached("/", "alice") is None
    put(cache, "/", "alice", FULL_PERMISSION)
    put(cache, "t/n", "CN=app/1", NO_PERMISSION)
    assert cache.cached("/", "alice") == FULL_PERMISSION
    assert cache.cached("t/n", "CN=app/1") == NO_PERMISSION
    assert cache.cached("t/n", "alice") is None
    updated = Permission("^q$", "", "")
    data = encode(PermissionRecord("/", "alice", updated))
    feed(cache, TreeEvent.NODE_UPDATED, PATHS.permission("/", "alice"), data)
    assert cache.cached("/", "alice") == updated
    feed(cache, TreeEvent.NODE_REMOVED, PATHS.permission("/", "alice"), None)
    assert cache.cached("/", "alice") is None
    assert cache.cached("t/n", "CN=app/1") == NO_PERMISSION


def test_the_cache_keys_by_names_that_need_escaping(cache: PermissionCache) -> None:
    for vhost, user in (("", "u"), (".", ".."), ("a b/c", "x~y"), ("/", "")):
        put(cache, vhost, user, FULL_PERMISSION)
        assert cache.cached(vhost, user) == FULL_PERMISSION
        feed(cache, TreeEvent.NODE_REMOVED, PATHS.permission(vhost, user), None)
        assert cache.cached(vhost, user) is None


def test_the_cache_ignores_vhost_znodes_and_refuses_unreadable_records(
    cache: PermissionCache, caplog: pytest.LogCaptureFixture
) -> None:
    feed(cache, TreeEvent.NODE_ADDED, PATHS.permissions)
    feed(cache, TreeEvent.NODE_ADDED, PATHS.vhost_permissions("/"))
    put(cache, "/", "alice", FULL_PERMISSION)
    with caplog.at_level(logging.WARNING):
        feed(cache, TreeEvent.NODE_UPDATED, PATHS.permission("/", "alice"), b"{not json")
    # An unreadable record grants nothing, rather than what the znode held before.
    assert cache.cached("/", "alice") is None
    assert "unreadable permission znode" in caplog.text


def test_the_cache_is_ready_once_initialized(cache: PermissionCache) -> None:
    assert not cache.ready.is_set()
    cache._on_event(TreeEvent.make(TreeEvent.INITIALIZED, None))
    assert cache.ready.is_set()


# ---- the gateway's checks ----------------------------------------------------------------------


class ZooKeeperSays:
    """Stands in for `PermissionCache.read`: what ZooKeeper holds now (by default, what the
    cache holds), or MetadataUnavailable when `down`."""

    def __init__(self, cache: PermissionCache) -> None:
        self.cache = cache
        self.reads = 0
        self.down = False
        self.permissions: dict[tuple[str, str], Permission] | None = None

    def __call__(self, vhost: str, principal: str) -> Permission | None:
        self.reads += 1
        if self.down:
            raise MetadataUnavailable("ZooKeeper is away")
        if self.permissions is not None:
            return self.permissions.get((vhost, principal))
        return self.cache.cached(vhost, principal)


@pytest.fixture
def zookeeper_says(cache: PermissionCache, monkeypatch: pytest.MonkeyPatch) -> ZooKeeperSays:
    says = ZooKeeperSays(cache)
    monkeypatch.setattr(cache, "read", says)
    return says


def ready_cache(cache: PermissionCache, **permissions: Permission) -> PermissionCache:
    cache._on_event(TreeEvent.make(TreeEvent.INITIALIZED, None))
    for user, permission in permissions.items():
        put(cache, "/", user, permission)
    return cache


def test_everything_is_allowed_when_authorization_is_off() -> None:
    async def main() -> None:
        assert not ALLOW_ALL.enforced
        await ALLOW_ALL.check_vhost()
        for access in Access:
            await ALLOW_ALL.check_queue(access, "q", (50, 10))
            await ALLOW_ALL.check_exchange(access, "", (60, 40))

    trio.run(main)


def test_a_user_without_a_record_is_refused_the_vhost(
    cache: PermissionCache, zookeeper_says: ZooKeeperSays
) -> None:
    ready_cache(cache, alice=NO_PERMISSION)

    async def main() -> None:
        await AccessControl(cache, "/", "alice").check_vhost()
        with pytest.raises(NotAllowed) as refused:
            await AccessControl(cache, "/", "bob").check_vhost()
        assert refused.value.reply_code == 530
        assert refused.value.closes_connection
        assert refused.value.method == (10, 40)
        assert (
            refused.value.reply_text == "NOT_ALLOWED - access to vhost '/' refused for user 'bob'"
        )
        with pytest.raises(NotAllowed):
            await AccessControl(cache, "other", "alice").check_vhost()

    trio.run(main)


def test_operations_are_refused_with_rabbitmqs_403(
    cache: PermissionCache, zookeeper_says: ZooKeeperSays
) -> None:
    ready_cache(cache, u=Permission("^mine-", "^mine-|^amq\\.default$", "^mine-"))
    access = AccessControl(cache, "/", "u")

    async def main() -> None:
        await access.check_queue(Access.CONFIGURE, "mine-q", (50, 10))
        await access.check_exchange(Access.WRITE, "", (60, 40))
        with pytest.raises(AccessRefused) as refused:
            await access.check_queue(Access.READ, "theirs", (60, 20))
        assert refused.value.reply_code == 403
        assert not refused.value.closes_connection
        assert refused.value.method == (60, 20)
        assert refused.value.reply_text == (
            "ACCESS_REFUSED - access to queue 'theirs' in vhost '/' refused for user 'u'"
        )
        with pytest.raises(AccessRefused, match="exchange 'x' in vhost '/'"):
            await access.check_exchange(Access.WRITE, "x", (60, 40))

    trio.run(main)


def test_a_removed_permission_refuses_the_next_operation(
    cache: PermissionCache, zookeeper_says: ZooKeeperSays
) -> None:
    ready_cache(cache, u=FULL_PERMISSION)
    access = AccessControl(cache, "/", "u")

    async def main() -> None:
        await access.check_queue(Access.READ, "q", (60, 70))
        feed(cache, TreeEvent.NODE_REMOVED, PATHS.permission("/", "u"), None)
        with pytest.raises(AccessRefused):
            await access.check_queue(Access.READ, "q", (60, 70))

    trio.run(main)


def test_allowed_operations_never_ask_zookeeper(
    cache: PermissionCache, zookeeper_says: ZooKeeperSays
) -> None:
    ready_cache(cache, u=FULL_PERMISSION)
    access = AccessControl(cache, "/", "u")

    async def main() -> None:
        await access.check_vhost()
        for _ in range(100):
            await access.check_exchange(Access.WRITE, "x", (60, 40))
        assert zookeeper_says.reads == 0

    trio.run(main)


def test_a_refusal_is_confirmed_with_zookeeper_so_a_fresh_grant_works_at_once(
    cache: PermissionCache, zookeeper_says: ZooKeeperSays
) -> None:
    ready_cache(cache)  # the watch for the grant has not fired yet
    zookeeper_says.permissions = {("/", "u"): FULL_PERMISSION}
    access = AccessControl(cache, "/", "u")

    async def main() -> None:
        await access.check_vhost()
        await access.check_queue(Access.READ, "q", (60, 70))
        assert zookeeper_says.reads == 2

    trio.run(main)


def test_without_zookeeper_the_cache_decides(
    cache: PermissionCache, zookeeper_says: ZooKeeperSays
) -> None:
    ready_cache(cache, u=Permission("", "", "^q$"))
    zookeeper_says.down = True
    access = AccessControl(cache, "/", "u")

    async def main() -> None:
        await access.check_vhost()
        await access.check_queue(Access.READ, "q", (60, 70))
        with pytest.raises(AccessRefused):
            await access.check_queue(Access.READ, "other", (60, 70))
        with pytest.raises(NotAllowed):
            await AccessControl(cache, "/", "bob").check_vhost()

    trio.run(main)


def test_before_the_cache_has_loaded_zookeeper_decides(
    cache: PermissionCache, zookeeper_says: ZooKeeperSays
) -> None:
    zookeeper_says.permissions = {("/", "u"): Permission("", "", "^q$")}
    access = AccessControl(cache, "/", "u")

    async def main() -> None:
        await access.check_queue(Access.READ, "q", (60, 70))
        with pytest.raises(AccessRefused):
            await access.check_queue(Access.READ, "other", (60, 70))
        zookeeper_says.down = True
        # Nothing to decide with: the client gets 541 (metadata unavailable), not a 403.
        with pytest.raises(MetadataUnavailable):
            await access.check_queue(Access.READ, "q", (60, 70))

    trio.run(main)
