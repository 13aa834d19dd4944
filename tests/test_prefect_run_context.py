"""Prefect's private flow-run context as trialflow uses it (``trialflow.flows.prefect_run_context``), pinned
against the installed Prefect: a Prefect that stops keeping a task's result links or its asset entries in
the places trialflow empties would leave the controller's memory growing with every trial again."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.usefixtures("prefect_server")


def test_a_closed_trials_task_runs_leave_the_flow_runs_context_and_the_others_stay():
    from prefect import flow, task
    from prefect.context import FlowRunContext

    from trialflow.flows.prefect_run_context import forget_task_runs

    @task
    def suggest() -> dict[str, float]:
        return {"x": 0.5}

    @task
    def submit(parameters: dict[str, float]) -> str:
        return f"submitted {parameters['x']}"

    def kept(context: FlowRunContext) -> tuple[set[object], set[object]]:
        linked = {state.state_details.task_run_id for state, *_ in context.run_results.values()}
        return linked, set(context.task_run_assets)

    @flow
    def two_trials() -> tuple[set[object], ...]:
        context = FlowRunContext.get()
        assert context is not None
        closed = suggest(return_state=True)
        submit(closed.result(), return_state=True)
        first = {r.state_details.task_run_id for r, *_ in context.run_results.values()}
        other = suggest(return_state=True)
        before = kept(context)
        forget_task_runs(first)
        after = kept(context)
        return first, {other.state_details.task_run_id}, *before, *after

    first, other, linked_before, assets_before, linked_after, assets_after = two_trials()
    assert len(first) == 2 and first <= linked_before and other <= linked_before  # where Prefect keeps them
    assert first <= assets_before  # an (empty) asset entry per task run
    assert not first & linked_after and other <= linked_after  # the closed trial's gone, the other's kept
    assert not first & assets_after
