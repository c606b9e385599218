"""The peers of PEERS.md, timed by the harness in the same run as asd: CasADi (in-process, SX and
MX graphs) and asdex (JAX, eager and jitted, in its own virtual environment, run as a subprocess).

Peers are never dependencies of asd: ``make bench`` installs casadi beside asd and jax + asdex in
``.venv-bench-jax``; set ``ASD_JAX_PYTHON`` to that interpreter. A missing peer is reported as a
:class:`harness.PeerResult` with the reason, never as a failure.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import tempfile
import threading

import numpy as np
import scipy.sparse as sp

from harness import ROOT, PeerResult, Session, Variants
from asd.timing import Policy, Timing, measure

HERE = os.path.dirname(os.path.abspath(__file__))
CASADI_VARIANTS = ("SX", "MX")


def periodic_laplacian(N: int) -> sp.csr_matrix:
    h2 = (1.0 / (N - 1)) ** 2
    e = np.ones(N)
    D = sp.diags([e[:-1], -2 * e, e[:-1]], [-1, 0, 1], shape=(N, N), format="lil")
    D[0, N - 1] = 1
    D[N - 1, 0] = 1
    D = D.tocsr()
    I = sp.identity(N, format="csr")
    return ((sp.kron(D, I) + sp.kron(I, D)) / h2).tocsr()


def _casadi(session: Session, case: str, n: int, build) -> PeerResult:
    """Time ``build(ca, Sym) -> casadi.Function`` for SX and MX: one-off = build + first call."""
    try:
        import casadi as ca
    except ImportError as exc:
        return PeerResult.failed("casadi", f"casadi not installed ({exc}); run make bench")
    x0 = np.random.default_rng(0).random(n)
    oneoff, call, fns = {}, {}, {}
    for kind in CASADI_VARIANTS:
        Sym = getattr(ca, kind)
        oneoff[kind] = session.measure(case, "casadi one-off", lambda: build(ca, Sym)(x0), variant=kind)
        fn = fns[kind] = build(ca, Sym)
        call[kind] = session.measure(case, "casadi call", lambda fn=fn: fn(x0), variant=kind)
    return PeerResult("casadi", Variants("casadi", call), Variants("casadi", oneoff), version=ca.__version__,
                      again=lambda label, policy: measure(lambda: fns[label](x0), policy))


def casadi_brusselator(session: Session, case: str, N: int) -> PeerResult:
    """B1 with the Laplacian as a sparse constant, as an SX and as an MX graph."""
    L = periodic_laplacian(N).tocsc()

    def build(ca, Sym):
        Lca = ca.DM(ca.Sparsity(L.shape[0], L.shape[1], L.indptr.tolist(), L.indices.tolist()), L.data.tolist())
        x = Sym.sym("x", 2 * N * N)
        u, v = x[: N * N], x[N * N:]
        du = 1 + u * u * v - 4.4 * u + 10 * ca.mtimes(Lca, u)
        dv = 3.4 * u - u * u * v + 10 * ca.mtimes(Lca, v)
        return ca.Function("J", [x], [ca.jacobian(ca.vertcat(du, dv), x)])

    return _casadi(session, case, 2 * N * N, build)


def casadi_rosenbrock_hessian(session: Session, case: str, n: int) -> PeerResult:
    """B3's Hessian, as an SX and as an MX graph."""

    def build(ca, Sym):
        x = Sym.sym("x", n)
        f = ca.sum1(100 * (x[1:] - x[:-1] ** 2) ** 2 + (1 - x[:-1]) ** 2)
        H, _ = ca.hessian(f, x)
        return ca.Function("H", [x], [H])

    return _casadi(session, case, n, build)


def jax_python() -> str:
    return os.environ.get("ASD_JAX_PYTHON") or os.path.join(ROOT, ".venv-bench-jax", "bin", "python")


class _Runner:
    """The asdex runner kept running (``serve``): its stdout read line by line on a thread, so that
    every wait for an answer has a timeout; its stderr in a temporary file (the last line is the
    reason given when it fails)."""

    def __init__(self, cmd: list[str], timeout: float, env: dict | None = None):
        self.timeout = timeout
        self.err = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.err, text=True,
                                     env=env)
        self.lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def answer(self) -> dict:
        """The next JSON object the runner prints (other lines skipped); RuntimeError with its
        last error line when it ends or times out first."""
        while True:
            try:
                line = self.lines.get(timeout=self.timeout)
            except queue.Empty:
                self.close()
                raise RuntimeError(f"asdex timed out after {self.timeout} s") from None
            if line is None:
                raise RuntimeError(self.reason())
            if line.lstrip().startswith("{"):
                return json.loads(line)

    def ask(self, label: str, policy: Policy) -> Timing:
        self.proc.stdin.write(json.dumps({"label": label, "policy": policy.to_json()}) + "\n")
        self.proc.stdin.flush()
        return Timing.from_json(self.answer())

    def reason(self) -> str:
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:  # its stdout ended but it did not: it is ended here
            self.proc.kill()
            self.proc.wait()
        self.err.seek(0)
        lines = self.err.read().strip().splitlines()
        return lines[-1] if lines else f"asdex failed (exit status {self.proc.returncode})"

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        self.err.close()


