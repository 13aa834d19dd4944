"""What the experiment flow keeps in Prefect's flow-run context and writes to its UI, without a server."""

from __future__ import annotations


def test_a_copy_of_the_flow_contexts_results_interrupted_by_another_thread_is_taken_again():
    """A clean run ended an experiment in ERROR ("dictionary changed size during iteration") when a task
    thread added a result while the loop copied them to forget a closed trial's: the copy is retried."""
    from trialflow.flows.prefect_run_context import items_of

    class ChangedWhileCopied(dict):
        interruptions = 2

        def items(self):
            if self.interruptions:
                self.interruptions -= 1
                raise RuntimeError("dictionary changed size during iteration")
            return super().items()

    results = ChangedWhileCopied(a=1, b=2)
    assert items_of(results) == [("a", 1), ("b", 2)] and results.interruptions == 0
    assert items_of(ChangedWhileCopied(a=1), tries=2) == []  # still changing: nothing forgotten this time


def test_an_artifact_write_that_failed_is_written_again_at_the_next_turn(monkeypatch):
    """A loaded clean run showed more summary versions than table versions: a table write that failed
    (the API busy) had been counted as written, so the next turn skipped it and the UI kept an old
    table. A failed write now leaves the artifact to be written again."""
    from types import SimpleNamespace

    import prefect.artifacts as artifacts

    from trialflow.flows.artifacts import ArtifactReporter

    written: list[str] = []
    failures = {"trials": 1}

    def create(kind):
        def write(key, **_):
            if failures.get(kind):
                failures[kind] -= 1
                raise RuntimeError("503 Service Unavailable")
            written.append(key.rsplit("-", 1)[1])
        return write

    monkeypatch.setattr(artifacts, "create_table_artifact", create("trials"))
    monkeypatch.setattr(artifacts, "create_markdown_artifact", create("best"))
    monkeypatch.setattr(artifacts, "create_progress_artifact", lambda **_: "progress-id")
    monkeypatch.setattr(artifacts, "update_progress_artifact", lambda **_: None)
    record = SimpleNamespace(optimize_mode="maximize", config={})
    store = SimpleNamespace(count_by_status=lambda: {"SUCCEEDED": 1}, trials=lambda: [], experiment=lambda: record,
                            controls=lambda: {})
    ctx = SimpleNamespace(experiment_id="e1", store=store,
                          config=SimpleNamespace(max_trial_number=2, is_hybrid=False))
    reporter = ArtifactReporter(ctx)  # type: ignore[arg-type]
    reporter.update()  # the table's write fails: nothing after it is written this turn
    assert written == []
    reporter.update()
    assert written == ["trials", "best"]
    reporter.update(final=True)  # the table is unchanged; the summary says the run ended
    assert written == ["trials", "best", "best"]
