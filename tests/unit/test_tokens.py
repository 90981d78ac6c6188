"""JWT verification (pure): signatures, algorithms, time claims, audience, principal, and
key material in Pulsar's data:/file: forms. No message may quote the token."""

from __future__ import annotations

import base64
import hashlib
import hmac
from pathlib import Path
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from starlight_py.auth.tokens import (
    InvalidToken,
    KeyMaterialError,
    TokenSettings,
    TokenVerifier,
    VerifiedToken,
    load_public_key,
    read_key_material,
)

SECRET = b"0123456789abcdef" * 4  # 64 bytes: long enough for HS512
NOW = 1_700_000_000.0


@pytest.fixture(scope="module")
def rsa_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


@pytest.fixture(scope="module")
def other_rsa_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def hs256(claims: dict[str, Any], key: bytes = SECRET, alg: str = "HS256") -> str:
    return jwt.encode(claims, key, algorithm=alg)


def verifier(**settings: Any) -> TokenVerifier:
    settings.setdefault("secret_key", SECRET)
    return TokenVerifier(TokenSettings(**settings))


def refused(v: TokenVerifier, token: str | bytes, now: float = NOW) -> str:
    with pytest.raises(InvalidToken) as info:
        v.verify(token, now=now)
    message = str(info.value)
    text = token if isinstance(token, str) else token.decode("latin-1")
    if text:
        assert text not in message
        for part in text.split("."):
            if len(part) > 8:
                assert part not in message
    return message


# ---- accepted --------------------------------------------------------------------------------


def test_hs256_token_names_its_subject_and_expiry() -> None:
    token = hs256({"sub": "alice", "exp": int(NOW) + 60})
    assert verifier().verify(token, now=NOW) == VerifiedToken("alice", NOW + 60)


@pytest.mark.parametrize("alg", ["HS256", "HS384", "HS512"])
def test_every_hmac_algorithm_works_with_the_secret_key(alg: str) -> None:
    token = hs256({"sub": "alice"}, alg=alg)
    assert verifier().verify(token, now=NOW) == VerifiedToken("alice", None)


def test_token_as_bytes_and_with_surrounding_whitespace() -> None:
    token = hs256({"sub": "alice"})
    assert verifier().verify(f" {token}\n".encode(), now=NOW).principal == "alice"


def test_rs256_token_with_the_public_key(rsa_key: rsa.RSAPrivateKey) -> None:
    token = jwt.encode({"sub": "svc-orders", "exp": NOW + 5}, rsa_key, algorithm="RS256")
    v = verifier(secret_key=None, public_key=rsa_key.public_key())
    assert v.verify(token, now=NOW) == VerifiedToken("svc-orders", NOW + 5)


def test_es256_token_with_an_ec_public_key() -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    token = jwt.encode({"sub": "edge"}, key, algorithm="ES256")
    v = verifier(secret_key=None, public_key=key.public_key(), public_algorithm="ES256")
    assert v.verify(token, now=NOW).principal == "edge"


def test_principal_from_another_claim() -> None:
    token = hs256({"sub": "123", "email": "bob@example.com"})
    assert verifier(principal_claim="email").verify(token, now=NOW).principal == "bob@example.com"


# ---- time ------------------------------------------------------------------------------------


def test_expired_token_is_refused_from_its_exp_second_on() -> None:
    token = hs256({"sub": "alice", "exp": int(NOW)})
    assert "expired" in refused(verifier(), token, now=NOW)
    assert "alice" in refused(verifier(), token, now=NOW + 3600)
    assert verifier().verify(token, now=NOW - 1).principal == "alice"


def test_not_yet_valid_token_is_refused() -> None:
    token = hs256({"sub": "alice", "nbf": int(NOW) + 10})
    assert "not valid before" in refused(verifier(), token, now=NOW)
    assert verifier().verify(token, now=NOW + 10).principal == "alice"


def test_clock_skew_allows_a_little_leeway_both_ways() -> None:
    expired = hs256({"sub": "alice", "exp": int(NOW) - 5})
    early = hs256({"sub": "alice", "nbf": int(NOW) + 5})
    lenient = verifier(clock_skew=10.0)
    assert lenient.verify(expired, now=NOW).principal == "alice"
    assert lenient.verify(early, now=NOW).principal == "alice"
    refused(verifier(clock_skew=1.0), expired)
    refused(verifier(clock_skew=1.0), early)


