"""The outbound HTTP layer: everything that POSTs to an outside URL goes through it, webhooks and
completion callbacks alike.

:mod:`.ssrf` (which targets are allowed), :mod:`.signing` (the signatures), :mod:`.transport` (one
POST with hard limits), :mod:`.admission` (the adaptive per-endpoint limit), :mod:`.attempt` (what
an answer means) and :mod:`.backoff` (when to try again, a retry policy as data). Pure cores but
the transport; importing this package loads none of them.
"""
