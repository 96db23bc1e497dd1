"""Sign in with the actuator token, and sign out."""

from __future__ import annotations

import hmac

from flask import current_app, g, redirect, request, url_for
from werkzeug.wrappers import Response as BaseResponse

from .._app import get_engine
from ..http.forms import form_text, posted_form
from ._core import dashboard, render_page, replace_session, safe_next, token_sign_in_enabled
from ._session import DashboardSession, token_digest


@dashboard.route("/sign-in", methods=["GET", "POST"])
def sign_in() -> BaseResponse | tuple[str, int]:
    """The token form; a right token signs the browser in (a new session, a new CSRF token)."""
    target = safe_next(request.args.get("next", posted_form().get("next")))
    if not token_sign_in_enabled():
        return render_page(
            "sign_in.html",
            status=403 if request.method == "POST" else 200,
            enabled=False,
            next=target,
            error=None,
        )
    if request.method == "GET":
        return render_page("sign_in.html", enabled=True, next=target, error=None)
    given = form_text("token", max_chars=4096)
    token = get_engine().settings.actuator_token
    if not hmac.compare_digest(
        given.encode("utf-8", "surrogatepass"), token.encode("utf-8", "surrogatepass")
    ):
        return render_page(
            "sign_in.html", status=401, enabled=True, next=target, error="That is not the token."
        )
    # A fresh session on sign-in: a CSRF token planted before it (session fixation) is worthless.
    replace_session(
        DashboardSession(
            csrf=DashboardSession.new().csrf, auth=token_digest(current_app.secret_key or "", token)
        )
    )
    return redirect(target, 303)


@dashboard.post("/sign-out")
def sign_out() -> BaseResponse:
    """Forget the session (the CSRF check already ran)."""
    replace_session(DashboardSession.new())
    g.harvest_dashboard_sign_out = True
    return redirect(url_for("harvest_dashboard.sign_in"), 303)
