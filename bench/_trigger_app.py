"""The benchmark's app with completion triggers on (``bench._app`` turns them off): a source
workflow that ends at once and a target it starts through one static trigger, for the
cross-shard trigger latency. Workers run it with::

    flask --app bench._trigger_app:create_app harvest worker --concurrency N

``BENCH_APP_CONFIG`` adds config keys, as for ``bench._app`` (``HARVEST_WORKFLOW_SHARDS``).
"""

from __future__ import annotations

import json
import os
from typing import Any

from flask import Flask

from flask_harvest import CompletionTrigger, Harvest
from flask_harvest.workflows import WorkflowContext

from ._app import CONFIG_ENV, base_config, db

harvest = Harvest(db=db)
SOURCE = "bench_trigger_source"
TARGET = "bench_trigger_target"


@harvest.workflow(SOURCE)
def trigger_source(ctx: WorkflowContext, value: Any) -> Any:
    """Ends at once: its terminal commit is where the measured latency starts."""
    return value


@harvest.workflow(TARGET)
def trigger_target(ctx: WorkflowContext, value: Any) -> Any:
    return value


#: The one trigger; its id is derived from the two names, the same in every process.
TRIGGER = harvest.completion_trigger(CompletionTrigger(SOURCE, TARGET))


def create_app(config: dict[str, Any] | None = None) -> Flask:
    app = Flask("bench_triggers")
    app.config.update(base_config())
    app.config.update(json.loads(os.environ.get(CONFIG_ENV, "{}")))
    app.config.update(config or {})
    db.init_app(app)
    harvest.init_app(app)
    return app
