"""The fault-injection harness: services this group owns, worker processes, a receiver, invariants.

Every test in ``tests/faults`` breaks something real (kills a worker, wipes or restarts Redis,
terminates PostgreSQL connections, crashes a process between commit and relay, points deliveries
at misbehaving receivers) and then checks the promise of flask-harvest with
:func:`check_invariants`: every dispatched delivery is received at least once or is in the DLQ
with a reason, no receipt carries an id that was never dispatched, and copies of one webhook all
carry the same ``webhook-id`` (and one webhook never shows up under two ids).

The group touches only what it owns:

* its own ``redis-server`` on a free port, without persistence (``--save "" --appendonly no``),
  which tests may ``FLUSHDB``, kill and restart;
* its own PostgreSQL database (``harvest_faults_<random>``), whose connections tests may
  terminate, dropped at the end of the session;
* the worker and receiver processes it starts, each in a session of its own, so that stopping
  one with ``os.killpg`` also stops RQ's forked scheduler.

Every subscription is created with a *canary* secret (``whsec_`` and the base64 of
``HARVEST-SECRET-CANARY-...``); after each test the flask-harvest log records and the output of
every worker process are searched for it (see ``test_secrets.py`` for the rest of that scenario).
"""

from __future__ import annotations

import base64
import hashlib
import http.client
import json
import logging
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis
import sqlalchemy as sa
from flask import Flask

from flask_harvest import HarvestEngine, OutboundWebhookPlugin, WebhookSubscription, get_engine
from flask_harvest.webhooks.stores.sql import SqlOutboundWebhookStore, metadata

from ..conftest import DATABASE_URL, service_unavailable
from ..pipeline import close_later
from ..worker_process import stop_group

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
#: The app the workers load unless a test names another (``start_worker(app=...)``).
WORKER_APP_SPEC = "faults_worker_app:create_app"
RECEIVER_SCRIPT = HERE / "receiver.py"

#: The settings every fault test starts from: short leases, deadlines and sweeps so that recovery
#: takes seconds, fast retries, and receivers on 127.0.0.1.
BASE_CONFIG: dict[str, Any] = {
    "HARVEST_JOBS_BACKEND": "rq",
    "HARVEST_WEBHOOKS_QUEUE": "faults",
    "HARVEST_WEBHOOKS_LEASE_SECONDS": 4,
    "HARVEST_WEBHOOKS_DEADLINE_SECONDS": 3,
    "HARVEST_WEBHOOKS_TIMEOUT_SECONDS": 2,
    "HARVEST_WEBHOOKS_CONNECT_TIMEOUT_SECONDS": 1,
    "HARVEST_SWEEP_INTERVAL_SECONDS": 0.5,
    "HARVEST_WEBHOOKS_INITIAL_BACKOFF_MS": 50,
    "HARVEST_WEBHOOKS_MAX_BACKOFF_MS": 500,
    "HARVEST_WEBHOOKS_ALLOW_PRIVATE_TARGETS": True,
}

# -- the secret canary -----------------------------------------------------------------------------

#: 21 bytes, a multiple of 3, so its base64 is the same prefix in every canary secret.
CANARY = b"HARVEST-SECRET-CANARY"
CANARY_PATTERNS = (CANARY.decode(), base64.b64encode(CANARY).decode())


def canary_secret() -> str:
    """Return a new Standard Webhooks secret whose key starts with ``HARVEST-SECRET-CANARY``."""
    return "whsec_" + base64.b64encode(CANARY + b"-" + secrets.token_bytes(10)).decode()


def find_canary(text: str) -> list[str]:
    """Return the canary patterns found in ``text``."""
    return [pattern for pattern in CANARY_PATTERNS if pattern in text]


# -- waiting ---------------------------------------------------------------------------------------


def wait_until(
    predicate: Callable[[], Any], timeout: float, what: str | Callable[[], str], interval: float = 0.1
) -> Any:
    """Poll ``predicate`` until it returns something true; return it, or fail after ``timeout``.

    ``what`` names what is awaited; a callable is asked only when the wait fails (to show state).
    """
    end = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > end:
            described = what() if callable(what) else what
            pytest.fail(f"timed out after {timeout:g} s waiting for {described}", pytrace=False)
        time.sleep(interval)


