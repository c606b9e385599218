"""The benchmark harness: warm-up and median policy on a fake clock, best-variant labelling, ratios,
where quick runs write, and ``python -m asd bench --quick`` end to end (every script, its JSON)."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

from asd.timing import Policy, Timing, best_variant, measure, ratio

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import harness  # noqa: E402


class FakeClock:
    """A clock that only moves when the timed function runs: call ``i`` lasts ``durations[i]``."""

    def __init__(self, durations):
        self.now, self.durations, self.calls = 0.0, list(durations), 0

    def __call__(self):
        return self.now

    def fn(self):
        self.now += self.durations[min(self.calls, len(self.durations) - 1)]
        self.calls += 1


def test_warm_up_calls_are_not_samples_and_the_median_is_reported():
    clock = FakeClock([10.0, 9.0, 1.0, 5.0, 2.0, 4.0, 3.0])
    t = measure(clock.fn, Policy(warmup=2, repeat=5, min_time=0.0, budget=100.0), clock=clock)
    assert clock.calls == 7
    assert t.samples == (1.0, 5.0, 2.0, 4.0, 3.0)
    assert t.first == 10.0 and t.warmup == 2 and t.number == 1
    assert t.median == 3.0 and t.min == 1.0
    assert t.quartiles == (2.0, 4.0) and t.iqr == 2.0


def test_fast_calls_are_looped_within_a_sample():
    clock = FakeClock([0.001])
    t = measure(clock.fn, Policy(warmup=1, repeat=3, min_time=0.01, budget=100.0), clock=clock)
    assert t.number == 10
    assert clock.calls == 1 + 3 * 10
    assert t.median == pytest.approx(0.001)


def test_budget_cuts_samples_of_slow_calls_but_keeps_warm_up_and_one_sample():
    clock = FakeClock([3.0])
    t = measure(clock.fn, Policy(warmup=1, repeat=7, min_time=0.0, budget=5.0), clock=clock)
    assert clock.calls == 3 and len(t.samples) == 2  # warm-up, then 3 s + 3 s >= the 5 s budget
    clock = FakeClock([3.0])
    t = measure(clock.fn, Policy(warmup=1, repeat=7, min_time=0.0, budget=0.0), clock=clock)
    assert clock.calls == 2 and t.samples == (3.0,) and t.quartiles == (3.0, 3.0)


def test_policy_refuses_no_warm_up_or_no_sample():
    with pytest.raises(ValueError, match="warmup"):
        Policy(warmup=0)
    with pytest.raises(ValueError, match="repeat"):
        Policy(repeat=0)
    assert Policy.from_json(Policy(repeat=3).to_json()) == Policy(repeat=3)


def test_timing_round_trips_through_json():
    t = Timing((0.5, 0.25, 1.0), 4, 1, 2.0)
    d = json.loads(json.dumps(t.to_json()))
    assert Timing.from_json(d) == t
    assert d["median"] == 0.5 and d["min"] == 0.25 and set(d) >= {"q1", "q3", "iqr", "samples"}


def test_best_variant_and_ratio():
    sx, mx = Timing((2.0,), 1, 1, 2.0), Timing((1.0,), 1, 1, 1.0)
    assert best_variant({"SX": sx, "MX": mx}) == "MX"
    assert best_variant({"a": sx, "b": Timing((2.0,), 1, 1, 2.0)}) == "a"  # ties: first given
    with pytest.raises(ValueError, match="no variant"):
        best_variant({})
    assert ratio(sx, mx) == 2.0 and ratio(3.0, mx) == 3.0
    assert ratio(None, mx) is None and ratio(sx, None) is None


def test_session_labels_best_variants_and_computes_ratios_in_one_place():
    s = harness.Session("t", Policy(warmup=1, repeat=1, min_time=0.0, budget=0.0))
    T = lambda v: Timing((v,), 1, 1, v)  # noqa: E731
    casadi = harness.PeerResult("casadi", harness.Variants("casadi", {"SX": T(4.0), "MX": T(2.0)}),
                                harness.Variants("casadi", {"SX": T(30.0), "MX": T(60.0)}), version="x")
    absent = harness.PeerResult.failed("asdex", "not installed")
    r = s.ratios("B1", {"oneoff": T(10.0), "prepared": T(1.0)}, {"jacfwd": T(100.0), "jacrev": None},
                 [casadi, absent])
    assert r == {"jacfwd/oneoff": 10.0, "jacfwd/prepared": 100.0, "casadi.oneoff/oneoff": 3.0,
                 "casadi.call/prepared": 2.0}
    assert any(c["best_variants"] == {"casadi.call": "casadi MX"} for c in s.comparisons)
    j = casadi.to_json()
    assert j["best"] == "MX" and j["label"] == "casadi MX" and j["best_oneoff"] == "SX"
    assert j["call"] == 2.0 and j["oneoff"] == 30.0 and set(j["variants"]) == {"SX", "MX"}
    assert absent.to_json() == {"error": "not installed"}

    calls = []
    v = s.variants("B1", "asd compiled", {"star": lambda: calls.append("star"), "acyclic": lambda: None})
    assert v.best in ("star", "acyclic") and calls == ["star", "star"]  # one warm-up, one sample
    assert [m["variant"] for m in s.measurements] == ["star", "acyclic"]


def test_interleave_alternates_blocks_and_pools_their_samples(monkeypatch):
    """asd's steady calls and every variant of each live peer's call are timed again in turns
    (peers first in odd rounds, asd first in even ones), each block after its warm-up time; every
    block is recorded, the medians (and the best variant) come from the interleaved blocks only,
    and a peer whose process ends keeps the rounds it completed, which its record counts."""
    monkeypatch.setattr(harness, "BLOCK_WARMUP_TIME", 0.01)
    s = harness.Session("t", Policy(warmup=1, repeat=2, min_time=0.0, budget=100.0))
    T = lambda *v: Timing(tuple(v), 1, 1, v[0])  # noqa: E731
    order, policies = [], []
    # CasADi: MX was best in its first blocks, SX is in the rounds (the best is chosen from those)
    rounds_of = {"SX": iter([T(1.5, 1.5), T(1.5, 1.5)]), "MX": iter([T(3.0, 3.0), T(3.0, 3.0)])}

    def casadi_again(label, policy):
        order.append(f"casadi {label}")
        policies.append(policy)
        return next(rounds_of[label])

    def dying(label, policy):
        order.append(f"asdex {label}")
        if sum(o.startswith("asdex") for o in order) > 1:
            raise RuntimeError("runner ended")
        return T(7.0, 7.0)

    casadi = harness.PeerResult("casadi", harness.Variants("casadi", {"SX": T(4.0), "MX": T(2.0)}),
                                harness.Variants("casadi", {"SX": T(30.0), "MX": T(60.0)}), again=casadi_again)
    asdex = harness.PeerResult("asdex", harness.Variants("asdex", {"jit": T(9.0)}),
                               harness.Variants("asdex", {"jit": T(90.0)}), again=dying)
    absent = harness.PeerResult.failed("other", "not installed")
    calls = {"prepared": lambda: order.append("prepared"), "compiled": lambda: order.append("compiled")}
    timings = {"oneoff": T(10.0), "prepared": T(3.0), "compiled": T(5.0)}
    out, peers = s.interleave("B1", calls, timings, [casadi, asdex, absent], rounds=2)

    def take(label):  # a block of asd's: warm-up calls for at least the warm-up time, then two samples
        n = next((i for i, k in enumerate(order) if k != label), len(order))
        assert n >= 3, order[:5]
        del order[:n]

    assert order[:3] == ["casadi SX", "casadi MX", "asdex jit"]
    del order[:3]
    take("prepared"), take("compiled")
    take("prepared"), take("compiled")  # round 2: asd first
    assert order == ["casadi SX", "casadi MX", "asdex jit"]
    assert all(p.warmup_time == 0.01 and p.repeat == 2 for p in policies)
    assert out["oneoff"] is timings["oneoff"]
    # the first measurements are not pooled: the blocks of the two rounds are
    assert len(out["prepared"].samples) == 2 * 2 and 3.0 not in out["prepared"].samples
    assert out["prepared"].warmup >= 1 and len(out["compiled"].samples) == 2 * 2
    c, a, o = peers
    assert c.call.timings["SX"].samples == (1.5,) * 4 and c.call.timings["MX"].samples == (3.0,) * 4
    assert c.call.best == "SX" and c.to_json()["call"] == 1.5 and c.to_json()["rounds"] == 2
    assert a.call.timings["jit"].samples == (7.0, 7.0) and a.rounds == 1  # round 2 failed: round 1 kept
    assert a.to_json()["rounds"] == 1
    assert o is absent
    rounds = [(m["impl"], m["variant"]) for m in s.measurements]
    assert rounds == [("casadi call", "SX round 1"), ("casadi call", "MX round 1"), ("asdex call", "jit round 1"),
                      ("asd prepared", "round 1"), ("asd compiled", "round 1"), ("asd prepared", "round 2"),
                      ("asd compiled", "round 2"), ("casadi call", "SX round 2"), ("casadi call", "MX round 2")]
    r = s.ratios("B1", out, {}, peers)
    assert r["casadi.call/prepared"] == pytest.approx(1.5 / out["prepared"].median)
    assert "casadi.call/oneoff" not in r and r["casadi.oneoff/oneoff"] == 3.0
    # a peer's call is compared with asd's steady calls only
    extra = dict(timings, detection_warm=T(1.0), oneoff_new=T(12.0))
    assert set(s.ratios("B1", extra, {}, [casadi])) == {"casadi.oneoff/oneoff", "casadi.call/prepared",
                                                         "casadi.call/compiled"}
    # a peer that ended before its first round keeps no call ratio (its only block is not beside asd's)
    gone = harness.PeerResult("asdex", harness.Variants("asdex", {"jit": T(9.0)}),
                              harness.Variants("asdex", {"jit": T(90.0)}), rounds=0)
    assert set(s.ratios("B1", out, {}, [gone])) == {"asdex.oneoff/oneoff"}
    # nothing to interleave: the timings as they were
    assert s.interleave("B1", calls, timings, [absent], rounds=2) == (timings, [absent])
    assert s.interleave("B1", {}, timings, [casadi], rounds=2)[0] is timings
    assert "rounds" not in casadi.to_json()


def test_interleave_runs_asd_on_the_peers_cpus_and_restores_its_own(monkeypatch):
    """With the session's CPUs set (a 1-thread run on a larger machine), asd's thread runs on them
    during the rounds, as the peers' processes do, and on its own CPUs again afterwards."""
    monkeypatch.setattr(harness, "BLOCK_WARMUP_TIME", 0.0)
    before = os.sched_getaffinity(0)
    first = harness.peer_cpus(1)
    assert harness.peer_cpus(len(before)) is None and (first is None) == (len(before) == 1)
    cpus = first or tuple(before)
    s = harness.Session("t", Policy(warmup=1, repeat=1, min_time=0.0, budget=100.0), cpus=cpus)
    seen = []
    T = Timing((1.0,), 1, 1, 1.0)
    peer = harness.PeerResult("casadi", harness.Variants("casadi", {"SX": T}), harness.Variants("casadi", {"SX": T}),
                              again=lambda label, policy: T)
    s.interleave("c", {"prepared": lambda: seen.append(os.sched_getaffinity(0))}, {"prepared": T}, [peer], rounds=2)
    assert seen and all(a == set(cpus) for a in seen)
    assert os.sched_getaffinity(0) == before


