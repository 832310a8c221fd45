"""Signed control and admin records (tracemq.protocol.signing, tracemq.auth): the canonical
bytes, the signature, every refusal reason, the replay guard and the settings."""

from __future__ import annotations

import hashlib
import hmac
import struct

import msgpack
import pytest
from tracemq.auth import SignerSettings, VerifierSettings
from tracemq.errors import ConfigError
from tracemq.protocol import admin, control, signing
from tracemq.protocol.signing import ReplayGuard, SignatureError, Verifier
from tracemq.settings import load_settings
from tracemq_broker.settings import BrokerSettings
from tracemq_nameserver.settings import NamesrvSettings

NOW = 1_700_000_000_000
SECRET_B = "broker-secret-0123456789"
SECRET_C = "client-secret-0123456789"
SECRET_A = "admin-secret-01234567890"
KEYS = {"broker": {"kb": SECRET_B}, "client": {"kc": SECRET_C}, "admin": {"ka": SECRET_A}}
SECRETS = {kid: secret for ring in KEYS.values() for kid, secret in ring.items()}


def _register(ts: int = NOW) -> control.BrokerRegister:
    return control.BrokerRegister(
        type="broker.register",
        ts=ts,
        broker=control.BrokerInfo(
            cluster="c", broker_name="b", address="h:1", data_bootstrap="k:9"
        ),
        topics={"T": control.TopicConfig(read_queues=1, write_queues=1)},
    )


def _seal(
    body: bytes, kid: str = "kb", purpose: signing.Purpose = "control", **kw: object
) -> bytes:
    return signing.seal(purpose, kid, SECRETS.get(kid, "x" * 20), body, **kw)  # type: ignore[arg-type]


def _open(data: bytes, verifier: Verifier | None = None, now: int = NOW) -> object:
    v = verifier or Verifier(KEYS, max_age_ms=300_000)
    return v.open(data, "control", control.decode, control.signer_roles, now)


def _kind(data: bytes, **kw: object) -> str:
    with pytest.raises(SignatureError) as info:
        _open(data, **kw)  # type: ignore[arg-type]
    return info.value.kind


def test_canonical_bytes_are_length_prefixed_fields() -> None:
    got = signing.canonical_bytes("control", "kb", 12, "ab", b"\x81")
    parts = [b"tracemq-sig-v1", b"control", b"kb", b"12", b"ab", b"\x81"]
    assert got == b"".join(struct.pack(">I", len(p)) + p for p in parts)
    # no two field splits give the same bytes (a plain concatenation would)
    assert signing.canonical_bytes("control", "kb1", 2, "ab", b"x") != signing.canonical_bytes(
        "control", "kb", 12, "ab", b"x"
    )


def test_signature_is_hmac_sha256_over_the_canonical_bytes() -> None:
    body = control.encode(_register())
    sealed = msgpack.unpackb(_seal(body, ts=NOW, nonce="0f" * 16))
    expected = hmac.new(
        SECRET_B.encode(),
        signing.canonical_bytes("control", "kb", NOW, "0f" * 16, body),
        hashlib.sha256,
    ).digest()
    assert sealed == {
        "v": 1,
        "type": "signed",
        "kid": "kb",
        "ts": NOW,
        "nonce": "0f" * 16,
        "sig": expected,
        "body": body,
    }


