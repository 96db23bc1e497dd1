"""The ``flask harvest worker`` process: an RQ worker that runs every kind of work in the app's
context, a pool that keeps many outbound attempts (webhooks and completion callbacks) in flight with
an adaptive limit per endpoint, the sweeper on a background thread, and a loop that starts a fresh
worker when Redis drops."""

from .loop import delivery_pool, run_worker, serve
from .pool import DeliveryPool
from .process import HarvestWorker

__all__ = ["DeliveryPool", "HarvestWorker", "delivery_pool", "run_worker", "serve"]
