"""S24: the render time of every GET page of the consumer portal with 10,000 tenants (one to three
endpoints each) and 1,000,000 deliveries over 30 days in PostgreSQL, through the Flask test client,
signed in through a portal link.

Two tenants are measured, renders alternating between them: :data:`~bench._tenants.BIG`, with
20,000 of the deliveries (and a DLQ of hundreds), and an ordinary one, with about a hundred. Pages
that need an id open the tenant's first endpoint and its newest dead-lettered delivery. Goal: every
page's p95 < 50 ms for both tenants; the last row names the slowest page.
"""

from __future__ import annotations

import html
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any
from urllib.parse import urlsplit

from flask import Flask
from flask.testing import FlaskClient
from flask_sqlalchemy import SQLAlchemy

from flask_harvest import Harvest, get_engine
from flask_harvest.portal import portal

from ._plans import captured, plans
from ._report import Context, Result, Row, percentile
from ._tenants import BIG, EVENT_TYPES, Tenants, endpoint_id, newest, ordinary, seeded

ID = "S24"
TITLE = "consumer portal render time, every page, 10,000 tenants and 1M deliveries"
#: Tenants, deliveries, and the big tenant's share of them: full and quick.
SIZES = {False: (10_000, 1_000_000, 20_000), True: (200, 20_000, 2_000)}
GOAL_MS = 50.0
GOAL = f"p95 < {GOAL_MS:.0f} ms, both tenants"
PREFIX = "/portal"
CONFIG = {
    "SECRET_KEY": "bench-portal-secret-key-0123456789abcdef",
    # No sweep from the web process during the measurement.
    "HARVEST_SWEEP_INTERVAL_SECONDS": 3600,
}
_NEXT = re.compile(r'href="([^"]*[?&](?:amp;)?cursor=[^"]*)"')


def _schema(name: str) -> dict[str, Any]:
    return {
        "type": "object",
        "required": ["id"],
        "properties": {"id": {"type": "string"}, "total": {"type": "integer"}},
        "description": name,
    }


def make_app(url: str) -> Flask:
    """The portal's app on ``url``: the catalog of :data:`~bench._tenants.EVENT_TYPES`, the portal
    under :data:`PREFIX`."""
    app = Flask("bench_portal")
    app.config.update(CONFIG, SQLALCHEMY_DATABASE_URI=url)
    db = SQLAlchemy(app)
    harvest = Harvest(db=db)
    for name in EVENT_TYPES:
        harvest.event_type(
            name,
            description=f"Sent when {name.replace('.', ' is ').replace('_', ' ')}.",
            schema=_schema(name),
            example={"id": "obj_1", "total": 4200},
        )
    harvest.init_app(app)
    app.register_blueprint(portal, url_prefix=PREFIX)
    app.extensions["bench_db"] = db
    app.extensions["bench_harvest"] = harvest
    return app


def close(app: Flask) -> None:
    get_engine(app).close()
    with app.app_context():
        app.extensions["bench_db"].engine.dispose()


def opened(app: Flask, tenant: str) -> FlaskClient:
    """A test client signed in to ``tenant``'s portal through a link (the redirect sets the cookie)."""
    harvest: Harvest = app.extensions["bench_harvest"]
    with app.test_request_context():
        link = urlsplit(harvest.portal_url(tenant))
    client = app.test_client()
    answer = client.get(f"{link.path}?{link.query}", follow_redirects=True)
    if answer.status_code != 200:
        raise AssertionError(f"the portal link of {tenant} answered {answer.status_code}")
    return client


@dataclass(frozen=True)
class Subject:
    """A measured tenant, signed in, with the ids its pages open."""

    label: str
    tenant: str
    client: FlaskClient
    endpoint: str
    dead_letter: str


@dataclass(frozen=True)
class Page:
    """A portal page: its label and its path for a tenant."""

    label: str
    path: Callable[[Subject], str]
    #: Open the next page of this list (its link's cursor) instead of the first.
    second: bool = False


def pages() -> list[Page]:
    """Every GET page of the portal that reads the tenant's rows, and its forms."""
    p = PREFIX
    return [
        Page("endpoints (index)", lambda s: f"{p}/"),
        Page("endpoint", lambda s: f"{p}/endpoints/{s.endpoint}"),
        Page("deliveries list", lambda s: f"{p}/deliveries"),
        Page("deliveries list, page 2", lambda s: f"{p}/deliveries", second=True),
        Page("deliveries list, dlq", lambda s: f"{p}/deliveries?state=dlq"),
        Page("deliveries of an endpoint", lambda s: f"{p}/deliveries?endpoint_id={s.endpoint}"),
        Page("delivery (dead-lettered)", lambda s: f"{p}/deliveries/{s.dead_letter}"),
        Page("event types", lambda s: f"{p}/event-types"),
        Page("replay form", lambda s: f"{p}/replay"),
        Page("new endpoint form", lambda s: f"{p}/endpoints/new"),
    ]


