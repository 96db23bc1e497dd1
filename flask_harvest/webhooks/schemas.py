"""Marshmallow schemas for every actuator request body and query string.

Unknown fields are refused (marshmallow's default), JSON numbers must be numbers and strings must
be strings, so a malformed request gets a 422 that names the field instead of a surprise later.
"""

from __future__ import annotations

from typing import Any

from marshmallow import Schema, ValidationError, fields, validate, validates_schema

from .operations import MAX_BULK_REPLAY

_ID = validate.Length(min=1, max=255)
_TEXT = validate.Length(max=2048)


class SubscriptionCreateSchema(Schema):
    id = fields.String(validate=_ID)
    target_url = fields.String(required=True, validate=_TEXT)
    event_topics = fields.List(
        fields.String(validate=_ID), required=True, validate=validate.Length(min=1, max=100)
    )
    secret = fields.String(validate=validate.Length(min=1, max=1024))
    description = fields.String(load_default="", validate=_TEXT)


class SubscriptionPatchSchema(Schema):
    target_url = fields.String(validate=_TEXT)
    event_topics = fields.List(fields.String(validate=_ID), validate=validate.Length(min=1, max=100))
    description = fields.String(validate=_TEXT)
    status = fields.String(validate=validate.OneOf(["active", "disabled"]))

    @validates_schema
    def _not_empty(self, data: dict[str, Any], **kwargs: Any) -> None:
        if not data:
            raise ValidationError("give at least one of target_url, event_topics, description, status")


class RotateSecretSchema(Schema):
    secret = fields.String(validate=validate.Length(min=1, max=1024))
    grace_seconds = fields.Float(validate=validate.Range(min=0, max=30 * 24 * 3600), allow_nan=False)


class ReplaySchema(Schema):
    """One delivery by ``log_id``, or a bulk replay by subscription and/or time window."""

    log_id = fields.String(validate=_ID)
    subscription_id = fields.String(validate=_ID)
    since = fields.AwareDateTime()
    until = fields.AwareDateTime()
    limit = fields.Integer(strict=True, load_default=100, validate=validate.Range(min=1, max=MAX_BULK_REPLAY))
    dry_run = fields.Boolean(load_default=False, truthy={True}, falsy={False})

    @validates_schema
    def _one_form(self, data: dict[str, Any], **kwargs: Any) -> None:
        bulk = {"subscription_id", "since", "until"} & data.keys()
        if "log_id" in data and bulk:
            raise ValidationError("give either log_id or a bulk selector, not both", "log_id")
        if "log_id" not in data and not bulk:
            raise ValidationError("give log_id, or subscription_id and/or since/until", "log_id")
        if "since" in data and "until" in data and data["since"] >= data["until"]:
            raise ValidationError("must be earlier than until", "since")


class DlqQuerySchema(Schema):
    limit = fields.Integer(load_default=50, validate=validate.Range(min=1, max=500))
    cursor = fields.String(validate=validate.Length(min=1, max=1024))
    subscription_id = fields.String(validate=_ID)
    topic = fields.String(validate=_ID)
