"""Run the production example on this machine and prove one delivery end to end.

Needs PostgreSQL and Redis on 127.0.0.1 (trust auth for ``postgres``, as on the development
machines). It uses a database of its own, ``harvest_example`` (dropped and created anew), and
Redis database 13 (flushed), then:

1. creates the tables with the release commands (``flask harvest init-db``, ``flask create-tables``);
2. starts a receiver on 127.0.0.1 that verifies signatures with ``flask_harvest.receiver``;
3. registers a subscription with ``flask harvest subscriptions add`` (which prints the secret);
4. starts gunicorn (2 web processes) and 2 ``flask harvest worker`` processes;
5. POSTs an order through gunicorn, waits for the signed delivery, checks it;
6. stops every process (SIGTERM to each process group) and exits 0 on success.

::

    python examples/production/run_local.py [--database-url URL] [--redis-url URL]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import redis
import requests
import sqlalchemy as sa
from flask import Flask
from rq import Worker
from werkzeug.serving import make_server

from flask_harvest.outbound.signing import verify_stripe
from flask_harvest.receiver import MemoryReplayCache, verify_webhook
from flask_harvest.webhooks.manager import outbox_delivery_id

HERE = Path(__file__).resolve().parent
DATABASE_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/harvest_example"
REDIS_URL = "redis://127.0.0.1:6379/13"
WORKERS = 2
#: The whole run gives up after this many seconds (then it still stops every process).
RUN_SECONDS = 90.0
_deadline = time.monotonic() + RUN_SECONDS
#: Held in the ``postgres`` database while a run uses harvest_example, so two runs take turns.
LOCK_ID = 0x68617276  # "harv"


class Failed(Exception):
    """The end-to-end check failed; the message says where."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_until(what: str, check: Callable[[], Any], timeout: float) -> Any:
    """Call ``check`` until it returns something truthy; return that."""
    end = min(time.monotonic() + timeout, _deadline)
    while time.monotonic() < end:
        with contextlib.suppress(Exception):
            result = check()
            if result:
                return result
        time.sleep(0.2)
    raise Failed(f"timed out after {timeout:g} s waiting for {what}")


# -- services ------------------------------------------------------------------------------------