class FaultTimeout(Exception):
    """A fault test ran past its time limit (see ``TIME_LIMIT_SECONDS``)."""


@pytest.fixture(autouse=True)
def _time_limit(request: pytest.FixtureRequest) -> Iterator[None]:
    """Stop a test that runs past its module's ``TIME_LIMIT_SECONDS`` (default 180 s).

    A backstop only: every wait has its own timeout. Teardown still runs and stops every process.
    """
    limit = int(getattr(request.module, "TIME_LIMIT_SECONDS", 180))

    def expire(_signum: int, _frame: object) -> None:
        raise FaultTimeout(f"{request.node.nodeid} ran for more than {limit} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(limit)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


# -- processes -------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def rss_kib(pid: int) -> int:
    """Return the resident set size of process ``pid`` in KiB (from ``/proc``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise LookupError(f"no VmRSS for process {pid}")


class RedisServer:
    """A ``redis-server`` of our own, without persistence, that tests may wipe, kill and restart."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        command = [
            "redis-server",
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--save", "",
            "--appendonly", "no",
            "--dir", str(self.folder),
            "--logfile", str(self.folder / "redis.log"),
        ]  # fmt: skip
        self.process = subprocess.Popen(command, start_new_session=True, stdout=subprocess.DEVNULL)
        client = self.client()
        try:
            wait_until(lambda: _pings(client), 10, f"redis-server on port {self.port}", interval=0.05)
        finally:
            client.close()

    def client(self) -> redis.Redis:
        return redis.Redis.from_url(self.url, socket_timeout=5)

    def kill(self) -> None:
        """Crash the server (SIGKILL): everything in it is gone, as after a restart without disk."""
        if self.process is not None:
            stop_group(self.process, signal.SIGKILL, timeout=10)
            self.process = None

    def restart_empty(self) -> None:
        self.kill()
        self.start()

    def flushdb(self) -> None:
        client = self.client()
        try:
            client.flushdb()
        finally:
            client.close()


def _pings(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False


@dataclass(frozen=True)
class Receipt:
    """One request the receiver got."""

    name: str
    webhook_id: str | None
    digest: str
    at: float
    #: The status it answered, or the mode that shaped the answer (ok, slow, silent, drip, huge).
    answer: int | str

    @property
    def answered_2xx(self) -> bool:
        if isinstance(self.answer, int):
            return 200 <= self.answer < 300
        return self.answer in ("ok", "slow", "huge")


class ReceiverProcess:
    """The asyncio receiver of ``receiver.py``, in a process of its own."""

    def __init__(self, folder: Path, *, tls: bool = False) -> None:
        command = [sys.executable, str(RECEIVER_SCRIPT)]
        if tls:
            cert, key = self_signed_certificate(folder)
            command += ["--tls-cert", str(cert), "--tls-key", str(key)]
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, start_new_session=True)
        assert self.process.stdout is not None
        line = self.process.stdout.readline().decode().split()
        if not line or line[0] != "PORTS":
            stop_group(self.process, signal.SIGKILL, timeout=5)
            raise RuntimeError("the receiver did not start")
        self.port, self.tls_port = int(line[1]), int(line[2])
        self._receipts: list[Receipt] = []

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.port}/{name}"

    def tls_url(self, name: str) -> str:
        return f"https://127.0.0.1:{self.tls_port}/{name}"

    def _call(self, method: str, path: str, body: bytes | None = None) -> bytes:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            conn.request(method, path, body=body)
            return conn.getresponse().read()
        finally:
            conn.close()

    def mode(self, name: str, kind: str, **options: Any) -> None:
        """Set how ``/<name>`` answers (see ``receiver.py``)."""
        self._call("PUT", f"/_mode/{name}", json.dumps({"kind": kind, **options}).encode())

    def receipts(self) -> list[Receipt]:
        """Every request received so far (fetched incrementally)."""
        fresh = json.loads(self._call("GET", f"/_receipts?since={len(self._receipts)}"))
        self._receipts.extend(Receipt(*row) for row in fresh)
        return list(self._receipts)

    def sent_bytes(self) -> dict[str, int]:
        sent: dict[str, int] = json.loads(self._call("GET", "/_stats"))["sent"]
        return sent

    def ids(self, name: str | None = None) -> set[str]:
        """The distinct webhook-ids received (at ``name``, if given)."""
        return {r.webhook_id for r in self.receipts() if r.webhook_id and (name is None or r.name == name)}

    def stop(self) -> None:
        stop_group(self.process, signal.SIGTERM, timeout=10)
        if self.process.stdout is not None:
            self.process.stdout.close()