def test_warm_up_time_adds_untimed_calls():
    clock = FakeClock([0.25])
    t = measure(clock.fn, Policy(warmup=2, repeat=3, min_time=0.0, budget=100.0, warmup_time=1.0), clock=clock)
    assert t.warmup == 4 and clock.calls == 7 and len(t.samples) == 3
    clock = FakeClock([2.0])
    t = measure(clock.fn, Policy(warmup=2, repeat=1, min_time=0.0, budget=100.0, warmup_time=1.0), clock=clock)
    assert t.warmup == 2  # the count is a minimum too
    assert Policy.from_json(Policy(warmup_time=0.5).to_json()).warmup_time == 0.5
    assert Policy.from_json(dict(warmup=1, repeat=2, min_time=0.0, budget=1.0)).warmup_time == 0.0
    with pytest.raises(ValueError, match="times must be >= 0"):
        Policy(warmup_time=-1.0)


def test_measure_result_returns_the_last_result_of_warm_calls():
    s = harness.Session("t", Policy(warmup=2, repeat=3, min_time=0.0, budget=100.0))
    calls = []
    t, last = s.measure_result("c", "dense", lambda: calls.append(len(calls)) or len(calls))
    assert len(calls) == 5 and last == 5 and len(t.samples) == 3 and t.warmup == 2