@pytest.mark.parametrize("value", ["tomorrow", True, [1], {"a": 1}])
def test_non_numeric_time_claims_are_refused(value: object) -> None:
    assert "non-numeric 'exp'" in refused(verifier(), hs256({"sub": "a", "exp": value}))
    assert "non-numeric 'nbf'" in refused(verifier(), hs256({"sub": "a", "nbf": value}))


# ---- audience --------------------------------------------------------------------------------


@pytest.mark.parametrize("aud", ["starlight", ["other", "starlight"]])
def test_audience_matches_a_string_or_a_list_member(aud: object) -> None:
    token = hs256({"sub": "alice", "aud": aud})
    assert verifier(audience="starlight").verify(token, now=NOW).principal == "alice"


@pytest.mark.parametrize("claims", [{"aud": "billing"}, {"aud": ["a", "b"]}, {}])
def test_wrong_or_missing_audience_is_refused(claims: dict[str, Any]) -> None:
    token = hs256({"sub": "alice", **claims})
    assert "audience 'starlight'" in refused(verifier(audience="starlight"), token)


def test_audience_from_another_claim() -> None:
    token = hs256({"sub": "alice", "aud": "billing", "resource": "starlight"})
    v = verifier(audience="starlight", audience_claim="resource")
    assert v.verify(token, now=NOW).principal == "alice"


def test_audience_is_not_checked_when_none_is_configured() -> None:
    # pyjwt alone would refuse a token with `aud` when no audience is given.
    token = hs256({"sub": "alice", "aud": "anything"})
    assert verifier().verify(token, now=NOW).principal == "alice"


# ---- signatures and algorithms ---------------------------------------------------------------


def test_wrong_hmac_secret_is_refused() -> None:
    token = hs256({"sub": "alice"}, key=b"another secret".ljust(64, b"."))
    assert "signature" in refused(verifier(), token)


def test_rs256_signed_by_another_key_is_refused(
    rsa_key: rsa.RSAPrivateKey, other_rsa_key: rsa.RSAPrivateKey
) -> None:
    token = jwt.encode({"sub": "alice"}, other_rsa_key, algorithm="RS256")
    v = verifier(secret_key=None, public_key=rsa_key.public_key())
    assert "signature" in refused(v, token)


def test_tampered_payload_is_refused() -> None:
    header, _, signature = hs256({"sub": "alice"}).split(".")
    forged = base64.urlsafe_b64encode(b'{"sub":"admin"}').rstrip(b"=").decode()
    assert "signature" in refused(verifier(), f"{header}.{forged}.{signature}")


def test_alg_none_is_refused() -> None:
    token = jwt.encode({"sub": "admin"}, None, algorithm="none")
    assert "'none' is not accepted" in refused(verifier(), token)


def test_hmac_token_keyed_with_the_public_key_is_refused(rsa_key: rsa.RSAPrivateKey) -> None:
    # The classic algorithm confusion: HS256 "signed" with the server's public key.
    public_pem = rsa_key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    header = base64.urlsafe_b64encode(b'{"alg":"HS256","typ":"JWT"}').rstrip(b"=")
    payload = base64.urlsafe_b64encode(b'{"sub":"admin"}').rstrip(b"=")
    signing_input = header + b"." + payload
    mac = hmac.new(public_pem, signing_input, hashlib.sha256).digest()
    token = (signing_input + b"." + base64.urlsafe_b64encode(mac).rstrip(b"=")).decode()
    v = verifier(secret_key=None, public_key=rsa_key.public_key())
    assert "'HS256' is not accepted" in refused(v, token)


def test_other_public_algorithm_than_configured_is_refused(rsa_key: rsa.RSAPrivateKey) -> None:
    token = jwt.encode({"sub": "alice"}, rsa_key, algorithm="RS384")
    v = verifier(secret_key=None, public_key=rsa_key.public_key())
    assert "'RS384' is not accepted" in refused(v, token)


