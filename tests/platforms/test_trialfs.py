"""The local trial filesystem under writers that rename and remove files while it reads."""

from __future__ import annotations

import os

from trialflow.platforms import trialfs
from trialflow.platforms.trialfs import LocalFS


def test_a_file_renamed_away_during_a_listing_is_left_out_not_a_missing_folder(tmp_path, monkeypatch):
    """A keeper writes ``.nni`` files through a temporary name and a rename: a listing that meets the
    temporary file must still list the folder, or the trial is taken for lost."""
    (tmp_path / "state").write_text("{}")
    temporary = tmp_path / "metrics.tmp123"
    temporary.write_text("x")
    scandir = os.scandir

    def scandir_then_rename(path):
        entries = list(scandir(path))  # listed while the temporary file is there ...
        os.rename(temporary, tmp_path / "metrics")  # ... renamed before its size is asked for
        return _Entries(entries)

    monkeypatch.setattr(trialfs.os, "scandir", scandir_then_rename)
    assert LocalFS().listdir(str(tmp_path)) == {"state": 2}


def test_a_missing_folder_lists_as_none(tmp_path):
    assert LocalFS().listdir(str(tmp_path / "gone")) is None
    (tmp_path / "file").write_text("")
    assert LocalFS().listdir(str(tmp_path / "file")) is None


class _Entries(list):
    """``os.scandir``'s context-manager protocol over a fixed list."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
