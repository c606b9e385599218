"""``python -m asd bench [--quick] [names...] [-- script options]``: run the benchmark scripts of a
source checkout.

Each benchmark prints its table and writes JSON into ``benchmarks/results/``. Names: jacobian,
hessian, hessian_detection, coloring, linalg, detection, trust, clients, large, asd_jax, distributed (default: all). Options (``--quick``,
``--no-peers``, ``--threads N``) are passed to every script. ``--quick`` is the smoke mode: tiny
sizes, one warm-up and two samples, and the JSON goes to ``$ASD_BENCH_OUT`` (default: a new
temporary folder), never to ``benchmarks/results/``.
"""

from __future__ import annotations

import os
import runpy
import sys
import tempfile
import traceback

NAMES = ("jacobian", "hessian", "hessian_detection", "coloring", "linalg", "detection", "trust", "clients", "large", "asd_jax", "distributed")
OUT_ENV = "ASD_BENCH_OUT"


def benchmarks_dir() -> str:
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = os.path.join(here, "benchmarks")
    if not os.path.isdir(path):
        sys.exit("python -m asd bench runs the scripts in a source checkout's benchmarks/ folder, "
                 "which this installation does not have; clone the repository and run `make bench`")
    return path


def split(argv: list[str]) -> tuple[list[str], list[str]]:
    """Benchmark names and the options passed on to every script (an option's value included)."""
    names, options = [], []
    takes_value = {"--threads"}
    it = iter(argv)
    for a in it:
        if a == "--":
            options.extend(it)
        elif a.startswith("-"):
            options.append(a)
            if a in takes_value:
                options.append(next(it, ""))
        else:
            names.append(a)
    unknown = [n for n in names if n not in NAMES]
    if unknown:
        sys.exit(f"python -m asd bench: no benchmark named {', '.join(unknown)}; choose from {', '.join(NAMES)}")
    return names or list(NAMES), options


def main(argv=None) -> None:
    names, options = split(list(sys.argv[1:] if argv is None else argv))
    folder = benchmarks_dir()
    if "--quick" in options and not os.environ.get(OUT_ENV):
        os.environ[OUT_ENV] = tempfile.mkdtemp(prefix="asd-bench-quick-")
    if "--quick" in options:
        print(f"quick smoke run: JSON goes to {os.environ[OUT_ENV]}")
    sys.path.insert(0, folder)
    failed = []
    for name in names:
        script = os.path.join(folder, f"{name}.py")
        print(f"\n=== benchmarks/{name}.py {' '.join(options)} ===", flush=True)
        saved = sys.argv
        sys.argv = [script, *options]
        try:
            runpy.run_path(script, run_name="__main__")
        except Exception:  # noqa: BLE001 - report the failing benchmark, run the others
            traceback.print_exc()
            failed.append(name)
        finally:
            sys.argv = saved
    if failed:
        sys.exit(f"python -m asd bench: {', '.join(failed)} failed (tracebacks above)")
