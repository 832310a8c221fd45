"""TLS and SASL in front of one embedded Tansu, for ``tracemq dev up --secure``.

Why a gateway: the bundled Tansu (0.6.0) cannot serve either by itself in a throw-away stack.
Its ``--cert``/``--key`` options are refused together by its argument parser and a listener given
``--cert`` alone does not answer a TLS ClientHello; with ``--authentication`` it does SCRAM, but
users can only be made through its Kafka API (``tansu user create``), which that same flag
closes to unauthenticated clients, and its storage does not keep users across a restart. So the
stack runs Tansu on a loopback port only this gateway uses, makes Tansu advertise the gateway's
address, and the gateway does what a secured Kafka listener does:

* TLS with a certificate of the stack's throw-away CA (clients verify it with ``SSL_CAFILE``);
* SASL before any other request: ``SaslHandshake`` then ``SaslAuthenticate`` (v0/v1, as
  aiokafka speaks them) with ``PLAIN``, ``SCRAM-SHA-256`` or ``SCRAM-SHA-512`` (RFC 5802/7677)
  against the stack's generated users; ``ApiVersions`` is answered by Tansu; any other request
  before a successful authentication, a wrong password or an unknown user closes the connection
  after a ``SASL_AUTHENTICATION_FAILED`` answer, as Kafka does;
* once authenticated, bytes flow unchanged both ways.

Clients therefore do real TLS and real SASL; what authenticates them is this process, not Tansu.
Limits: no SaslAuthenticate v2 (flexible encoding; aiokafka uses v1), no re-authentication.
At most ``MAX_CONNECTIONS`` connections at once (more are closed at accept); a request before
authentication is at most ``MAX_PREAUTH_FRAME`` bytes.

Run: ``python -m tracemq_devkit.devstack.kafka_gateway --listen H:P --upstream H:P --cert PEM --key
PEM --name CLUSTER``; users come as JSON ``{"user": "password"}`` in
``TRACEMQ_DEV_GATEWAY_USERS`` (never on the command line).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import hmac
import json
import os
import secrets
import signal
import ssl
import struct
from collections.abc import Callable
from dataclasses import dataclass

from tracemq.errors import StackError
from tracemq.log import configure_logging, get_logger

log = get_logger("kafka-gateway")

API_VERSIONS, SASL_HANDSHAKE, SASL_AUTHENTICATE = 18, 17, 36
NONE, SASL_AUTH_FAILED, UNSUPPORTED_SASL_MECHANISM, ILLEGAL_SASL_STATE = 0, 58, 33, 34
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
_HASHES: dict[str, Callable[..., hashlib._Hash]] = {
    "SCRAM-SHA-256": hashlib.sha256,
    "SCRAM-SHA-512": hashlib.sha512,
}
SCRAM_ITERATIONS = 4096
MAX_CONNECTIONS = 512
MAX_PREAUTH_FRAME = 64 * 1024
AUTH_TIMEOUT_S = 30.0


class AuthFailed(StackError):
    """The client's SASL exchange failed; the message goes back to it."""


@dataclass(frozen=True)
class ScramCredential:
    salt: bytes
    iterations: int
    stored_key: bytes
    server_key: bytes


def scram_credential(
    mechanism: str, password: str, salt: bytes, iterations: int
) -> ScramCredential:
    h = _HASHES[mechanism]
    salted = hashlib.pbkdf2_hmac(h().name, password.encode(), salt, iterations)
    client_key = hmac.new(salted, b"Client Key", h).digest()
    return ScramCredential(
        salt=salt,
        iterations=iterations,
        stored_key=h(client_key).digest(),
        server_key=hmac.new(salted, b"Server Key", h).digest(),
    )


