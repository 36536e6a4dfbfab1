"""One direction of dependency: ``models`` <- ``hdl`` <- ``testbench``; ``host`` uses ``models`` only.

Checked on the sources (``ast``), so an import hidden inside a function counts as much as one at the top.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import in ``path``; a relative import as its dots and name."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            out.append((node.lineno, "." * node.level + (node.module or "")))
        elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
              and getattr(node.func, "attr", getattr(node.func, "id", None)) == "import_module"):
            out.append((node.lineno, node.args[0].value))
    return out


def _violations(root: Path, folder: str, allowed: tuple[str, ...]) -> list[str]:
    """Every import of an ``inagg`` module under ``root/folder`` outside ``allowed`` (the package root is allowed)."""
    bad = []
    for path in sorted((root / folder).rglob("*.py")):
        for line, name in _imports(path):
            if name.startswith("inagg.") and not name.startswith(allowed):
                bad.append(f"{path.relative_to(root)}:{line} imports {name}")
    return bad


def test_host_imports_models_only():
    assert _violations(ROOT, "host", ("inagg.models", "inagg.host")) == []


def test_models_import_nothing_of_ours_but_models():
    assert _violations(ROOT, "models", ("inagg.models",)) == []
    assert [name for path in (ROOT / "models").rglob("*.py") for _, name in _imports(path) if name == "inagg"] == []
    assert [name for path in (ROOT / "models").rglob("*.py") for _, name in _imports(path) if name[:1] == "."] == []


@pytest.mark.parametrize("source, found", [
    ("def f():\n    from inagg.testbench.bridge import run\n", ["host/x.py:2 imports inagg.testbench.bridge"]),
    ("import inagg.hdl.switch as s\n", ["host/x.py:1 imports inagg.hdl.switch"]),
    ("importlib.import_module('inagg.testbench.toolchain')\n", ["host/x.py:1 imports inagg.testbench.toolchain"]),
    ("from inagg.models.job import JobSpec\nfrom inagg import __version__\n", []),
])
def test_the_check_sees_imports_inside_functions(tmp_path, source, found):
    (tmp_path / "host").mkdir()
    (tmp_path / "host" / "x.py").write_text(source)
    assert _violations(tmp_path, "host", ("inagg.models", "inagg.host")) == found
