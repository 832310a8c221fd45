"""Signed control and admin records: who may change routes and topics.

Anyone who can write to the control cluster can write a record to ``tracemq.namesrv`` or
``tracemq.admin``; the signature is what tells the nameserver and the brokers that a record
comes from a holder of a key of the right role (as RocketMQ's ACL signs each request with an
AccessKey / SecretKey HMAC).

Wire format — the plain record (:mod:`tracemq.protocol.control`, :mod:`tracemq.protocol.admin`)
travels as the ``body`` of a sealed envelope, a msgpack map::

    {"v": 1, "type": "signed", "kid": <access key id>, "ts": <epoch ms>,
     "nonce": <32 hex digits>, "sig": <32 bytes>, "body": <the plain record's msgpack bytes>}

``sig`` is HMAC-SHA256, keyed with the secret of ``kid``, over :func:`canonical_bytes`: a tag,
the purpose (``control`` or ``admin``), ``kid``, ``ts``, ``nonce`` and ``body``, each prefixed
with its length. The body is signed as the exact bytes sent, so nothing depends on how a map is
encoded again, and a record signed for one topic never verifies on the other.

Checks, in order (:meth:`Verifier.open`), each a ``kind`` of :class:`ProtocolError` and so a
``reason`` of the consumer's ``..._rejected_total`` counter:

* ``garbage`` / ``version`` / ``schema`` — the envelope (or the plain record) is malformed;
* ``forged`` — unknown ``kid``, or the signature does not match;
* ``expired`` — ``ts`` further than the maximum age from the verifier's clock (either way);
* then the body is decoded (its own ``garbage`` … ``schema`` kinds);
* ``unsigned`` — a well-formed plain record without an envelope;
* ``wrong_role`` — a valid signature by a key whose role may not send this record type;
* ``replayed`` — the caller's replay guard (:class:`ReplayGuard` or the nameserver's shared one
  in Redis) has seen this signature at other coordinates within its window.

A signed record's body is parsed only after its signature checked out. A plain record is still
decoded, so that a malformed one is counted for what is wrong with it (and the counters of the
earlier protocol keep their meaning); a well-formed one is then refused as ``unsigned``.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import struct
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import msgpack

from tracemq.errors import SignatureError
from tracemq.protocol._envelope import SCHEMA_VERSION, ProtocolError, show, unpack_dict

SIGNED_TYPE = "signed"
Purpose = Literal["control", "admin"]
Role = Literal["broker", "client", "admin"]
ROLES: tuple[Role, ...] = ("broker", "client", "admin")

#: An access key id: what a log line may show of a key.
KEY_ID_RE = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
#: Shortest secret accepted: 16 characters (the dev stack generates 32).
SECRET_MIN = 16
NONCE_RE = re.compile(r"^[0-9a-f]{16,64}$")
SIG_BYTES = 32
TS_MAX = 2**63 - 1
_TAG = b"tracemq-sig-v1"

T = TypeVar("T")


@dataclass(frozen=True)
class Seal:
    """The signature fields of a sealed record, and the plain record it carries."""

    kid: str
    ts: int
    nonce: str
    sig: bytes
    body: bytes

    @property
    def replay_key(self) -> str:
        """What identifies this signed record (a copy of it has the same)."""
        return f"{self.kid}:{self.sig.hex()}"


def canonical_bytes(purpose: str, kid: str, ts: int, nonce: str, body: bytes) -> bytes:
    """The bytes the signature covers (length-prefixed fields, so no two inputs collide)."""
    out = bytearray()
    for part in (_TAG, purpose.encode(), kid.encode(), str(ts).encode(), nonce.encode(), body):
        out += struct.pack(">I", len(part))
        out += part
    return bytes(out)


def signature(secret: str, purpose: str, kid: str, ts: int, nonce: str, body: bytes) -> bytes:
    """HMAC-SHA256 of :func:`canonical_bytes` under ``secret``."""
    msg = canonical_bytes(purpose, kid, ts, nonce, body)
    return hmac.new(secret.encode(), msg, hashlib.sha256).digest()


def seal(
    purpose: Purpose,
    kid: str,
    secret: str,
    body: bytes,
    *,
    ts: int | None = None,
    nonce: str | None = None,
) -> bytes:
    """Wrap the plain record ``body`` into a signed envelope (``ts`` defaults to now)."""
    ts = int(time.time() * 1000) if ts is None else ts
    nonce = secrets.token_hex(16) if nonce is None else nonce
    return msgpack.packb(  # type: ignore[no-any-return]
        {
            "v": SCHEMA_VERSION,
            "type": SIGNED_TYPE,
            "kid": kid,
            "ts": ts,
            "nonce": nonce,
            "sig": signature(secret, purpose, kid, ts, nonce, body),
            "body": body,
        },
        use_bin_type=True,
    )


def unseal(data: bytes | None) -> tuple[Seal | None, bytes]:
    """``(seal, body)`` of a signed envelope, ``(None, data)`` of anything else that is a
    msgpack map of schema version 1 (a plain record, checked by its own decoder).

    Raises only :class:`ProtocolError` (``garbage``, ``version``, ``schema``) whatever
    ``data`` is. Nothing is verified here."""
    obj = unpack_dict(data)
    if obj.get("type") != SIGNED_TYPE:
        return None, bytes(data)  # type: ignore[arg-type]
    kid, ts, nonce, sig, body = (obj.get(k) for k in ("kid", "ts", "nonce", "sig", "body"))
    if not isinstance(kid, str) or not KEY_ID_RE.match(kid):
        raise ProtocolError(f"signed record: bad kid {show(kid)}", "schema")
    if type(ts) is not int or not 0 <= ts <= TS_MAX:
        raise ProtocolError(f"signed record: bad ts {show(ts)}", "schema")
    if not isinstance(nonce, str) or not NONCE_RE.match(nonce):
        raise ProtocolError(f"signed record: bad nonce {show(nonce)}", "schema")
    if not isinstance(sig, bytes) or len(sig) != SIG_BYTES:
        raise ProtocolError(f"signed record: sig must be {SIG_BYTES} bytes", "schema")
    if not isinstance(body, bytes) or not body:
        raise ProtocolError("signed record: body must be non-empty bytes", "schema")
    return Seal(kid=kid, ts=ts, nonce=nonce, sig=sig, body=body), body


def parse_keys(text: str | None) -> dict[str, str]:
    """``id:secret[,id:secret]`` → ``{id: secret}``. Raises ValueError naming the bad key id
    (never quoting a secret)."""
    keys: dict[str, str] = {}
    for n, item in enumerate((text or "").split(","), 1):
        item = item.strip()
        if not item:
            continue
        kid, sep, secret = item.partition(":")
        kid = kid.strip()
        if not sep or not KEY_ID_RE.match(kid):
            raise ValueError(
                f"entry {n} is not id:secret with an id of 1-64 characters [A-Za-z0-9._-]"
            )
        if len(secret) < SECRET_MIN:
            raise ValueError(f"the secret of key {kid!r} is shorter than {SECRET_MIN} characters")
        if kid in keys:
            raise ValueError(f"key id {kid!r} is listed twice")
        keys[kid] = secret
    return keys


@dataclass(frozen=True)
class Signer:
    """The identity a process signs with: an access key id and its secret."""

    key_id: str
    secret: str

    def __post_init__(self) -> None:
        if not KEY_ID_RE.match(self.key_id):
            raise ValueError("access key id must be 1-64 characters [A-Za-z0-9._-]")
        if len(self.secret) < SECRET_MIN:
            raise ValueError(f"secret key is shorter than {SECRET_MIN} characters")

    def __repr__(self) -> str:  # never the secret in a log line or a traceback
        return f"Signer(key_id={self.key_id!r})"

    def seal(self, purpose: Purpose, body: bytes) -> bytes:
        return seal(purpose, self.key_id, self.secret, body)


def maybe_seal(signer: Signer | None, purpose: Purpose, body: bytes) -> bytes:
    """``body`` sealed by ``signer``, or as it is without one (a verifier will refuse it)."""
    return body if signer is None else signer.seal(purpose, body)


class Verifier:
    """Checks signed records against keys configured per role (see the module docstring).

    ``keys`` maps each role to ``{key id: secret}``; several keys of one role are valid at once
    (rotation). ``disabled`` accepts every well-formed record, signed or not, unchecked."""

    def __init__(
        self,
        keys: Mapping[str, Mapping[str, str]],
        *,
        max_age_ms: int = 300_000,
        disabled: bool = False,
    ) -> None:
        self._keys: dict[str, tuple[str, str]] = {}
        for role, ring in keys.items():
            for kid, secret in ring.items():
                if kid in self._keys:
                    raise ValueError(f"key id {kid!r} is configured for two roles")
                self._keys[kid] = (role, secret)
        self.max_age_ms = max_age_ms
        self.disabled = disabled

    def __repr__(self) -> str:
        return f"Verifier(key_ids={sorted(self._keys)!r}, disabled={self.disabled})"

    def roles(self) -> set[str]:
        return {role for role, _ in self._keys.values()}

    def authenticate(self, s: Seal, purpose: Purpose, now_ms: int | None = None) -> str:
        """The role of ``s``'s key if its signature and age check out; else SignatureError."""
        entry = self._keys.get(s.kid)
        if entry is None:
            raise SignatureError(f"unknown access key id {s.kid!r}", "forged", s.kid)
        role, secret = entry
        expected = signature(secret, purpose, s.kid, s.ts, s.nonce, s.body)
        if not hmac.compare_digest(expected, s.sig):
            raise SignatureError(f"signature of key {s.kid!r} does not match", "forged", s.kid)
        now = int(time.time() * 1000) if now_ms is None else now_ms
        if now - s.ts > self.max_age_ms:
            raise SignatureError(
                f"signed {now - s.ts} ms ago, past the maximum age of {self.max_age_ms} ms",
                "expired",
                s.kid,
            )
        if s.ts - now > self.max_age_ms:
            raise SignatureError(
                f"signed {s.ts - now} ms ahead of this clock, past the maximum age of "
                f"{self.max_age_ms} ms",
                "expired",
                s.kid,
            )
        return role

    def open(
        self,
        data: bytes | None,
        purpose: Purpose,
        decode: Callable[[bytes], T],
        roles: Callable[[T], frozenset[str]],
        now_ms: int | None = None,
    ) -> tuple[T, Seal | None]:
        """Check and decode one record: ``(record, seal)`` — ``seal`` is None when verification
        is disabled (nothing was checked, so nothing is for a replay guard to remember). Raises
        only :class:`ProtocolError` (replays are the caller's check, :class:`ReplayGuard`)."""
        s, body = unseal(data)
        if self.disabled:
            return decode(body), None
        role = None if s is None else self.authenticate(s, purpose, now_ms)
        record = decode(body)
        if s is None:
            raise SignatureError("record is not signed", "unsigned")
        allowed = roles(record)
        if role not in allowed:
            raise SignatureError(
                f"key {s.kid!r} has role {role!r}; this record needs "
                f"{' or '.join(sorted(allowed))}",
                "wrong_role",
                s.kid,
            )
        return record, s


