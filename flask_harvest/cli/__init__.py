"""``flask harvest ...``: operator commands, thin over the engine's services; one module per group.

Each command prints text for people or, with ``--json``, JSON for scripts. A failure exits with
status 1 (2 for misused options) and a one-line ``Error: ...`` reason, never a traceback. A secret is
printed only by ``subscriptions add`` and ``subscriptions rotate-secret``, once.

The group is a ``flask.commands`` entry point, so ``flask harvest ... --help`` finds it without
building the app; ``init_app`` also adds it to the app's own commands.
"""

from __future__ import annotations

from ._common import HarvestGroup
from .callbacks import completion_cli
from .deliveries import deliveries_cli
from .dlq import dlq_cli
from .event_types import event_types_cli
from .maintenance import init_db_command, purge_command, stats_command, sweep_command, worker_command
from .operational import operational_cli
from .outbox import outbox_cli
from .schedules import schedules_cli
from .subscriptions import subscriptions_cli
from .triggers import triggers_cli
from .workflows import workflows_cli

__all__ = ["harvest_cli"]

harvest_cli = HarvestGroup(
    "harvest",
    help="flask-harvest: outbound webhooks, durable workflows, their completion callbacks and "
    "completion triggers; the worker and maintenance.",
    aliases={"completion-deliveries": "completion-delivery", "callbacks": "completion-delivery"},
)
# Every group is listed in every app: in an app without workflows (or triggers) their commands say
# so in one line, whatever parts the app runs.
for command in (
    init_db_command,
    subscriptions_cli,
    event_types_cli,
    dlq_cli,
    deliveries_cli,
    operational_cli,
    purge_command,
    stats_command,
    sweep_command,
    worker_command,
    outbox_cli,
    completion_cli,
    workflows_cli,
    triggers_cli,
):
    harvest_cli.add_command(command)
workflows_cli.add_command(schedules_cli)