def second_page(client: FlaskClient, path: str) -> str:
    """The path of the next page of the list at ``path`` (its *Next* link)."""
    body = client.get(path).get_data(as_text=True)
    links = [html.unescape(link) for link in _NEXT.findall(body)]
    if not links:
        raise AssertionError(f"{path} has no next page")
    return links[-1]


def get(client: FlaskClient, path: str) -> None:
    answer = client.get(path)
    if answer.status_code != 200:
        raise AssertionError(f"{path} answered {answer.status_code}")


def _render(client: FlaskClient, path: str, app: Flask) -> None:
    get(client, path)


def alternate(
    paths: dict[str, tuple[FlaskClient, str]], reps: int, warmup: int = 5
) -> dict[str, list[float]]:
    """GET each subject's path in a rotating order, call by call; each one's milliseconds (after
    ``warmup`` rounds)."""
    names = list(paths)
    times: dict[str, list[float]] = {name: [] for name in names}
    for rep in range(reps + warmup):
        shift = rep % len(names)
        for name in names[shift:] + names[:shift]:
            client, path = paths[name]
            started = time.perf_counter()
            get(client, path)
            elapsed = time.perf_counter() - started
            if rep >= warmup:
                times[name].append(elapsed * 1000)
    return times


def statements(app: Flask, client: FlaskClient, path: str) -> int:
    """How many statements one render of ``path`` sends to the database."""
    engine = get_engine(app).store.capabilities.engine
    assert engine is not None
    with captured(engine) as sent:
        get(client, path)
    return len(sent)


def run(ctx: Context) -> Result:
    reps = ctx.pick(300, 20)
    seed = seeded(*SIZES[ctx.quick])
    app = make_app(seed.database_url)
    try:
        return _measure(app, seed, reps)
    finally:
        close(app)


def _subject(app: Flask, seed: Tenants, label: str, tenant: str) -> Subject:
    return Subject(
        label,
        tenant,
        opened(app, tenant),
        endpoint_id(tenant, 0),
        newest(seed.database_url, tenant, "dlq"),
    )


def _measure(app: Flask, seed: Tenants, reps: int) -> Result:
    subjects = [
        _subject(app, seed, "big", BIG),
        _subject(app, seed, "ordinary", ordinary(seed.database_url, seed.tenants)),
    ]
    result = Result()
    summary: list[tuple[str, float, bool]] = []
    for page in pages():
        paths = {}
        for subject in subjects:
            path = page.path(subject)
            paths[subject.label] = (
                subject.client,
                second_page(subject.client, path) if page.second else path,
            )
        times = alternate(paths, reps)
        p95 = {name: percentile(t, 95) for name, t in times.items()}
        p50 = {name: percentile(t, 50) for name, t in times.items()}
        met = all(value < GOAL_MS for value in p95.values())
        big_client, big_path = paths["big"]
        sent = statements(app, big_client, big_path)
        summary.append((page.label, max(p95.values()), met))
        result.rows.append(
            Row(
                ID,
                f"{page.label}, big tenant (p95)",
                p95["big"],
                "ms",
                GOAL,
                met,
                baseline=p95["ordinary"],
                baseline_label="ordinary tenant",
                ratio=p95["big"] / p95["ordinary"],
                note=f"p50 {p50['big']:.1f} ms vs {p50['ordinary']:.1f} ms; {sent} statements",
            )
        )
        result.details[page.label] = {
            "paths": {name: path for name, (_, path) in paths.items()},
            "statements": sent,
            "render_ms": {
                name: {"p50": p50[name], "p95": p95[name], "reps": len(t)} for name, t in times.items()
            },
            # The plans of a page that misses its goal: which statement grows with the tenant.
            "plans": [] if met else plans(app, partial(_render, big_client, big_path), touching="harvest_"),
        }
    slowest = max(summary, key=lambda item: item[1])
    missed = [label for label, _, met in summary if not met]
    result.rows.append(
        Row(
            ID,
            f"every portal page ({len(summary)}), slowest p95: {slowest[0]}",
            slowest[1],
            "ms",
            GOAL,
            not missed,
            note=f"{len(summary) - len(missed)} of {len(summary)} pages meet the goal"
            + (f"; missed: {', '.join(missed)}" if missed else ""),
        )
    )
    result.details["tenants"] = {s.label: s.tenant for s in subjects}
    result.details["sizes"] = {
        "tenants": seed.tenants,
        "deliveries": seed.deliveries,
        "big_deliveries": seed.big_deliveries,
    }
    result.details["seed_seconds"] = seed.seed_seconds
    result.details["verdict"] = {
        "met": not missed,
        "slowest": slowest[0],
        "slowest_p95": slowest[1],
        "missed": missed,
    }
    return result


if __name__ == "__main__":
    from .__main__ import main

    raise SystemExit(main(["--only", ID, *sys.argv[1:]]))