def test_quick_runs_never_write_into_results(tmp_path, monkeypatch):
    monkeypatch.setenv(harness.OUT_ENV, str(tmp_path))
    assert harness.output_path("x", None, quick=True) == str(tmp_path / "x.json")
    assert harness.output_path("x", None, quick=False) == os.path.join(harness.RESULTS, "x.json")
    with pytest.raises(SystemExit, match="never writes"):
        harness.output_path("x", os.path.join(harness.RESULTS, "x.json"), quick=True)
    monkeypatch.delenv(harness.OUT_ENV)
    assert not harness.output_path("x", None, quick=True).startswith(harness.RESULTS)


def _timings(record):
    return record["harness"]["measurements"]


# every script runs for a minute in all: the default suite runs the two with peers and ratios
@pytest.mark.parametrize("subset", [("jacobian", "hessian"), pytest.param((), id="all", marks=pytest.mark.slow)])
def test_every_benchmark_quick(tmp_path, subset):
    """``python -m asd bench --quick`` runs every script; each JSON carries the harness's fields."""
    before = {p: p.stat().st_mtime for p in (ROOT / "benchmarks" / "results").glob("*.json")}
    env = dict(os.environ, ASD_BENCH_OUT=str(tmp_path), ASD_JAX_PYTHON=str(tmp_path / "no-jax"))
    out = subprocess.run([sys.executable, "-m", "asd", "bench", "--quick", *subset], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    from asd.bench import NAMES

    for name in subset or NAMES:
        record = json.loads((tmp_path / f"{name}.json").read_text())
        h = record["harness"]
        assert h["quick"] is True and h["policy"]["warmup"] >= 1
        # the machine's speed at the start and the end of the run (harness.reference)
        assert {when: set(h["reference"][when]) for when in ("start", "end")} == {
            "start": {"dispatch", "memory"}, "end": {"dispatch", "memory"}}, name
        assert all(v > 0 for when in ("start", "end") for v in h["reference"][when].values())
        assert _timings(record), name
        for m in _timings(record):
            assert {"case", "impl", "variant", "median", "min", "iqr", "samples", "warmup"} <= set(m)
            assert m["warmup"] >= 1 and len(m["samples"]) >= 1 and m["min"] <= m["median"]

    for name in ("jacobian", "hessian"):
        rows = json.loads((tmp_path / f"{name}.json").read_text())["rows"]
        dense = "jacfwd" if name == "jacobian" else "dense_hessian"
        assert all(f"{dense}/prepared" in r["ratios"] and r["timings"][dense]["warmup"] >= 1 for r in rows)
        peer_rows = [r for r in rows if "casadi" in r]
        assert peer_rows, f"{name}: no row ran the peers"
        for r in peer_rows:
            c = r["casadi"]
            if "error" in c:  # casadi is optional
                continue
            assert set(c["variants"]) == {"SX", "MX"} and c["label"] == f"casadi {c['best']}"
            assert c["call"] == c["variants"][c["best"]]["call"]["median"]
            assert r["ratios"]["casadi.call/prepared"] == pytest.approx(c["call"] / r["prepared"])
            assert "error" in r["asdex"]  # no JAX environment here: skipped, with the reason
    if "coloring" in (subset or NAMES):
        lap = json.loads((tmp_path / "coloring.json").read_text())["laplacian"]
        if "igraph_colors" in lap:  # igraph is optional
            assert set(lap["ratios"]) == {"igraph/star", "igraph/acyclic"}
    assert before == {p: p.stat().st_mtime for p in (ROOT / "benchmarks" / "results").glob("*.json")}


@pytest.mark.slow
def test_asdex_runner_times_eager_and_jit(tmp_path):
    """The JAX runner uses the same policy and reports both variants (needs .venv-bench-jax)."""
    import peers

    if not os.path.exists(peers.jax_python()):
        pytest.skip("no JAX environment (make bench creates .venv-bench-jax)")
    s = harness.Session("t", Policy(warmup=1, repeat=2, min_time=0.0, budget=60.0))
    r = peers.asdex(s, "B1 N=4", "brusselator", 4)
    assert r.error is None, r.error
    labels = {"eager", "jit", "eager, eigen=false", "jit, eigen=false"}
    assert set(r.call.timings) == labels and set(r.oneoff.timings) == labels and r.call.best in labels
    assert all(t.warmup == 1 and len(t.samples) == 2 for t in r.call.timings.values())
    assert {m["impl"] for m in s.measurements} == {"asdex call", "asdex one-off"}
    assert r.again is None and r.close is None

    # limited to one CPU (a 1-thread benchmark), as the runners report it; an ASD_PEER_CPUS of the
    # caller's environment does not limit an unlimited run
    first = harness.peer_cpus(1)
    if first is not None:
        one = peers.asdex(s, "B1 N=4", "brusselator", 4, cpus=first)
        assert one.error is None and one.notes[0].startswith("ran on 1 of"), one.notes
        os.environ["ASD_PEER_CPUS"] = str(first[0])
        try:
            free = peers.asdex(s, "B1 N=4", "brusselator", 4)
        finally:
            del os.environ["ASD_PEER_CPUS"]
        assert free.notes[0].startswith(f"ran on {len(os.sched_getaffinity(0))} of"), free.notes

    # kept running for the interleaved rounds: each again() is a new block of the best call
    r = peers.asdex(s, "B1 N=4", "brusselator", 4, serve=True)
    assert r.error is None, r.error
    try:
        blocks = [r.again("jit, eigen=false", s.policy),
                  r.again("eager", Policy(warmup=3, repeat=1, min_time=0.0, budget=60.0))]
        assert [(t.warmup, len(t.samples)) for t in blocks] == [(1, 2), (3, 1)]
        assert blocks[1].median > 10 * blocks[0].median  # the eager variant, in the other process
    finally:
        r.close()
    assert r.close() is None  # closing twice is harmless
    with pytest.raises(Exception):
        r.again("jit", s.policy)
