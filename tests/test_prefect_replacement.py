"""Replacing a function of Prefect's server modules (the kept server's process only): done where this
Prefect has it, nothing changed where it lacks the module, the name or what the replacement reads."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap


def test_a_replacement_is_made_only_where_prefect_has_what_it_replaces(tmp_path):
    code = textwrap.dedent("""
        import asyncio
        from prefect.server.api import background_workers as workers
        from trialflow.server.kept_server_app import hold_loop_services
        from trialflow.server.prefect_replacement import replace_in_prefect

        name = "register_and_schedule_perpetual_services"
        original = getattr(workers, name)
        print(replace_in_prefect("prefect.server.no_such_module", name, lambda _, module: print)
              or replace_in_prefect(workers.__name__, "no_such_function", lambda _, module: print)
              or replace_in_prefect(workers.__name__, name, lambda _, module: module.no_such_helper),
              getattr(workers, name) is original)
        held = hold_loop_services()
        asyncio.run(getattr(workers, name)("a docket"))
        print(getattr(workers, name) is not original, len(held))
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PREFECT_HOME": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["False", "True", "True", "1"]
