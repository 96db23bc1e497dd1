"""Blinker signals sent as deliveries and subscriptions change state.

Every signal is sent with the Flask app as sender. Delivery signals carry ``delivery`` (the
:class:`~flask_harvest.webhooks.models.DeliveryLog` as recorded), and those an attempt sends also
``attempt`` (the :class:`~flask_harvest.webhooks.models.DeliveryAttempt` with its ``elapsed_ms``,
or ``None`` when no request was made); subscription signals carry ``subscription_id``. Connect
receivers as usual::

    from flask_harvest import signals

    @signals.delivery_dead_lettered.connect
    def page_someone(app, delivery, **extra):
        ...
"""

from __future__ import annotations

from blinker import Namespace

_signals = Namespace()

#: The receiver answered 2xx.
delivery_succeeded = _signals.signal("harvest.delivery-succeeded")
#: An attempt failed and the delivery will be retried at ``delivery.next_attempt_at``.
delivery_failed = _signals.signal("harvest.delivery-failed")
#: An attempt dead-lettered the delivery (attempts exhausted, 410, an SSRF refusal, the attempt
#: limit was lowered, or its subscription stopped being active after the dispatch).
#: A failed enqueue dead-letters without this signal: ``dispatch`` raises ``EnqueueError`` instead.
delivery_dead_lettered = _signals.signal("harvest.delivery-dead-lettered")
#: The delivery was not sent: its subscription was inactive at dispatch, or has been removed.
delivery_skipped = _signals.signal("harvest.delivery-skipped")
#: A claimed delivery must wait ``seconds`` for its subscription's rate limit before it is sent
#: (no attempt is used): it waits in the worker, or goes back to its queue due then.
delivery_rate_limited = _signals.signal("harvest.delivery-rate-limited")
#: The receiver answered 410 Gone and its subscription was disabled.
subscription_disabled = _signals.signal("harvest.subscription-disabled")
#: The subscription reached the consecutive-failure threshold and was marked failed.
subscription_failed = _signals.signal("harvest.subscription-failed")
#: A workflow execution reached its terminal state (after the transaction committed, once per
#: execution): ``execution`` is the :class:`~flask_harvest.workflows.models.Execution`.
workflow_finished = _signals.signal("harvest.workflow-finished")
#: A completion trigger was evaluated for a source execution (after the transaction committed):
#: ``event`` is the :class:`~flask_harvest.triggers.firing.FireEvent`, ``outcome`` its outcome
#: (``started``, ``skipped``, ``deduped``, ``validation_failed``, ``payload_too_large``,
#: ``chain_depth_exceeded``): the ``harvest.completion_trigger.fires`` counter.
completion_trigger_fired = _signals.signal("harvest.completion-trigger-fired")
#: A completion trigger was skipped: ``trigger_id``, ``source_exec_id`` and ``reason``
#: (``condition_unmet``, ``condition_invalid``): the ``harvest.completion_trigger.skipped`` counter.
completion_trigger_skipped = _signals.signal("harvest.completion-trigger-skipped")

#: A completion callback was delivered (2xx); carries ``delivery`` (a
#: :class:`~flask_harvest.callbacks.CompletionDelivery`).
completion_callback_delivered = _signals.signal("harvest.completion-callback-delivered")
#: A completion-callback attempt failed and will be retried at ``delivery.next_attempt_at``.
completion_callback_failed = _signals.signal("harvest.completion-callback-failed")
#: A completion callback failed for good (a permanent 4xx, exhaustion, a refused target) and was
#: dead-lettered with the reason ``CallbackDeliveryExhausted``.
completion_callback_dead_lettered = _signals.signal("harvest.completion-callback-dead-lettered")
