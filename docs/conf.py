"""Sphinx configuration for the flask-harvest documentation.

Only Sphinx's built-in extensions are used, and intersphinx stays off: the docs must build with no
network. Build with ``sphinx-build -W --keep-going -b html docs docs/_build/html``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

# Import the package from this checkout even when it is not installed.
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, os.fspath(ROOT))

from flask_harvest._version import __version__  # noqa: E402

project = "flask-harvest"
author = "the flask-harvest authors"
copyright = "the flask-harvest authors"
release = __version__
version = ".".join(__version__.split(".")[:2])

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.viewcode",
]

exclude_patterns = ["_build"]
root_doc = "index"

autodoc_member_order = "bysource"
autodoc_default_options = {"members": True, "show-inheritance": True}
autodoc_typehints = "description"
autodoc_typehints_description_target = "documented"

html_theme = "alabaster"
html_title = f"flask-harvest {release}"


def _check_configuration_page(app: Any) -> None:
    """Warn (an error under -W) when configuration.rst misses a HARVEST_* key.

    The table is written by hand so that it can explain each key; this keeps it complete when a
    key is added to flask_harvest.config.
    """
    from sphinx.util import logging

    from flask_harvest.config import KEYS

    text = (Path(app.srcdir) / "configuration.rst").read_text(encoding="utf-8")
    missing = [key for key in KEYS.values() if f"``{key}``" not in text]
    if missing:
        logging.getLogger(__name__).warning(
            "configuration.rst does not document %s; add a row for each key in flask_harvest.config",
            ", ".join(missing),
        )


def setup(app: Any) -> None:
    app.connect("builder-inited", _check_configuration_page)
