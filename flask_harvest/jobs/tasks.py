"""Job functions: importable, module-level, taking ids only (RQ pickles the reference)."""

from __future__ import annotations

from flask import current_app


def deliver_webhook(delivery_id: str) -> str | None:
    """Make one attempt of a delivery in the current app; return the state it ended in.

    Workers push the app context around each job (see :class:`flask_harvest.jobs.rq.HarvestWorker`).
    """
    from ..webhooks.plugin import get_state

    state = get_state(current_app)
    outcome = state.runner.run(delivery_id)
    return outcome.value if outcome is not None else None
