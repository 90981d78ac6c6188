"""Password users (pure): RabbitMQ's password hashes (checked against hashes a real RabbitMQ
3.10.8 wrote), tags, the loopback rule, and the password provider's decisions."""

from __future__ import annotations

import base64
import hashlib
import time
from pathlib import Path

import jwt
import pytest
from pamqp.encode import field_table

from starlight_py.auth.authenticator import (
    AuthenticationFailed,
    ConfiguredAuthenticator,
    build_authenticator,
)
from starlight_py.auth.tokens import TokenSettings, TokenVerifier
from starlight_py.cli import STANDALONE_AUTHENTICATION, _configured
from starlight_py.config import ConfigError, load_config
from starlight_py.management.auth import log_in
from starlight_py.management.errors import LoginFailed, NotAuthorised
from starlight_py.metadata.records import decode, encode
from starlight_py.metadata.zookeeper import MetadataUnavailable
from starlight_py.model.users import (
    MD5,
    SHA256,
    SHA512,
    InvalidUser,
    User,
    hash_password,
    is_loopback,
    may_connect_from,
    parse_tags,
)

# From `rabbitmqctl add_user` + `export_definitions` on RabbitMQ 3.10.8.
RABBITMQ_USERS = [
    ("guest", "guest", "4mAtv/8mjCp33L2JzZc4avW5JLp+Z+EUYdBWBWK+0y55mMrn"),
    ("alice", "s3cret-Ü", "0wCherbKaJij/ZehsZlTqc0XS8Zlaq0uLIZCwSXqVgHxvusB"),
    ("bob", "bobpw", "ZCzsmXiiHhYLhwVPjD+D056U6eMF3+a/z3fwHs8/5Tty7Ux+"),
    # tests/fixtures/rabbitmq_definitions.json (make_rabbitmq_definitions.py).
    ("adm-app", "secret", "0AiSQSVW5e1iekP7oyrBXU/NBwi+d25ReujOwN1oxUglOsdv"),
    ("guest", "guest", "1vV6Jduv1wrJ7pdnRlyj7OHayUOrmEX8Lf5xrqJx1P6iNN7J"),
]


# ---- hashes ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "password", "password_hash"), RABBITMQ_USERS)
def test_hashes_written_by_rabbitmq_check_their_password(
    name: str, password: str, password_hash: str
) -> None:
    user = User(name, password_hash, SHA256)
    assert user.check_password(password)
    assert not user.check_password(password + "x")
    assert not user.check_password(password.upper())


def test_a_hash_is_salt_then_sha256_of_salt_and_password() -> None:
    salt = b"\x01\x02\x03\x04"
    raw = base64.b64decode(hash_password("pw", salt))
    assert raw == salt + hashlib.sha256(salt + b"pw").digest()


def test_new_hashes_are_salted_differently_and_check() -> None:
    first, second = User.with_password("u", "pw"), User.with_password("u", "pw")
    assert first.password_hash != second.password_hash
    assert first.check_password("pw") and second.check_password("pw")
    assert first.hashing_algorithm == SHA256


@pytest.mark.parametrize("algorithm", [MD5, SHA512])
def test_older_and_longer_algorithms_check_too(algorithm: str) -> None:
    user = User("u", hash_password("pw", algorithm=algorithm), algorithm)
    assert user.check_password("pw") and not user.check_password("px")


def test_a_hash_of_another_algorithm_does_not_check() -> None:
    with pytest.raises(InvalidUser, match="not a salted md5"):
        User("guest", RABBITMQ_USERS[0][2], MD5)


def test_no_hash_and_empty_passwords_never_log_in() -> None:
    assert not User("u").check_password("")
    assert not User("u").check_password("anything")
    # RabbitMQ refuses an empty password even when it is the hashed one.
    assert not User("u", hash_password("")).check_password("")


@pytest.mark.parametrize(
    ("password_hash", "algorithm", "message"),
    [
        ("!!notb64", SHA256, "not base64"),
        (base64.b64encode(b"short").decode(), SHA256, "not a salted sha256"),
        ("", "rabbit_password_hashing_bcrypt", "unknown hashing_algorithm"),
    ],
)
def test_unusable_hashes_are_refused(password_hash: str, algorithm: str, message: str) -> None:
    with pytest.raises(InvalidUser, match=message):
        User("u", password_hash, algorithm)