def test_a_valid_record_opens_and_every_refusal_has_its_reason() -> None:
    body = control.encode(_register())
    record, seal = _open(_seal(body, ts=NOW))  # type: ignore[misc]
    assert record == _register() and seal.kid == "kb"
    assert _kind(body) == "unsigned"
    assert _kind(signing.seal("control", "kb", "wrong-secret-0123456789", body, ts=NOW)) == "forged"
    assert _kind(signing.seal("control", "nobody", SECRET_B, body, ts=NOW)) == "forged"
    # any byte of what is signed changed: forged
    env = msgpack.unpackb(_seal(body, ts=NOW))
    for field, new in (
        ("ts", NOW + 1),
        ("nonce", "1" * 32),
        ("body", body.replace(b"k:9", b"e:9")),
    ):
        assert _kind(msgpack.packb({**env, field: new})) == "forged", field
    # signed for the admin topic, replayed on the control topic: forged
    assert _kind(_seal(body, purpose="admin", ts=NOW)) == "forged"
    assert _kind(_seal(body, ts=NOW - 300_001)) == "expired"
    assert _kind(_seal(body, ts=NOW + 300_001)) == "expired"
    _open(_seal(body, ts=NOW - 300_000))  # the edge is still valid
    assert _kind(_seal(body, kid="kc", ts=NOW)) == "wrong_role"
    assert _kind(_seal(body, kid="ka", ts=NOW)) == "wrong_role"
    hb = control.encode(control.ClientHeartbeat(ts=NOW, client_id="c", group="g", role="consumer"))
    _open(_seal(hb, kid="kc", ts=NOW))
    assert _kind(_seal(hb, kid="kb", ts=NOW)) == "wrong_role"


def test_the_signature_is_checked_before_the_body_is_read() -> None:
    garbage = b"\xc1\xc1"
    assert _kind(signing.seal("control", "kb", "wrong-secret-0123456789", garbage, ts=NOW)) == (
        "forged"
    )
    with pytest.raises(signing.ProtocolError) as info:
        _open(_seal(garbage, ts=NOW))
    assert info.value.kind == "garbage"


def test_admin_roles() -> None:
    v = Verifier(KEYS)

    def kind(op: admin.AdminOp, kid: str) -> str | None:
        req = admin.AdminRequest(type=op, request_id="r", broker="b", body={"group": "g"})
        data = _seal(admin.encode(req), kid=kid, purpose="admin", ts=NOW)
        try:
            v.open(data, "admin", admin.decode_request, admin.signer_roles, NOW)
        except SignatureError as exc:
            return exc.kind
        return None

    assert kind("topic.create", "ka") is None
    assert kind("topic.delete", "kc") == "wrong_role"
    assert kind("topic.delete", "kb") == "wrong_role"
    assert kind("retry.ensure", "kc") is None  # a consumer asks for its retry topics
    assert kind("retry.ensure", "ka") is None


def test_two_keys_of_one_role_are_valid_at_once() -> None:
    old, new = "old-secret-0123456789", "new-secret-0123456789"
    v = Verifier({"broker": {"old": old, "new": new}})
    body = control.encode(_register())
    for kid, secret in (("old", old), ("new", new)):
        v.open(signing.seal("control", kid, secret, body, ts=NOW), "control", control.decode,
               control.signer_roles, NOW)  # fmt: skip
    rotated = Verifier({"broker": {"new": new}})
    with pytest.raises(SignatureError, match="unknown access key id 'old'"):
        rotated.open(signing.seal("control", "old", old, body, ts=NOW), "control",
                     control.decode, control.signer_roles, NOW)  # fmt: skip


def test_disabled_verification_accepts_unsigned_records() -> None:
    v = Verifier({}, disabled=True)
    record, seal = v.open(control.encode(_register()), "control", control.decode,
                          control.signer_roles, NOW)  # fmt: skip
    assert record == _register() and seal is None


def test_replay_guard() -> None:
    g = ReplayGuard(max_age_ms=1000, max_entries=3)
    s1, _ = signing.unseal(_seal(b"\x80", ts=NOW))
    assert s1 is not None
    g.check(s1, "t/0/1", NOW)
    g.check(s1, "t/0/1", NOW + 10)  # the same record read again (a re-delivery): fine
    with pytest.raises(SignatureError) as info:
        g.check(s1, "t/0/2", NOW + 20)
    assert info.value.kind == "replayed" and info.value.key_id == "kb"
    # forgotten once it is past the maximum age (the verifier refuses it as expired by then)
    g.check(s1, "t/0/3", NOW + 1002)
    # bounded: the oldest go first
    for i in range(5):
        s, _ = signing.unseal(_seal(b"\x80", ts=NOW + 1002))
        assert s is not None
        g.check(s, f"t/0/{10 + i}", NOW + 1002)
    # s1 (past its age) was dropped as expired, two of the five evicted to keep three
    assert len(g) == 3 and g.evicted == 2


