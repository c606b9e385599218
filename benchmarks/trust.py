"""The price of checking instead of trusting: a validated cache hit against a prepared call.

    python benchmarks/trust.py           # B1 Brusselator N=64; writes benchmarks/results/trust.json
    python benchmarks/trust.py --quick   # N=8, JSON into a temporary folder

Target (trust issue): a cache hit of ``asd.sparse_jacobian`` - the prepared call plus the
cross-mode probe - costs at most the call plus one product of the other mode plus 10%.
"""

from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import harness  # noqa: E402
from harness import Session, Targets  # noqa: E402

import asd  # noqa: E402
from asd.problems import brusselator, brusselator_input  # noqa: E402
from asd.timing import fmt_seconds, table  # noqa: E402


def main(argv=None) -> dict:
    a = harness.parse(harness.arguments("trust", __doc__), argv)
    torch.set_num_threads(a.threads)
    s = Session.from_args(a)
    N = 8 if a.quick else 64
    f, x = brusselator(N), brusselator_input(N)
    case = f"B1 N={N}"
    op = asd.prepare_jacobian(f, x)
    asd.sparse_jacobian(f, x)  # fills the cache
    g = op._g
    xf = x.reshape(-1)
    u = torch.randn(op.pattern.shape[0], dtype=x.dtype)
    v = torch.randn(op.pattern.shape[1], dtype=x.dtype)
    other = (lambda: torch.func.jvp(g, (xf,), (v,))[1]) if op.mode == "reverse" else \
        (lambda: torch.func.vjp(g, xf)[1](u)[0])
    t_call = s.measure(case, "prepared call", lambda: op(x))
    t_hit = s.measure(case, "validated cache hit (sparse_jacobian)", lambda: asd.sparse_jacobian(f, x))
    t_probe = s.measure(case, "op.check (probe alone, values given)", lambda: op.check(x, op.values(x)))
    t_other = s.measure(case, "one product of the other mode", other)
    overhead = t_hit.median - t_call.median
    targets = Targets()
    targets.add("cache-hit overhead <= one other-mode product + 10%", overhead <= 1.1 * t_other.median,
                f"{fmt_seconds(overhead)} vs {fmt_seconds(1.1 * t_other.median)}")
    row = dict(case=case, mode=op.mode, ncolors=op.ncolors, call=t_call.median, hit=t_hit.median,
               probe=t_probe.median, other_product=t_other.median, overhead=overhead,
               overhead_in_products=overhead / t_other.median,
               timings=harness.timings_json(dict(call=t_call, hit=t_hit, probe=t_probe, other=t_other)))
    print(table([dict(row, **{k: fmt_seconds(row[k]) for k in ("call", "hit", "probe", "other_product", "overhead")})],
                [("case", "case"), ("mode", "mode"), ("call", "prepared call"), ("hit", "validated hit"),
                 ("other_product", "one other product"), ("overhead", "overhead"),
                 ("overhead_in_products", "in products")]))
    for t in targets.items:
        print(f"  [{harness.verdict(t['met'])}] {t['what']}: {t['value']}")
    return harness.write(s, dict(benchmark="trust", rows=[row], targets=targets.items), a.out)


if __name__ == "__main__":
    main()
