"""The ``/actuator/webhooks`` blueprint: JSON endpoints for on-call operators.

Deny by default: with no ``HARVEST_ACTUATOR_TOKEN`` and no authorizer registered with
:meth:`~flask_harvest.extension.Harvest.actuator_authorizer`, every route
answers 403. Secrets appear only in the responses that create a subscription or rotate its secret.

Every route of subscriptions, deliveries and the operational endpoint takes a tenant scope,
``?tenant=<tenant>``: it then reads and changes that tenant's subscriptions and deliveries only, and
answers 404 for another tenant's, as for one that does not exist (the operational endpoint, the
application's own, is absent from every tenant's scope). Without it a route sees every tenant's
rows.
"""

from __future__ import annotations

import logging
from typing import Any

from flask import Blueprint, Response, jsonify, request

from .._app import get_engine
from ..errors import InvalidFieldError
from ..http.admin import install_admin_api, load_body, load_query, no_such_route
from .models import WebhookSubscriptionStatus
from .openapi import build_openapi
from .ordering import DEFAULT_ORDERING_POLICY
from .schemas import (
    DlqQuerySchema,
    EmptySchema,
    ReplaySchema,
    RotateSecretSchema,
    SubscriptionCreateSchema,
    SubscriptionPatchSchema,
)
from .tenants import ALL_TENANTS, TenantScope, validate_tenant

log = logging.getLogger(__name__)
actuator = Blueprint("harvest_actuator", __name__)

install_admin_api(actuator, realm="harvest-actuator")


def _scope() -> TenantScope:
    """The request's tenant scope: ``?tenant=<tenant>``, or every tenant without it.

    :raises InvalidFieldError: (422) the tenant is not a valid tenant, or is given twice.
    """
    given = request.args.getlist("tenant")
    if not given:
        return ALL_TENANTS
    if len(given) > 1:
        raise InvalidFieldError("tenant", "give one tenant, once")
    return validate_tenant(given[0])


# -- deliveries ------------------------------------------------------------------------------------


@actuator.get("/dlq")
def list_dlq() -> Response:
    """Dead-lettered deliveries, newest first; ``X-Next-Cursor`` continues the listing."""
    query = load_query(DlqQuerySchema())
    query.pop("tenant", None)  # the scope, read (and checked) as on every route
    page, next_cursor = get_engine().operations.dlq_page(**query, tenant=_scope())
    response = jsonify([d.to_dict() for d in page])
    if next_cursor:
        response.headers["X-Next-Cursor"] = next_cursor
    return response


@actuator.post("/replay")
def replay() -> tuple[Response, int]:
    """Replay one dead-lettered delivery (``log_id``) or many (subscription and/or window); a bulk
    replay answers each selected delivery's outcome, never an error half-way."""
    scope = _scope()
    body = load_body(ReplaySchema())
    engine = get_engine()
    if "log_id" in body:
        result = engine.operations.replay(body["log_id"], tenant=scope)
    else:
        result = engine.operations.replay_many(
            subscription_id=body.get("subscription_id"),
            since=body.get("since"),
            until=body.get("until"),
            limit=body["limit"],
            dry_run=body["dry_run"],
            tenant=scope,
        )
    return jsonify(result.to_dict()), 202 if result.enqueue_error else 200


@actuator.get("/deliveries/<delivery_id>")
def show_delivery(delivery_id: str) -> Response:
    return jsonify(get_engine().operations.delivery_with_attempts(delivery_id, tenant=_scope()))


@actuator.post("/deliveries/<delivery_id>/skip")
def skip_delivery(delivery_id: str) -> Response:
    """Give up on a dead-lettered delivery (it becomes skipped, never sent) and release its
    ordering key. A JSON body is required, even if empty ({}), as for every write."""
    scope = _scope()
    load_body(EmptySchema())
    return jsonify(get_engine().operations.skip(delivery_id, tenant=scope).to_dict())


@actuator.get("/subscriptions/<subscription_id>/blocked-keys")
def blocked_keys(subscription_id: str) -> Response:
    """The ordering keys of a subscription waiting for an operator (their head is dead-lettered)."""
    blocked = get_engine().operations.blocked_keys(subscription_id, tenant=_scope())
    return jsonify([k.to_dict() for k in blocked])


@actuator.get("/stats")
def stats() -> Response:
    return jsonify(get_engine().operations.stats(tenant=_scope()))


# -- subscriptions ---------------------------------------------------------------------------------


@actuator.get("/subscriptions")
def list_subscriptions() -> Response:
    return jsonify([s.to_dict() for s in get_engine().operations.list_subscriptions(tenant=_scope())])


