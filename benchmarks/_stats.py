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


def summary_row(bench: str, measure: str, value: float, unit: str, baseline: str, base_value: float | None,
                target: float | None = None, higher_is_better: bool = False) -> list[object]:
    """One row of ``python -m benchmarks``'s table: the measure, its baseline from the same run, their
    ratio, and the verdict against ``target`` (a ratio) when there is one."""
    ratio = value / base_value if base_value else None
    if target is None or ratio is None:
        verdict = "-"
    else:
        verdict = "PASS" if (ratio >= target if higher_is_better else ratio <= target) else "OVER"
    return [bench, measure, f"{value:,.3g} {unit}".strip(), baseline,
            f"{base_value:,.3g} {unit}".strip() if base_value is not None else "-",
            f"{ratio:.2f}x" if ratio is not None else "-",
            (">= " if higher_is_better else "<= ") + f"{target:g}x" if target is not None else "-", verdict]
