"""The ``algo`` group (register, list, unregister, show customized tuners and assessors, as nnictl
algo), ``package`` (the pip extras built-in algorithms need) and NNI's ``ss_gen``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from .common import CliError, console

algo_app = typer.Typer(help="Register customized tuners and assessors under a name (NNI's nnictl algo).",
                       no_args_is_help=True)
package_app = typer.Typer(help="Install what a built-in algorithm needs (NNI's nnictl package).", no_args_is_help=True)


@algo_app.command("register")
def algo_register(meta: Annotated[Path, typer.Option("--meta", "--meta_path", "-m", help="NNI meta file: algoType, "
                                                     "builtinName, className[, classArgsValidator]")]) -> None:
    """Register a customized tuner or assessor; configs then name it like a built-in one. The meta
    file's folder is where its module is looked up."""
    from ..assessors import ASSESSORS
    from ..tuners import TUNERS
    from ..tuners.custom import load_class
    from ..tuners.registry import read_meta, register

    entry = read_meta(meta)
    load_class(entry.class_name, entry.code_directory, entry.builtin_name)
    if entry.class_args_validator:
        load_class(entry.class_args_validator, entry.code_directory, f"{entry.builtin_name} classArgsValidator")
    register(entry, set(TUNERS) | set(ASSESSORS))
    name = escape(entry.builtin_name)
    console.print(f"registered {entry.algo_type} [bold]{name}[/] ({escape(entry.class_name)}); use it as "
                  f"{entry.algo_type}: {{name: {name}}}", markup=True, highlight=False)


@algo_app.command("list")
def algo_list() -> None:
    """The built-in and the registered algorithms, as NNI's `nnictl algo list`."""
    from rich.table import Table

    from ..assessors import ASSESSORS
    from ..assessors import NNI_NAMES as ASSESSOR_NAMES
    from ..tuners import NNI_NAMES as TUNER_NAMES
    from ..tuners import TUNERS
    from ..tuners.registry import registered_algorithms

    entries = registered_algorithms()
    builtins = Table("name", "also accepted (any case)", "type", "className", title="built-in")
    for kind, known, names in (("tuner", TUNERS, TUNER_NAMES), ("assessor", ASSESSORS, ASSESSOR_NAMES)):
        for nni_name in dict.fromkeys(names.values()):
            keys = [k for k, v in names.items() if v == nni_name]
            factory = known[keys[0]][0]
            also = ", ".join(k for k in keys if k != nni_name.lower())
            builtins.add_row(nni_name, also, kind, f"{factory.__module__}.{factory.__qualname__}")
    console.print(builtins)
    table = Table("name", "type", "className", "classArgsValidator", "code directory", title="registered")
    for e in entries:
        table.add_row(e.builtin_name, e.algo_type, e.class_name, e.class_args_validator or "", e.code_directory or "")
    console.print(table)


@algo_app.command("unregister")
def algo_unregister(name: str) -> None:
    """Forget a registered algorithm (its files stay where they are)."""
    from ..tuners.registry import unregister

    entry = unregister(name)
    console.print(f"unregistered {entry.algo_type} {entry.builtin_name}")


algo_app.command("reg", hidden=True)(algo_register)  # nnictl's aliases
algo_app.command("unreg", hidden=True)(algo_unregister)


@algo_app.command("show")
def algo_show(name: str) -> None:
    """One algorithm: a registered one's meta (as `algo register` took it), or a built-in's classArgs."""
    import yaml

    from ..assessors import ASSESSORS
    from ..assessors import NNI_NAMES as ASSESSOR_NAMES
    from ..tuners import NNI_NAMES as TUNER_NAMES
    from ..tuners import TUNERS
    from ..tuners.registry import registered

    entry = registered(name)
    if entry is not None:
        meta = {"builtinName": entry.builtin_name, "algoType": entry.algo_type, "className": entry.class_name,
                "classArgsValidator": entry.class_args_validator, "codeDirectory": entry.code_directory}
        typer.echo(yaml.safe_dump({k: v for k, v in meta.items() if v is not None}, sort_keys=False), nl=False)
        return
    for kind, table in (("tuner", TUNERS), ("assessor", ASSESSORS)):
        if name.lower() in table:
            allowed = sorted(table[name.lower()][1])
            typer.echo(yaml.safe_dump({"builtinName": name, "algoType": kind, "source": "trialflow",
                                       "classArgs": allowed, "extra": _extra_of(name)}, sort_keys=False), nl=False)
            return
    raise CliError(f"no algorithm {name!r}: `trialflow algo list` shows the registered ones; built-in tuners: "
                   f"{', '.join(dict.fromkeys(TUNER_NAMES.values()))}; assessors: "
                   f"{', '.join(dict.fromkeys(ASSESSOR_NAMES.values()))}")


def _extra_of(name: str) -> str | None:
    from ..tuners import NEEDS

    need = NEEDS.get(name.lower())
    return f"trialflow[{need[2]}]" if need else None


@package_app.command("show")
def package_show() -> None:
    """Built-in algorithms that need an optional package, and whether it is installed."""
    import importlib.util

    from ..tuners import NEEDS

    for name, (module, what, extra) in sorted(NEEDS.items()):
        state = "installed" if importlib.util.find_spec(module) is not None else "not installed"
        console.print(f"{name}: needs {what} (pip install 'trialflow[{extra}]'): {state}", highlight=False)


@package_app.command("install")
def package_install(name: str) -> None:
    """Install the pip extra the built-in algorithm NAME needs (e.g. BOHB: statsmodels); pip's own log
    is shown only when it fails."""
    from ..tuners import NAS_TUNERS, NEEDS, TUNERS

    key = name.lower()
    if key in {n.lower() for n in NAS_TUNERS}:
        raise CliError(f"{name} is one of NNI's neural architecture search tuners, out of trialflow's scope; "
                       "nothing to install")
    if key not in TUNERS:
        raise CliError(f"no built-in algorithm {name!r}; `trialflow package show` lists those that need a package")
    if key not in NEEDS:
        console.print(f"{name} needs no extra package: it is ready to use", highlight=False)
        return
    extra = f"trialflow[{NEEDS[key][2]}]"
    console.print(f"pip install '{extra}' ...", highlight=False)
    result = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                             extra], check=False, capture_output=True, text=True)
    if result.returncode:
        sys.stderr.write(result.stdout[-4000:] + result.stderr[-4000:])
        raise CliError(f"pip install '{extra}' failed (exit {result.returncode}); pip's output is above")
    console.print(f"{name}: {NEEDS[key][1]} installed", highlight=False)


def ss_gen(trial_command: Annotated[str | None, typer.Option("--trial_command", "-t")] = None,
           trial_dir: Annotated[str | None, typer.Option("--trial_dir", "-d")] = None,
           file: Annotated[str | None, typer.Option("--file", "-f")] = None) -> None:
    """NNI's search-space generation from annotated trial code: annotations were removed in NNI 3.0 and
    trialflow has none, so there is nothing to generate. Write the space as JSON (searchSpace or
    searchSpaceFile) and read parameters with nni.get_next_parameter()."""
    raise CliError("ss_gen generated search spaces from NNI annotations, which NNI 3.0 removed and trialflow does "
                   "not have: write the search space as JSON (searchSpaceFile) and read it with "
                   "nni.get_next_parameter()")
