"""The read-only commands' store reader (``sqlite3``, no SQLAlchemy) reads every record as the store
does, on stores written by every schema version: an older one is opened (and so upgraded) by the store
first, a damaged one is the store's one-line error."""

from __future__ import annotations

from pathlib import Path

import pytest

from trialflow.experiments import list_experiments, open_records
from trialflow.records.store import ExperimentStore
from trialflow.records.store_reader import EmbeddedReader
from trialflow.records.store_records import DB_RELATIVE_PATH, StoreUnreadable

ASSETS = sorted((Path(__file__).parent / "assets" / "stores").glob("v*"), key=lambda p: int(p.name[1:]))
EXPERIMENT = "embedded1"  # the embedded experiment every asset holds


def _working_directory(asset: Path, tmp_path: Path) -> Path:
    db = tmp_path / "w" / EXPERIMENT / DB_RELATIVE_PATH
    db.parent.mkdir(parents=True)
    db.write_bytes((asset / "trialflow.sqlite").read_bytes())
    return tmp_path / "w"


@pytest.mark.parametrize("asset", ASSETS, ids=lambda p: p.name)
def test_the_reader_reads_every_record_as_the_store_does(asset, tmp_path):
    root = _working_directory(asset, tmp_path)
    first = open_records(root, EXPERIMENT)
    first.close()
    # this code's schema is read directly; an older store is opened by the store, which upgrades it
    assert isinstance(first, EmbeddedReader) == (asset == ASSETS[-1])
    reader, store = open_records(root, EXPERIMENT), ExperimentStore.embedded(root / EXPERIMENT, EXPERIMENT)
    try:
        assert isinstance(reader, EmbeddedReader)
        assert reader.experiment() == store.experiment()
        trials = reader.trials()
        assert trials == store.trials() and reader.count_trials() == store.count_trials() == len(trials) == 5
        assert reader.metrics() == store.metrics() and len(reader.metrics()) > len(trials)
        for trial in trials:
            for kind in ("PERIODICAL", "FINAL"):
                assert reader.metrics(trial.id, kind) == store.metrics(trial.id, kind)
        assert reader.metrics(type="FINAL") == store.metrics(type="FINAL")
    finally:
        reader.close()
        store.close()


@pytest.mark.breaks_records
def test_a_damaged_store_is_the_stores_one_line_error(tmp_path):
    root = _working_directory(ASSETS[-1], tmp_path)
    (root / EXPERIMENT / DB_RELATIVE_PATH).write_bytes(b"not a database " * 100)
    with pytest.raises(StoreUnreadable, match="cannot be read .* the file is damaged; restore it from a backup"):
        open_records(root, EXPERIMENT)
    unreadable: list[str] = []
    assert list_experiments(root, unreadable) == [] and len(unreadable) == 1
    assert unreadable[0].startswith(f"{EXPERIMENT}: the experiment store {root / EXPERIMENT / DB_RELATIVE_PATH}")
