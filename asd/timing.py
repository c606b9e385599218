"""Small timing helpers shared by the demo and the benchmarks."""

from __future__ import annotations

import statistics
import sys
import time
from typing import Callable


def timeit(fn: Callable[[], object], *, repeat: int = 7, min_time: float = 0.05, max_time: float = 5.0) -> float:
    """Median seconds per call of ``fn`` (after one warm-up call), looping short calls."""
    fn()
    t0 = time.perf_counter()
    fn()
    one = max(time.perf_counter() - t0, 1e-7)
    number = max(1, int(min_time / one))
    repeat = max(1, min(repeat, int(max_time / (one * number)) or 1))
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        samples.append((time.perf_counter() - t0) / number)
    return statistics.median(samples)


def once(fn: Callable[[], object]) -> tuple[float, object]:
    """Seconds taken by a single call of ``fn``, and its result."""
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


class Progress:
    """A one-line text progress bar on stderr (no dependency)."""

    def __init__(self, total: int, label: str = "", width: int = 30, stream=sys.stderr):
        self.total, self.label, self.width, self.stream, self.done = total, label, width, stream, 0

    def step(self, what: str = "") -> None:
        self.done += 1
        filled = int(self.width * self.done / max(self.total, 1))
        bar = "#" * filled + "-" * (self.width - filled)
        self.stream.write(f"\r{self.label} [{bar}] {self.done}/{self.total} {what:<40}")
        if self.done >= self.total:
            self.stream.write("\n")
        self.stream.flush()


def fmt_seconds(s: float | None) -> str:
    if s is None:
        return "-"
    if s >= 1:
        return f"{s:.2f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.1f} ms"
    return f"{s * 1e6:.0f} us"


def table(rows: list[dict], columns: list[tuple[str, str]]) -> str:
    """A plain-text table of ``rows`` with ``columns`` given as (key, header)."""
    cells = [[h for _, h in columns]] + [[str(r.get(k, "-")) for k, _ in columns] for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(columns))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
