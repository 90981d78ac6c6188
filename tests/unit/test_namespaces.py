"""Vhost -> Pulsar namespace rules (Starlight-compatible)."""

from __future__ import annotations

import pytest

from starlight_py.model.namespaces import InvalidVhostName, NamespaceName, NamespaceRules

DEFAULT = NamespaceRules()
CUSTOM = NamespaceRules(default_tenant="acme", default_namespace="main")
SHORT_TO_TENANT = NamespaceRules(
    default_tenant="acme", default_namespace="main", map_short_to_tenant=True
)


@pytest.mark.parametrize(
    ("vhost", "expected"),
    [
        ("/", NamespaceName("public", "default")),
        ("", NamespaceName("public", "default")),
        ("orders", NamespaceName("public", "orders")),
        ("/orders", NamespaceName("public", "orders")),
        ("tenant/ns", NamespaceName("tenant", "ns")),
        ("/tenant/ns", NamespaceName("tenant", "ns")),
        ("a-b_c.d=e:f", NamespaceName("public", "a-b_c.d=e:f")),
        ("T1/N-2", NamespaceName("T1", "N-2")),
    ],
)
def test_default_rules(vhost: str, expected: NamespaceName) -> None:
    assert DEFAULT.namespace_for(vhost) == expected


@pytest.mark.parametrize(
    ("vhost", "expected"),
    [
        ("/", "acme/main"),
        ("", "acme/main"),
        ("orders", "acme/orders"),
        ("/orders", "acme/orders"),
        ("other/ns", "other/ns"),
    ],
)
def test_configured_defaults(vhost: str, expected: str) -> None:
    assert str(CUSTOM.namespace_for(vhost)) == expected


@pytest.mark.parametrize(
    ("vhost", "expected"),
    [
        ("/", "acme/main"),
        ("", "acme/main"),
        ("orders", "orders/main"),
        ("/orders", "orders/main"),
        ("other/ns", "other/ns"),
        ("/other/ns", "other/ns"),
    ],
)
def test_map_short_to_tenant(vhost: str, expected: str) -> None:
    assert str(SHORT_TO_TENANT.namespace_for(vhost)) == expected


@pytest.mark.parametrize(
    "vhost",
    [
        "my vhost",
        "orders!",
        "a*b",
        "caf\u00e9",  # \w would match it without re.ASCII; Pulsar does not
        "t/n s",
        "t n/ns",
        "tenant/",
        "/tenant/",
        "/tenant//",
        "//",
        "/ ",
        "tab\there",
        "new\nline",
        "\u0661\u0662",  # Arabic-Indic digits
    ],
)
def test_invalid_characters_are_refused(vhost: str) -> None:
    for rules in (DEFAULT, SHORT_TO_TENANT):
        with pytest.raises(InvalidVhostName) as info:
            rules.namespace_for(vhost)
        assert repr(vhost) in str(info.value)


@pytest.mark.parametrize("vhost", ["a/b/c", "/a/b/c", "a//b", "t/n/", "/a/b/c/d"])
def test_more_than_one_slash_is_refused(vhost: str) -> None:
    with pytest.raises(InvalidVhostName) as info:
        DEFAULT.namespace_for(vhost)
    assert "more than one '/'" in str(info.value)


def test_invalid_vhost_name_is_a_value_error() -> None:
    assert issubclass(InvalidVhostName, ValueError)


def test_namespace_name_str_and_parse_round_trip() -> None:
    name = NamespaceName("tenant", "ns")
    assert str(name) == "tenant/ns"
    assert NamespaceName.parse(str(name)) == name


@pytest.mark.parametrize(
    "text", ["tenant", "", "/ns", "tenant/", "a/b/c", "a b/c", "a/b c", "/", "t\u00e9/n"]
)
def test_namespace_name_parse_refuses(text: str) -> None:
    with pytest.raises(InvalidVhostName):
        NamespaceName.parse(text)


def test_namespace_name_is_frozen_and_hashable() -> None:
    name = NamespaceName("t", "n")
    assert {name: 1}[NamespaceName("t", "n")] == 1
    with pytest.raises(AttributeError):
        name.tenant = "x"  # type: ignore[misc]
