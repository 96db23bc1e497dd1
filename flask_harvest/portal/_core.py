"""The portal blueprint and what every page shares: the link that opens it, the session that
scopes it to one tenant, CSRF, the frame policy and security headers, the theme, errors and
rendering.

Page modules (:mod:`.endpoints`, :mod:`.deliveries`) add their routes to :data:`portal`. Every
page reads and changes rows through :class:`~flask_harvest.webhooks.operations.WebhookOperations`
with ``tenant=`` the session's tenant (:func:`tenant`), never anything the request names: another
tenant's row is exactly as absent as one that does not exist.
"""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import urlsplit

from flask import Blueprint, Response, current_app, g, redirect, render_template, request, url_for
from flask.blueprints import BlueprintSetupState
from marshmallow import ValidationError
from werkzeug.exceptions import HTTPException
from werkzeug.wrappers import Response as BaseResponse

from .._app import get_engine
from ..config import KEYS, MAX_PORTAL_LINK_SECONDS, PORTAL_COLORS, Settings, portal_frame_ancestors
from ..dashboard.when import when_html
from ..errors import ConfigurationError, HarvestError, InvalidFieldError, SubscriptionNotFoundError
from ..http import pages
from ..http.forms import posted_form, read_form
from ..webhooks.tenants import validate_tenant
from ._session import (
    COOKIE_NAME,
    PortalSession,
    csrf_matches,
    dump_session,
    load_session,
    make_link_token,
    read_link_token,
)

portal = Blueprint(
    "harvest_portal",
    __name__,
    # The console's templates and stylesheet: the portal's pages are written in the same style.
    template_folder="../dashboard/templates",
    static_folder="../dashboard/static",
    static_url_path="/static",
)
portal.add_app_template_filter(when_html, "harvest_when")

#: Endpoints open without a session: the link itself, the stylesheets.
_OPEN_ENDPOINTS = frozenset({"harvest_portal.static", "harvest_portal.theme_css", "harvest_portal.open_link"})
#: The longest life a link can be given: a link is a credential in an address bar.
MAX_LINK_SECONDS = MAX_PORTAL_LINK_SECONDS


def _check_key(state: BlueprintSetupState) -> None:
    app = state.app
    if not (app.config.get(KEYS["portal_secret_key"]) or app.secret_key):
        raise ConfigurationError(
            f"the portal needs {KEYS['portal_secret_key']} or app.secret_key to sign its links and "
            "sessions: set a long random value before registering it"
        )


portal.record_once(_check_key)


def _key() -> str | bytes:
    key: str | bytes | None = get_engine().settings.portal_secret_key or current_app.secret_key
    if not key:
        raise ConfigurationError(f"the portal needs {KEYS['portal_secret_key']} or app.secret_key")
    return key


def portal_url(tenant: str, *, expires_in: float | None = None) -> str:
    """Return a link that opens the portal for ``tenant`` (an absolute URL; build it inside a
    request, or with ``SERVER_NAME`` set). Anyone holding it sees that tenant's endpoints and
    deliveries until it expires, so hand it only to that tenant's signed-in users.

    :param expires_in: seconds the link can be opened (default ``HARVEST_PORTAL_LINK_SECONDS``,
        at most 7 days); the session it opens lasts ``HARVEST_PORTAL_SESSION_SECONDS``.
    :raises InvalidFieldError: ``tenant`` is not a tenant id, or ``expires_in`` is out of range.
    :raises ConfigurationError: the portal blueprint is not registered on the app.
    """
    chosen = validate_tenant(tenant)
    if chosen is None:
        raise InvalidFieldError("tenant", "is required: a portal shows one tenant's rows")
    seconds = get_engine().settings.portal_link_seconds if expires_in is None else expires_in
    if (
        isinstance(seconds, bool)
        or not isinstance(seconds, int | float)
        or not 0 < seconds <= MAX_LINK_SECONDS
    ):
        raise InvalidFieldError("expires_in", f"must be between 0 and {MAX_LINK_SECONDS} seconds")
    if not any(bp is portal for bp in current_app.iter_blueprints()):
        raise ConfigurationError(
            "register the portal first: app.register_blueprint(portal, url_prefix='/portal')"
        )
    token = make_link_token(chosen, _key(), expires_at=time.time() + seconds)
    return url_for("harvest_portal.open_link", token=token, _external=True)


# -- the session -----------------------------------------------------------------------------------


def current_session() -> PortalSession:
    """The session of the current request (its guard made sure there is one)."""
    session: PortalSession = g.harvest_portal_session
    return session


def tenant() -> str:
    """The one tenant the current request may see."""
    return current_session().tenant


def _start_session(session: PortalSession) -> None:
    g.harvest_portal_session = session
    g.harvest_portal_set_cookie = True


@portal.get("/open")
def open_link() -> BaseResponse | tuple[str, int]:
    """Open the portal from a link: a new session for the link's tenant, then the index (the token
    leaves the address bar, and no page refers to it)."""
    token = request.args.get("token")
    chosen = read_link_token(token, _key(), MAX_LINK_SECONDS, now=time.time())
    if chosen is None:
        return render_page(
            "error.html",
            status=403,
            title="Link expired",
            message="This link has expired or is not valid. Open the portal again from your account.",
        )
    _start_session(PortalSession.new(chosen))
    return redirect(url_for("harvest_portal.index"), 303)


