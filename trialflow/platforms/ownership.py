"""What trialflow made in a working directory it shares with others, so that ``trialflow platform
clean`` removes that and nothing else.

A remote machine's ``remoteWorkingDirectory`` or a job platform's share may hold the user's own
folders (a project called ``code``, a study with a ``trials`` folder) and links to folders elsewhere.
trialflow therefore claims each top-level folder it works in -- ``code`` (bundles), ``runtime`` and
one per experiment, named by its id -- by writing :data:`MARKER` into it before anything else goes
there. :func:`owned_folders` finds exactly those: a real folder (never a link), with a marker that is
a regular file, named ``code``, ``runtime`` or an experiment id. A folder made by an older trialflow,
without a marker, is left alone.
"""

from __future__ import annotations

from ..foundation.ids import looks_like_experiment_id
from .trialfs import TrialFS

MARKER = ".trialflow-made"
MARKER_TEXT = b"made by trialflow: `trialflow platform clean` removes this folder\n"
SHARED_FOLDERS = ("code", "runtime")  # besides one folder per experiment


def claim(fs: TrialFS, root: str, experiment_id: str, shared: tuple[str, ...] = SHARED_FOLDERS) -> None:
    """Create and mark the folders an experiment works in under ``root``: ``shared`` (those of
    :data:`SHARED_FOLDERS` it uses there) and its own (idempotent). A folder of that name that is
    already there unmarked (the user's own ``code``, an older trialflow's) is used as it is and stays
    unmarked: clean never removes it."""
    for name in (*shared, experiment_id):
        folder = fs.join(root, name)
        if fs.kind(folder) is None:
            fs.makedirs(folder)
            fs.write(fs.join(folder, MARKER), MARKER_TEXT)


def owned_folders(fs: TrialFS, root: str) -> list[str]:
    """The folders under ``root`` that trialflow made and marked (see the module's rule), sorted."""
    found = []
    for name in sorted(fs.listdir(root) or {}):
        if name not in SHARED_FOLDERS and not looks_like_experiment_id(name):
            continue
        folder = fs.join(root, name)
        if fs.kind(folder) == "dir" and fs.kind(fs.join(folder, MARKER)) == "file":
            found.append(folder)
    return found
