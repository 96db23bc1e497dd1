"""A fast HTTP receiver on 127.0.0.1, in a process of its own so it takes no GIL from the harness.

It is a small asyncio HTTP/1.1 server with keep-alive. What a path does is in the path:

* ``/ok/...``: ``200`` at once;
* ``/slow/<ms>/...``: ``200`` after ``ms`` milliseconds, without blocking other requests;
* ``/never/...``: never answers; the connection stays open until the client gives up;
* ``/limit/<n>/<ms>/...``: like ``/slow/<ms>/`` while at most ``n`` requests to ``/limit/`` paths
  are in flight (this one included), ``503`` at once past that: a receiver with a fixed capacity.

It records every request: path, ``webhook-id``, arrival time (``time.time()``), answer time, and
the ``sent_at`` the benchmark put in the payload, so latency is receipt minus dispatch. The harness
reads them through ``GET /_stats``, ``GET /_records`` and ``POST /_reset``.

    python -m bench._receivers      # prints its port on the first line of stdout
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests

ROOT = Path(__file__).resolve().parent.parent
_SENT_AT = re.compile(rb'"sent_at":\s*([0-9.eE+-]+)')
_OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Type: text/plain\r\n\r\nok"
_BUSY = b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 4\r\nContent-Type: text/plain\r\n\r\nbusy"


class _Server:
    def __init__(self) -> None:
        # (path, webhook id, body, received_at, answered_at or None, status)
        self.records: list[tuple[str, str, bytes, float, float | None, int]] = []
        self.by_path: Counter[str] = Counter()  # requests answered 200
        self.refused = 0  # requests answered 503 by a /limit/ path
        self.inflight = 0
        self.peak = 0
        self.limited = 0  # requests to /limit/ paths in flight

    def reset(self) -> None:
        self.records.clear()
        self.by_path.clear()
        self.refused = 0
        self.peak = self.inflight

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while await self._one(reader, writer):
                pass
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.close()

    async def _one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        method, target = lines[0].split(b" ")[:2]
        headers: dict[bytes, bytes] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(b":")
            if sep:
                headers[name.strip().lower()] = value.strip()
        length = int(headers.get(b"content-length", b"0"))
        body = await reader.readexactly(length) if length else b""
        received = time.time()
        path = target.decode("latin-1")
        keep_alive = headers.get(b"connection", b"").lower() != b"close"
        if path.startswith("/_"):
            writer.write(self._control(method, path))
            await writer.drain()
            return keep_alive
        webhook_id = headers.get(b"webhook-id", b"").decode("latin-1")
        self.inflight += 1
        self.peak = max(self.peak, self.inflight)
        limited = path.startswith("/limit/")
        self.limited += limited
        try:
            if path.startswith("/never/"):
                self.records.append((path, webhook_id, body, received, None, 0))
                await reader.read()  # until the client times out and closes
                return False
            if path.startswith("/slow/"):
                await asyncio.sleep(int(path.split("/")[2]) / 1000)
            if limited:
                _, _, capacity, delay = path.split("/")[:4]
                if self.limited > int(capacity):
                    self.refused += 1
                    writer.write(_BUSY)
                    self.records.append((path, webhook_id, body, received, time.time(), 503))
                    await writer.drain()
                    return keep_alive
                await asyncio.sleep(int(delay) / 1000)
        finally:
            self.inflight -= 1
            self.limited -= limited
        writer.write(_OK)
        self.records.append((path, webhook_id, body, received, time.time(), 200))
        self.by_path[path] += 1
        await writer.drain()
        return keep_alive

    def _control(self, method: bytes, path: str) -> bytes:
        data: Any
        if path.startswith("/_stats"):
            data = {
                "count": sum(self.by_path.values()),
                "by_path": dict(self.by_path),
                "inflight": self.inflight,
                "refused": self.refused,
                "peak": self.peak,
            }
        elif path.startswith("/_records"):
            data = [
                [p, wid, _sent_at(body), got, answered, status]
                for p, wid, body, got, answered, status in self.records
            ]
        elif path.startswith("/_reset") and method == b"POST":
            self.reset()
            data = {"ok": True}
        else:
            data = {"error": "unknown control path"}
        payload = json.dumps(data).encode()
        return (
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
            + str(len(payload)).encode()
            + b"\r\n\r\n"
            + payload
        )


def process_cpu_seconds(pid: int) -> float:
    """CPU time (user + system) process ``pid`` has used so far (its children not included)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _sent_at(body: bytes) -> float | None:
    match = _SENT_AT.search(body)
    return float(match.group(1)) if match else None


async def _serve() -> None:
    server = _Server()
    listener = await asyncio.start_server(server.handle, "127.0.0.1", 0, backlog=1024)
    port = listener.sockets[0].getsockname()[1]
    sys.stdout.write(f"{port}\n")
    sys.stdout.flush()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    # Exit at once: open keep-alive connections would otherwise be cancelled noisily.
    listener.close()
    sys.stdout.flush()
    os._exit(0)


@dataclass(frozen=True)
class Record:
    """One request the receiver answered (or, for ``/never``, received)."""

    path: str
    webhook_id: str
    sent_at: float | None
    received_at: float
    answered_at: float | None
    status: int = 200  # 0 for one never answered

    @property
    def latency(self) -> float | None:
        """Dispatch to receipt, in seconds (when the payload carried ``sent_at``)."""
        return None if self.sent_at is None else self.received_at - self.sent_at


class Receiver:
    """Starts the receiver process and talks to it."""

    def __init__(self) -> None:
        self._process: subprocess.Popen[bytes] | None = None
        self.port = 0
        self._control = requests.Session()
        self._control.trust_env = False

    def start(self) -> Receiver:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self._process = subprocess.Popen(
            [sys.executable, "-m", "bench._receivers"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            start_new_session=True,
        )
        assert self._process.stdout is not None
        line = self._process.stdout.readline()
        if not line.strip():
            raise RuntimeError("the receiver did not start")
        self.port = int(line)
        return self

    def __enter__(self) -> Receiver:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def pid(self) -> int:
        assert self._process is not None
        return self._process.pid

    def cpu_seconds(self) -> float:
        """The receiver process's CPU time so far: one core's worth per second means it is the
        bottleneck."""
        return process_cpu_seconds(self.pid)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def stats(self) -> dict[str, Any]:
        answer = self._control.get(self.url("/_stats"), timeout=10)
        result: dict[str, Any] = answer.json()
        return result

    def count(self, prefix: str | None = None) -> int:
        stats = self.stats()
        if prefix is None:
            return int(stats["count"])
        return sum(n for path, n in stats["by_path"].items() if path.startswith(prefix))

    def records(self) -> list[Record]:
        answer = self._control.get(self.url("/_records"), timeout=60)
        return [Record(*row) for row in answer.json()]

    def reset(self) -> None:
        self._control.post(self.url("/_reset"), timeout=10)

    def wait_count(self, count: int, *, timeout: float, prefix: str | None = None) -> bool:
        """Wait until ``count`` requests (to paths starting with ``prefix``) were answered."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.count(prefix) >= count:
                return True
            time.sleep(0.05)
        return self.count(prefix) >= count

    def stop(self) -> None:
        self._control.close()
        if self._process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self._process.pid, signal.SIGTERM)
        try:
            self._process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._process.pid, signal.SIGKILL)
            self._process.wait(timeout=5)
        if self._process.stdout is not None:
            self._process.stdout.close()
        self._process = None


if __name__ == "__main__":
    asyncio.run(_serve())