def test_both_keys_configured_accept_both_kinds(rsa_key: rsa.RSAPrivateKey) -> None:
    v = verifier(public_key=rsa_key.public_key())
    assert v.verify(hs256({"sub": "a"}), now=NOW).principal == "a"
    assert v.verify(jwt.encode({"sub": "b"}, rsa_key, algorithm="RS256"), now=NOW).principal == "b"


# ---- garbage and missing principal -----------------------------------------------------------


@pytest.mark.parametrize(
    "token",
    ["", "guest", "a.b.c", "....", "eyJhbGciOiJIUzI1NiJ9.not-base64!.x", "\u00e9t\u00e9"],
)
def test_garbage_is_refused_as_malformed(token: str) -> None:
    message = refused(verifier(), token)
    assert "malformed" in message or "not ASCII" in message or "algorithm" in message


def test_non_ascii_bytes_are_refused() -> None:
    assert "not ASCII" in refused(verifier(), b"\xff\xfe.token")


def test_payload_that_is_not_an_object_is_refused() -> None:
    header = base64.urlsafe_b64encode(b'{"alg":"HS256"}').rstrip(b"=")
    payload = base64.urlsafe_b64encode(b"[1,2]").rstrip(b"=")
    mac = hmac.new(SECRET, header + b"." + payload, hashlib.sha256).digest()
    token = b".".join([header, payload, base64.urlsafe_b64encode(mac).rstrip(b"=")]).decode()
    refused(verifier(), token)


@pytest.mark.parametrize("claims", [{}, {"sub": ""}, {"sub": 42}, {"sub": ["a"]}])
def test_token_without_a_string_principal_is_refused(claims: dict[str, Any]) -> None:
    assert "claim 'sub'" in refused(verifier(), hs256(claims))


def test_settings_need_a_key_and_do_not_print_the_secret() -> None:
    with pytest.raises(ValueError):
        TokenSettings()
    assert SECRET.decode() not in repr(TokenSettings(secret_key=SECRET))


# ---- key material ----------------------------------------------------------------------------


def test_data_urls_in_base64_and_plain() -> None:
    encoded = base64.b64encode(SECRET).decode()
    assert read_key_material(f"data:;base64,{encoded}") == SECRET
    assert read_key_material(f"data:application/octet-stream;base64,{encoded}") == SECRET
    assert read_key_material("data:,plain%20text") == b"plain text"


def test_file_urls(tmp_path: Path) -> None:
    path = tmp_path / "dir with space" / "secret.key"
    path.parent.mkdir()
    path.write_bytes(SECRET)
    assert read_key_material(path.as_uri()) == SECRET
    assert read_key_material(f"file://localhost{path}") == SECRET


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ("data:;base64,%%%notbase64", "base64"),
        ("data:no-comma", "','"),
        ("file:///no/such/secret.key", "cannot read"),
        ("file://remote-host/etc/key", "remote host"),
        ("c2VjcmV0c2VjcmV0", "data: or file:"),
    ],
)
def test_bad_key_material_is_explained_without_echoing_it(spec: str, words: str) -> None:
    with pytest.raises(KeyMaterialError) as info:
        read_key_material(spec)
    assert words in str(info.value)
    if not spec.startswith("file:"):
        assert spec not in str(info.value)


def test_public_keys_in_pem_and_der(rsa_key: rsa.RSAPrivateKey) -> None:
    public = rsa_key.public_key()
    for encoding in (serialization.Encoding.PEM, serialization.Encoding.DER):
        material = public.public_bytes(encoding, serialization.PublicFormat.SubjectPublicKeyInfo)
        loaded = load_public_key(material, "RS256")
        assert loaded.public_numbers() == public.public_numbers()


def test_public_key_must_fit_the_algorithm(rsa_key: rsa.RSAPrivateKey) -> None:
    material = rsa_key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    with pytest.raises(KeyMaterialError, match="cannot verify ES256"):
        load_public_key(material, "ES256")
    with pytest.raises(KeyMaterialError, match="not a PEM or DER public key"):
        load_public_key(b"-----BEGIN PUBLIC KEY-----\ngarbage\n", "RS256")
    with pytest.raises(KeyMaterialError, match="not a PEM or DER public key"):
        load_public_key(SECRET, "RS256")