@contextlib.contextmanager
def fresh_database(url: sa.URL) -> Iterator[None]:
    """Drop and create ``url``'s database, holding a lock so concurrent runs take turns."""
    admin = sa.create_engine(url.set(database="postgres"), isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(sa.text("SELECT pg_advisory_lock(:id)"), {"id": LOCK_ID})
            name = url.database
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
            try:
                yield
            finally:
                conn.execute(sa.text("SELECT pg_advisory_unlock(:id)"), {"id": LOCK_ID})
    finally:
        admin.dispose()


class Receiver:
    """A Flask app on 127.0.0.1 whose ``/webhooks`` route verifies with the receiver kit."""

    def __init__(self) -> None:
        self.secret = ""  # known once the subscription exists; read on every request
        self.received: list[dict[str, Any]] = []
        app = Flask("receiver")

        @app.post("/webhooks")
        @verify_webhook(lambda: self.secret, replay_cache=MemoryReplayCache())
        def webhooks(payload: Any, delivery_id: str) -> tuple[str, int]:
            from flask import request

            # The Stripe-style header is on every delivery too; check it for good measure.
            verify_stripe(self.secret, request.headers["Autumn-Signature"], request.get_data())
            self.received.append({"delivery_id": delivery_id, "payload": payload})
            return "", 204

        self.server = make_server("127.0.0.1", 0, app, threaded=True)
        self.url = f"http://127.0.0.1:{self.server.server_port}/webhooks"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


# -- processes -----------------------------------------------------------------------------------


class Processes:
    """Child processes, each in its own process group (its own session), with a log file each."""

    def __init__(self, env: dict[str, str], logs: Path) -> None:
        self.env = env
        self.logs = logs
        self.running: list[tuple[str, subprocess.Popen[bytes]]] = []

    def flask(self, *args: str) -> str:
        """Run ``flask --app app:create_app ARGS`` to completion; return its output."""
        done = subprocess.run(  # noqa: S603 (this script's own fixed commands)
            [sys.executable, "-m", "flask", "--app", "app:create_app", *args],
            cwd=HERE,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        if done.returncode != 0:
            raise Failed(f"flask {' '.join(args)} exited {done.returncode}:\n{done.stdout}{done.stderr}")
        return done.stdout

    def start(self, name: str, *command: str) -> None:
        log = (self.logs / f"{name}.log").open("wb")
        process = subprocess.Popen(  # noqa: S603 (this script's own fixed commands)
            [sys.executable, "-m", *command],
            cwd=HERE,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: stopping it stops its children
        )
        log.close()
        self.running.append((name, process))

    def children(self, name: str) -> int:
        """Return how many child processes ``name`` has (gunicorn's web processes)."""
        pid = dict(self.running)[name].pid
        count = 0
        for stat in Path("/proc").glob("[0-9]*/stat"):
            with contextlib.suppress(OSError, IndexError):
                # The fields after the command name, which is in parentheses: state, ppid, ...
                if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    count += 1
        return count

    def check_alive(self) -> None:
        for name, process in self.running:
            if process.poll() is not None:
                raise Failed(f"{name} exited with status {process.returncode}")

    def stop(self, timeout: float = 20.0) -> None:
        for _, process in self.running:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
        end = time.monotonic() + timeout
        for name, process in self.running:
            try:
                process.wait(max(0.1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                print(f"{name} did not stop after SIGTERM; killing it", file=sys.stderr)
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()

    def print_logs(self) -> None:
        for name, _ in self.running:
            text = (self.logs / f"{name}.log").read_text(errors="replace")
            print(f"---- {name} (last lines) ----\n" + "\n".join(text.splitlines()[-30:]), file=sys.stderr)


# -- the run -------------------------------------------------------------------------------------


def run(database_url: str, redis_url: str, logs: Path) -> None:
    receiver = Receiver()
    web_port = free_port()
    env = {
        **os.environ,
        "DATABASE_URL": database_url,
        "REDIS_URL": redis_url,
        "BIND": f"127.0.0.1:{web_port}",
        "WEB_CONCURRENCY": "2",
        # The receiver is on 127.0.0.1, which the SSRF guard refuses unless this is set. Only for
        # this local run: never set it in production.
        "HARVEST_WEBHOOKS_ALLOW_PRIVATE_TARGETS": "true",
        "PYTHONUNBUFFERED": "1",
    }
    processes = Processes(env, logs)
    try:
        processes.flask("harvest", "init-db")
        processes.flask("create-tables")
        print("tables created with `flask harvest init-db` and `flask create-tables`")

        added = json.loads(
            processes.flask("harvest", "subscriptions", "add", receiver.url, "--topic", "order.*", "--json")
        )
        receiver.secret = added["secret"]
        print(f"receiver on {receiver.url}; subscription {added['id']} for order.*")

        processes.start("gunicorn", "gunicorn", "-c", "gunicorn.conf.py")
        for number in range(1, WORKERS + 1):
            processes.start(f"worker-{number}", "flask", "--app", "app:create_app", "harvest", "worker")
        base = f"http://127.0.0.1:{web_port}"

        def web_up() -> bool:
            processes.check_alive()
            return requests.get(f"{base}/healthz", timeout=2).status_code == 200

        wait_until("gunicorn to answer /healthz", web_up, 45)
        wait_until("gunicorn's 2 web processes", lambda: processes.children("gunicorn") == 2, 20)
        connection = redis.Redis.from_url(redis_url)

        def workers_up() -> bool:
            processes.check_alive()
            return len(Worker.all(connection=connection)) >= WORKERS

        wait_until(f"{WORKERS} workers to register with RQ", workers_up, 45)
        connection.close()
        print(f"gunicorn answers on {base} from 2 web processes; {WORKERS} harvest workers are up")

        order = {"reference": "ord_1001", "total_cents": 4200}
        response = requests.post(f"{base}/orders", json=order, timeout=10)
        if response.status_code != 201:
            raise Failed(f"POST /orders answered {response.status_code}: {response.text}")
        created = response.json()
        print(f"POST /orders -> 201, order {created['order_id']}, event {created['event_id']}")

        [delivery] = wait_until("the signed delivery", lambda: receiver.received, 30)
        expected_id = outbox_delivery_id(created["event_id"], added["id"])
        if delivery["delivery_id"] != expected_id:
            raise Failed(f"delivery id {delivery['delivery_id']}, expected {expected_id}")
        if delivery["payload"] != {"order_id": created["order_id"], **order}:
            raise Failed(f"unexpected payload {delivery['payload']}")
        print(f"receiver verified delivery {expected_id}: {json.dumps(delivery['payload'])}")

        def delivered() -> bool:
            shown = json.loads(processes.flask("harvest", "deliveries", "show", expected_id, "--json"))
            return bool(shown["state"] == "delivered")

        wait_until("the delivery to be recorded as delivered", delivered, 20)
        print(f"flask harvest deliveries show {expected_id}: delivered")
        time.sleep(0.5)  # a duplicate would have arrived by now
        if len(receiver.received) != 1:
            raise Failed(f"the receiver got {len(receiver.received)} deliveries, expected 1")
    except BaseException:
        processes.print_logs()
        raise
    finally:
        processes.stop()
        receiver.stop()
    print(f"stopped gunicorn and {WORKERS} workers")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", default=DATABASE_URL, help=f"default: {DATABASE_URL}")
    parser.add_argument("--redis-url", default=REDIS_URL, help=f"default: {REDIS_URL}")
    args = parser.parse_args()
    # Stopped from outside (a test's timeout, Ctrl-C): still stop the children in `finally`.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no access log from the receiver
    database_url = sa.make_url(args.database_url)
    try:
        with fresh_database(database_url), tempfile.TemporaryDirectory() as logs:
            redis.Redis.from_url(args.redis_url).flushdb()
            run(database_url.render_as_string(hide_password=False), args.redis_url, Path(logs))
    except Failed as exc:
        print(f"production example FAILED: {exc}", file=sys.stderr)
        return 1
    print("production example OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
