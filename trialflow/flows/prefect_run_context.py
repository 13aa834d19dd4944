"""What trialflow touches of Prefect's private flow-run context (``FlowRunContext``): one function,
:func:`forget_task_runs`, which a test pins against the installed Prefect
(``tests/test_prefect_run_context.py``: a Prefect that renames or reshapes these fields fails it).

Lifecycle: called inside a flow run, from the experiment loop, when a trial's last task run closed.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from prefect.context import FlowRunContext


def forget_task_runs(task_runs: set[UUID]) -> None:
    """Drop what the flow run's context keeps of a closed trial's task runs (``task_runs``) and never
    reads again; kept, it would grow with every trial (benchmarks/scale.py measures the controller's
    memory):

    * ``run_results``, links from their results to their states, by which a result passed to a later
      task becomes an edge of the run graph (suggest -> submit -> trial). Every task of the trial has
      been created with its inputs once its last task run closed, and no later task is given them;
    * ``task_run_assets`` entries with no asset: an empty set adds nothing to a downstream task's
      upstream assets, exactly as a missing entry.
    """
    context = FlowRunContext.get()
    if context is None:
        return
    for key, (state, *_) in items_of(context.run_results):
        if state.state_details.task_run_id in task_runs:
            context.run_results.pop(key, None)
    for task_run_id, assets in items_of(context.task_run_assets):
        if not assets:
            context.task_run_assets.pop(task_run_id, None)


def items_of(mapping: dict[Any, Any], tries: int = 100) -> list[tuple[Any, Any]]:
    """A copy of the items of a dict that task threads change meanwhile. Copying runs no Python code of
    its own, but the garbage collector may run a finalizer during it, and another thread may then
    change the dict (``RuntimeError: dictionary changed size during iteration``): the copy is taken
    again. After ``tries`` interrupted copies, none (nothing is forgotten this time)."""
    for _ in range(tries):
        try:
            return list(mapping.items())
        except RuntimeError:
            continue
    return []
