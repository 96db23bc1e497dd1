"""Sphinx configuration for the flask-harvest documentation.

Only Sphinx's built-in extensions are used, and intersphinx stays off: the docs must build with no
network. The diagrams need Graphviz's ``dot`` (Debian: ``apt-get install graphviz``). Build with
``sphinx-build -W --keep-going -b html docs docs/_build/html``.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Any

from sphinx.errors import ConfigError

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
    "sphinx.ext.graphviz",
    "sphinx.ext.viewcode",
]

exclude_patterns = ["_build"]
root_doc = "index"

autodoc_member_order = "bysource"
autodoc_default_options = {"members": True, "show-inheritance": True}
autodoc_typehints = "description"
autodoc_typehints_description_target = "documented"

graphviz_output_format = "svg"

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


# The output formats in which sphinx.ext.graphviz runs dot (the text builders show the alt text).
_DOT_FORMATS = frozenset({"html", "latex", "texinfo"})


def _check_dot(app: Any) -> None:
    """Refuse to build when Graphviz's ``dot`` is missing.

    Without it sphinx.ext.graphviz only warns and leaves the diagrams out, which a build without
    ``-W`` would publish silently.
    """
    if app.builder.format not in _DOT_FORMATS:
        return
    dot = app.config.graphviz_dot
    if shutil.which(dot) is None:
        raise ConfigError(
            f"Graphviz's {dot!r} command is not installed; the diagrams of architecture.rst need it. "
            "Install Graphviz (Debian: apt-get install graphviz) or set graphviz_dot to its path."
        )


def setup(app: Any) -> None:
    app.connect("builder-inited", _check_dot)
    app.connect("builder-inited", _check_configuration_page)