def self_signed_certificate(folder: Path) -> tuple[Path, Path]:
    """Make a self-signed certificate for 127.0.0.1 with the ``openssl`` command."""
    if shutil.which("openssl") is None:
        service_unavailable("openssl", "PATH", FileNotFoundError("openssl"))
    cert, key = folder / "bad-cert.pem", folder / "bad-key.pem"
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
            "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
            "-keyout", str(key), "-out", str(cert),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )  # fmt: skip
    return cert, key


# -- worker processes ------------------------------------------------------------------------------

WORKER_APP = textwrap.dedent(
    """
    import json
    import logging
    import os

    import sqlalchemy as sa
    from flask import Flask

    from flask_harvest import OutboundWebhookPlugin
    from flask_harvest.webhooks.stores.sql import SqlOutboundWebhookStore


    def create_app():
        level = os.environ.get("FAULTS_LOG_LEVEL", "INFO")
        logging.basicConfig(
            level="DEBUG" if level == "DEBUG" else "WARNING",  # DEBUG: every library too
            format="%(asctime)s %(process)d %(threadName)s %(name)s %(levelname)s %(message)s",
        )
        logging.getLogger("flask_harvest").setLevel(level)
        app = Flask("faults_worker")
        app.config.update(json.loads(os.environ["FAULTS_CONFIG"]))
        # A small pool per process: the group shares one PostgreSQL server with other test runs.
        engine = sa.create_engine(os.environ["FAULTS_DATABASE_URL"], pool_size=6, max_overflow=6)
        OutboundWebhookPlugin(SqlOutboundWebhookStore(engine), app)
        return app
    """
)


