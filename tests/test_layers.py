"""The layers of ``docs/architecture.md`` are the layers the imports run in: the table there, read as
written, places every module of the package, and no import (function-level ones included) reaches a
layer above its module's, nor Prefect from a layer that says it does not know Prefect."""

from __future__ import annotations

import ast
import re
from fnmatch import fnmatchcase
from functools import cache
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "trialflow"
ARCHITECTURE = PACKAGE.parent / "docs" / "architecture.md"
ROOT = ""  # the package root (its version; the public API, imported by name): the bottom layer


@cache
def patterns() -> list[str]:
    """The table's module patterns (``platforms/*_config``): modules matching one form a unit of their own,
    apart from their package's."""
    text = ARCHITECTURE.read_text(encoding="utf-8").split("## Layers", 1)[1].split("\n## ", 1)[0]
    return sorted({n for n in re.findall(r"`([^`]+)`", text) if "*" in n})


@cache
def _modules() -> list[str]:
    """Every module of the package, as its path inside the package without ``.py``."""
    return ["/".join(p.relative_to(PACKAGE).with_suffix("").parts) for p in PACKAGE.rglob("*.py")]


def units() -> set[str]:
    """The package's top-level modules and subpackages (``testing/`` aside: test support), and the
    patterns that some module matches."""
    found = {p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__"}
    found |= {p.parent.name for p in PACKAGE.glob("*/__init__.py")}
    found |= {pattern for pattern in patterns() if any(fnmatchcase(m, pattern) for m in _modules())}
    return found - {"testing"}


def _unit_of_path(parts: tuple[str, ...] | list[str]) -> str:
    """The unit of the module at ``parts`` inside the package: the first pattern a leading part of its
    path matches, else its top-level name."""
    for depth in range(len(parts), 0, -1):
        for pattern in patterns():
            if fnmatchcase("/".join(parts[:depth]), pattern):
                return pattern
    return parts[0] if parts else ROOT


def layer_table() -> list[tuple[str, set[str], bool, tuple[str, ...]]]:
    """Rows of the Layers table, bottom first: (layer, its units, knows Prefect, the modules that may
    import Prefect in a layer that does not). A unit is a backticked top-level name (``store``,
    ``tuners/``); other backticked words describe parts of it."""
    text = ARCHITECTURE.read_text(encoding="utf-8").split("## Layers", 1)[1].split("\n## ", 1)[0]
    known, rows = units(), []
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or cells[0] in ("Layer", "---") or set(cells[0]) <= {"-"}:
            continue
        names = {n.rstrip("/") for n in re.findall(r"`([^`]+)`", cells[1])}
        prefect = cells[2].lower().startswith("yes")
        allowed = () if prefect else tuple(re.findall(r"`([^`]+)`", cells[2]))
        rows.append((cells[0], names & known, prefect, allowed))
    return rows


def _module(path: Path) -> tuple[str, str]:
    """(unit, path of the module inside the package without ``.py``)."""
    relative = path.relative_to(PACKAGE).with_suffix("")
    parts = relative.parts[:-1] if relative.name == "__init__" else relative.parts
    return _unit_of_path(parts), "/".join(parts)


def _imports(path: Path) -> set[str]:
    """Every module ``path`` imports, as dotted names (relative imports resolved), at any depth."""
    package = ["trialflow", *path.relative_to(PACKAGE).parent.parts]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(package[:len(package) - node.level + 1]) if node.level else ""
            target = ".".join(p for p in (base, node.module or "") if p)
            found |= {f"{target}.{a.name}" for a in node.names} if node.module is None else {target}
    return found


def _unit_of(dotted: str) -> str | None:
    """The trialflow unit a dotted import names (None outside the package)."""
    parts = dotted.split(".")
    if parts[0] != "trialflow":
        return None
    return ROOT if parts[1:2] == ["__version__"] else _unit_of_path(parts[1:])


def test_the_table_places_every_module_of_the_package_in_one_layer():
    rows = layer_table()
    placed = [name for _, names, _, _ in rows for name in names]
    assert len(rows) >= 10 and len(placed) == len(set(placed)), f"a module in two layers: {placed}"
    assert units() - set(placed) == set(), "modules in no layer of docs/architecture.md"


def test_no_import_reaches_a_layer_above_its_module_nor_prefect_where_the_layer_does_not_know_it():
    rows = layer_table()
    rank = {name: i for i, (_, names, _, _) in enumerate(rows) for name in names} | {ROOT: -1}
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        unit, module = _module(path)
        if unit == "testing":
            continue
        for dotted in sorted(_imports(path)):
            other = _unit_of(dotted)
            if other is not None and other != "testing" and rank[other] > rank[unit]:
                wrong.append(f"{module} ({rows[rank[unit]][0]}) imports {dotted} ({rows[rank[other]][0]})")
            if dotted.split(".")[0] == "prefect" and rank[unit] >= 0:
                layer, _, knows, allowed = rows[rank[unit]]
                if not knows and not f"{module}/".startswith(allowed):  # a package's __init__ is in it
                    wrong.append(f"{module} ({layer}, which does not know Prefect) imports {dotted}")
    assert not wrong, "\n".join(wrong)
