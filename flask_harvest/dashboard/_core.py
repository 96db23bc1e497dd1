"""The dashboard blueprint and what every page shares: access, CSRF, security headers, errors,
navigation and rendering.

Page modules (:mod:`.webhooks`, and one per subsystem) add their routes to :data:`dashboard`, a
:class:`NavEntry` per page to :data:`NAV` and a :class:`Panel` per overview section to
:data:`PANELS`. A nav entry or panel whose subsystem the app does not use is left out.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, unquote, urlsplit

from flask import Blueprint, Flask, Response, current_app, g, redirect, render_template, request, url_for
from marshmallow import ValidationError
from werkzeug.exceptions import HTTPException
from werkzeug.wrappers import Response as BaseResponse

from .._app import get_engine
from .._input import text_problem
from ..config import KEYS, Settings
from ..engine import HarvestEngine
from ..errors import ConfigurationError, HarvestError
from ..http import pages
from ..http.admin import authorizer_allows
from ..http.forms import MAX_FIELD_CHARS, posted_form, read_form
from ._session import COOKIE_NAME, DashboardSession, csrf_matches, digest_matches, dump_session, load_session

dashboard = Blueprint(
    "harvest_dashboard",
    __name__,
    template_folder="templates",
    static_folder="static",
    static_url_path="/static",
)

#: The strictest policy the pages work with: no script at all, styles only from our own file.
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; style-src 'self'; img-src 'self' data:; form-action 'self'; "
    "frame-ancestors 'none'; base-uri 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "X-Frame-Options": "DENY",
}
#: Endpoints open without sign-in (the sign-in form itself and the stylesheet).
_OPEN_ENDPOINTS = frozenset({"harvest_dashboard.static", "harvest_dashboard.sign_in"})


@dataclass(frozen=True)
class NavEntry:
    """A link in the navigation bar, shown when ``available(engine)`` is true, by ``order`` (then
    in the order added): the webhook pages, then workflows (20) and triggers (30), as the overview's
    panels."""

    label: str
    endpoint: str
    available: Callable[[HarvestEngine], bool]
    order: int = 10


@dataclass(frozen=True)
class Panel:
    """A section of the overview page: ``template`` rendered with ``build(engine)``, in ``order``,
    when ``available(engine)`` is true."""

    order: int
    template: str
    build: Callable[[HarvestEngine], Mapping[str, Any]]
    available: Callable[[HarvestEngine], bool]


NAV: list[NavEntry] = []
PANELS: list[Panel] = []


def always(_: HarvestEngine) -> bool:
    return True


def check_dashboard_config(app: Flask) -> None:
    """Refuse to serve the dashboard on an app that cannot sign its session cookie.

    :raises ConfigurationError: the app has no ``secret_key``.
    """
    if not app.secret_key:
        raise ConfigurationError(
            f"{KEYS['dashboard']} needs app.secret_key (or SECRET_KEY in app.config) to sign its "
            "session cookie: set a long random value before init_app"
        )


def install_dashboard(app: Flask, settings: Settings) -> None:
    """Register the dashboard on ``app`` at ``HARVEST_DASHBOARD_URL_PREFIX``.

    :raises ConfigurationError: the app has no ``secret_key`` to sign the session cookie with.
    """
    check_dashboard_config(app)
    app.register_blueprint(dashboard, url_prefix=settings.dashboard_url_prefix)


def _under_prefix(path: str) -> bool:
    prefix = get_engine().settings.dashboard_url_prefix.rstrip("/")
    return path == prefix or path.startswith(prefix + "/")


# -- the session -----------------------------------------------------------------------------------


def _session() -> DashboardSession:
    current: DashboardSession | None = g.get("harvest_dashboard_session")
    if current is None:
        current = load_session(
            request.cookies.get(COOKIE_NAME),
            current_app.secret_key or "",
            get_engine().settings.dashboard_session_seconds,
        )
        if current is None:
            current = DashboardSession.new()
            g.harvest_dashboard_set_cookie = True
        g.harvest_dashboard_session = current
    return current


def replace_session(new: DashboardSession) -> None:
    """Make ``new`` this client's session (sent as the cookie with the response)."""
    g.harvest_dashboard_session = new
    g.harvest_dashboard_set_cookie = True


