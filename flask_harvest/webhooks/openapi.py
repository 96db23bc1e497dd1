"""The actuator's OpenAPI 3 description, generated from its marshmallow schemas with apispec.

Served at ``GET <HARVEST_ACTUATOR_PREFIX>/openapi.json`` (behind the same access check as every
actuator route), for people reading the API and for client generators. The request shapes come
from :mod:`flask_harvest.webhooks.schemas`, so the document cannot drift from what is validated.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from apispec import APISpec
from apispec.ext.marshmallow import MarshmallowPlugin

from .._version import __version__
from .catalog import EventType
from .operations import ReplayOutcome
from .schemas import (
    DlqQuerySchema,
    EmptySchema,
    ReplaySchema,
    RotateSecretSchema,
    SubscriptionCreateSchema,
    SubscriptionPatchSchema,
)
from .tenants import MAX_TENANT_LENGTH

_ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["code", "message"],
            "properties": {
                "code": {"type": "string"},
                "message": {"type": "string"},
                "fields": {"type": "object", "additionalProperties": True},
            },
        }
    },
}
_OBJECT = {"type": "object", "additionalProperties": True}
_STRINGS = {"type": "array", "items": {"type": "string"}}
_REPLAY_RESULT = {
    "type": "object",
    "required": ["dry_run", "count", "delivery_ids", "results"],
    "properties": {
        "dry_run": {"type": "boolean"},
        "count": {"type": "integer", "description": "how many were replayed (in a dry run: would be)"},
        "delivery_ids": {**_STRINGS, "description": "the deliveries replayed, newest first"},
        "results": {
            "type": "array",
            "description": "each selected delivery's outcome: one that left the dead-letter queue "
            "(or was deleted) after the selection was read is reported with the reason",
            "items": {
                "type": "object",
                "required": ["delivery_id", "outcome"],
                "properties": {
                    "delivery_id": {"type": "string"},
                    "outcome": {"type": "string", "enum": [o.value for o in ReplayOutcome]},
                    "reason": {"type": "string", "description": "why it was not replayed"},
                },
            },
        },
        "warning": {"type": "string", "description": "replayed, but the jobs could not be queued"},
    },
}


_EVENT_TYPE = {
    "type": "object",
    "required": ["name", "description", "version", "schema", "example"],
    "properties": {
        "name": {"type": "string", "description": "the topic events of this type are dispatched under"},
        "description": {"type": "string"},
        "version": {"type": "integer", "minimum": 1},
        "schema": {"description": "the JSON Schema of the payload (an object, or true/false)"},
        "example": {"description": "a payload that matches the schema"},
    },
}
_WARNINGS = {
    "type": "array",
    "items": {"type": "string"},
    "description": "present when a topic pattern selects no event type in the catalog (a warning: "
    "the subscription was saved)",
}


def _json(schema: Any) -> dict[str, Any]:
    return {"content": {"application/json": {"schema": schema}}}


def _responses(
    ok: int,
    description: str,
    schema: Any | None = None,
    *,
    errors: tuple[int, ...],
    conflict: str = "the id is taken, or the delivery is not dead-lettered",
) -> dict[str, Any]:
    refusals = {401: "no or a wrong bearer token", 403: "the actuator is closed, or the authorizer refused"}
    reasons = {
        400: "the body is not a JSON object (or nested too deeply)",
        404: "no such subscription, delivery or event type",
        409: conflict,
        413: "the body is larger than 64 KiB",
        415: "the body is not JSON",
        422: "a field or query parameter has a wrong value",
        500: "a fault of the server (the authorizer raised, a configuration error); the cause is logged",
        503: "the store is unavailable",
        **refusals,
    }
    answers: dict[str, Any] = {str(ok): {"description": description, **(_json(schema) if schema else {})}}
    for status in (*errors, 401, 403, 500, 503):
        answers[str(status)] = {
            "description": reasons[status],
            **_json({"$ref": "#/components/schemas/Error"}),
        }
    return answers


_ID = {"type": "string", "minLength": 1, "maxLength": 255, "pattern": "^[^/]+$"}


def _id_parameter(name: str) -> dict[str, Any]:
    return {"name": name, "in": "path", "required": True, "schema": _ID}


#: The tenant scope every route of subscriptions and deliveries takes.
_TENANT_PARAMETER = {
    "name": "tenant",
    "in": "query",
    "required": False,
    "description": f"read and change only this tenant's subscriptions and deliveries (printable, no "
    f"spaces, at most {MAX_TENANT_LENGTH} characters); another tenant's answer 404 as absent ones",
    "schema": {"type": "string", "minLength": 1, "maxLength": MAX_TENANT_LENGTH},
}
#: The paths whose routes take no tenant scope (the event catalog and this document are the app's).
_UNSCOPED = ("/event-types", "/event-types/{name}", "/openapi.json", "/dlq")


def _add_tenant_scope(document: dict[str, Any]) -> None:
    """Add the ``tenant`` query parameter, and its 422, to every scoped operation (``/dlq`` has it
    from its query schema)."""
    for path, operations in document["paths"].items():
        if path in _UNSCOPED:
            continue
        for operation in operations.values():
            operation["parameters"] = [*operation.get("parameters", []), dict(_TENANT_PARAMETER)]
            operation["responses"].setdefault(
                "422",
                {
                    "description": "a field or query parameter has a wrong value",
                    **_json({"$ref": "#/components/schemas/Error"}),
                },
            )


def build_openapi(prefix: str, event_types: Sequence[EventType] = ()) -> dict[str, Any]:
    """Return the actuator's OpenAPI 3.0 document, with paths under ``prefix``.

    :param event_types: the event catalog, listed under ``x-webhooks`` (the 3.0 form of 3.1's
        ``webhooks``, as ReDoc reads it): one ``post`` per type, its body the type's JSON Schema
        and example, so a subscriber's tooling can read what each topic sends.
    """
    spec = APISpec(
        title="flask-harvest actuator",
        version=__version__,
        openapi_version="3.0.3",
        plugins=[MarshmallowPlugin()],
        info={"description": "Operators' JSON API for outbound webhooks (see the operations guide)."},
        servers=[{"url": prefix.rstrip("/") or "/"}],
    )
    spec.components.security_scheme("bearer", {"type": "http", "scheme": "bearer"})
    spec.components.schema("Error", _ERROR)
    spec.components.schema("ReplayResult", _REPLAY_RESULT)
    spec.components.schema("EventType", _EVENT_TYPE)
    spec.components.schema(
        "Subscription",
        {"type": "object", "additionalProperties": True, "properties": {"warnings": _WARNINGS}},
    )
    for name, schema in (
        ("SubscriptionCreate", SubscriptionCreateSchema),
        ("SubscriptionPatch", SubscriptionPatchSchema),
        ("RotateSecret", RotateSecretSchema),
        ("Empty", EmptySchema),
        ("Replay", ReplaySchema),
    ):
        spec.components.schema(name, schema=schema)

    def request_body(name: str) -> dict[str, Any]:
        return {"required": True, **_json({"$ref": f"#/components/schemas/{name}"})}

    sub = [_id_parameter("subscription_id")]
    result = {"$ref": "#/components/schemas/ReplayResult"}
    subscription = {"$ref": "#/components/schemas/Subscription"}
    event_type = {"$ref": "#/components/schemas/EventType"}
    spec.path(
        path="/dlq",
        operations={
            "get": {
                "summary": "Dead-lettered deliveries, newest first; X-Next-Cursor continues",
                "parameters": [{"in": "query", "schema": DlqQuerySchema}],
                "responses": _responses(
                    200, "a page of deliveries", {"type": "array", "items": _OBJECT}, errors=(422,)
                ),
            }
        },
    )
    spec.path(
        path="/replay",
        operations={
            "post": {
                "summary": "Replay one delivery (log_id) or many (subscription and/or window)",
                "description": "A single replay of a delivery not in the dead-letter queue answers "
                "409; a bulk replay answers what became of each delivery it selected.",
                "requestBody": request_body("Replay"),
                "responses": {
                    **_responses(200, "what was replayed", result, errors=(400, 404, 409, 413, 415, 422)),
                    "202": {"description": "replayed, not queued yet", **_json(result)},
                },
            }
        },
    )
    spec.path(
        path="/deliveries/{delivery_id}",
        operations={
            "get": {
                "summary": "One delivery and its attempts",
                "parameters": [_id_parameter("delivery_id")],
                "responses": _responses(200, "the delivery", _OBJECT, errors=(404,)),
            }
        },
    )
    spec.path(
        path="/deliveries/{delivery_id}/skip",
        operations={
            "post": {
                "summary": "Skip a dead-lettered delivery (never sent) and release its ordering key",
                "description": "Send {}. The next delivery of its ordering key, if any, is queued.",
                "parameters": [_id_parameter("delivery_id")],
                "requestBody": request_body("Empty"),
                "responses": _responses(
                    200, "the skipped delivery", _OBJECT, errors=(400, 404, 409, 413, 415, 422)
                ),
            }
        },
    )
    spec.path(
        path="/stats",
        operations={
            "get": {"summary": "Delivery counts", "responses": _responses(200, "counts", _OBJECT, errors=())}
        },
    )
    spec.path(
        path="/subscriptions",
        operations={
            "get": {
                "summary": "Every subscription, oldest first",
                "responses": _responses(200, "subscriptions", {"type": "array", "items": _OBJECT}, errors=()),
            },
            "post": {
                "summary": "Create a subscription; the answer shows its secret, once",
                "requestBody": request_body("SubscriptionCreate"),
                "responses": _responses(
                    201, "the subscription and its secret", subscription, errors=(400, 409, 413, 415, 422)
                ),
            },
        },
    )
    spec.path(
        path="/subscriptions/{subscription_id}",
        operations={
            "get": {
                "summary": "One subscription (never its secret)",
                "parameters": sub,
                "responses": _responses(200, "the subscription", _OBJECT, errors=(404,)),
            },
            "patch": {
                "summary": "Change URL, topics, description, status, payload filter, headers, rate limit "
                "or ordering policy",
                "description": "A payload_filter of null removes the filter; headers replace every "
                "custom header ({} removes them); a rate_limit of null removes the rate limit.",
                "parameters": sub,
                "requestBody": request_body("SubscriptionPatch"),
                "responses": _responses(
                    200, "the subscription", subscription, errors=(400, 404, 413, 415, 422)
                ),
            },
            "delete": {
                "summary": "Remove a subscription; its delivery logs stay",
                "parameters": sub,
                "responses": _responses(204, "removed", errors=(404,)),
            },
        },
    )
    spec.path(
        path="/subscriptions/{subscription_id}/blocked-keys",
        operations={
            "get": {
                "summary": "Ordering keys waiting for an operator: their head is dead-lettered",
                "parameters": sub,
                "responses": _responses(
                    200,
                    "ordering_key, delivery_id, waiting",
                    {"type": "array", "items": _OBJECT},
                    errors=(404,),
                ),
            }
        },
    )
    spec.path(
        path="/subscriptions/{subscription_id}/rotate-secret",
        operations={
            "post": {
                "summary": "A new secret (send {} for the defaults); the old one signs during the grace",
                "parameters": sub,
                "requestBody": request_body("RotateSecret"),
                "responses": _responses(
                    200, "the subscription and its new secret", _OBJECT, errors=(400, 404, 413, 415, 422)
                ),
            }
        },
    )
    spec.path(
        path="/operational",
        operations={
            "get": {
                "summary": "The operational endpoint: its subscription and latest notifications",
                "description": "The endpoint is the application's own: in a tenant's scope it answers 404.",
                "responses": _responses(200, "its status", _OBJECT, errors=(404,)),
            }
        },
    )
    spec.path(
        path="/operational/test",
        operations={
            "post": {
                "summary": "Send a test notification to the operational endpoint (send {})",
                "requestBody": request_body("Empty"),
                "responses": _responses(
                    202,
                    "the test notification's delivery, queued",
                    _OBJECT,
                    errors=(400, 404, 409, 413, 415, 422),
                    conflict="no operational endpoint is configured, or it is turned off",
                ),
            }
        },
    )
    spec.path(
        path="/event-types",
        operations={
            "get": {
                "summary": "The event catalog: every event type, by name",
                "responses": _responses(
                    200, "event types", {"type": "array", "items": event_type}, errors=()
                ),
            }
        },
    )
    spec.path(
        path="/event-types/{name}",
        operations={
            "get": {
                "summary": "One event type: description, version, schema and example",
                "parameters": [_id_parameter("name")],
                "responses": _responses(200, "the event type", event_type, errors=(404,)),
            }
        },
    )
    spec.path(
        path="/openapi.json",
        operations={
            "get": {"summary": "This document", "responses": _responses(200, "OpenAPI 3", _OBJECT, errors=())}
        },
    )
    document: dict[str, Any] = spec.to_dict()
    if event_types:
        document["x-webhooks"] = {
            event_type.name: {
                "post": {
                    "summary": event_type.description,
                    "requestBody": {
                        "required": True,
                        "content": {
                            "application/json": {"schema": event_type.schema, "example": event_type.example}
                        },
                    },
                    "responses": {"2XX": {"description": "received"}},
                }
            }
            for event_type in event_types
        }
    for name in ("SubscriptionCreate", "SubscriptionPatch", "RotateSecret", "Replay", "Empty"):
        # The schemas refuse unknown fields (marshmallow's RAISE); apispec says so only from 6.1.
        document["components"]["schemas"][name]["additionalProperties"] = False
    document["security"] = [{"bearer": []}]
    _add_tenant_scope(document)
    return document
