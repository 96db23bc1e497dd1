"""The dashboard's "Retry from step N": a fork of a run, after a page that explains the modes.

Thin over :meth:`~flask_harvest.workflows.service.WorkflowService.fork`, as the HTTP API's fork
route is: the same checks, the same errors. The POST carries the session's CSRF token, as every
dashboard form does (the blueprint checks it).
"""

from __future__ import annotations

import re

from flask import redirect, request, url_for
from werkzeug.wrappers import Response as BaseResponse

from ..errors import InvalidFieldError
from ..http.forms import form_text
from ..workflows.forks import check_from_step, parse_fork_mode
from ..workflows.models import ForkMode
from ._core import dashboard, render_page
from .workflows import workflows_service

#: What each mode does, for the page's choice (the first is the default).
MODES = {
    ForkMode.RECORDED.value: "Replay: the steps from this one on return what the source run recorded; "
    "nothing runs for real, and no completion callback or trigger is sent. A way to reproduce a run.",
    ForkMode.LIVE.value: "Run for real: the steps from this one on run again, and the end of the new run "
    "sends completion callbacks and fires completion triggers as any run's does.",
    ForkMode.LIVE_QUIET.value: "Run for real, quietly: the steps run again, but the new run sends no "
    "completion callback and fires no completion trigger.",
}


def _from_step(text: str | None) -> int:
    # ASCII digits only: str.isdigit() also takes "²", which int() refuses.
    value = (text or "").strip()
    if not re.fullmatch(r"[0-9]{1,9}", value):
        raise InvalidFieldError("from_step", f"must be a step position, 0 or more, not {text!r:.40}")
    return check_from_step(int(value))


@dashboard.route("/workflows/<execution_id>/fork", methods=["GET", "POST"])
def fork_execution(execution_id: str) -> BaseResponse | tuple[str, int]:
    """Retry from step N: the GET explains the modes, the POST creates the fork and shows it."""
    service = workflows_service()
    source = service.get(execution_id)
    if request.method == "GET":
        from_step = _from_step(request.args.get("from_step"))
        recorded = len(service.steps(source.execution_id))
        check_from_step(from_step, recorded)
        return render_page(
            "workflows/fork.html", execution=source, from_step=from_step, modes=MODES, recorded=recorded
        )
    from_step = _from_step(form_text("from_step", max_chars=20))
    mode = parse_fork_mode(form_text("mode", max_chars=20) or ForkMode.RECORDED.value)
    fork = service.fork(source.execution_id, from_step, mode)
    return redirect(url_for(".execution", execution_id=fork.execution_id, done="forked"), 303)
