"""The consumer portal: a blueprint the application mounts, where each of its customers (a tenant)
manages its own webhook endpoints and sees, filters and replays its own deliveries.

``app.register_blueprint(portal, url_prefix="/portal")``, then ``harvest.portal_url(tenant)`` for a
signed-in customer; see ``docs/portal.rst``. Each page module adds its routes to the blueprint of
:mod:`._core` when imported here.
"""

from __future__ import annotations

from . import deliveries, endpoints
from ._core import MAX_LINK_SECONDS, content_security_policy, portal, portal_url

__all__ = ["MAX_LINK_SECONDS", "content_security_policy", "deliveries", "endpoints", "portal", "portal_url"]
