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


def deliver_webhook_batch(batch_id: str, member_job_ids: list[str]) -> None:
    """Attempt the deliveries of a batch job (see :meth:`flask_harvest.jobs.rq.RqBackend.enqueue`).

    ``member_job_ids`` are the deliveries' own job ids; the delivery ids are read from them.
    """
    from ..webhooks.plugin import get_state
    from .base import delivery_id_of
    from .pool import current_pool
    from .rq import RqBackend, forget_batch

    state = get_state(current_app)
    if isinstance(state.backend, RqBackend):
        forget_batch(state.backend.queue, batch_id, member_job_ids)
    delivery_ids = [delivery_id_of(member) for member in member_job_ids]
    pool = current_pool()
    if pool is not None:
        pool.deliver_many(delivery_ids)
        return
    for delivery_id in delivery_ids:
        state.runner.run(delivery_id)