def signed_in() -> bool:
    """Whether the current request may use the dashboard: a session signed in with the actuator
    token, or the actuator's authorizer answering exactly ``True``."""
    engine = get_engine()
    if digest_matches(_session(), current_app.secret_key or "", engine.settings.actuator_token):
        return True
    authorizer = engine.access.authorizer
    # An authorizer that raises is a 500 page (AuthorizerError), as on the admin APIs.
    return authorizer is not None and authorizer_allows(authorizer)


def token_sign_in_enabled() -> bool:
    return bool(get_engine().settings.actuator_token)


#: What a sign-in's ``next`` may not hold anywhere: controls and spaces (a browser drops tabs and
#: newlines from a URL, so ``/\t/evil.example`` would become ``//evil.example``; CR and LF cannot
#: go in a header) and backslashes (a browser reads ``\`` as ``/``).
_UNSAFE_IN_NEXT = re.compile(r"[\x00-\x20\x7f-\x9f\\]")
#: What its path may not hold once decoded (an encoded space is a character of an id).
_UNSAFE_IN_PATH = re.compile(r"[\x00-\x1f\x7f-\x9f\\]")
#: Characters left as they are when ``next`` is quoted for the ``Location`` header.
_URL_SAFE = "/?#[]@!$&'()*+,;=:%-._~"


def confined_next(target: object, index: str) -> str:
    """Return ``target`` if it is a path under ``index`` (the dashboard's overview, ending in
    ``/``) as a browser resolves it, quoted for a header; else ``index``. Pure.

    Resolved as a browser does: percent-escapes decoded (``%2e%2e`` is ``..``), so a dot segment,
    an empty segment (``//``) or an encoded slash or backslash anywhere sends to the index.
    """
    if not isinstance(target, str) or not target or len(target) > MAX_FIELD_CHARS:
        return index
    if _UNSAFE_IN_NEXT.search(target) or text_problem(target) is not None:
        return index
    parts = urlsplit(target)
    path = unquote(parts.path)
    segments = path.split("/")[1:]
    if (
        parts.scheme
        or parts.netloc
        or not parts.path.startswith(index)
        or not path.startswith(index)
        or _UNSAFE_IN_PATH.search(path)
        or any(segment in (".", "..") for segment in segments)
        or "" in segments[:-1]
    ):
        return index
    return quote(target, safe=_URL_SAFE)


def _here() -> str:
    """The current page as a ``next``: its path percent-encoded as the browser sent it (the
    decoded ``request.full_path`` would turn an id's ``%20`` into a space, which ``next`` refuses)."""
    query = request.query_string.decode("latin-1")
    here = quote(request.script_root + request.path, safe="/!$&'()*+,;=:@-._~")
    return f"{here}?{query}" if query else here


def safe_next(target: str | None) -> str:
    """Return ``target`` if it is a path inside the dashboard, else the overview: a sign-in link
    must not send the operator to another site, nor to another page of the app."""
    return confined_next(target, url_for("harvest_dashboard.overview"))


@dashboard.before_request
def _guard() -> BaseResponse | tuple[str, int] | None:
    session = _session()
    if request.method not in ("GET", "HEAD"):
        # Read before the access check (the CSRF token is in the form), so within the limit.
        read_form()
    if request.method not in ("GET", "HEAD") and not csrf_matches(session, posted_form().get("csrf_token")):
        # Checked before anything else: a cross-site form can never reach a route that changes state.
        return render_page(
            "error.html",
            status=403,
            title="Refused",
            message=(
                "The form's CSRF token is missing or stale; nothing was changed. "
                "Reload the page and try again."
            ),
        )
    if signed_in():
        g.harvest_dashboard_allowed = True
        return None
    if request.endpoint in _OPEN_ENDPOINTS:
        return None
    if token_sign_in_enabled():
        if request.method in ("GET", "HEAD"):
            return redirect(url_for("harvest_dashboard.sign_in", next=_here()), 303)
        return render_page("error.html", status=401, title="Sign in", message="Sign in first.")
    engine = get_engine()
    if engine.access.authorizer is not None:
        return render_page(
            "error.html",
            status=403,
            title="Refused",
            message=("The dashboard's authorizer refused this request."),
        )
    return render_page(
        "error.html",
        status=403,
        title="Dashboard closed",
        message=(
            f"The dashboard is closed: set {KEYS['actuator_token']} or register an actuator authorizer."
        ),
    )