def test_keyrings_parse_and_never_quote_a_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    assert signing.parse_keys(f"a:{SECRET_A}, b:{SECRET_B}") == {"a": SECRET_A, "b": SECRET_B}
    assert signing.parse_keys("k:with:colons-0123456789") == {"k": "with:colons-0123456789"}
    for bad, message in (
        ("nocolon0123456789abc", "entry 1 is not id:secret"),
        ("k:tiny_pw", "shorter than 16"),
        (f"k:{SECRET_A},k:{SECRET_B}", "listed twice"),
        (f"bad id:{SECRET_A}", "entry 1"),
    ):
        monkeypatch.setenv("TRACEMQ_AUTH_BROKER_KEYS", bad)
        with pytest.raises(ConfigError, match=message) as info:
            load_settings(NamesrvSettings)
        assert "TRACEMQ_AUTH_BROKER_KEYS='<redacted>'" in str(info.value)
        for secret in (SECRET_A, SECRET_B, "tiny_pw", "nocolon0123456789abc"):
            assert secret not in str(info.value)


def test_a_verifier_without_keys_refuses_to_start(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("BROKER", "CLIENT", "ADMIN"):
        monkeypatch.delenv(f"TRACEMQ_AUTH_{var}_KEYS", raising=False)
    monkeypatch.delenv("TRACEMQ_AUTH_DISABLED", raising=False)
    monkeypatch.setenv("TRACEMQ_AUTH_BROKER_KEYS", f"kb:{SECRET_B}")
    with pytest.raises(ConfigError, match="no keys in TRACEMQ_AUTH_CLIENT_KEYS"):
        load_settings(NamesrvSettings).verifier("nameserver", ("broker", "client"))
    monkeypatch.setenv("TRACEMQ_AUTH_DISABLED", "true")
    assert load_settings(NamesrvSettings).verifier("nameserver", ("broker", "client")).disabled
    monkeypatch.setenv("TRACEMQ_AUTH_DISABLED", "false")
    monkeypatch.setenv("TRACEMQ_AUTH_CLIENT_KEYS", f"kb:{SECRET_C}")
    with pytest.raises(ConfigError, match="configured for two roles"):
        load_settings(VerifierSettings).verifier("nameserver", ("broker", "client"))


def test_signer_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("ACCESS_KEY_ID", "SECRET_KEY", "ADMIN_ACCESS_KEY_ID", "ADMIN_SECRET_KEY"):
        monkeypatch.delenv(f"TRACEMQ_{var}", raising=False)
    assert load_settings(SignerSettings).signer() is None
    monkeypatch.setenv("TRACEMQ_ACCESS_KEY_ID", "kc")
    with pytest.raises(ConfigError, match="must be set together"):
        load_settings(BrokerSettings)
    monkeypatch.setenv("TRACEMQ_SECRET_KEY", SECRET_C)
    s = load_settings(SignerSettings)
    assert s.signer() == signing.Signer("kc", SECRET_C) == s.admin_signer()
    assert SECRET_C not in repr(s.signer()) and SECRET_C not in repr(s)
    monkeypatch.setenv("TRACEMQ_ADMIN_ACCESS_KEY_ID", "ka")
    monkeypatch.setenv("TRACEMQ_ADMIN_SECRET_KEY", SECRET_A)
    assert load_settings(SignerSettings).admin_signer() == signing.Signer("ka", SECRET_A)