class Users:
    """Passwords (for PLAIN) and SCRAM credentials per mechanism, made once at start."""

    def __init__(self, passwords: dict[str, str]) -> None:
        self._passwords = dict(passwords)
        self._scram = {
            (mech, user): scram_credential(mech, pw, secrets.token_bytes(16), SCRAM_ITERATIONS)
            for user, pw in passwords.items()
            for mech in _HASHES
        }
        # an unknown user gets a stable fake salt, so the exchange does not tell who exists
        self._fake_key = secrets.token_bytes(32)

    def check_plain(self, user: str, password: str) -> bool:
        known = self._passwords.get(user)
        return known is not None and hmac.compare_digest(known.encode(), password.encode())

    def scram(self, mechanism: str, user: str) -> ScramCredential | None:
        return self._scram.get((mechanism, user))

    def fake_salt(self, user: str) -> bytes:
        return hmac.new(self._fake_key, user.encode(), hashlib.sha256).digest()[:16]


def _attrs(message: str) -> dict[str, str]:
    out = {}
    for part in message.split(","):
        key, sep, value = part.partition("=")
        if not sep or len(key) != 1:
            raise AuthFailed("malformed SCRAM message")
        out[key] = value
    return out


def check_plain(users: Users, data: bytes) -> str:
    """Check a SASL/PLAIN message (``authzid NUL user NUL password``); return the user.
    Raises :class:`AuthFailed`."""
    parts = data.split(b"\0")
    if len(parts) != 3:
        raise AuthFailed("malformed SASL/PLAIN message")
    try:
        user, password = parts[1].decode(), parts[2].decode()
    except UnicodeDecodeError:
        raise AuthFailed("SASL/PLAIN message is not UTF-8") from None
    if not users.check_plain(user, password):
        raise AuthFailed("Authentication failed: invalid credentials with SASL mechanism PLAIN")
    return user


class ScramServer:
    """The server side of one SCRAM exchange (two client messages)."""

    def __init__(self, mechanism: str, users: Users) -> None:
        self.mechanism = mechanism
        self.users = users
        self.h = _HASHES[mechanism]
        self.step_no = 0
        self.user = ""
        self.cred: ScramCredential | None = None
        self.client_first_bare = self.server_first = self.nonce = self.gs2 = ""

    def step(self, data: bytes) -> tuple[bytes, bool]:
        """Answer one client message; ``(reply, done)``. Raises :class:`AuthFailed`."""
        try:
            text = data.decode()
        except UnicodeDecodeError:
            raise AuthFailed("SCRAM message is not UTF-8") from None
        self.step_no += 1
        if self.step_no == 1:
            return self._first(text), False
        if self.step_no == 2:
            return self._final(text), True
        raise AuthFailed("unexpected SCRAM message")

    def _first(self, text: str) -> bytes:
        parts = text.split(",", 2)
        if len(parts) != 3 or parts[0] not in ("n", "y"):
            raise AuthFailed("malformed SCRAM client-first message")
        self.gs2 = f"{parts[0]},{parts[1]},"
        self.client_first_bare = parts[2]
        a = _attrs(self.client_first_bare)
        if "n" not in a or "r" not in a:
            raise AuthFailed("SCRAM client-first message lacks n= or r=")
        self.user = a["n"].replace("=2C", ",").replace("=3D", "=")
        self.cred = self.users.scram(self.mechanism, self.user)
        salt = self.cred.salt if self.cred else self.users.fake_salt(self.user)
        iterations = self.cred.iterations if self.cred else SCRAM_ITERATIONS
        self.nonce = a["r"] + secrets.token_urlsafe(18)
        self.server_first = f"r={self.nonce},s={base64.b64encode(salt).decode()},i={iterations}"
        return self.server_first.encode()

    def _final(self, text: str) -> bytes:
        head, sep, proof_b64 = text.rpartition(",p=")
        if not sep:
            raise AuthFailed("SCRAM client-final message lacks p=")
        a = _attrs(head)
        if a.get("r") != self.nonce:
            raise AuthFailed("SCRAM nonce mismatch")
        if a.get("c") != base64.b64encode(self.gs2.encode()).decode():
            raise AuthFailed("SCRAM channel binding mismatch")
        auth_message = f"{self.client_first_bare},{self.server_first},{head}".encode()
        if self.cred is None:
            raise AuthFailed(self._failure())
        try:
            proof = base64.b64decode(proof_b64, validate=True)
        except ValueError:
            raise AuthFailed("SCRAM proof is not base64") from None
        signature = hmac.new(self.cred.stored_key, auth_message, self.h).digest()
        if len(proof) != len(signature):
            raise AuthFailed(self._failure())
        client_key = bytes(x ^ y for x, y in zip(proof, signature, strict=True))
        if not hmac.compare_digest(self.h(client_key).digest(), self.cred.stored_key):
            raise AuthFailed(self._failure())
        server_sig = hmac.new(self.cred.server_key, auth_message, self.h).digest()
        return f"v={base64.b64encode(server_sig).decode()}".encode()

    def _failure(self) -> str:
        return f"Authentication failed: invalid credentials with SASL mechanism {self.mechanism}"


