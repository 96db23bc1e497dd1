"""A fast webhook receiver for the fault tests, run in a process of its own.

``python receiver.py [--tls-cert CERT --tls-key KEY]`` listens on 127.0.0.1 (a free port, and a
second one for TLS when given a certificate), prints ``PORTS <http> <https>`` and serves until it
gets ``SIGTERM``. It is plain asyncio, so it keeps thousands of connections and answers thousands
of requests a second on one core, and slow or silent behaviours cost it nothing.

Every request to ``/<name>[/...]`` is recorded as a receipt: the name, the ``webhook-id`` header,
a digest of the body, the time, and what the receiver did. How ``<name>`` answers is its *mode*,
set with ``PUT /_mode/<name>`` and a JSON body (the default is ``{"kind": "ok"}``):

``ok``          200.
``status``      ``status`` with ``headers``; with ``once_per_id``, only to the first request of each
                webhook-id (then 200); with ``percent``, only to the webhook-ids whose SHA-256
                falls in that share (a deterministic choice; the others get 200).
``slow``        200 after ``delay`` seconds.
``silent``      reads the request and never answers (until the client hangs up).
``drip``        200 with a ``Content-Length`` of 100,000, then one byte a second.
``huge``        200 with a ``Content-Length`` of ``bytes``, streamed as fast as the client reads.

``GET /_receipts?since=N`` returns the receipts from the N-th on as JSON, ``GET /_stats`` the bytes
the ``huge`` mode sent per name.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import signal
import ssl
import sys
import time
from http import HTTPStatus
from typing import Any
from urllib.parse import parse_qs, urlsplit

#: Nothing the receiver does lasts longer than this (a silent or dripping answer included).
LONGEST = 300.0
_CHUNK = b"x" * (1 << 20)


class Receiver:
    def __init__(self) -> None:
        self.receipts: list[list[Any]] = []
        self.modes: dict[str, dict[str, Any]] = {}
        self.seen: set[tuple[str, str]] = set()
        self.sent: dict[str, int] = {}

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                request = await _read_request(reader)
                if request is None:
                    return
                if not await self.answer(reader, writer, *request):
                    return
        except (ConnectionError, ssl.SSLError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            return
        finally:
            with contextlib.suppress(Exception):
                writer.close()

    async def answer(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        method: str,
        target: str,
        headers: dict[str, str],
        body: bytes,
    ) -> bool:
        """Answer one request; return whether the connection stays open."""
        parts = urlsplit(target)
        path = parts.path
        if path.startswith("/_mode/") and method == "PUT":
            self.modes[path[len("/_mode/") :]] = json.loads(body)
            return await _reply(writer, 204)
        if path == "/_receipts":
            since = int(parse_qs(parts.query).get("since", ["0"])[0])
            return await _reply(writer, 200, json.dumps(self.receipts[since:]).encode())
        if path == "/_stats":
            return await _reply(writer, 200, json.dumps({"sent": self.sent}).encode())
        name = path.strip("/").split("/")[0]
        mode = self.modes.get(name, {"kind": "ok"})
        kind = mode["kind"]
        webhook_id = headers.get("webhook-id")
        status = 200
        if kind == "status" and not (mode.get("once_per_id") and (name, webhook_id) in self.seen):
            status = int(mode["status"]) if _chosen(webhook_id, mode.get("percent", 100)) else 200
        self.seen.add((name, webhook_id or ""))
        digest = hashlib.sha256(body).hexdigest()[:32]
        self.receipts.append([name, webhook_id, digest, time.time(), status if kind == "status" else kind])
        if kind == "status":
            return await _reply(writer, status, mode.get("body", "").encode(), mode.get("headers", {}))
        if kind == "slow":
            await asyncio.sleep(float(mode["delay"]))
            return await _reply(writer, 200)
        if kind == "silent":
            # The client hangs up when its read timeout or deadline ends the attempt.
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(reader.read(), LONGEST)
            return False
        if kind == "drip":
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n")
            end = time.monotonic() + LONGEST
            while time.monotonic() < end:
                writer.write(b"x")
                await writer.drain()
                await asyncio.sleep(1.0)
            return False
        if kind == "huge":
            total = int(mode["bytes"])
            writer.write(f"HTTP/1.1 200 OK\r\nContent-Length: {total}\r\n\r\n".encode())
            sent = 0
            try:
                while sent < total:
                    chunk = _CHUNK[: total - sent]
                    writer.write(chunk)
                    await writer.drain()
                    sent += len(chunk)
            finally:
                self.sent[name] = self.sent.get(name, 0) + sent
            return False
        return await _reply(writer, 200)


def _chosen(webhook_id: str | None, percent: float) -> bool:
    """Whether ``webhook_id`` is among the ``percent`` of ids a ``status`` mode answers."""
    digest = hashlib.sha256((webhook_id or "").encode()).digest()
    return int.from_bytes(digest[:4], "big") % 10_000 < percent * 100


async def _read_request(reader: asyncio.StreamReader) -> tuple[str, str, dict[str, str], bytes] | None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return None
    lines = head.decode("latin-1").split("\r\n")
    method, target, _version = lines[0].split(" ", 2)
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if line:
            key, _, value = line.partition(":")
            headers[key.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "0"))
    body = await reader.readexactly(length) if length else b""
    return method, target, headers, body


async def _reply(
    writer: asyncio.StreamWriter, status: int, body: bytes = b"", headers: dict[str, str] | None = None
) -> bool:
    lines = [f"HTTP/1.1 {status} {HTTPStatus(status).phrase}", f"Content-Length: {len(body)}"]
    lines += [f"{key}: {value}" for key, value in (headers or {}).items()]
    writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)
    await writer.drain()
    return True


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tls-cert")
    parser.add_argument("--tls-key")
    args = parser.parse_args()
    receiver = Receiver()
    server = await asyncio.start_server(receiver.serve, "127.0.0.1", 0, limit=1 << 16, backlog=1024)
    servers = [server]
    https_port = 0
    if args.tls_cert:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(args.tls_cert, args.tls_key)
        tls = await asyncio.start_server(receiver.serve, "127.0.0.1", 0, ssl=context)
        servers.append(tls)
        https_port = tls.sockets[0].getsockname()[1]
    print(f"PORTS {server.sockets[0].getsockname()[1]} {https_port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    # A failed TLS handshake (the client refuses our certificate) is expected: keep it quiet.
    loop.set_exception_handler(lambda _loop, _context: None)
    await stop.wait()
    for each in servers:
        each.close()


if __name__ == "__main__":
    asyncio.run(main())
    sys.exit(0)
