"""What the experiment flow keeps in Prefect's flow-run context, without a server."""

from __future__ import annotations


def test_a_copy_of_the_flow_contexts_results_interrupted_by_another_thread_is_taken_again():
    """A clean run ended an experiment in ERROR ("dictionary changed size during iteration") when a task
    thread added a result while the loop copied them to forget a closed trial's: the copy is retried."""
    from trialflow.flows.experiment import items_of

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
