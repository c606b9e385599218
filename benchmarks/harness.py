"""The benchmark harness: options, warm timings, peers' labelled variants, ratios and the JSON record.

Every script in benchmarks/ times asd, dense AD and the peers through one :class:`Session`, under
one :class:`asd.timing.Policy` (warm-up calls, then samples; the median is the figure, min and IQR
are recorded), and writes its record with :func:`write`. ``--quick`` shrinks the sizes, uses
:data:`asd.timing.QUICK` and writes into ``$ASD_BENCH_OUT`` or a new temporary folder, never into
benchmarks/results/.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from typing import Callable, Iterable, Mapping, Sequence

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from asd.timing import FULL, QUICK, Policy, Timing, best_variant, fmt_seconds, measure, ratio  # noqa: E402

RESULTS = os.path.join(HERE, "results")
OUT_ENV = "ASD_BENCH_OUT"


# ------------------------------------------------------------------------------------ options
def arguments(name: str, description: str | None) -> argparse.ArgumentParser:
    """The options every benchmark script takes (``--quick``, ``--out``, ``--threads``, ``--no-peers``)."""
    p = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help="smoke run: tiny sizes, 1 warm-up and 2 samples, JSON into a temporary folder")
    p.add_argument("--out", default=None,
                   help=f"JSON file to write (default benchmarks/results/{name}.json; with --quick "
                        f"${OUT_ENV}/{name}.json or a new temporary folder)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch intra-op threads; in the peers' comparisons (jacobian, hessian) both sides get "
                        "as many CPUs (asdex's runners and asd's thread are limited to them, CasADi runs on one)")
    p.add_argument("--no-peers", action="store_true", help="time asd and dense AD only")
    p.set_defaults(bench_name=name)
    return p


def parse(parser: argparse.ArgumentParser, argv: list[str] | None = None) -> argparse.Namespace:
    """Parse ``argv``; adds ``policy`` (QUICK or FULL) and resolves ``out``."""
    a = parser.parse_args(argv)
    a.policy = QUICK if a.quick else FULL
    a.out = output_path(a.bench_name, a.out, a.quick)
    a.cpus = peer_cpus(a.threads)
    return a


def peer_cpus(threads: int) -> tuple[int, ...] | None:
    """The CPUs both sides of a peer comparison run on with ``threads`` torch threads: the first
    ``threads`` of this process's, or ``None`` (no limit) where that is all of them."""
    cpus = sorted(os.sched_getaffinity(0))
    return tuple(cpus[:max(threads, 1)]) if threads < len(cpus) else None


def output_path(name: str, out: str | None, quick: bool) -> str:
    """Where the JSON record goes; a quick run is refused a path inside benchmarks/results/."""
    if out is None:
        if not quick:
            return os.path.join(RESULTS, f"{name}.json")
        folder = os.environ.get(OUT_ENV) or tempfile.mkdtemp(prefix="asd-bench-quick-")
        out = os.path.join(folder, f"{name}.json")
    if quick and os.path.commonpath([os.path.abspath(out), RESULTS]) == RESULTS:
        raise SystemExit(f"--out {out}: a --quick run never writes into {RESULTS}; "
                         f"give another path, or set {OUT_ENV} to a temporary folder")
    return out


# ------------------------------------------------------------------------------- measurements
@dataclass(frozen=True)
class Variants:
    """One implementation timed in several labelled variants (CasADi SX/MX, asdex eager/jit, ...)."""

    impl: str
    timings: Mapping[str, Timing]

    @property
    def best(self) -> str:
        return best_variant(self.timings)

    @property
    def timing(self) -> Timing:
        return self.timings[self.best]

    @property
    def label(self) -> str:
        return f"{self.impl} {self.best}".strip()

    def to_json(self) -> dict:
        return dict(best=self.best, label=self.label, median=self.timing.median,
                    variants={k: t.to_json() for k, t in self.timings.items()})


