"""Python's cyclic garbage collector paused while start-up work runs, and skipped at exit.

An import allocates many objects that live as long as the process, and every few hundred allocations
start a collection that finds next to nothing to free (Prefect's server imports a fifth faster without
them: benchmarks/README.md). Imports made under
:func:`collector_paused` skip those collections; afterwards the collector runs as before and finds
whatever garbage the imports left. (The kept Prefect server keeps it paused through its whole start:
:mod:`trialflow.server.kept_server_app`.) A process that goes on to run an experiment imports what the
run needs under :func:`long_lived_imports`, which also sets those objects aside from every later
collection, each of which would walk them again. :func:`no_collection_at_exit` spares a process that ran
an experiment the interpreter's last collection.

Standard library only.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager


@contextmanager
def _paused(set_aside_after: bool) -> Iterator[None]:
    """The collector paused for the block (a block inside another pause leaves it to the outer one) and,
    with ``set_aside_after``, every object alive set aside before it runs again; however the block ends."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if set_aside_after:
            gc.freeze()  # before the collector runs again, whose first pass would walk them all once
        if enabled:
            gc.enable()


def collector_paused() -> AbstractContextManager[None]:
    """Pause the collector for the block, when it runs (a nested block leaves it to the outer one); it
    runs again after the block, however the block ends."""
    return _paused(set_aside_after=False)


def set_aside(collect_first: bool) -> None:
    """Set aside every object the process holds now (its imports, after :func:`collector_paused`) from
    all later collections, so that a long-running process never walks them again. ``collect_first``
    frees the imports' garbage first (a full collection); without it that garbage (a few thousand
    objects) is kept for good, which costs less than the collection where a start is waited for."""
    if collect_first:
        gc.collect()
    gc.freeze()


def long_lived_imports() -> AbstractContextManager[None]:
    """Run the block (the imports a run needs) with the collector paused, then set aside every object
    alive from all later collections (as :func:`set_aside` without a collection first), however the block
    ends: the run's collections never walk the imports' objects. Use where the process goes on to run an
    experiment; the garbage the imports left (a few thousand objects) is kept for good."""
    return _paused(set_aside_after=True)


def no_collection_at_exit() -> None:
    """Make the interpreter's last collection, at exit, skip every object alive then. After an
    experiment it walks all that Prefect, SQLAlchemy and the run made -- about a CPU-second, several on
    a busy machine -- between the command's last line (a Ctrl-C's too) and the shell's prompt, and frees
    nothing the exit needs: the exit handlers flush and close what the process wrote, and the exit
    itself releases its memory. Call once per process."""
    import atexit

    atexit.register(gc.freeze)