# -- Kafka framing (only what the pre-authentication exchange needs) ---------------------------
async def read_frame(reader: asyncio.StreamReader, limit: int) -> bytes:
    size = struct.unpack(">i", await reader.readexactly(4))[0]
    if size < 8 or size > limit:
        raise AuthFailed(f"request of {size} bytes before authentication")
    return await reader.readexactly(size)


def parse_request(frame: bytes) -> tuple[int, int, int, bytes]:
    """api key, version, correlation id and body of a request (header v1, as every request
    allowed before authentication has). Raises :class:`AuthFailed` for any malformed frame."""
    if len(frame) < 10:
        raise AuthFailed(f"request header of {len(frame)} bytes")
    api_key, version, corr, id_len = struct.unpack(">hhih", frame[:10])
    at = 10 + max(id_len, 0)
    if at > len(frame):
        raise AuthFailed("request header longer than its frame")
    return api_key, version, corr, frame[at:]


def read_string(body: bytes) -> str:
    """A Kafka STRING (int16 length, UTF-8) at the start of ``body``."""
    if len(body) < 2:
        raise AuthFailed("truncated string")
    (n,) = struct.unpack(">h", body[:2])
    if n < 0 or 2 + n > len(body):
        raise AuthFailed("bad string length")
    try:
        return body[2 : 2 + n].decode()
    except UnicodeDecodeError:
        raise AuthFailed("string is not UTF-8") from None


def read_bytes(body: bytes) -> bytes:
    """A Kafka BYTES (int32 length) at the start of ``body``."""
    if len(body) < 4:
        raise AuthFailed("truncated bytes")
    (n,) = struct.unpack(">i", body[:4])
    if n < 0 or 4 + n > len(body):
        raise AuthFailed("bad bytes length")
    return body[4 : 4 + n]


def _string(b: str) -> bytes:
    raw = b.encode()
    return struct.pack(">h", len(raw)) + raw


def _response(corr: int, body: bytes) -> bytes:
    return struct.pack(">ii", len(body) + 4, corr) + body


def handshake_response(corr: int, error: int) -> bytes:
    body = struct.pack(">hi", error, len(MECHANISMS)) + b"".join(_string(m) for m in MECHANISMS)
    return _response(corr, body)


def authenticate_response(
    corr: int, version: int, error: int, message: str | None, data: bytes
) -> bytes:
    body = struct.pack(">h", error)
    body += _string(message) if message is not None else struct.pack(">h", -1)
    body += struct.pack(">i", len(data)) + data
    if version >= 1:
        body += struct.pack(">q", 0)  # session lifetime: no re-authentication required
    return _response(corr, body)