@actuator.post("/subscriptions")
def create_subscription() -> tuple[Response, int]:
    scope = _scope()
    body = load_body(SubscriptionCreateSchema())
    tenant = body.get("tenant")
    if scope is not ALL_TENANTS:
        # A scoped caller creates in its own tenant; naming another would step out of the scope.
        if "tenant" in body and tenant != scope:
            raise InvalidFieldError(
                "tenant", "must be the tenant of the request's scope (?tenant=), or left out"
            )
        tenant = scope
    operations = get_engine().operations
    created = operations.create_subscription(
        target_url=body["target_url"],
        event_topics=body["event_topics"],
        secret=body.get("secret"),
        subscription_id=body.get("id"),
        description=body["description"],
        payload_filter=body.get("payload_filter"),
        headers=body.get("headers"),
        rate_limit=body.get("rate_limit"),
        ordering_policy=body.get("ordering_policy", DEFAULT_ORDERING_POLICY),
        tenant=tenant,
    )
    # The one response that shows the secret: the caller must store it now.
    shown = {**created.subscription.to_dict(), "secret": created.secret}
    return jsonify(_with_warnings(shown, operations.topic_warnings(created.subscription.event_topics))), 201


@actuator.get("/subscriptions/<subscription_id>")
def show_subscription(subscription_id: str) -> Response:
    return jsonify(get_engine().operations.get_subscription(subscription_id, tenant=_scope()).to_dict())


@actuator.patch("/subscriptions/<subscription_id>")
def update_subscription(subscription_id: str) -> Response:
    scope = _scope()
    body = load_body(SubscriptionPatchSchema())
    status = body.get("status")
    operations = get_engine().operations
    updated = operations.update_subscription(
        subscription_id,
        target_url=body.get("target_url"),
        event_topics=body.get("event_topics"),
        description=body.get("description"),
        status=WebhookSubscriptionStatus(status) if status else None,
        payload_filter=body.get("payload_filter"),
        # An explicit null removes the filter; leaving the key out keeps it.
        remove_payload_filter="payload_filter" in body and body["payload_filter"] is None,
        headers=body.get("headers"),
        rate_limit=body.get("rate_limit"),
        remove_rate_limit="rate_limit" in body and body["rate_limit"] is None,
        ordering_policy=body.get("ordering_policy"),
        tenant=scope,
    )
    return jsonify(_with_warnings(updated.to_dict(), operations.topic_warnings(body.get("event_topics"))))


def _with_warnings(shown: dict[str, Any], warnings: list[str]) -> dict[str, Any]:
    """A subscription's answer, with ``warnings`` when some topic pattern selects no event type."""
    return {**shown, "warnings": warnings} if warnings else shown


@actuator.delete("/subscriptions/<subscription_id>")
def remove_subscription(subscription_id: str) -> tuple[str, int]:
    get_engine().operations.remove_subscription(subscription_id, tenant=_scope())
    return "", 204


@actuator.post("/subscriptions/<subscription_id>/rotate-secret")
def rotate_secret(subscription_id: str) -> Response:
    # A JSON body is required, even if empty ({}): a cross-site form cannot send one, so a
    # cookie-trusting authorizer cannot be tricked into rotating a secret.
    scope = _scope()
    body = load_body(RotateSecretSchema())
    rotated = get_engine().operations.rotate_secret(
        subscription_id, new_secret=body.get("secret"), grace_seconds=body.get("grace_seconds"), tenant=scope
    )
    # The one response that shows the new secret.
    return jsonify({**rotated.subscription.to_dict(), "secret": rotated.secret})


# -- operational webhooks --------------------------------------------------------------------------


@actuator.get("/operational")
def operational_status() -> Response:
    """The operational endpoint: configured or not, its reserved subscription, latest notifications."""
    return jsonify(get_engine().operations.operational_status(tenant=_scope()))


@actuator.post("/operational/test")
def operational_test() -> tuple[Response, int]:
    """Send a test notification to the operational endpoint (the body is ``{}``)."""
    scope = _scope()
    load_body(EmptySchema())
    notice, enqueue_error = get_engine().operations.send_operational_test(tenant=scope)
    shown = notice.to_dict()
    return jsonify(shown if enqueue_error is None else {**shown, "enqueue_error": enqueue_error}), 202


# -- the event catalog ------------------------------------------------------------------------------


@actuator.get("/event-types")
def list_event_types() -> Response:
    """Every event type in the catalog, by name: its description, version, schema and example."""
    return jsonify([t.to_dict() for t in get_engine().operations.event_types()])


@actuator.get("/event-types/<name>")
def show_event_type(name: str) -> Response:
    return jsonify(get_engine().operations.event_type(name).to_dict())


@actuator.get("/openapi.json")
def openapi() -> Response:
    """This API's OpenAPI 3 description, generated from the request schemas."""
    engine = get_engine()
    return jsonify(build_openapi(engine.settings.actuator_prefix, engine.operations.event_types()))


@actuator.route("/", defaults={"path": ""}, methods=["GET", "POST", "PUT", "PATCH", "DELETE"])
@actuator.route("/<anypath:path>", methods=["GET", "POST", "PUT", "PATCH", "DELETE"])
def unknown_route(path: str) -> tuple[Response, int]:
    """Anything else under the prefix, after the auth check like every route: a JSON 404, or 405
    with ``Allow`` for a method the path does not take."""
    return no_such_route()