@dataclass(frozen=True)
class PeerResult:
    """A peer on one case: its steady call and its one-off (build + first call), per variant.

    ``again(label, policy)`` times variant ``label``'s call once more (a new block of samples
    under ``policy``) while the peer is still set up, for :meth:`Session.interleave`; ``close``
    releases what it holds (the asdex runners' processes). Neither is part of the record.
    ``rounds``: the interleaved rounds the call's timings come from (``None``: not interleaved);
    ``notes``: how it ran (the CPUs it was limited to, one of asdex's configurations that failed)."""

    peer: str
    call: Variants | None = None
    oneoff: Variants | None = None
    error: str | None = None
    version: str | None = None
    again: Callable[[str, Policy], Timing] | None = field(default=None, compare=False, repr=False)
    close: Callable[[], None] | None = field(default=None, compare=False, repr=False)
    rounds: int | None = None
    notes: tuple[str, ...] = ()

    @classmethod
    def failed(cls, peer: str, reason: str) -> PeerResult:
        return cls(peer, error=reason)

    def to_json(self) -> dict:
        if self.error is not None:
            return dict(error=self.error)
        out = dict(call=self.call.timing.median, oneoff=self.oneoff.timing.median, best=self.call.best,
                   best_oneoff=self.oneoff.best, label=self.call.label, version=self.version,
                   variants={k: dict(call=self.call.timings[k].to_json(), oneoff=self.oneoff.timings[k].to_json())
                             for k in self.call.timings})
        if self.rounds is not None:
            out["rounds"] = self.rounds
        if self.notes:
            out["notes"] = list(self.notes)
        return out


def reference(rounds: int = 100) -> dict:
    """Seconds (medians of ``rounds``, about 0.1 s in all) of a fixed workload, the same in every
    run, so that two runs' records say how fast this shared machine was in each: ``dispatch``, 400
    additions of two 64-element tensors (Python and PyTorch's dispatcher, where a one-off spends
    most of its time), and ``memory``, one copy of 8 MB (memory bandwidth). This machine's speed
    moves about 2x within a second at times: it is the moment's speed, not the run's."""
    import torch

    a, b = torch.ones(64, dtype=torch.float64), torch.ones(64, dtype=torch.float64)
    src, dst = torch.ones(1 << 20, dtype=torch.float64), torch.empty(1 << 20, dtype=torch.float64)

    def dispatch():
        for _ in range(400):
            torch.add(a, b)

    policy = Policy(warmup=3, repeat=rounds, min_time=0.0)
    return dict(dispatch=measure(dispatch, policy).median, memory=measure(lambda: dst.copy_(src), policy).median)


