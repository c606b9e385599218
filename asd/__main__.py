"""``python -m asd demo | bench | figures | guide``."""

from __future__ import annotations

import sys


def main(argv=None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    cmd = argv.pop(0) if argv else "demo"
    if cmd == "demo":
        from .demo import main as run
    elif cmd == "bench":
        from .bench import main as run
    elif cmd == "figures":
        from .viz.guide import make_figures

        def run(args):
            for path in make_figures(args[0] if args else "figures"):
                print(path)
    elif cmd == "guide":
        from .viz.guide.build import main as run
    else:
        sys.exit(f"unknown command {cmd!r}; use one of: demo, bench, figures, guide")
    run(argv)


if __name__ == "__main__":
    main()
