"""Installs ``trialflow-nni.pth`` beside the package. Its first line appends the NNI compatibility
package (``trialflow/trial/nni_shim``) to ``sys.path`` so that ``import nni`` works in a trial script
run by hand (NNI's standalone mode: empty parameters, results printed); appended after site-packages,
so an installed NNI is found first. Its second line, run at every interpreter's start, guards the kept
Prefect server's port where ``TRIALFLOW_GUARD_PORT`` is set (``trialflow.server.port_guard``; a shell
that ran ``eval "$(trialflow server env)"``), and costs an environment lookup elsewhere. Everything
else is in pyproject.toml.
"""

import os

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.editable_wheel import editable_wheel

PTH = "trialflow-nni.pth"
SHIM = os.path.join("trialflow", "trial", "nni_shim")


# TRIALFLOW_GUARD_PORT is trialflow.server.port_guard.GUARD_ENV (the package is not imported to build it)
GUARD_LINE = ('import os; os.environ.get("TRIALFLOW_GUARD_PORT") and '
              '__import__("trialflow.server.port_guard", fromlist=["_"]).guard_from_environment()')


def _write_pth(folder: str, shim: str) -> str:
    path = os.path.join(folder, PTH)
    with open(path, "w", encoding="utf-8") as f:
        f.write(shim + "\n" + GUARD_LINE + "\n")
    return path


class BuildWithPth(build_py):
    """A wheel's ``.pth`` names the shim relative to site-packages, where the wheel installs it."""

    def run(self) -> None:
        super().run()
        if not self.editable_mode:
            _write_pth(self.build_lib, SHIM)

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        extra = [] if self.editable_mode else [os.path.join(self.build_lib, PTH)]
        return [*super().get_outputs(include_bytecode), *extra]


class EditableWithPth(editable_wheel):
    """An editable install's ``.pth`` names the shim in the source tree."""

    def _run_build_commands(self, dist_name, unpacked_wheel, build_lib, tmp_dir):  # type: ignore[no-untyped-def]
        result = super()._run_build_commands(dist_name, unpacked_wheel, build_lib, tmp_dir)
        _write_pth(str(unpacked_wheel), os.path.join(os.path.dirname(os.path.abspath(__file__)), SHIM))
        return result


setup(cmdclass={"build_py": BuildWithPth, "editable_wheel": EditableWithPth})