class Session:
    """Times callables under one policy and keeps every measurement and every ratio for the record."""

    def __init__(self, name: str, policy: Policy = FULL, *, quick: bool = False, cpus: tuple[int, ...] | None = None):
        self.name, self.policy, self.quick = name, policy, quick
        #: the CPUs the peers run on (:func:`peer_cpus`), and asd's thread during :meth:`interleave`
        self.cpus = cpus
        self.measurements: list[dict] = []
        self.comparisons: list[dict] = []
        #: the machine's speed when the session started (:func:`reference`; the record adds the end's)
        self.reference = reference()

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Session:
        return cls(args.bench_name, args.policy, quick=args.quick, cpus=getattr(args, "cpus", None))

    def measure(self, case: str, impl: str, fn: Callable[[], object], *, variant: str = "",
                policy: Policy | None = None) -> Timing:
        """Time ``fn`` warm (see :func:`asd.timing.measure`) and record it under ``case`` / ``impl``."""
        return self.record(case, impl, measure(fn, policy or self.policy), variant)

    def measure_result(self, case: str, impl: str, fn: Callable[[], object]) -> tuple[Timing, object]:
        """:meth:`measure`, also returning what the last call of ``fn`` returned (to check it)."""
        box = [None]

        def call():
            box[0] = None  # the previous result is freed before the next call
            box[0] = fn()

        t = self.measure(case, impl, call)
        return t, box[0]

    def record(self, case: str, impl: str, timing: Timing, variant: str = "") -> Timing:
        """Record a timing taken elsewhere (e.g. by a peer's runner in its own process)."""
        self.measurements.append(dict(case=case, impl=impl, variant=variant, **timing.to_json()))
        return timing

    def variants(self, case: str, impl: str, fns: Mapping[str, Callable[[], object]]) -> Variants:
        """Time every variant of ``impl``; the returned :class:`Variants` names the best."""
        return Variants(impl, {label: self.measure(case, impl, fn, variant=label) for label, fn in fns.items()})

    def compare(self, case: str, subjects: Mapping[str, Timing | None],
                baselines: Mapping[str, Timing | Variants | None]) -> dict[str, float]:
        """Ratios ``baseline / subject`` of medians, keyed ``"baseline/subject"``; a ratio above 1 means
        the subject is faster. A :class:`Variants` baseline counts with its best variant, named in the record."""
        ratios, labels = {}, {}
        for b, tb in baselines.items():
            if isinstance(tb, Variants):
                labels[b] = tb.label
                tb = tb.timing
            for s, ts in subjects.items():
                r = ratio(tb, ts)
                if r is not None:
                    ratios[f"{b}/{s}"] = r
        self.comparisons.append(dict(case=case, ratios=ratios, best_variants=labels))
        return ratios

    def ratios(self, case: str, asd: Mapping[str, Timing | None], dense: Mapping[str, Timing | None],
               peers: Iterable[PeerResult] = ()) -> dict[str, float]:
        """The standard comparison of a row: every dense baseline against every asd timing; each
        peer's best one-off against asd's ``"oneoff"``, its best call against asd's steady calls
        (:data:`STEADY`)."""
        steady = {k: v for k, v in asd.items() if k in STEADY}
        out = self.compare(case, asd, dense) if dense else {}
        for p in peers:
            if p.error is None:
                out.update(self.compare(case, {"oneoff": asd.get("oneoff")}, {f"{p.peer}.oneoff": p.oneoff}))
                if p.rounds != 0:  # (a peer that ended before its first round has no block beside asd's)
                    out.update(self.compare(case, steady, {f"{p.peer}.call": p.call}))
        return out

    def interleave(self, case: str, calls: Mapping[str, Callable[[], object]], asd: dict[str, Timing | None],
                   peers: Sequence[PeerResult], rounds: int | None = None) -> tuple[dict, list[PeerResult]]:
        """Time asd's steady calls and every variant of each peer's call again, in turns, ``rounds``
        times (default :data:`INTERLEAVE_ROUNDS`, one in a quick run), and report the medians over
        those blocks.

        One block lasts a fraction of a second, while this machine's speed moves by 1.5-3x over
        seconds to minutes: a ratio of two blocks taken a minute apart measures the moment as much
        as the code. With the blocks alternating (the peers first in odd rounds, asd first in even
        ones), both sides' medians are taken over the same stretch of time. Where the session has
        :attr:`cpus`, asd's thread runs on them during the rounds, as the peers' processes do. Each block starts with
        :data:`BLOCK_WARMUP_TIME` seconds of untimed calls, so that a process that sat idle through
        the other side's block (the asdex runner's XLA threads, both sides' caches) is back in its
        steady state when the samples start. Every variant of a peer is timed again, so the best
        one is chosen from the rounds too. ``calls`` maps keys of ``asd`` (``"prepared"``,
        ``"compiled"``, and figures with absolute targets such as ``"oneoff"``, which one block at
        one moment would decide alone) to the callables timed there; only peers that can time
        their calls again (:attr:`PeerResult.again`) take part, and one whose process ends keeps the rounds it
        completed (:attr:`PeerResult.rounds` says how many). Every block is recorded (variant
        ``round k``); the first measurements stay in the record but not in the medians. Returns
        ``(asd, peers)`` with the pooled timings in place of the first ones."""
        rounds = (1 if self.quick else INTERLEAVE_ROUNDS) if rounds is None else rounds
        keys = [k for k in calls if asd.get(k) is not None]
        live = [p for p in peers if p.error is None and p.again is not None and p.call is not None]
        if rounds <= 0 or not keys or not live:
            return asd, list(peers)
        policy = replace(self.policy, warmup_time=0.0 if self.quick else BLOCK_WARMUP_TIME)
        blocks: dict = {k: [] for k in keys}
        peer_blocks: dict = {p.peer: {label: [] for label in p.call.timings} for p in live}
        taken = {p.peer: 0 for p in live}

        def time_peers(r: int) -> None:
            for p in list(live):
                try:  # a round counts for a peer only with every variant timed
                    got = {label: p.again(label, policy) for label in p.call.timings}
                except Exception as exc:  # noqa: BLE001 - the peer's process ended: the rounds so far count
                    print(f"  {case}: {p.peer} stopped in round {r} ({exc}); its earlier rounds are kept")
                    live.remove(p)
                    continue
                for label, block in got.items():
                    peer_blocks[p.peer][label].append(self.record(case, f"{p.peer} call", block, f"{label} round {r}"))
                taken[p.peer] += 1

        def time_asd(r: int) -> None:
            for k in keys:
                blocks[k].append(self.measure(case, f"asd {k}", calls[k], variant=f"round {r}", policy=policy))

        pinned = None
        if self.cpus is not None:  # (this thread only: torch's workers are not asked to run on them)
            pinned = os.sched_getaffinity(0)
            os.sched_setaffinity(0, self.cpus)
        try:
            for r in range(1, rounds + 1):
                for part in ((time_peers, time_asd) if r % 2 else (time_asd, time_peers)):
                    part(r)
        finally:
            if pinned is not None:
                os.sched_setaffinity(0, pinned)
        asd = dict(asd, **{k: pooled(b) for k, b in blocks.items()})
        out = []
        for p in peers:
            if p.peer in taken:
                if taken[p.peer]:
                    timings = {label: pooled(b) for label, b in peer_blocks[p.peer].items()}
                    p = replace(p, call=Variants(p.call.impl, timings))
                p = replace(p, rounds=taken[p.peer])
            out.append(p)
        return asd, out

    def row(self, case: str, fields: dict, asd: Mapping[str, Timing | None], dense: Mapping[str, Timing | None],
            peers: Iterable[PeerResult] = ()) -> dict:
        """A JSON row: ``fields``, each timing's median under its key, every Timing under ``"timings"``,
        :meth:`ratios` under ``"ratios"`` and each peer's result under its name."""
        peers = list(peers)
        timings = {**asd, **dense}
        return dict(fields, **medians(timings), timings=timings_json(timings),
                    ratios=self.ratios(case, asd, dense, peers), **{p.peer: p.to_json() for p in peers})

    def to_json(self) -> dict:
        return dict(policy=self.policy.to_json(), quick=self.quick, measurements=self.measurements,
                    comparisons=self.comparisons, reference=dict(start=self.reference, end=reference()))


