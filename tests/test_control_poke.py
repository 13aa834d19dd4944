"""A control written to an embedded store wakes the controller that watches it: trialflow stop, trial
kill and update land at once instead of at the experiment loop's next look."""

from __future__ import annotations

import os

from trialflow.foundation.readable import wait_readable
from trialflow.records.control_poke import POKE_FILE, ControlsWatch
from trialflow.records.store import Control, ExperimentStore


def test_a_control_written_by_another_process_wakes_the_watch_and_only_then(tmp_path):
    controller = ExperimentStore.embedded(tmp_path, "pokeexp")
    controller.create_experiment("poke", {"a": 1})
    watch = ControlsWatch(controller.url)
    try:
        assert watch.fd is not None
        poke_file = tmp_path / "db" / POKE_FILE
        assert poke_file.stat().st_mode & 0o777 == 0o600
        assert wait_readable([watch.fd], 0.3) == []  # nothing written: the loop sleeps its whole wait
        command = ExperimentStore.embedded(tmp_path, "pokeexp")  # as `trialflow stop` opens it
        command.set_control(Control.STOP, True)
        command.close()
        assert wait_readable([watch.fd], 30) == [watch.fd]
        watch.clear()
        assert wait_readable([watch.fd], 0.3) == []  # read: asleep again until the next control
        controller.set_control(Control.TRIAL_CONCURRENCY, 3)
        assert wait_readable([watch.fd], 30) == [watch.fd]
        assert controller.controls() == {"stop": True, "trial_concurrency": 3}
    finally:
        watch.close()
        controller.close()


def test_without_a_watching_controller_a_control_makes_no_file_and_a_planted_link_is_not_followed(tmp_path):
    store = ExperimentStore.embedded(tmp_path, "pokeexp")
    store.create_experiment("poke", {"a": 1})
    store.set_control(Control.STOP, True)  # no controller: nothing to wake, nothing made
    assert not (tmp_path / "db" / POKE_FILE).exists()
    target = tmp_path / "someone-elses-file"
    target.write_text("kept")
    os.utime(target, (1_000_000, 1_000_000))
    (tmp_path / "db" / POKE_FILE).symlink_to(target)
    watch = ControlsWatch(store.url)  # refuses the link: the loop looks on its own clock
    try:
        assert watch.fd is None
        store.set_control(Control.STOP, False)
        assert target.stat().st_mtime == 1_000_000 and target.read_text() == "kept"
    finally:
        watch.close()
        store.close()


def test_a_shared_database_has_nothing_to_watch():
    assert ControlsWatch("postgresql+psycopg://u@127.0.0.1:5/db").fd is None