class Worker:
    """One ``flask harvest worker`` process, started in a session of its own.

    With ``restart``, the harness restarts it one second after it exits, as the deployment
    docs' systemd unit (``Restart=always``) or supervisor program (``autorestart``) would.
    """

    def __init__(self, command: list[str], environment: dict[str, str], log_path: Path, cwd: Path) -> None:
        self.command = command
        self.environment = environment
        self.log_path = log_path
        self.cwd = cwd
        self.restart = False
        #: The exit statuses of the processes the harness restarted.
        self.exits: list[int] = []
        self.process = self._spawn()

    def _spawn(self) -> subprocess.Popen[bytes]:
        with open(self.log_path, "ab") as log:  # the child keeps its own copy of the descriptor
            return subprocess.Popen(
                self.command,
                cwd=self.cwd,
                env=self.environment,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def respawn_if_exited(self) -> bool:
        status = self.process.poll()
        if status is None or not self.restart:
            return False
        stop_group(self.process, signal.SIGKILL, timeout=5)  # RQ's scheduler child, if it is left
        self.exits.append(status)
        self.process = self._spawn()
        return True

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL the worker and everything it started (RQ's scheduler child)."""
        self.restart = False
        stop_group(self.process, signal.SIGKILL, timeout=20)

    def stop(self, timeout: float = 30) -> int | None:
        """SIGTERM: a graceful stop; return the exit status (``None`` if it had to be killed)."""
        self.restart = False
        return stop_group(self.process, signal.SIGTERM, timeout=timeout)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


class Supervisor:
    """Restarts exited workers that asked for it, one second after they exit."""

    def __init__(self, workers: list[Worker]) -> None:
        self.workers = workers
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="faults-supervisor", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            for worker in list(self.workers):
                worker.respawn_if_exited()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


# -- the environment of one test -------------------------------------------------------------------


@dataclass
class Summary:
    """What :func:`check_invariants` saw."""

    delivered: int
    dlq: int
    allowed_other: int
    receipts: int
    #: Requests answered 2xx beyond the first of each webhook-id (at-least-once copies).
    duplicates: int


@dataclass
class FaultEnv:
    """Everything one fault test works with; see the module docstring."""

    redis_server: RedisServer
    database_url: sa.URL
    engine: sa.Engine
    folder: Path
    app_folder: Path
    receiver: ReceiverProcess
    #: The harness's own view of the database: a fresh connection per look, so that terminated
    #: connections (scenario 3) never get in its way.
    inspector: sa.Engine
    config: dict[str, Any] = field(default_factory=dict)
    workers: list[Worker] = field(default_factory=list)
    secrets: list[str] = field(default_factory=list)
    supervisor: Supervisor | None = None
    _apps: list[Flask] = field(default_factory=list)

    # -- the app in this (the "web") process --------------------------------------------------

    def settings(self, **overrides: Any) -> dict[str, Any]:
        return {**BASE_CONFIG, "HARVEST_REDIS_URL": self.redis_server.url, **self.config, **overrides}

    def app(self, **overrides: Any) -> Flask:
        """A Flask app on the group's database and Redis, as the web process would have it."""
        app = Flask("faults_web")
        app.config.update(self.settings(**overrides))
        OutboundWebhookPlugin(SqlOutboundWebhookStore(self.engine), app)
        self._apps.append(app)
        return close_later(app)

    @property
    def state(self) -> HarvestEngine:
        if not self._apps:
            self.app()
        return get_engine(self._apps[0])

    @property
    def store(self) -> SqlOutboundWebhookStore:
        store = self.state.store
        assert isinstance(store, SqlOutboundWebhookStore)
        return store

    def subscribe(self, sub_id: str, url: str, topics: Iterable[str] = ("fault.*",)) -> WebhookSubscription:
        secret = canary_secret()
        self.secrets.append(secret)
        return self.store.add_subscription(WebhookSubscription(url, tuple(topics), secret, id=sub_id))

    def dispatch(self, topic: str, payload: Any, *, ordering_key: str | None = None) -> list[str]:
        with self._apps[0].app_context() if self._apps else self.app().app_context():
            return self.state.manager.dispatch(topic, payload, ordering_key=ordering_key)

    # -- workers ------------------------------------------------------------------------------

    def start_worker(
        self,
        *args: str,
        concurrency: int = 16,
        restart: bool = False,
        log_level: str = "INFO",
        app: str = WORKER_APP_SPEC,
        **overrides: Any,
    ) -> Worker:
        """Start ``flask harvest worker --concurrency N`` with this test's settings.

        :param restart: restart it when it exits, as a process manager would.
        :param log_level: the level of the ``flask_harvest`` logger in the worker.
        :param app: the ``--app`` the worker loads (a module of this checkout, e.g.
            ``tests.faults.workflow_app:create_app``); the webhook app by default.
        """
        log_path = self.folder / f"worker-{len(self.workers)}.log"
        environment = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(
                [str(self.app_folder), str(ROOT), os.environ.get("PYTHONPATH", "")]
            ),
            "FAULTS_CONFIG": json.dumps(self.settings(**overrides)),
            "FAULTS_DATABASE_URL": self.database_url.render_as_string(hide_password=False),
            "FAULTS_LOG_LEVEL": log_level,
        }
        command = [
            sys.executable, "-m", "flask", "--app", app,
            "harvest", "worker", "--concurrency", str(concurrency), *args,
        ]  # fmt: skip
        worker = Worker(command, environment, log_path, self.folder)
        worker.restart = restart
        self.workers.append(worker)
        if restart and self.supervisor is None:
            self.supervisor = Supervisor(self.workers)
        return worker

    def worker_logs(self) -> str:
        return "\n".join(w.log() for w in self.workers)

    # -- the database -------------------------------------------------------------------------

    def rows(self, ids: Iterable[str] | None = None) -> dict[str, sa.Row[Any]]:
        """Delivery rows by id (all of them, or those of ``ids``)."""
        query = (
            "SELECT id, subscription_id, state, last_error, payload, attempt FROM harvest_webhook_deliveries"
        )
        with self.inspector.connect() as conn:
            rows = {row.id: row for row in conn.execute(sa.text(query))}
        if ids is None:
            return rows
        wanted = set(ids)
        return {key: row for key, row in rows.items() if key in wanted}

    def states(self, ids: Iterable[str]) -> dict[str, int]:
        counts: dict[str, int] = defaultdict(int)
        for row in self.rows(ids).values():
            counts[row.state] += 1
        return dict(counts)

    def all_final(self, ids: Iterable[str]) -> bool:
        ids = list(ids)
        rows = self.rows(ids)
        return len(rows) == len(set(ids)) and all(
            row.state in ("delivered", "dlq", "skipped") for row in rows.values()
        )

    def wait_final(self, ids: Iterable[str], timeout: float, what: str = "every delivery final") -> float:
        """Wait until every delivery of ``ids`` is delivered, dead-lettered or skipped; return when."""
        ids = list(ids)
        wait_until(lambda: self.all_final(ids), timeout, lambda: f"{what} ({self.states(ids)})", interval=0.1)
        return time.monotonic()

    def terminate_backends(self) -> int:
        """Terminate every PostgreSQL connection to the group's database; return how many."""
        return terminate_backends(self.database_url)


def terminate_backends(database_url: sa.URL) -> int:
    admin = sa.create_engine(sa.make_url(DATABASE_URL), isolation_level="AUTOCOMMIT", poolclass=sa.NullPool)
    try:
        with admin.connect() as conn:
            killed = conn.execute(
                sa.text(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                    "WHERE datname = :name AND pid <> pg_backend_pid()"
                ),
                {"name": database_url.database},
            ).scalar()
    finally:
        admin.dispose()
    return int(killed or 0)


def check_invariants(
    env: FaultEnv,
    dispatched: Iterable[str],
    *,
    extra_known: Iterable[str] = (),
    allow: Callable[[sa.Row[Any]], bool] | None = None,
) -> Summary:
    """Assert the promise for one run and return what was seen.

    1. Every dispatched id is ``DELIVERED`` (and the receiver answered one of its requests 2xx)
       or in the ``DLQ`` with a reason (or, where a scenario documents it, a row ``allow``
       accepts).
    2. No receipt carries an id outside ``dispatched`` and ``extra_known``.
    3. Copies of one delivery carry the same id, body and target; one webhook (one target and
       body) never arrives under two ids; the body is the delivery's stored payload.
    """
    dispatched = list(dispatched)
    rows = env.rows()
    receipts = env.receiver.receipts()
    subscriptions = SqlOutboundWebhookStore(env.inspector).list_subscriptions()
    names = {sub.id: _name_of(sub.target_url) for sub in subscriptions}
    by_id: dict[str | None, list[Receipt]] = defaultdict(list)
    for receipt in receipts:
        by_id[receipt.webhook_id].append(receipt)
    problems: list[str] = []
    delivered = dlq = other = 0
    for delivery_id in dispatched:
        row = rows.get(delivery_id)
        if row is None:
            problems.append(f"{delivery_id}: dispatched, but there is no row")
        elif row.state == "delivered":
            delivered += 1
            if not any(r.answered_2xx for r in by_id.get(delivery_id, [])):
                problems.append(f"{delivery_id}: delivered, but the receiver never answered it 2xx")
        elif row.state == "dlq":
            dlq += 1
            if not row.last_error:
                problems.append(f"{delivery_id}: in the DLQ without a reason")
        elif allow is not None and allow(row):
            other += 1
        else:
            problems.append(
                f"{delivery_id}: neither delivered nor dead-lettered: {row.state} ({row.last_error})"
            )
    known = set(dispatched) | set(extra_known)
    for webhook_id, copies in by_id.items():
        if webhook_id not in known:
            problems.append(f"{len(copies)} receipt(s) with an id that was never dispatched: {webhook_id}")
            continue
        if len({c.digest for c in copies}) > 1 or len({c.name for c in copies}) > 1:
            problems.append(f"{webhook_id}: copies differ in body or target")
        row = rows.get(webhook_id)
        if row is not None:
            if hashlib.sha256(row.payload.encode()).hexdigest()[:32] != copies[0].digest:
                problems.append(f"{webhook_id}: the body received is not the stored payload")
            if names.get(row.subscription_id) not in (None, copies[0].name):
                problems.append(f"{webhook_id}: received at {copies[0].name}, not its subscription's target")
    by_webhook: dict[tuple[str, str], set[str | None]] = defaultdict(set)
    for receipt in receipts:
        by_webhook[(receipt.name, receipt.digest)].add(receipt.webhook_id)
    for (name, _digest), ids in by_webhook.items():
        if len(ids) > 1:
            problems.append(f"one webhook to {name} arrived under {len(ids)} ids: {sorted(map(str, ids))}")
    assert not problems, f"{len(problems)} violation(s), the first: " + "; ".join(problems[:15])
    return Summary(
        delivered=delivered,
        dlq=dlq,
        allowed_other=other,
        receipts=len(receipts),
        duplicates=sum(max(0, sum(c.answered_2xx for c in copies) - 1) for copies in by_id.values()),
    )


def _name_of(url: str) -> str:
    return url.split("/", 3)[3].split("/")[0] if url.count("/") >= 3 else ""


# -- fixtures --------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def fault_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """The group's own redis-server, started once per session."""
    if shutil.which("redis-server") is None:
        service_unavailable("redis-server", "PATH", FileNotFoundError("redis-server"))
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    server.start()
    try:
        yield server
    finally:
        server.kill()


@pytest.fixture(scope="session")
def fault_database() -> Iterator[sa.URL]:
    """The group's own PostgreSQL database, created for the session and dropped after it."""
    base = sa.make_url(DATABASE_URL)
    name = f"harvest_faults_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine(base, isolation_level="AUTOCOMMIT", poolclass=sa.NullPool)
    try:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    except sa.exc.OperationalError as exc:
        service_unavailable("PostgreSQL", base.render_as_string(hide_password=True), exc)
    url = base.set(database=name)
    engine = sa.create_engine(url, poolclass=sa.NullPool)
    try:
        metadata.create_all(engine)
    finally:
        engine.dispose()
    try:
        yield url
    finally:
        terminate_backends(url)
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}"')
        admin.dispose()


