"""Marshmallow schemas for every actuator request body and query string.

Unknown fields are refused (marshmallow's default), JSON numbers must be numbers and strings must
be strings, so a malformed request gets a 422 that names the field instead of a surprise later.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from marshmallow import Schema, ValidationError, fields, validate, validates_schema

from .._input import text_problem, to_utc
from ..conditions import parse_condition
from ..errors import InvalidFieldError
from ..outbound.rate import MAX_BURST, MAX_PER_SECOND, MIN_PER_SECOND
from .models import (
    MAX_DESCRIPTION_LENGTH,
    MAX_HEADERS,
    MAX_ID_LENGTH,
    MAX_URL_LENGTH,
    validate_headers,
    validate_rate_limit,
)
from .operations import MAX_BULK_REPLAY, MAX_DLQ_PAGE, MAX_GRACE_SECONDS
from .ordering import OrderingPolicy
from .tenants import MAX_TENANT_LENGTH, validate_tenant

_ID = validate.Length(min=1, max=MAX_ID_LENGTH)
_URL = validate.Length(max=MAX_URL_LENGTH)
_DESCRIPTION = validate.Length(max=MAX_DESCRIPTION_LENGTH)


class StrictBoolean(fields.Boolean):
    """JSON ``true`` or ``false`` only.

    marshmallow's ``truthy={True}`` still takes ``1`` (``1 == True`` in a set), so a typo such as
    ``"dry_run": 1`` would run a bulk replay for real in a surprising way.
    """

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> bool:
        if not isinstance(value, bool):
            raise ValidationError("must be JSON true or false")
        return value


class Text(fields.String):
    """A string a database can keep and a socket can send: no NUL, no lone surrogate."""

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> str:
        text: str = super()._deserialize(value, attr, data, **kwargs)
        problem = text_problem(text)
        if problem is not None:
            raise ValidationError(problem)
        return text


class UtcDateTime(fields.AwareDateTime):
    """An ISO 8601 datetime with a time zone, converted to UTC; refused if that overflows."""

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> datetime:
        parsed: datetime = super()._deserialize(value, attr, data, **kwargs)
        try:
            return to_utc(parsed, attr or "datetime")
        except InvalidFieldError as exc:
            raise ValidationError(exc.message) from None


class PayloadFilter(fields.Dict):
    """A payload filter: a condition's JSON form, checked like a trigger's guard (operators,
    shapes, paths, caps); ``null`` for none."""

    def __init__(self, **kwargs: Any) -> None:
        description = (
            "a condition (the completion triggers' language: Eq, In, GreaterThan, All, Any, Not, "
            "Exists, ...): a delivery is made only of the payloads it holds on; null: every payload"
        )
        super().__init__(allow_none=True, metadata={"description": description}, **kwargs)

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> dict[str, Any]:
        # Checked here so the answer is the schema's 422 naming the field; the JSON form is kept
        # (the operations parse it again, as they do for any caller).
        try:
            parse_condition(value, field=attr or "payload_filter")
        except InvalidFieldError as exc:
            raise ValidationError(exc.message) from None
        return dict(value)


class Headers(fields.Dict):
    """Custom headers: names to values, checked as :func:`~.models.validate_headers` does."""

    def __init__(self, **kwargs: Any) -> None:
        description = (
            f"header names to values sent with every delivery (at most {MAX_HEADERS}; not secrets: "
            "they are shown wherever the subscription is)"
        )
        super().__init__(
            keys=fields.String(), values=fields.String(), metadata={"description": description}, **kwargs
        )

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> dict[str, str]:
        try:
            return validate_headers(value, attr or "headers")
        except InvalidFieldError as exc:
            raise ValidationError(exc.message) from None


class RateLimitField(fields.Dict):
    """A rate limit, ``{"per_second": <number>, "burst": <whole number>}``, checked as
    :func:`~.models.validate_rate_limit` does; ``null`` for none."""

    def __init__(self, **kwargs: Any) -> None:
        description = (
            f"at most per_second deliveries per second (from {MIN_PER_SECOND:g} to "
            f"{MAX_PER_SECOND:g}), with a burst of up to burst at once (1 to {MAX_BURST}), across "
            "every worker; a delivery over it waits its turn. null: no limit"
        )
        super().__init__(allow_none=True, metadata={"description": description}, **kwargs)

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> dict[str, Any]:
        try:
            validate_rate_limit(value, attr or "rate_limit")
        except InvalidFieldError as exc:
            raise ValidationError(exc.message) from None
        return dict(value)


def OrderingPolicyField() -> Text:
    """A subscription's ordering policy: ``block`` or ``skip``."""
    return Text(
        validate=validate.OneOf([policy.value for policy in OrderingPolicy]),
        metadata={
            "description": "what an ordering key does when its head is dead-lettered: block (wait "
            "for an operator to replay or skip it; the default) or skip (move on to the next)"
        },
    )


