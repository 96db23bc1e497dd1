"""The server-rendered pages' form and query input (the console's and the portal's): a body read
within the admin APIs' limit, and fields refused by name (422) when they cannot be text."""

from __future__ import annotations

import io

from flask import g, request
from werkzeug.datastructures import MultiDict

from .._input import text_problem
from ..errors import InvalidFieldError
from .admin import MAX_BODY_BYTES, read_body

#: The longest form field a page reads.
MAX_FIELD_CHARS = 2048


def read_form() -> MultiDict[str, str]:
    """Parse the request's form from a body of at most :data:`MAX_BODY_BYTES`, read through the
    admin APIs' own limit (413 before a larger one is read, so no anonymous request makes the
    server buffer it or spool its files to disk), and keep it for :func:`posted_form`."""
    body = read_body(MAX_BODY_BYTES)
    parser = request.make_form_data_parser()
    _, fields, files = parser.parse(io.BytesIO(body), request.mimetype, len(body), request.mimetype_params)
    for _, upload in files.items(multi=True):
        upload.close()  # no page takes a file
    g.harvest_form = fields
    return fields


def posted_form() -> MultiDict[str, str]:
    """The submitted form of a request other than ``GET`` or ``HEAD`` (empty for those).

    Pages read this, never ``request.form``: it was parsed within the body limit.
    """
    fields: MultiDict[str, str] = g.get("harvest_form") or MultiDict()
    return fields


def form_text(name: str, *, required: bool = False, max_chars: int = MAX_FIELD_CHARS) -> str:
    """Return a form field's text, stripped; refuse a NUL, a lone surrogate or an over-long value
    (422 naming the field) before anything reads it."""
    value = posted_form().get(name, "")
    problem = text_problem(value) if value else None
    if problem is not None or len(value) > max_chars:
        raise InvalidFieldError(name, problem or f"is longer than {max_chars} characters")
    value = value.strip()
    if required and not value:
        raise InvalidFieldError(name, "is required")
    return value


def form_texts(name: str, *, max_items: int = 500, max_chars: int = MAX_FIELD_CHARS) -> list[str]:
    """Return every value of a repeated form field (checkboxes), stripped and without empties;
    refuse bad text or more than ``max_items`` values (422 naming the field)."""
    values = posted_form().getlist(name)
    if len(values) > max_items:
        raise InvalidFieldError(name, f"has more than {max_items} values")
    for value in values:
        problem = text_problem(value)
        if problem is not None or len(value) > max_chars:
            raise InvalidFieldError(name, problem or f"is longer than {max_chars} characters")
    return [value.strip() for value in values if value.strip()]


def query_text(name: str, *, max_chars: int = MAX_FIELD_CHARS) -> str | None:
    """Return a query parameter's text, or ``None`` when absent or empty; refuse bad text (422)."""
    value = request.args.get(name)
    if not value:
        return None
    problem = text_problem(value)
    if problem is not None or len(value) > max_chars:
        raise InvalidFieldError(name, problem or f"is longer than {max_chars} characters")
    return value.strip() or None