@portal.before_request
def _guard() -> tuple[str, int] | None:
    if request.method not in ("GET", "HEAD"):
        read_form()  # within the body limit, before anything else reads it
    if request.endpoint in _OPEN_ENDPOINTS:
        return None
    session = load_session(
        request.cookies.get(COOKIE_NAME), _key(), get_engine().settings.portal_session_seconds
    )
    if session is None:
        return render_page(
            "error.html",
            status=401,
            title="Session ended",
            message="Your session has ended. Open the portal again from your account.",
        )
    g.harvest_portal_session = session
    if request.method not in ("GET", "HEAD") and not csrf_matches(session, posted_form().get("csrf_token")):
        # Before any route runs: a cross-site form can never change anything.
        return render_page(
            "error.html",
            status=403,
            title="Refused",
            message="The form has expired; nothing was changed. Reload the page and try again.",
        )
    return None


def content_security_policy(settings: Settings) -> str:
    """The portal's policy: no script, styles and images only from the app (and the logo's
    origin), forms posted only to the app, framed only by the configured origins."""
    return _policy(settings, portal_frame_ancestors(settings))


def _policy(settings: Settings, frame_ancestors: list[str]) -> str:
    ancestors = " ".join(frame_ancestors) or "'none'"
    images = "'self' data:"
    logo = settings.portal_logo_url
    if logo.startswith("https://"):
        parts = urlsplit(logo)
        images += f" https://{parts.netloc}"
    return (
        f"default-src 'none'; style-src 'self'; img-src {images}; form-action 'self'; "
        f"frame-ancestors {ancestors}; base-uri 'none'"
    )


def _routed_here() -> bool:
    """Whether routing itself answered a request under the portal's prefix (a 404 or 405 no view
    ran for, a 308 for a doubled slash)."""
    if request.routing_exception is None:
        return False
    home = next(current_app.url_map.iter_rules("harvest_portal.index")).rule  # the prefix and "/"
    return request.path.startswith(home) or request.path == home.rstrip("/")


@portal.after_app_request
def _headers(response: Response) -> Response:
    # Every answer under the prefix, routing's own included, not only the blueprint's views.
    if request.blueprint != portal.name and not _routed_here():
        return response
    settings = get_engine().settings
    # Parsed once per answer: the policy, X-Frame-Options and the cookie's SameSite all follow it.
    ancestors = portal_frame_ancestors(settings)
    response.headers["Content-Security-Policy"] = _policy(settings, ancestors)
    response.headers["X-Content-Type-Options"] = "nosniff"
    # A link's token is in its address: no page may send it on as a referrer.
    response.headers["Referrer-Policy"] = "no-referrer"
    if not ancestors:
        response.headers["X-Frame-Options"] = "DENY"
    if request.endpoint not in ("harvest_portal.static", "harvest_portal.theme_css"):
        response.headers["Cache-Control"] = "no-store"
    if g.get("harvest_portal_set_cookie"):
        framed = bool(ancestors) and request.is_secure
        response.set_cookie(
            COOKIE_NAME,
            dump_session(g.harvest_portal_session, _key()),
            max_age=int(settings.portal_session_seconds),
            path=url_for("harvest_portal.index"),
            secure=request.is_secure,
            httponly=True,
            # In a frame of another site a Lax cookie is never sent; None needs HTTPS.
            samesite="None" if framed else "Lax",
        )
    return response


# -- rendering -------------------------------------------------------------------------------------


def render_page(template: str, *, status: int = 200, **context: Any) -> tuple[str, int]:
    """Render a portal template (``harvest_portal/<template>``) with the shared context."""
    return render_template(f"harvest_portal/{template}", **context), status


@portal.context_processor
def _shared_context() -> dict[str, Any]:
    settings = get_engine().settings
    session: PortalSession | None = g.get("harvest_portal_session")
    return {
        "csrf_token": "" if session is None else session.csrf,
        "signed_in": session is not None,
        # Shown on every page: a customer sees at once whose account a link opened.
        "tenant_id": "" if session is None else session.tenant,
        "portal_name": settings.portal_name,
        "portal_logo": settings.portal_logo_url,
    }


@portal.get("/theme.css")
def theme_css() -> Response:
    """The theme's colours, as a stylesheet (the policy allows no inline style)."""
    settings = get_engine().settings
    # Each colour was checked at start-up: #rrggbb or empty.
    chosen = [(var, getattr(settings, name)) for name, var in PORTAL_COLORS.items()]
    rules = " ".join(f"{var}: {color};" for var, color in chosen if color)
    css = f":root {{ {rules} }}\n" if rules else ""
    return Response(css, mimetype="text/css", headers={"Cache-Control": "max-age=300"})


def unconfirmed(template: str, kept: str, **context: Any) -> tuple[str, int] | None:
    """:func:`~flask_harvest.http.pages.unconfirmed` with the portal's templates."""
    return pages.unconfirmed(render_page, template, kept, **context)


@portal.errorhandler(HarvestError)
@portal.errorhandler(ValidationError)
@portal.errorhandler(HTTPException)
def _error(exc: Exception) -> tuple[str, int] | HTTPException:
    """Every error as a page, with the status the admin APIs give it; an endpoint that is not
    there (or is another tenant's: the same answer) in the portal's words."""
    if isinstance(exc, SubscriptionNotFoundError):
        return render_page("error.html", status=404, title="Not found", message="There is no such endpoint.")
    return pages.error_page(render_page, exc, "harvest portal")