@dashboard.after_app_request
def _headers(response: Response) -> Response:
    # Every answer under the prefix, including routing's own (a 308 for a doubled slash, a 404 or
    # 405 no view ran for), not only the blueprint's views.
    if request.blueprint != dashboard.name and not _under_prefix(request.path):
        return response
    for name, value in SECURITY_HEADERS.items():
        response.headers[name] = value
    if request.endpoint != "harvest_dashboard.static":
        # Pages show operational data (and once, a new secret): never kept in a cache.
        response.headers["Cache-Control"] = "no-store"
    if g.get("harvest_dashboard_set_cookie"):
        prefix = get_engine().settings.dashboard_url_prefix
        if g.get("harvest_dashboard_sign_out"):
            response.delete_cookie(
                COOKIE_NAME, path=prefix, secure=request.is_secure, httponly=True, samesite="Lax"
            )
        else:
            response.set_cookie(
                COOKIE_NAME,
                dump_session(g.harvest_dashboard_session, current_app.secret_key or ""),
                max_age=int(get_engine().settings.dashboard_session_seconds),
                path=prefix,
                secure=request.is_secure,
                httponly=True,
                samesite="Lax",
            )
    return response


# -- rendering -------------------------------------------------------------------------------------


def render_page(template: str, *, status: int = 200, **context: Any) -> tuple[str, int]:
    """Render a dashboard template (``harvest_dashboard/<template>``) with the shared context."""
    return render_template(f"harvest_dashboard/{template}", **context), status


#: A stand-in argument value that every converter's ``to_url`` leaves as it is.
_LINK_MARK = "HarvestDashboardLinkMark"


def link_maker(endpoint: str, argument: str) -> Callable[[str], str]:
    """Return ``make(value)``, equal to ``url_for(endpoint, **{argument: value})`` for a rule whose
    ``argument`` has the default converter, from one ``url_for`` call: a list page links every row
    without paying the URL build per row."""
    values: dict[str, Any] = {argument: _LINK_MARK}
    built = url_for(endpoint, **values)
    prefix, _, suffix = built.partition(_LINK_MARK)
    quote = current_app.url_map.converters["default"](current_app.url_map).to_url

    def make(value: str) -> str:
        return prefix + quote(value) + suffix

    return make


@dashboard.context_processor
def _shared_context() -> dict[str, Any]:
    engine = get_engine()
    allowed = bool(g.get("harvest_dashboard_allowed"))
    return {
        "csrf_token": _session().csrf,
        "nav": sorted((e for e in NAV if e.available(engine)), key=lambda e: e.order) if allowed else [],
        "signed_in": allowed,
        "signed_in_by_token": allowed and bool(_session().auth),
    }


def unconfirmed(template: str, kept: str, **context: Any) -> tuple[str, int] | None:
    """:func:`~flask_harvest.http.pages.unconfirmed` with the dashboard's templates."""
    return pages.unconfirmed(render_page, template, kept, **context)


# -- errors: HTML pages, never a traceback -----------------------------------------------------------


@dashboard.errorhandler(HarvestError)
@dashboard.errorhandler(ValidationError)
@dashboard.errorhandler(HTTPException)
def _error(exc: Exception) -> tuple[str, int] | HTTPException:
    """Every error as a page, with the status the admin APIs give it (one mapping for both)."""
    return pages.error_page(render_page, exc, "harvest dashboard")