@pytest.fixture(scope="session")
def _app_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("faults_app")
    (folder / "faults_worker_app.py").write_text(WORKER_APP)
    return folder


@pytest.fixture
def faults(
    fault_redis: RedisServer,
    fault_database: sa.URL,
    _app_folder: Path,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> Iterator[FaultEnv]:
    """A clean environment: empty tables, an empty Redis, a fresh receiver (with a TLS port).

    Afterwards: every worker is stopped, and the canary secret must appear neither in the
    flask-harvest log records of this process nor in any worker's output.
    """
    caplog.set_level(logging.DEBUG, logger="flask_harvest")
    if fault_redis.process is None or fault_redis.process.poll() is not None:
        fault_redis.start()  # a test that killed it and failed before restarting it
    fault_redis.flushdb()
    engine = sa.create_engine(fault_database, pool_size=5, max_overflow=10)
    names = ", ".join(f'"{table.name}"' for table in metadata.sorted_tables)
    with engine.begin() as conn:
        conn.exec_driver_sql(f"TRUNCATE {names} RESTART IDENTITY")
    receiver = ReceiverProcess(tmp_path, tls=True)
    inspector = sa.create_engine(fault_database, poolclass=sa.NullPool)
    env = FaultEnv(fault_redis, fault_database, engine, tmp_path, _app_folder, receiver, inspector)
    try:
        yield env
    finally:
        if env.supervisor is not None:
            env.supervisor.stop()
        for worker in env.workers:
            worker.kill()
        receiver.stop()
        engine.dispose()
        inspector.dispose()
    leaks = find_canary(caplog.text) + find_canary(env.worker_logs())
    leaks += [f"secret of subscription {n}" for n, s in enumerate(env.secrets) if s in env.worker_logs()]
    assert not leaks, f"a secret leaked into the logs: {leaks}"