class Tenant(fields.String):
    """A tenant (:func:`~.tenants.validate_tenant`): printable, no spaces, at most 128 characters."""

    def __init__(self, **kwargs: Any) -> None:
        description = (
            f"the tenant (1 to {MAX_TENANT_LENGTH} printable characters without spaces) the "
            "subscription belongs to: it receives the events dispatched for that tenant only"
        )
        super().__init__(
            validate=validate.Length(min=1, max=MAX_TENANT_LENGTH),
            metadata={"description": description},
            **kwargs,
        )

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> str:
        text: str = super()._deserialize(value, attr, data, **kwargs)
        try:
            validate_tenant(text, attr or "tenant")
        except InvalidFieldError as exc:
            raise ValidationError(exc.message) from None
        return text


class SubscriptionCreateSchema(Schema):
    id = Text(validate=_ID)
    target_url = Text(required=True, validate=_URL)
    event_topics = fields.List(Text(validate=_ID), required=True, validate=validate.Length(min=1, max=100))
    secret = Text(validate=validate.Length(min=1, max=1024))
    description = Text(load_default="", validate=_DESCRIPTION)
    payload_filter = PayloadFilter()
    headers = Headers()
    rate_limit = RateLimitField()
    ordering_policy = OrderingPolicyField()
    tenant = Tenant()


class SubscriptionPatchSchema(Schema):
    target_url = Text(validate=_URL)
    event_topics = fields.List(Text(validate=_ID), validate=validate.Length(min=1, max=100))
    description = Text(validate=_DESCRIPTION)
    status = Text(validate=validate.OneOf(["active", "disabled"]))
    #: ``null`` removes the filter.
    payload_filter = PayloadFilter()
    #: Replaces every custom header; ``{}`` removes them.
    headers = Headers()
    #: ``null`` removes the rate limit.
    rate_limit = RateLimitField()
    ordering_policy = OrderingPolicyField()

    @validates_schema
    def _not_empty(self, data: dict[str, Any], **kwargs: Any) -> None:
        if not data:
            raise ValidationError(
                "give at least one of target_url, event_topics, description, status, payload_filter, "
                "headers, rate_limit, ordering_policy"
            )


class EmptySchema(Schema):
    """A write that takes no field: the body is ``{}``, required so that a cross-site form
    cannot make the write."""


class RotateSecretSchema(Schema):
    secret = Text(validate=validate.Length(min=1, max=1024))
    grace_seconds = fields.Float(validate=validate.Range(min=0, max=MAX_GRACE_SECONDS), allow_nan=False)


class ReplaySchema(Schema):
    """One delivery by ``log_id``, or a bulk replay by subscription and/or time window.

    The two forms do not mix: ``dry_run`` and ``limit`` belong to the bulk form only, so a single
    replay that carries them is refused rather than silently run for real.
    """

    log_id = Text(validate=_ID)
    subscription_id = Text(validate=_ID)
    since = UtcDateTime()
    until = UtcDateTime()
    limit = fields.Integer(strict=True, load_default=100, validate=validate.Range(min=1, max=MAX_BULK_REPLAY))
    dry_run = StrictBoolean(load_default=False)

    @validates_schema(pass_original=True)
    def _one_form(self, data: dict[str, Any], original: Any, **kwargs: Any) -> None:
        bulk = {"subscription_id", "since", "until"} & data.keys()
        if "log_id" in data:
            # The bulk-only fields have defaults, so they are looked for in what was sent.
            given = set(original) if isinstance(original, dict) else set()
            mixed = sorted(bulk | ({"dry_run", "limit"} & given))
            if mixed:
                raise ValidationError(
                    f"a single replay takes log_id alone, without {', '.join(mixed)}: those belong "
                    "to a bulk replay (subscription_id and/or since/until, without log_id)",
                    "log_id",
                )
            return
        if not bulk:
            raise ValidationError("give log_id, or subscription_id and/or since/until", "log_id")
        if "since" in data and "until" in data and data["since"] >= data["until"]:
            raise ValidationError("must be earlier than until", "since")


class DlqQuerySchema(Schema):
    limit = fields.Integer(load_default=50, validate=validate.Range(min=1, max=MAX_DLQ_PAGE))
    cursor = Text(validate=validate.Length(min=1, max=1024))
    subscription_id = Text(validate=_ID)
    topic = Text(validate=_ID)
    #: The scope, as on every route (see the actuator).
    tenant = Tenant()
