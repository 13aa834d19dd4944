"""The layers of ``docs/architecture.md`` are the layers the imports run in: the table there, read as
written, places every module of the package, and no import (function-level ones included) reaches a
layer above its module's, nor Prefect from a layer that says it does not know Prefect."""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "trialflow"
ARCHITECTURE = PACKAGE.parent / "docs" / "architecture.md"
ROOT = ""  # the package root (its version; the public API, imported by name): the bottom layer


def units() -> set[str]:
    """The package's top-level modules and subpackages (``testing/`` aside: test support)."""
    found = {p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__"}
    found |= {p.parent.name for p in PACKAGE.glob("*/__init__.py")}
    return found - {"testing"}


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
    return (parts[0] if parts else ROOT), "/".join(parts)


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
    return ROOT if parts[1:2] in ([], ["__version__"]) else parts[1]


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
