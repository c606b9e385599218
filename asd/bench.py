"""``python -m asd bench [names...]``: run the benchmark scripts of a source checkout.

Each benchmark prints its table and writes JSON into ``benchmarks/results/``. Names: jacobian,
hessian, hessian_detection, coloring, linalg, detection (default: all that exist).
"""

from __future__ import annotations

import os
import runpy
import sys

NAMES = ("jacobian", "hessian", "hessian_detection", "coloring", "linalg", "detection")


def benchmarks_dir() -> str:
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = os.path.join(here, "benchmarks")
    if not os.path.isdir(path):
        sys.exit("python -m asd bench runs the scripts in a source checkout's benchmarks/ folder, "
                 "which this installation does not have; clone the repository and run `make bench`")
    return path


def main(argv=None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    names = [a for a in argv if not a.startswith("-")] or list(NAMES)
    folder = benchmarks_dir()
    sys.path.insert(0, folder)
    for name in names:
        script = os.path.join(folder, f"{name}.py")
        if not os.path.exists(script):
            print(f"(no benchmark {name!r})")
            continue
        print(f"\n=== benchmarks/{name}.py ===", flush=True)
        saved = sys.argv
        sys.argv = [script]
        try:
            runpy.run_path(script, run_name="__main__")
        finally:
            sys.argv = saved
