"""Small helpers shared by the benchmark scripts: timing and table printing."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1000


def print_table(title: str, header: list[str], rows: list[list[object]]) -> None:
    print(f"\n{title}")
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=False)]
    print("  ".join(str(h).ljust(w) for h, w in zip(header, widths, strict=True)))
    for row in rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)))
