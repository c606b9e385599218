"""Reporting shared by the benchmark scripts: table, target checks and the JSON record."""

from __future__ import annotations

import json
import os
import platform
import time

import torch

from asd.timing import fmt_seconds

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def peer(row: dict, name: str, key: str):
    """A peer's figure from a row (``None`` when the peer is missing or failed)."""
    v = row.get(name)
    return v.get(key) if isinstance(v, dict) else None


class Targets:
    """Collects target checks: ``add(what, met, value)``."""

    def __init__(self):
        self.items: list[dict] = []

    def add(self, what: str, met, value) -> None:
        self.items.append(dict(what=what, met=bool(met), value=value))


def report(name: str, issue: str, rows: list[dict], table_text: str, targets: list[dict], *, first_call: float,
           threads: int, out: str) -> dict:
    """Print the table and the targets, write the JSON record to ``out``; returns the record."""
    print(f"\nfirst call of the process (Numba kernels loaded/compiled, torch.func set up): {fmt_seconds(first_call)}")
    print(f"torch {torch.__version__}, {threads} thread(s), {platform.processor() or platform.machine()}\n")
    print(table_text)
    print(f"\nTargets ({issue}):")
    for c in targets:
        print(f"  [{'ok' if c['met'] else 'MISSED'}] {c['what']}: {c['value']}")
    record = dict(benchmark=name, torch=torch.__version__, threads=threads, first_call=first_call, rows=rows,
                  targets=targets, date=time.strftime("%Y-%m-%d %H:%M"))
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as fh:
        json.dump(record, fh, indent=1, default=str)
    print(f"\nwrote {out}")
    return record
