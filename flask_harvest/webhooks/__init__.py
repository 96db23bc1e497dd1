"""Outbound webhooks: subscriptions, stores, dispatch and delivery."""