#: rounds of :meth:`Session.interleave` in a full run (even: each side goes first as often)
INTERLEAVE_ROUNDS = 4
#: seconds of untimed calls that start each block of :meth:`Session.interleave` (full runs)
BLOCK_WARMUP_TIME = 0.5
#: asd's timings that a peer's call is compared with (its one-off is compared with ``"oneoff"``)
STEADY = ("prepared", "compiled", "call")


def pooled(blocks: Sequence[Timing]) -> Timing:
    """One Timing of the samples of several blocks of the same call (seconds per call each); its
    ``number``, ``warmup`` and ``first`` are the first block's."""
    first = blocks[0]
    return Timing(tuple(s for b in blocks for s in b.samples), first.number, first.warmup, first.first)


def settle(call: Callable[[], object]) -> dict:
    """Run a prepared operator's first calls, timed on their own: the evaluation strategy changes
    while it warms up (plain autograd first, the batched products recorded as a graph at call
    ``CALLS_BEFORE_TRACING``), so the steady state measured afterwards is what a solver loop sees.
    Returns the mean of those calls and the slowest one."""
    from asd.backends.traced import CALLS_BEFORE_TRACING

    times = []
    for _ in range(CALLS_BEFORE_TRACING + 2):
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    return dict(calls=len(times), mean=sum(times) / len(times), max=max(times))


