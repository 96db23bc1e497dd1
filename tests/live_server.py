"""A WSGI app on a real HTTP server on 127.0.0.1, for what a test client cannot do: a body sent
chunked or never finished, a client library, another process reading it."""

from __future__ import annotations

import json
import re
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from flask import Flask
from werkzeug.serving import make_server


class LiveServer:
    """``app`` served from a thread, on a port of its own, until :meth:`close`."""

    def __init__(self, app: Flask) -> None:
        self._server = make_server("127.0.0.1", 0, app, threaded=True)
        self.port: int = self._server.server_port
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def send_unfinished(self, path: str, headers: dict[str, str], body_start: bytes) -> tuple[int, str]:
        """POST to ``path`` with ``headers`` and the start of a body that never ends; return the
        status and the JSON error code the server answers with, or fail if it waits for the rest."""
        head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        head += "".join(f"{name}: {value}\r\n" for name, value in headers.items()) + "\r\n"
        with socket.create_connection(("127.0.0.1", self.port), timeout=5) as sock:
            sock.sendall(head.encode("latin-1") + body_start)
            data = b""
            try:
                while b"\r\n\r\n" not in data:
                    chunk = sock.recv(65536)
                    assert chunk, "the server closed the connection without answering"
                    data += chunk
                header_block, _, rest = data.partition(b"\r\n\r\n")
                match = re.search(rb"(?i)content-length: *(\d+)", header_block)
                assert match is not None, header_block
                while len(rest) < int(match.group(1)):
                    rest += sock.recv(65536)
            except TimeoutError:
                pytest.fail("the server waited for the body instead of answering")
        code: str = json.loads(rest)["error"]["code"]
        return int(header_block.split(b" ", 2)[1]), code


@contextmanager
def live_server(app: Flask) -> Iterator[LiveServer]:
    """Serve ``app`` for the ``with`` block."""
    server = LiveServer(app)
    try:
        yield server
    finally:
        server.close()