def test_tags_as_rabbitmq_takes_them() -> None:
    assert parse_tags("administrator, management,,") == ("administrator", "management")
    assert parse_tags(["a", "b", "a"]) == ("a", "b")
    assert parse_tags("") == () and parse_tags(None) == ()
    with pytest.raises(InvalidUser):
        parse_tags(3)


def test_json_is_rabbitmqs_shape_and_round_trips() -> None:
    user = User("alice", RABBITMQ_USERS[1][2], SHA256, ("monitoring", "policymaker"))
    assert user.to_json() == {
        "name": "alice",
        "password_hash": RABBITMQ_USERS[1][2],
        "hashing_algorithm": SHA256,
        "tags": ["monitoring", "policymaker"],
        "limits": {},
    }
    assert User.from_json(user.to_json()) == user
    assert decode(encode(user)) == user
    assert User.from_json({"name": "x", "tags": "a,b"}) == User("x", "", SHA256, ("a", "b"))


# ---- loopback users ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.1.2.3", True),
        ("::1", True),
        ("::ffff:127.0.0.1", True),
        ("localhost", True),
        ("192.0.2.2", False),
        ("::ffff:192.0.2.2", False),
        ("fd00::2", False),
    ],
)
def test_loopback_addresses(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_loopback_users_log_in_only_from_loopback() -> None:
    assert may_connect_from("guest", "127.0.0.1", ("guest",))
    assert not may_connect_from("guest", "192.0.2.2", ("guest",))
    assert may_connect_from("alice", "192.0.2.2", ("guest",))
    assert may_connect_from("guest", "192.0.2.2", ())
    assert may_connect_from("guest", None, ("guest",))


# ---- the password provider ---------------------------------------------------------------

SECRET = b"s" * 32


class Directory:
    """Users as a UserCache answers: `cached` may lag behind `current` (ZooKeeper's)."""

    def __init__(self, *users: User) -> None:
        self.cached = {user.name: user for user in users}
        self.current = dict(self.cached)
        self.fresh_reads = 0
        self.down = False
        self.cached_when_down = True

    def lookup(self, name: str, fresh: bool = False) -> User | None:
        if not fresh:
            return self.cached.get(name)
        self.fresh_reads += 1
        if self.down:
            if self.cached_when_down:
                return self.cached.get(name)
            raise MetadataUnavailable("ZooKeeper is away")
        return self.current.get(name)


def plain(user: str, password: str) -> bytes:
    return f"\x00{user}\x00{password}".encode()


def passwords(directory: Directory, tokens: bool = False) -> ConfiguredAuthenticator:
    verifier = TokenVerifier(TokenSettings(secret_key=SECRET)) if tokens else None
    return ConfiguredAuthenticator(verifier, None, directory, ("guest",))


def test_right_password_logs_in_with_the_users_tags() -> None:
    directory = Directory(User.with_password("alice", "pw", ("administrator",)))
    principal = passwords(directory).authenticate("PLAIN", plain("alice", "pw"), None, "10.0.0.1")
    assert (principal.name, principal.tags, principal.by_password) == (
        "alice",
        ("administrator",),
        True,
    )


def test_amqplain_logs_in_too() -> None:
    directory = Directory(User.with_password("alice", "pw"))
    response = field_table({"LOGIN": "alice", "PASSWORD": "pw"})[4:]
    assert passwords(directory).authenticate("AMQPLAIN", response).name == "alice"


@pytest.mark.parametrize(("user", "password"), [("alice", "wrong"), ("nobody", "pw")])
def test_wrong_credentials_are_refused(user: str, password: str) -> None:
    directory = Directory(User.with_password("alice", "pw"))
    with pytest.raises(AuthenticationFailed):
        passwords(directory).authenticate("PLAIN", plain(user, password))


def test_logins_read_zookeeper_not_a_cache_that_may_lag() -> None:
    directory = Directory(User.with_password("alice", "old"), User.with_password("carol", "pw"))
    directory.current = {
        "alice": User.with_password("alice", "new"),
        "bob": User.with_password("bob", "pw"),
    }
    authenticator = passwords(directory)
    assert authenticator.authenticate("PLAIN", plain("alice", "new")).name == "alice"
    assert authenticator.authenticate("PLAIN", plain("bob", "pw")).name == "bob"
    for user, password in (("alice", "old"), ("carol", "pw")):  # changed, deleted
        with pytest.raises(AuthenticationFailed):
            authenticator.authenticate("PLAIN", plain(user, password))


def test_without_zookeeper_or_its_copy_logins_are_refused() -> None:
    directory = Directory(User.with_password("alice", "pw"))
    directory.down = True
    authenticator = passwords(directory)
    assert authenticator.authenticate("PLAIN", plain("alice", "pw")).name == "alice"
    directory.cached_when_down = False
    with pytest.raises(AuthenticationFailed, match="cannot read user"):
        authenticator.authenticate("PLAIN", plain("alice", "pw"))


def test_guest_logs_in_only_from_loopback() -> None:
    authenticator = passwords(Directory(User.with_password("guest", "guest")))
    assert authenticator.authenticate("PLAIN", plain("guest", "guest"), None, "127.0.0.1")
    with pytest.raises(AuthenticationFailed, match="can only connect via localhost"):
        authenticator.authenticate("PLAIN", plain("guest", "guest"), None, "192.0.2.2")


def test_with_tokens_too_stored_users_use_passwords_and_others_tokens() -> None:
    directory = Directory(User.with_password("alice", "pw"))
    authenticator = passwords(directory, tokens=True)
    jwt_token = jwt.encode({"sub": "svc", "exp": int(time.time() + 60)}, SECRET, "HS256")
    assert authenticator.authenticate("PLAIN", plain("alice", "pw")).name == "alice"
    assert authenticator.authenticate("PLAIN", plain("anyone", jwt_token)).name == "svc"
    with pytest.raises(AuthenticationFailed):
        # A stored user's wrong password is not tried as a token.
        authenticator.authenticate("PLAIN", plain("alice", jwt_token))
    assert authenticator.mechanisms(tls=False) == ("PLAIN", "AMQPLAIN")


def test_update_secret_of_a_password_login_rechecks_the_password() -> None:
    directory = Directory(User.with_password("alice", "pw"))
    authenticator = passwords(directory)
    principal = authenticator.authenticate("PLAIN", plain("alice", "pw"))
    assert authenticator.update_secret(principal, b"pw") == principal
    with pytest.raises(AuthenticationFailed):
        authenticator.update_secret(principal, b"other")


def test_the_password_provider_is_configured_and_needs_a_store() -> None:
    config = load_config(
        None,
        {},
        {"authenticationEnabled": "true", "authenticationProviders": "password"},
    )
    assert config.loopback_users == ("guest",)
    built = build_authenticator(config, Directory())
    assert isinstance(built, ConfiguredAuthenticator) and built.users is not None
    with pytest.raises(ConfigError, match="user store"):
        build_authenticator(config)
    with pytest.raises(ConfigError, match="unknown provider"):
        load_config(None, {}, {"authenticationProviders": "passwd"})


# ---- standalone and the management API ---------------------------------------------------------


def test_standalone_turns_passwords_on_unless_told_otherwise(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("STARLIGHT_AUTHENTICATION_ENABLED", raising=False)
    assert STANDALONE_AUTHENTICATION == {
        "authenticationEnabled": "true",
        "authenticationProviders": "password",
    }
    assert not _configured("authenticationEnabled", None, {})
    assert _configured("authenticationEnabled", None, {"authenticationEnabled": "false"})
    conf = tmp_path / "proxy.conf"
    conf.write_text("authenticationEnabled=false\n")
    assert _configured("authenticationEnabled", conf, {})
    assert not _configured("authenticationProviders", conf, {})
    monkeypatch.setenv("STARLIGHT_AUTHENTICATION_ENABLED", "false")
    assert _configured("authenticationEnabled", None, {})


def basic(credentials: str) -> str:
    return "Basic " + base64.b64encode(credentials.encode()).decode()


def test_management_logins_of_password_users_follow_their_tags() -> None:
    directory = Directory(
        User.with_password("admin", "pw", ("administrator",)),
        User.with_password("watcher", "pw", ("monitoring",)),
        User.with_password("app", "pw"),
    )
    authenticator = passwords(directory)
    admin = log_in(basic("admin:pw"), authenticator, None, (), "127.0.0.1")
    assert admin.tags == ["administrator"]
    watcher = log_in(basic("watcher:pw"), authenticator, None, (), "127.0.0.1")
    assert watcher.tags == ["monitoring"]
    with pytest.raises(NotAuthorised, match="Not management user"):
        log_in(basic("app:pw"), authenticator, None, (), "127.0.0.1")
    with pytest.raises(LoginFailed):
        log_in(basic("admin:wrong"), authenticator, None, (), "127.0.0.1")