#: XLA's CPU runtime without its multi-threaded Eigen (XLA still runs its own threads): on two CPUs
#: asdex's jitted B3 n=10^5 call took 0.47-0.5 ms this way, against 0.48-1.1 ms by default
#: (changing within one process)
XLA_NO_EIGEN_THREADS = "--xla_cpu_multi_thread_eigen=false"
#: the XLA configurations asdex runs in: a suffix of its variants' labels, and the XLA_FLAGS added
XLA_CONFIGS = (("", None), (", eigen=false", XLA_NO_EIGEN_THREADS))


def _xla_env(flags: str | None) -> dict:
    env = dict(os.environ)
    if flags:
        env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} {flags}".strip()
    return env


def asdex(session: Session, case: str, problem: str, size: int, timeout: float = 1200, *,
          serve: bool = False, cpus: tuple[int, ...] | None = None) -> PeerResult:
    """Run benchmarks/_asdex_runner.py in the JAX environment under the session's policy, once per
    XLA configuration of :data:`XLA_CONFIGS` (each runner's eager and jitted variants, labelled with
    the configuration's suffix; a configuration that fails is named in the result's ``notes``).
    With ``serve``, the runners stay set up: the result's ``again`` times a variant's call once more
    and ``close`` ends them (the caller's duty). ``cpus``: the CPUs the runners run on
    (:func:`harness.peer_cpus` of the benchmark's torch threads; XLA otherwise ran B3's products on
    two cores while asd ran on one: 0.47 against 0.81-0.85 ms on one core); the CPUs each runner
    reports are noted in the result."""
    python = jax_python()
    if not os.path.exists(python):
        return PeerResult.failed("asdex", "no JAX environment (run make bench, or set ASD_JAX_PYTHON)")
    cmd = [python, os.path.join(HERE, "_asdex_runner.py"), problem, str(size), json.dumps(session.policy.to_json())]
    parts: dict = {"oneoff": {}, "call": {}}
    runners, where, errors, version = [], {}, [], None
    available = len(os.sched_getaffinity(0))
    used: set = set()  # the number of CPUs each runner reports it ran on

    def close():
        for r in runners:
            r.close()

    try:
        for suffix, flags in XLA_CONFIGS:
            env = _xla_env(flags)
            env.pop("ASD_PEER_CPUS", None)  # (one exported by the caller's shell would limit it unnoted)
            if cpus is not None:
                env["ASD_PEER_CPUS"] = ",".join(str(c) for c in cpus)
            runner = None
            if serve:
                runner = _Runner(cmd + ["serve"], timeout, env)
                runners.append(runner)
                try:
                    res = runner.answer()
                except (RuntimeError, ValueError) as exc:  # (a line that is not JSON: ValueError)
                    runner.close()
                    runners.remove(runner)
                    errors.append(f"XLA_FLAGS={flags or 'default'}: {exc}")
                    continue
            else:
                try:
                    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
                except subprocess.TimeoutExpired:
                    errors.append(f"XLA_FLAGS={flags or 'default'}: asdex timed out after {timeout} s")
                    continue
                if out.returncode != 0:
                    errors.append(f"XLA_FLAGS={flags or 'default'}: "
                                  + (out.stderr.strip().splitlines()[-1] if out.stderr.strip() else "asdex failed"))
                    continue
                res = json.loads(out.stdout.strip().splitlines()[-1])
            version = res.get("version")
            used.add(res.get("cpus"))
            for what in ("oneoff", "call"):
                for k, t in res[what].items():
                    parts[what][k + suffix] = session.record(case, f"asdex {what.replace('oneoff', 'one-off')}",
                                                             Timing.from_json(t), k + suffix)
                    where[k + suffix] = (runner, k)
    except BaseException:  # the runners started so far end with this call
        close()
        raise
    if not parts["call"]:
        close()
        return PeerResult.failed("asdex", "; ".join(errors) if errors else "asdex failed")
    call, oneoff = Variants("asdex", parts["call"]), Variants("asdex", parts["oneoff"])
    remarks = [f"ran on {'/'.join(str(c) for c in sorted(used, key=str))} of this machine's {available} CPUs"
               + (f" (CPUs {','.join(str(c) for c in cpus)}, as asd's thread in the rounds)" if cpus is not None else "")]
    if not runners:
        return PeerResult("asdex", call, oneoff, version=version, notes=tuple(remarks + errors))

    def again(label: str, policy: Policy) -> Timing:
        runner, base = where[label]
        return runner.ask(base, policy)

    return PeerResult("asdex", call, oneoff, version=version, again=again, close=close,
                      notes=tuple(remarks + errors))


CASADI = {"brusselator": casadi_brusselator, "rosenbrock": casadi_rosenbrock_hessian}


def run(session: Session, case: str, problem: str, size: int) -> list[PeerResult]:
    """Every peer on ``problem`` ("brusselator": B1 Jacobian, "rosenbrock": B3 Hessian) at ``size``,
    each left set up to time its call again (:meth:`harness.Session.interleave`), on the session's
    CPUs (CasADi runs on one anyway); :func:`close` them afterwards."""
    return [CASADI[problem](session, case, size), asdex(session, case, problem, size, serve=True, cpus=session.cpus)]


def close(results: list[PeerResult]) -> None:
    """Release what the peers of :func:`run` still hold."""
    for p in results:
        if p.close is not None:
            p.close()