class ReplayGuard:
    """In-memory replay check with bounded memory: a signature seen at other coordinates
    (topic/partition/offset) while it is still within the maximum age is a replay; the same
    coordinates again are a legitimate re-read (a consumer's re-delivery), not a replay.

    Entries leave when their record has expired (it is refused as ``expired`` from then on);
    past ``max_entries`` the oldest leave first (counted by ``evicted``)."""

    def __init__(self, max_age_ms: int, max_entries: int = 100_000) -> None:
        self.max_age_ms = max_age_ms
        self.max_entries = max_entries
        self._seen: OrderedDict[str, tuple[int, str]] = OrderedDict()
        self.evicted = 0

    def __len__(self) -> int:
        return len(self._seen)

    def check(self, s: Seal, where: str, now_ms: int | None = None) -> None:
        """Record ``s`` as seen at ``where``; raise SignatureError(``replayed``) if it was seen
        elsewhere."""
        now = int(time.time() * 1000) if now_ms is None else now_ms
        while self._seen:
            first = next(iter(self._seen.values()))
            if first[0] >= now:
                break
            self._seen.popitem(last=False)
        key = s.replay_key
        prev = self._seen.get(key)
        if prev is not None:
            if prev[1] != where:
                raise SignatureError(
                    f"signature of key {s.kid!r} already seen at {prev[1]}", "replayed", s.kid
                )
            return
        # kept until the record could no longer pass the age check (it is expired then)
        self._seen[key] = (s.ts + self.max_age_ms + 1, where)
        while len(self._seen) > self.max_entries:
            self._seen.popitem(last=False)
            self.evicted += 1


def coordinates(where: Mapping[str, Any] | None) -> str:
    """``topic/partition/offset`` of a record, for replay guards (``?`` if unknown)."""
    if not where:
        return "?"
    return f"{where.get('topic')}/{where.get('partition')}/{where.get('offset')}"


__all__ = [
    "ROLES",
    "SIGNED_TYPE",
    "ReplayGuard",
    "Seal",
    "SignatureError",
    "Signer",
    "Verifier",
    "canonical_bytes",
    "coordinates",
    "maybe_seal",
    "parse_keys",
    "seal",
    "signature",
    "unseal",
]
