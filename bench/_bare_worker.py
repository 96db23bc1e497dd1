"""S2's baseline worker: :class:`HarvestWorker` (no pool) running bare POST jobs until the queue is
empty. ``python -m bench._bare_worker QUEUE``."""

from __future__ import annotations

import sys

from rq import Queue

from flask_harvest.worker import HarvestWorker

from ._app import create_app
from ._services import redis_client


def main(queue_name: str) -> None:
    app = create_app()
    connection = redis_client()
    worker = HarvestWorker([Queue(queue_name, connection=connection)], connection=connection, app=app)
    worker.work(burst=True)


if __name__ == "__main__":
    main(sys.argv[1])
