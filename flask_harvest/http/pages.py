"""What the server-rendered pages (the console's and the portal's) answer alike: a confirmation
step, and an error as a page with the admin APIs' status."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from flask import request
from werkzeug.exceptions import HTTPException
from werkzeug.http import HTTP_STATUS_CODES

from .admin import error_answer
from .forms import form_text

#: ``render(template, status=..., **context)``: a page of one blueprint's templates.
Render = Callable[..., tuple[str, int]]


def unconfirmed(render: Render, template: str, kept: str, **context: Any) -> tuple[str, int] | None:
    """The answer of a confirmation page until its box is ticked: the page for a ``GET``, the page
    again with a 422 saying ``kept`` (what was left as it is) for a ``POST`` without the box, and
    ``None`` once a ``POST`` confirms (the caller then acts)."""
    if request.method == "GET":
        return render(template, error="", **context)
    if form_text("confirm", max_chars=8) != "yes":
        return render(template, status=422, error=f"Tick the box to confirm; {kept}.", **context)
    return None


def error_page(render: Render, exc: Exception, where: str) -> tuple[str, int] | HTTPException:
    """``exc`` as an error page, with the status the admin APIs give it (one mapping for all); a
    redirect that routing raised is returned as it is."""
    if isinstance(exc, HTTPException) and (exc.code is None or exc.code < 400):
        return exc
    answer = error_answer(exc, where)
    return render(
        "error.html",
        status=answer.status,
        title=HTTP_STATUS_CODES.get(answer.status, "Error"),
        message=answer.message,
    )
