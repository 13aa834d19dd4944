"""The imports of a process that runs an experiment are set aside from the collector's later passes
(:func:`trialflow.foundation.startup_gc.long_lived_imports`), in a process of their own: setting aside
is for the whole process."""

from __future__ import annotations

import json
import subprocess
import sys

PROBE = """
import gc, json
from trialflow.foundation.startup_gc import long_lived_imports

before = gc.get_freeze_count()
with long_lived_imports():
    paused_inside = not gc.isenabled()
    kept = [[i] for i in range(5000)]  # stands for the objects an import leaves alive
set_aside = gc.get_freeze_count() - before >= 5000
# the permanent generation is left out of the collector's lists: a later pass never walks it
walked = any(o is kept[0] for o in gc.get_objects())
running_after = gc.isenabled()
try:
    with long_lived_imports():
        raise ImportError("a missing module")
except ImportError:
    pass
running_after_a_failed_import = gc.isenabled()
gc.disable()
with long_lived_imports():
    pass
print(json.dumps({"paused_inside": paused_inside, "set_aside": set_aside, "walked": walked,
                  "running_after": running_after,
                  "running_after_a_failed_import": running_after_a_failed_import,
                  "paused_by_an_outer_block_stays_paused": not gc.isenabled()}))
"""


def test_a_runs_imports_are_set_aside_from_later_collections_and_the_collector_runs_again_after():
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {"paused_inside": True, "set_aside": True, "walked": False,
                                      "running_after": True, "running_after_a_failed_import": True,
                                      "paused_by_an_outer_block_stays_paused": True}
