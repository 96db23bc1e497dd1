"""The overview page: one panel per subsystem the app uses (see :class:`~._core.Panel`)."""

from __future__ import annotations

from typing import Any

from werkzeug.exceptions import NotFound

from .._app import get_engine
from ..http.admin import AnyPathConverter
from ._core import NAV, PANELS, NavEntry, always, dashboard, render_page

NAV.append(NavEntry("Overview", "harvest_dashboard.overview", always))


@dashboard.get("/")
def overview() -> tuple[str, int]:
    engine = get_engine()
    panels: list[tuple[str, Any]] = [
        (panel.template, panel.build(engine))
        for panel in sorted(PANELS, key=lambda p: p.order)
        if panel.available(engine)
    ]
    return render_page("overview.html", panels=panels)


@dashboard.record_once
def _converter(state: Any) -> None:
    state.app.url_map.converters.setdefault("anypath", AnyPathConverter)


@dashboard.route("/<anypath:path>", methods=["GET", "POST", "PUT", "PATCH", "DELETE"])
def unknown_page(path: str) -> tuple[str, int]:
    """Any other path or method under the prefix (a newline in the path too): a 404 page with the
    dashboard's headers, after the access and CSRF checks like every page."""
    raise NotFound(f"There is no dashboard page at /{path}.")
