"""Job functions: importable, module-level, taking ids only (RQ pickles the reference)."""

from __future__ import annotations

from flask import current_app


def deliver_webhook(delivery_id: str) -> str | None:
    """Make one attempt of a delivery in the current app.

    Workers push the app context around each job (see :class:`flask_harvest.jobs.rq.HarvestWorker`).
    Returns the state the delivery is in when the job ends (``inflight`` when a worker's pool took
    the attempt), or ``None`` when there was nothing to do.
    """
    from ..webhooks.plugin import get_state
    from .pool import current_pool

    pool = current_pool()
    # In a pooled worker the job only claims the row and starts the attempt on the pool.
    outcome = (
        pool.deliver(delivery_id) if pool is not None else get_state(current_app).runner.run(delivery_id)
    )
    return outcome.value if outcome is not None else None
