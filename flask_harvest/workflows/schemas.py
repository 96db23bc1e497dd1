"""Marshmallow schemas for the workflow HTTP API's request bodies and query strings.

Unknown fields are refused (marshmallow's default), strings must be strings and numbers numbers,
and no string may hold what a database cannot store (a NUL, a lone surrogate), so a malformed
request gets a 400 naming the field instead of an error later. Responses are the JSON forms of
:func:`~flask_harvest.workflows.service.execution_to_dict` and
:func:`~flask_harvest.workflows.service.step_to_dict`, the one source of those shapes.
"""

from __future__ import annotations

from typing import Any

from marshmallow import Schema, ValidationError, fields, validate

from .._input import text_problem
from ..errors import InvalidFieldError
from ._schema import NAME_LENGTH
from .models import ExecutionState, ForkMode, IdReusePolicy, encode_json
from .queues import MAX_CONCURRENCY, MAX_PRIORITY, MIN_PRIORITY

__all__ = [
    "CancelSchema",
    "ChildrenQuerySchema",
    "ForkSchema",
    "ListQuerySchema",
    "ResultQuerySchema",
    "StartSchema",
    "TerminateSchema",
]

#: The longest cancel or terminate reason accepted (it becomes the execution's error).
MAX_REASON_LENGTH = 2000
#: The longest cursor accepted (the cursors the API returns are far shorter).
MAX_CURSOR_LENGTH = 200
#: The most executions one page lists.
MAX_PAGE = 500


def _storable(value: str) -> None:
    # PostgreSQL refuses a NUL in text, and no driver can encode a lone surrogate.
    problem = text_problem(value)
    if problem is not None:
        raise ValidationError(problem)


def _text(max_length: int) -> list[Any]:
    return [validate.Length(min=1, max=max_length), _storable]


class JsonValueField(fields.Raw):
    """Any JSON value that comes back equal from the database (no ``NaN`` or ``Infinity``)."""

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> Any:
        try:
            encode_json(value, field=attr or "value")
        except InvalidFieldError as exc:
            raise ValidationError(exc.message) from None
        return value


class StartSchema(Schema):
    """``POST /workflows/<name>/start``."""

    #: The workflow's input; checked against ``HARVEST_WORKFLOW_MAX_INPUT_BYTES`` by the service
    #: (a 413), so it is taken as it comes here.
    input = fields.Raw(load_default=None, allow_none=True)
    workflow_id = fields.String(validate=_text(NAME_LENGTH))
    id_reuse_policy = fields.String(
        load_default=IdReusePolicy.ALLOW_DUPLICATE.value,
        validate=validate.OneOf([p.value for p in IdReusePolicy]),
    )
    #: Passed through to the service unchanged; completion callbacks say what they accept.
    completion_callbacks = JsonValueField(load_default=None, allow_none=True)
    #: The workflow queue, concurrency key and limit, and priority (default: the workflow's).
    queue = fields.String(validate=_text(NAME_LENGTH))
    concurrency_key = fields.String(validate=_text(NAME_LENGTH))
    concurrency_limit = fields.Integer(strict=True, validate=validate.Range(min=1, max=MAX_CONCURRENCY))
    priority = fields.Integer(strict=True, validate=validate.Range(min=MIN_PRIORITY, max=MAX_PRIORITY))


class CancelSchema(Schema):
    """``POST /workflows/<execution_id>/cancel``: an optional reason, recorded as the error."""

    reason = fields.String(validate=_text(MAX_REASON_LENGTH))


class TerminateSchema(CancelSchema):
    """``POST /workflows/<execution_id>/terminate``."""


class ListQuerySchema(Schema):
    """``GET /workflows?name=&state=&cursor=&limit=``."""

    name = fields.String(validate=_text(NAME_LENGTH))
    state = fields.String(validate=validate.OneOf([s.value for s in ExecutionState]))
    cursor = fields.String(validate=_text(MAX_CURSOR_LENGTH))
    limit = fields.Integer(load_default=50, validate=validate.Range(min=1, max=MAX_PAGE))


class ChildrenQuerySchema(Schema):
    """``GET /workflows/<execution_id>/children?cursor=&limit=``."""

    cursor = fields.String(validate=_text(MAX_CURSOR_LENGTH))
    limit = fields.Integer(load_default=50, validate=validate.Range(min=1, max=MAX_PAGE))


class ResultQuerySchema(Schema):
    """``GET /workflows/<execution_id>/result?wait=N&follow=true``: seconds to wait for the end, at
    most ``HARVEST_WORKFLOW_RESULT_MAX_WAIT_SECONDS`` (a longer wait is cut to it); ``follow``
    (default true) follows a continue-as-new chain to its last run."""

    wait = fields.Float(load_default=0.0, allow_nan=False, validate=validate.Range(min=0))
    follow = fields.Boolean(load_default=True)


class ForkSchema(Schema):
    """``POST /workflows/<execution_id>/fork``: the fork point and the mode (``recorded`` unless
    given). Whether ``from_step`` is past the source's recorded steps is the service's check."""

    from_step = fields.Integer(required=True, strict=True, validate=validate.Range(min=0))
    mode = fields.String(
        load_default=ForkMode.RECORDED.value, validate=validate.OneOf([m.value for m in ForkMode])
    )
