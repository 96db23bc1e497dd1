"""The package's public names: imported on first use, and the same names everywhere they are listed."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import flask_harvest

INIT = Path(flask_harvest.__file__)


def _type_checking_imports() -> dict[str, tuple[str, str]]:
    """Return ``public name -> (module, attribute)`` from the ``if TYPE_CHECKING:`` block."""
    tree = ast.parse(INIT.read_text(encoding="utf-8"))
    block = next(
        node
        for node in tree.body
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"
    )
    found: dict[str, tuple[str, str]] = {}
    for node in block.body:
        assert isinstance(node, ast.ImportFrom)
        for alias in node.names:
            found[alias.asname or alias.name] = ("." * node.level + (node.module or ""), alias.name)
    return found


def test_the_type_checking_imports_the_lazy_table_and_all_agree() -> None:
    imports = _type_checking_imports()
    lazy = flask_harvest._LAZY
    assert set(imports) == set(lazy) == set(flask_harvest.__all__) - {"__version__"}
    for name, (module, attribute) in lazy.items():
        if attribute is None:  # a submodule: ``from . import signals``
            assert imports[name] == (".", name) and module == "." + name
        else:
            assert imports[name] == (module, attribute), name


def test_every_public_name_resolves_to_its_object() -> None:
    for name in flask_harvest.__all__:
        value = getattr(flask_harvest, name)
        module, attribute = flask_harvest._LAZY.get(name, ("._version", name))
        source = sys.modules["flask_harvest" + module]
        assert value is (source if attribute is None else getattr(source, attribute)), name
    assert flask_harvest.WebhookOutboundManager is flask_harvest.OutboundWebhookManager


def test_star_import_and_unknown_names_in_a_fresh_interpreter() -> None:
    command = (
        "import flask_harvest, sys\n"
        "assert 'flask' not in sys.modules, 'importing the package loaded Flask'\n"
        "namespace = {}\n"
        "exec('from flask_harvest import *', namespace)\n"
        "assert set(flask_harvest.__all__) <= set(namespace), 'a public name is missing'\n"
        "try:\n"
        "    flask_harvest.NoSuchName\n"
        "except AttributeError as exc:\n"
        "    print(exc)\n"
    )
    done = subprocess.run([sys.executable, "-c", command], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "module 'flask_harvest' has no attribute 'NoSuchName'"
