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
    ctx = _one_trial_done(monkeypatch)
    reporter = ArtifactReporter(ctx)  # type: ignore[arg-type]
    reporter.update()  # the table's write fails: nothing after it is written this turn
    assert written == []
    reporter.update()
    assert written == ["trials", "best"]
    reporter.update(final=True)  # the table is unchanged; the summary says the run ended
    assert written == ["trials", "best", "best"]


def _one_trial_done(monkeypatch):
    """The context an ArtifactReporter reads: a maximizing experiment of 2 trials, 1 succeeded; the
    progress artifact's update writes nothing."""
    from types import SimpleNamespace

    import prefect.artifacts as artifacts

    monkeypatch.setattr(artifacts, "update_progress_artifact", lambda **_: None)
    record = SimpleNamespace(optimize_mode="maximize", config={})
    store = SimpleNamespace(count_by_status=lambda: {"SUCCEEDED": 1}, trials=lambda: [], experiment=lambda: record,
                            controls=lambda: {})
    return SimpleNamespace(experiment_id="e1", store=store, config=SimpleNamespace(max_trial_number=2, is_hybrid=False))


def test_an_artifact_turn_with_nothing_to_write_does_not_say_the_api_answers(monkeypatch):
    """By hand: with the kept server stopped (``--force``) mid-run, the cancel check found the API gone,
    then a turn of the UI artifacts that had nothing new to write counted as the API answering, so the
    run's final artifacts were written with Prefect's retries: 70 s between the last trial and DONE. The
    final write now tries once."""
    import logging

    import prefect.artifacts as artifacts
    from prefect.settings import PREFECT_API_URL, PREFECT_CLIENT_MAX_RETRIES, temporary_settings

    from trialflow.flows.api_outage import OptionalCalls
    from trialflow.flows.artifacts import ArtifactReporter

    monkeypatch.setattr(OptionalCalls, "_apis_down", set())
    retries: list[int] = []

    def write(**_):
        retries.append(PREFECT_CLIENT_MAX_RETRIES.value())
        raise ConnectionRefusedError("[Errno 111] Connection refused")

    monkeypatch.setattr(artifacts, "create_progress_artifact", lambda **_: "progress-id")
    monkeypatch.setattr(artifacts, "create_table_artifact", write)
    with temporary_settings(updates={PREFECT_API_URL: "http://127.0.0.1:9/api"}):
        reporter = ArtifactReporter(_one_trial_done(monkeypatch))  # type: ignore[arg-type]
        reporter._next_snapshot = float("inf")  # the progress only: written now, unchanged at the next turn
        reporter.update()
        OptionalCalls("the cancel check", logging.getLogger("test")).failed(ConnectionRefusedError())
        reporter.update()  # nothing to write
        reporter.update(final=True)
    assert retries == [0]
