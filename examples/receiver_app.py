"""Receiving flask-harvest webhooks: a Flask app whose ``/webhooks`` route uses the receiver kit.

``verify_webhook`` checks the Standard Webhooks signature against the raw body, refuses stale
timestamps and replayed delivery ids, and calls the view with the parsed ``payload`` and the
``delivery_id``. Run as a script, the app signs a few deliveries the way a flask-harvest sender
does and posts them to itself through Flask's test client (no server, no services): a valid one,
one with a tampered body, and the valid one again. It prints each status code and exits 0.

    python examples/receiver_app.py

To serve it instead: ``WEBHOOK_SECRET=whsec_... flask --app examples/receiver_app.py run``
(the secret is the one ``flask harvest subscriptions add`` printed for the subscription).
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

from flask import Flask

from flask_harvest import generate_secret
from flask_harvest.outbound.signing import sign_headers
from flask_harvest.receiver import MemoryReplayCache, verify_webhook

# A real receiver reads its secret from the environment (or a secrets manager); the demo makes one.
SECRET = os.environ.get("WEBHOOK_SECRET") or generate_secret()

app = Flask(__name__)
#: Fine for one process; with several (gunicorn workers), use RedisReplayCache.
replay_cache = MemoryReplayCache()
orders: dict[str, Any] = {}


@app.post("/webhooks")
@verify_webhook(SECRET, replay_cache=replay_cache)
def webhooks(payload: dict[str, Any], delivery_id: str) -> tuple[dict[str, str], int]:
    # Delivery is at-least-once: keep the delivery id with what it changed, and drop copies.
    orders[payload["order_id"]] = {"delivery_id": delivery_id, **payload}
    return {"received": delivery_id}, 200


def post(body: bytes, headers: dict[str, str]) -> tuple[int, str]:
    """POST to ``/webhooks`` through the test client; return the status and the error code."""
    response = app.test_client().post("/webhooks", data=body, headers=headers)
    error = (response.get_json(silent=True) or {}).get("error") or {}
    return response.status_code, error.get("code", "")


def main() -> int:
    body = json.dumps({"order_id": "ord_1001", "total": 42}, separators=(",", ":")).encode()
    # What the sender puts on each attempt: webhook-id, webhook-timestamp, webhook-signature.
    headers = {
        "Content-Type": "application/json",
        **sign_headers([SECRET], "msg_1f6a0c2e9b8d4f7a", int(time.time()), body),
    }
    results = {
        "valid delivery": post(body, headers),
        "tampered body": post(body.replace(b"42", b"4200"), headers),
        "replayed delivery": post(body, headers),
    }
    for name, (status, code) in results.items():
        print(f"{name:<18} -> {status} {code}".rstrip())
    expected = {
        "valid delivery": (200, ""),
        "tampered body": (401, "invalid_signature"),
        "replayed delivery": (409, "replayed"),
    }
    ok = results == expected and list(orders) == ["ord_1001"]
    print("receiver example OK" if ok else "receiver example FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
