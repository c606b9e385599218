"""Warm timing shared by the demo, the benchmarks and the peers' runners: one policy, one place.

Every measured callable is called ``policy.warmup`` times untimed (and for at least
``policy.warmup_time`` seconds), then timed in ``policy.repeat``
samples (fast calls are looped so that a sample lasts at least ``policy.min_time``); sampling stops
early once ``policy.budget`` seconds are spent, so very slow calls (dense baselines) get fewer
samples, never fewer than one, and never without a warm-up. A :class:`Timing` keeps every sample;
its median is the figure reported, its minimum and quartiles are recorded beside it.

This module imports the standard library only: ``benchmarks/_asdex_runner.py`` runs in a JAX
environment without torch and loads this file by its path.
"""

from __future__ import annotations

import math
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Callable, Mapping


@dataclass(frozen=True)
class Policy:
    """How a callable is timed.

    Parameters
    ----------
    warmup : int
        Untimed calls before the first sample (at least 1).
    repeat : int
        Samples wanted (at least 1).
    min_time : float
        Seconds a sample should last at least; a faster call is looped within the sample.
    budget : float
        Seconds of sampling per measurement; once spent, no further sample is taken.
    warmup_time : float
        Seconds the untimed calls should last at least (more than ``warmup`` of them where each is
        short): a process that sat idle, or whose caches another process filled, is back in its
        steady state before the first sample.
    """

    warmup: int = 1
    repeat: int = 7
    min_time: float = 0.02
    budget: float = 5.0
    warmup_time: float = 0.0

    def __post_init__(self):
        if self.warmup < 1:
            raise ValueError(f"Policy(warmup={self.warmup}): at least one warm-up call is required; pass warmup>=1")
        if self.repeat < 1:
            raise ValueError(f"Policy(repeat={self.repeat}): at least one sample is required; pass repeat>=1")
        if self.min_time < 0 or self.budget < 0 or self.warmup_time < 0:
            raise ValueError(f"Policy(min_time={self.min_time}, budget={self.budget}, warmup_time={self.warmup_time}): "
                             "times must be >= 0")

    def to_json(self) -> dict:
        return dict(warmup=self.warmup, repeat=self.repeat, min_time=self.min_time, budget=self.budget,
                    warmup_time=self.warmup_time)

    @classmethod
    def from_json(cls, d: Mapping) -> Policy:
        return cls(**{k: d[k] for k in ("warmup", "repeat", "min_time", "budget")}, warmup_time=d.get("warmup_time", 0.0))


FULL = Policy()
QUICK = Policy(warmup=1, repeat=2, min_time=0.0, budget=0.05)


@dataclass(frozen=True)
class Timing:
    """Seconds per call of one warm measurement.

    Parameters
    ----------
    samples : tuple of float
        Seconds per call, one value per sample, in the order taken.
    number : int
        Calls per sample.
    warmup : int
        Untimed warm-up calls made before the samples.
    first : float
        Seconds of the first warm-up call (the cold call, recorded, never reported as the figure).
    """

    samples: tuple[float, ...]
    number: int
    warmup: int
    first: float

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def min(self) -> float:
        return min(self.samples)

    @property
    def quartiles(self) -> tuple[float, float]:
        if len(self.samples) < 2:
            return self.samples[0], self.samples[0]
        q1, _, q3 = statistics.quantiles(self.samples, n=4, method="inclusive")
        return q1, q3

    @property
    def iqr(self) -> float:
        q1, q3 = self.quartiles
        return q3 - q1

    def to_json(self) -> dict:
        q1, q3 = self.quartiles
        return dict(median=self.median, min=self.min, q1=q1, q3=q3, iqr=q3 - q1, samples=list(self.samples),
                    number=self.number, warmup=self.warmup, first=self.first)

    @classmethod
    def from_json(cls, d: Mapping) -> Timing:
        """The Timing that :meth:`to_json` wrote (e.g. by a peer's runner in another process)."""
        return cls(tuple(float(s) for s in d["samples"]), int(d["number"]), int(d["warmup"]), float(d["first"]))


def measure(fn: Callable[[], object], policy: Policy = FULL, *,
            clock: Callable[[], float] = time.perf_counter) -> Timing:
    """Time ``fn`` warm under ``policy``.

    Parameters
    ----------
    fn : callable
        Called with no arguments; its result is discarded.
    policy : Policy
        Warm-up calls, samples wanted, minimum sample length and sampling budget.
    clock : callable
        Seconds as a float (``time.perf_counter``; tests pass a fake clock).

    Returns
    -------
    Timing
        The samples (seconds per call) and how they were taken.
    """
    first = last = 0.0
    calls = 0
    start = clock()
    while calls < policy.warmup or clock() - start < policy.warmup_time:
        t0 = clock()
        fn()
        last = clock() - t0
        if calls == 0:
            first = last
        calls += 1
    number = 1 if last >= policy.min_time else max(1, math.ceil(policy.min_time / max(last, 1e-9)))
    samples: list[float] = []
    spent = 0.0
    while len(samples) < policy.repeat and (not samples or spent < policy.budget):
        t0 = clock()
        for _ in range(number):
            fn()
        dt = clock() - t0
        spent += dt
        samples.append(dt / number)
    return Timing(tuple(samples), number, calls, first)


def best_variant(variants: Mapping[str, Timing]) -> str:
    """The label of the variant with the smallest median.

    Parameters
    ----------
    variants : mapping of str to Timing
        One measurement per variant (e.g. ``{"SX": ..., "MX": ...}``).

    Returns
    -------
    str
        The winning label; ties go to the first label given.
    """
    if not variants:
        raise ValueError("best_variant(variants={}): no variant was measured; pass at least one Timing")
    return min(variants, key=lambda k: variants[k].median)


def ratio(slower: Timing | float | None, faster: Timing | float | None) -> float | None:
    """``slower / faster`` of two medians (seconds), ``None`` when either is missing.

    A ratio above 1 means ``faster`` takes less time than ``slower``.
    """
    if slower is None or faster is None:
        return None
    a = slower.median if isinstance(slower, Timing) else float(slower)
    b = faster.median if isinstance(faster, Timing) else float(faster)
    return a / b if b > 0 else None


def once(fn: Callable[[], object], *, clock: Callable[[], float] = time.perf_counter) -> tuple[float, object]:
    """Seconds taken by a single, deliberately cold call of ``fn``, and its result.

    Only for what is cold by definition (the first call of a process); everything else goes
    through :func:`measure`.
    """
    t0 = clock()
    out = fn()
    return clock() - t0, out


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


def fmt_seconds(s: Timing | float | None) -> str:
    """``s`` (a Timing's median, or seconds) as text with a unit; ``-`` for ``None``."""
    if s is None:
        return "-"
    if isinstance(s, Timing):
        s = s.median
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
