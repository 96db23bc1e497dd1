"""``flask harvest operational ...``: the app's own endpoint for operational notifications."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .._app import get_engine
from . import _common as out
from ._common import HarvestGroup as _Group
from ._common import operations as _ops

operational_cli = _Group(
    "operational",
    help="The operational endpoint (HARVEST_OPERATIONAL_WEBHOOK_URL): its status, and a test notification.",
)


def _status(data: Mapping[str, Any]) -> str:
    if not data["configured"]:
        return (
            "no operational endpoint is configured (set HARVEST_OPERATIONAL_WEBHOOK_URL and "
            "HARVEST_OPERATIONAL_WEBHOOK_SECRET)"
        )
    subscription = data["subscription"] or {}
    head = out.fields(
        {
            "subscription": subscription.get("id", "(missing)"),
            "url": subscription.get("target_url", ""),
            "status": subscription.get("status", ""),
            "consecutive_failures": subscription.get("consecutive_failures", ""),
            "kinds": ", ".join(data["kinds"]),
            "rate_limit_hold_seconds": f"{data['rate_limit_hold_seconds']:g}"
            if data["rate_limit_hold_seconds"]
            else "off",
        }
    )
    recent = out.table(
        [(d["id"], d["topic"], d["state"], d["attempt"], d["timestamp"]) for d in data["recent"]],
        ("id", "topic", "state", "attempt", "at"),
        empty="no notifications yet",
    )
    return f"{head}\nlatest notifications:\n{recent}"


@operational_cli.command("status")
@out.json_option
def operational_status(as_json: bool) -> None:
    """The operational endpoint's subscription, the kinds it is sent, its latest notifications."""
    out.output(_ops().operational_status(), as_json, _status)


@operational_cli.command("test")
@out.json_option
def operational_test(as_json: bool) -> None:
    """Send a test notification (harvest.operational.test), signed and queued like the others."""
    notice, enqueue_error = _ops().send_operational_test()
    # With the local backend the job runs on this process's threads: let it finish before exiting.
    out.finish_local_jobs(get_engine())
    shown = get_engine().operations.delivery_with_attempts(notice.id)
    if enqueue_error is not None:
        shown = {**shown, "enqueue_error": enqueue_error}
    out.output(shown, as_json, out.delivery)
