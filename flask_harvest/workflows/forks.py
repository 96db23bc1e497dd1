"""Forks ("retry from step N"), the pure part: the fork's ``workflow_id`` and its arguments' checks.

A fork is a new run of the same workflow, with the source run's input, whose checkpoints before
its fork point are copies of the source's (see :doc:`forks`). The SQL is in ``_forks.py``; which
ends of a fork notify is :attr:`~flask_harvest.workflows.models.Execution.notifies`.
"""

from __future__ import annotations

import hashlib

from ..errors import InvalidFieldError
from .models import ForkMode

__all__ = ["check_from_step", "fork_workflow_id", "parse_fork_mode"]

#: Between a fork's source ``workflow_id`` and its own execution id.
FORK_SEPARATOR = ":fork:"
#: The longest ``workflow_id`` (the column's length; a test checks they agree).
NAME_LENGTH = 255
# How many hex digits of the source workflow_id's SHA-256 stand for its cut-off part.
_DIGEST_CHARS = 16


def fork_workflow_id(source_workflow_id: str, execution_id: str) -> str:
    """Return the ``workflow_id`` of the fork ``execution_id`` of a run of ``source_workflow_id``.

    ``{source}:fork:{execution_id}``: unique (the execution id is), so concurrent forks of one run
    never collapse into one. When that is longer than 255 characters, the source part is cut and
    followed by ``~`` and 16 hex digits of its SHA-256, so the result is the same for the same
    arguments and two long sources that differ only past the cut stay apart.
    """
    suffix = f"{FORK_SEPARATOR}{execution_id}"
    whole = f"{source_workflow_id}{suffix}"
    if len(whole) <= NAME_LENGTH:
        return whole
    digest = hashlib.sha256(source_workflow_id.encode("utf-8", "surrogatepass")).hexdigest()
    keep = NAME_LENGTH - len(suffix) - 1 - _DIGEST_CHARS
    return f"{source_workflow_id[:keep]}~{digest[:_DIGEST_CHARS]}{suffix}"


def parse_fork_mode(mode: object) -> ForkMode:
    """Return ``mode`` as a :class:`ForkMode` (a member or its value).

    :raises InvalidFieldError: it is neither.
    """
    if isinstance(mode, ForkMode):
        return mode
    if isinstance(mode, str):
        for member in ForkMode:
            if member.value == mode:
                return member
    choices = ", ".join(m.value for m in ForkMode)
    raise InvalidFieldError("mode", f"must be one of {choices}, not {mode!r:.80}")


def check_from_step(from_step: object, recorded: int | None = None) -> int:
    """Return ``from_step`` if it is a fork point: an integer from 0 to ``recorded`` (the source
    run's number of checkpoints, when known).

    :raises InvalidFieldError: it is not an integer, is negative, or is past ``recorded``.
    """
    if isinstance(from_step, bool) or not isinstance(from_step, int):
        raise InvalidFieldError("from_step", f"must be an integer, not {from_step!r:.80}")
    if from_step < 0:
        raise InvalidFieldError("from_step", f"must be 0 or more, not {from_step}")
    if recorded is not None and from_step > recorded:
        raise InvalidFieldError(
            "from_step",
            f"must be at most {recorded}, the number of steps the source run recorded, not {from_step}",
        )
    return from_step