class Gateway:
    def __init__(
        self, name: str, upstream: tuple[str, int], users: Users, ssl_ctx: ssl.SSLContext | None
    ) -> None:
        self.name = name
        self.upstream = upstream
        self.users = users
        self.ssl_ctx = ssl_ctx
        self.active = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        if self.active >= MAX_CONNECTIONS:
            log.warning("too many connections; closing", cluster=self.name, peer=str(peer))
            writer.close()
            return
        self.active += 1
        up_writer: asyncio.StreamWriter | None = None
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
            user = await asyncio.wait_for(
                self.authenticate(reader, writer, up_reader, up_writer), AUTH_TIMEOUT_S
            )
            log.info("authenticated", cluster=self.name, user=user, peer=str(peer))
            await self.pipe(reader, writer, up_reader, up_writer)
        except AuthFailed as exc:
            log.warning("refused", cluster=self.name, peer=str(peer), reason=str(exc))
        except (OSError, asyncio.IncompleteReadError, TimeoutError, ssl.SSLError) as exc:
            log.info("connection ended", cluster=self.name, peer=str(peer), error=repr(exc))
        finally:
            self.active -= 1
            for w in (writer, up_writer):
                if w is not None:
                    w.close()

    async def authenticate(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        up_reader: asyncio.StreamReader,
        up_writer: asyncio.StreamWriter,
    ) -> str:
        mechanism: str | None = None
        scram: ScramServer | None = None
        while True:
            frame = await read_frame(reader, MAX_PREAUTH_FRAME)
            api_key, version, corr, body = parse_request(frame)
            if api_key == API_VERSIONS:
                up_writer.write(struct.pack(">i", len(frame)) + frame)
                size = struct.unpack(">i", await up_reader.readexactly(4))[0]
                writer.write(struct.pack(">i", size) + await up_reader.readexactly(size))
                await writer.drain()
            elif api_key == SASL_HANDSHAKE and version <= 1 and mechanism is None:
                wanted = read_string(body)
                ok = wanted in MECHANISMS
                writer.write(handshake_response(corr, NONE if ok else UNSUPPORTED_SASL_MECHANISM))
                await writer.drain()
                if not ok:
                    raise AuthFailed(f"unsupported SASL mechanism {wanted[:64]!r}")
                mechanism = wanted
                scram = ScramServer(wanted, self.users) if wanted in _HASHES else None
            elif api_key == SASL_AUTHENTICATE and version <= 1 and mechanism is not None:
                try:
                    data = read_bytes(body)
                    if scram is None:
                        user = check_plain(self.users, data)
                        reply, done = b"", True
                    else:
                        reply, done = scram.step(data)
                        user = scram.user
                except AuthFailed as exc:
                    writer.write(
                        authenticate_response(corr, version, SASL_AUTH_FAILED, str(exc), b"")
                    )
                    await writer.drain()
                    raise
                writer.write(authenticate_response(corr, version, NONE, None, reply))
                await writer.drain()
                if done:
                    return user
            else:
                raise AuthFailed(
                    f"request (api key {api_key} v{version}) before SASL authentication"
                )

    async def pipe(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        up_reader: asyncio.StreamReader,
        up_writer: asyncio.StreamWriter,
    ) -> None:
        async def copy(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            while data := await src.read(256 * 1024):
                dst.write(data)
                await dst.drain()

        tasks = [
            asyncio.create_task(copy(reader, up_writer)),
            asyncio.create_task(copy(up_reader, writer)),
        ]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for t in done:
                t.result()
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


def _hostport(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


async def serve(args: argparse.Namespace) -> None:
    users = Users(json.loads(os.environ.get("TRACEMQ_DEV_GATEWAY_USERS", "{}")))
    ctx: ssl.SSLContext | None = None
    if args.cert:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.load_cert_chain(args.cert, args.key)
    gw = Gateway(args.name, _hostport(args.upstream), users, ctx)
    host, port = _hostport(args.listen)
    server = await asyncio.start_server(
        gw.handle, host, port, ssl=ctx, ssl_handshake_timeout=10 if ctx else None
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    log.info(
        "listening", cluster=args.name, listen=args.listen, upstream=args.upstream, tls=bool(ctx)
    )
    async with server:
        await stop.wait()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m tracemq_devkit.devstack.kafka_gateway")
    p.add_argument("--listen", required=True)
    p.add_argument("--upstream", required=True)
    p.add_argument("--name", required=True)
    p.add_argument("--cert")
    p.add_argument("--key")
    args = p.parse_args(argv)
    configure_logging("INFO")
    asyncio.run(serve(args))


if __name__ == "__main__":
    main()