def timings_json(timings: Mapping[str, Timing | None]) -> dict:
    """``{key: Timing.to_json()}`` of the timings present."""
    return {k: t.to_json() for k, t in timings.items() if t is not None}


def medians(timings: Mapping[str, Timing | None]) -> dict:
    """``{key: median seconds}`` of the timings present (the rows' flat fields)."""
    return {k: t.median for k, t in timings.items() if t is not None}


# ----------------------------------------------------------------------------------- reporting
def verdict(met) -> str:
    """How a target check prints: ``ok``, ``MISSED``, or ``inconclusive`` (``met`` is ``None``)."""
    return "inconclusive" if met is None else "ok" if met else "MISSED"


class Targets:
    """Collects target checks: ``add(what, met, value)``."""

    def __init__(self):
        self.items: list[dict] = []

    def add(self, what: str, met, value) -> None:
        """``met``: whether the target is reached, ``None`` where the measurement cannot tell."""
        self.items.append(dict(what=what, met=None if met is None else bool(met), value=value))


def peer_value(row: dict, name: str, key: str):
    """A peer's figure from a JSON row (``None`` when the peer is missing or failed)."""
    v = row.get(name)
    return v.get(key) if isinstance(v, dict) else None


def fmt_ratio(ratios: Mapping[str, float], key: str) -> str:
    """``ratios[key]`` as table text (``"1,234x"``, ``"0.37x"``), ``-`` when it was not measured."""
    v = ratios.get(key)
    return "-" if v is None else (f"{v:,.0f}x" if v >= 10 else f"{v:.2f}x")


PEER_COLUMNS = [("ca1", "CasADi one-off"), ("ca2", "CasADi call (best)"), ("ax1", "asdex one-off"),
                ("ax2", "asdex call (best)")]


def peer_cells(row: dict) -> dict:
    """The table cells of :data:`PEER_COLUMNS` for a JSON row: one-off, and best call with its variant."""
    cells = {}
    for who, short in (("casadi", "ca"), ("asdex", "ax")):
        best = peer_value(row, who, "best")
        cells[f"{short}1"] = fmt_seconds(peer_value(row, who, "oneoff"))
        cells[f"{short}2"] = f"{fmt_seconds(peer_value(row, who, 'call'))} ({best})" if best else "-"
    return cells


def machine() -> dict:
    torch = sys.modules.get("torch")
    return dict(python=platform.python_version(), platform=platform.platform(),
                processor=platform.processor() or platform.machine(), cpus=os.cpu_count(), load=os.getloadavg(),
                torch=getattr(torch, "__version__", None),
                threads=torch.get_num_threads() if torch is not None else None,
                date=time.strftime("%Y-%m-%d %H:%M"))


def _jsonable(o):
    return o.tolist() if hasattr(o, "tolist") else str(o)


def write(session: Session, record: dict, out: str) -> dict:
    """Add the harness's fields (policy, measurements, comparisons, machine) to ``record`` and write
    it as JSON to ``out``; returns the record written."""
    record = dict(record, harness=session.to_json(), machine=record.get("machine") or machine())
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as fh:
        json.dump(record, fh, indent=1, default=_jsonable)
    print(f"\nwrote {out}")
    return record


def report(session: Session, issue: str, rows: list[dict], table_text: str, targets: list[dict], *,
           first_call: float, out: str) -> dict:
    """Print the table and the targets, then :func:`write` the record with the rows."""
    m = machine()
    print(f"\nfirst call of the process (Numba kernels loaded/compiled, torch.func set up): {fmt_seconds(first_call)}")
    print(f"torch {m['torch']}, {m['threads']} thread(s), {m['processor']}; "
          f"policy {session.policy}{' (quick)' if session.quick else ''}\n")
    print(table_text)
    print(f"\nTargets ({issue}):")
    for c in targets:
        print(f"  [{verdict(c['met'])}] {c['what']}: {c['value']}")
    return write(session, dict(benchmark=session.name, torch=m["torch"], threads=m["threads"], first_call=first_call,
                               rows=rows, targets=targets, date=m["date"], machine=m), out)
