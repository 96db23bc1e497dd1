"""gunicorn settings for the production example: ``gunicorn -c gunicorn.conf.py``.

``BIND`` (default ``127.0.0.1:8000``) and ``WEB_CONCURRENCY`` (default 2 processes) come from the
environment, as most platforms set them.
"""

from __future__ import annotations

import os

# The factory, called once in each worker process.
wsgi_app = "app:create_app()"
# So that ``app`` imports from this folder wherever gunicorn was started.
pythonpath = os.path.dirname(os.path.abspath(__file__))
bind = os.environ.get("BIND", "127.0.0.1:8000")
workers = int(os.environ.get("WEB_CONCURRENCY", "2"))
# Threads: a request waits on PostgreSQL, and the after-commit relay runs on a thread too.
worker_class = "gthread"
threads = 4
# Not preloaded: each worker opens its own database and Redis connections after the fork.
preload_app = False
timeout = 30
graceful_timeout = 20
accesslog = "-"
errorlog = "-"
