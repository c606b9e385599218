"""Compiling a recorded products graph, once per graph and machine.

A prepared operator compiles the flat ATen graph of its products (:mod:`asd.backends.traced`,
recorded by :mod:`asd.backends.record`, specialized by :mod:`asd.backends.specialize`) with
Inductor directly - no Dynamo frame and no guards in front of every call: the operator's own value
fingerprint already guards the graph, and its shapes are static. The graph is compiled ahead of
time into an AOTInductor package (kernels and their C++ caller in one library) and written to an
on-disk cache, so that another process preparing the same operator loads it in milliseconds,
without importing Inductor's compiler (where AOTInductor refuses a graph, Inductor's own artifact
of ``torch._inductor.standalone_compile`` is stored instead: it loads in about a second).

The cache key is a hash of everything the compiled code depends on: the graph's code (operations,
shapes and the Python scalars baked into it), the shape, strides, dtype and device of every input
(tensors are inputs of the graph, never baked in: no value can be served stale), the number of
threads the kernels are generated for, the versions of torch and Python, the processor's vector
instructions and Inductor's configuration. An artifact that cannot be loaded, or whose result on
the example inputs differs from the graph's own, is compiled again (and replaced).

The cache lives in ``$ASD_CACHE_DIR/compiled`` (default ``~/.cache/asd/compiled``, or under
``$XDG_CACHE_HOME``); ``ASD_CACHE_DIR=""`` turns it off. It keeps at most ``$ASD_CACHE_MAX_MB``
megabytes (default 2048; an artifact is about 1.5 MB), evicting the least recently used.
Inductor's own caches stay where ``TORCHINDUCTOR_CACHE_DIR`` puts them. Their keys hold the
inputs' shapes and strides but not their storage offsets, so a graph that reads storage offsets
(``as_strided``) is compiled by Inductor with them off, and a freshly compiled Inductor artifact
must reproduce the graph's result as a loaded one must. A graph reading a tensor with PyTorch's
lazy negation or conjugation bit (``conj().imag``) is not compiled: the kernels ignore the bit.
"""

from __future__ import annotations

import hashlib
import logging
import os
import platform
import shutil
import sys
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass
from typing import Callable

import torch

from .._fork import fork_safe

__all__ = ["compile_graph", "compile_products", "cache_dir", "graph_key", "tensor_layout", "Compiled", "STATS", "FORMAT"]

#: bump when what is stored (or how it is called) changes
FORMAT = 2
#: compile to AOTInductor packages (False: Inductor's own artifacts only)
AOTI = True
_LOCK = fork_safe(threading.Lock())
_COMPILE_LOCK = fork_safe(threading.RLock())


@dataclass
class Compiled:
    """A compiled graph: call it with the graph's inputs."""

    fn: Callable
    key: str
    source: str  # "compiled", "loaded" or "memory"
    seconds: float
    path: str | None = None
    note: str | None = None

    def __call__(self, *args):
        return self.fn(*args)


class _Stats:
    """Seconds spent compiling and loading in this process (``asd.backends.compile_cache.STATS``).

    ``compile_seconds`` and ``load_seconds`` count Inductor's compilation and the loading of cached
    artifacts; ``graph_seconds`` counts everything a compiled operator adds to the call that
    compiles it: recording the products' graph, specializing it, computing its cache key,
    compiling or loading it and the first call of the result (what a warm-started process pays for
    ``compile=True``), failed attempts included."""

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self.compiled = 0
        self.loaded = 0
        self.compile_seconds = 0.0
        self.load_seconds = 0.0
        self.graph_seconds = 0.0
        self.failed_loads = 0

    def as_dict(self) -> dict:
        return dict(compiled=self.compiled, loaded=self.loaded, compile_seconds=self.compile_seconds,
                    load_seconds=self.load_seconds, graph_seconds=self.graph_seconds,
                    failed_loads=self.failed_loads)


STATS = _Stats()
# artifacts loaded or compiled in this process, by key: a second operator on the same graph
_MEMORY: dict[str, Callable] = {}


def cache_dir() -> str | None:
    """The folder of the compiled artifacts, or ``None`` when the on-disk cache is off."""
    root = os.environ.get("ASD_CACHE_DIR")
    if root is None:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        root = os.path.join(base, "asd")
    elif not root.strip():
        return None
    return os.path.join(root, "compiled")


def _max_bytes() -> int:
    try:
        return int(float(os.environ.get("ASD_CACHE_MAX_MB", "2048")) * (1 << 20))
    except ValueError:
        return 2048 << 20


def _evict(folder: str, keep: str | None = None) -> None:
    """Remove the least recently used artifacts while the folder holds more than
    ``$ASD_CACHE_MAX_MB`` (default 2048) megabytes (a loaded artifact counts as used)."""
    try:
        entries = [(e.stat().st_mtime, e.stat().st_size, e.path) for e in os.scandir(folder)
                   if e.is_file() and e.name.endswith((".pt2", ".bin"))]
    except OSError:
        return
    total, limit = sum(size for _, size, _ in entries), _max_bytes()
    for _, size, path in sorted(entries):
        if total <= limit:
            break
        if path == keep:
            continue
        try:
            os.remove(path)
            total -= size
        except OSError:
            pass


def _meta(t) -> str:
    if isinstance(t, torch.Tensor):
        return (f"T({tuple(t.shape)},{tuple(t.stride())},{t.storage_offset()},{t.dtype},{t.device.type},"
                f"{t.layout},{t.requires_grad},{t.is_neg()},{t.is_conj()})")
    return f"V({type(t).__name__}:{t!r})"


_ENVIRONMENT: str | None = None


def _cpu() -> str:
    """The processor, as far as compiled code depends on it (the vector instructions it may use)."""
    flags = []
    for name in ("avx2", "avx512", "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_fp16", "arm_sve"):
        probe = getattr(torch.cpu, f"_is_{name}_supported", None)
        if probe is not None:
            try:
                flags.append(f"{name}={bool(probe())}")
            except Exception:  # noqa: BLE001
                flags.append(f"{name}=?")
    model = platform.processor()
    try:
        with open("/proc/cpuinfo") as fh:
            model = next((line.split(":", 1)[1].strip() for line in fh if line.startswith("model name")), model)
    except OSError:
        pass
    return f"{model}|{torch.backends.cpu.get_cpu_capability()}|{','.join(flags)}"


def _environment() -> str:
    """What a compiled artifact depends on besides its graph, without Inductor's compiler (loading a
    cached artifact must stay cheap): the machine and versions (computed once per process), and the
    settings a program may change between two compilations (Inductor's configuration, float32
    matmul precision and TF32, deterministic algorithms), read at every call."""
    global _ENVIRONMENT
    if _ENVIRONMENT is None:
        _ENVIRONMENT = "|".join([f"asd-format={FORMAT}", torch.__version__, str(torch.version.git_version),
                                 sys.version, platform.machine(), platform.system(), _cpu(),
                                 os.environ.get("ATEN_CPU_CAPABILITY", "")])
    import torch._inductor.config as inductor_config

    # aot_inductor.metadata is written by every AOTInductor compilation itself (the machine, already
    # in the key)
    items = sorted((k, v) for k, v in inductor_config.save_config_portable().items() if k != "aot_inductor.metadata")
    config = hashlib.sha256(repr(items).encode()).hexdigest()
    settings = [torch.get_float32_matmul_precision(), torch.backends.cuda.matmul.allow_tf32,
                torch.backends.cudnn.allow_tf32, torch.are_deterministic_algorithms_enabled()]
    return "|".join([_ENVIRONMENT, config, repr(settings)])


def graph_key(gm: torch.fx.GraphModule, example_inputs) -> str:
    """The cache key of ``gm`` compiled for inputs like ``example_inputs`` (see the module docstring)."""
    if any(n.op == "get_attr" for n in gm.graph.nodes):
        raise ValueError("a graph with attribute tensors: make them inputs first (asd.backends.specialize.lift)")
    h = hashlib.sha256()
    h.update(_environment().encode())
    h.update(gm.code.encode())
    for t in example_inputs:
        h.update(_meta(t).encode())
    for device in sorted({str(t.device) for t in example_inputs if isinstance(t, torch.Tensor)} - {"cpu"}):
        dev = torch.device(device)
        if dev.type == "cuda":
            h.update(f"{torch.cuda.get_device_name(dev)}|{torch.cuda.get_device_capability(dev)}|"
                     f"{torch.version.cuda}".encode())
    # Inductor's CPU kernels are generated for the number of threads set when they are compiled
    h.update(f"threads={kernel_threads()}|{torch.get_default_dtype()}".encode())
    h.update(repr(sorted(kernel_options(gm).items())).encode())
    return h.hexdigest()[:40]


#: parts of the names of ATen ops that read or write at indices loaded from a tensor (``index``,
#: ``_unsafe_index``, ``index_select``, ``gather``, ``scatter_add``, ``embedding``, ``take``,
#: ``masked_select``, ``grid_sampler_2d``, ``max_pool2d_with_indices_backward``, in-place forms
#: included): a name that merely contains one keeps Inductor's heuristic, as before
_INDIRECT = ("index", "indices", "gather", "scatter", "embedding", "take", "masked", "grid_sampler", "nonzero",
             "unpool")


def kernel_options(gm: torch.fx.GraphModule) -> dict:
    """Inductor settings ``gm`` is compiled under, besides the process's (part of its cache key).

    A graph that reads nothing through an index tensor has its CPU kernels vectorized even where
    some loads are not contiguous: Inductor's tiling heuristic otherwise generates a scalar loop for
    a kernel with a few loads like ``u[i // 6]`` (the pushed gather's broadcast of a row's value to
    its stored entries), and the B1 Brusselator's kernel took 49 us instead of 27. Gathers through
    index tensors keep the heuristic, which was not measured without it."""
    for n in gm.graph.nodes:
        if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload) \
                and any(part in n.target.overloadpacket.__name__ for part in _INDIRECT):
            return {}
    return {"cpp.enable_tiling_heuristics": False}


def kernel_threads() -> int:
    """The number of threads Inductor generates CPU kernels for: its ``cpp.threads`` where set,
    else PyTorch's."""
    import torch._inductor.config as inductor_config

    threads = inductor_config.cpp.threads
    return threads if threads > 0 else torch.get_num_threads()


def _close(a, b) -> bool:
    """Whether a compiled result ``a`` is the graph's ``b`` up to rounding: relative to the result's
    largest magnitude, at the dtype's precision (bfloat16 keeps 8 bits). A result that cancels to
    rounding noise may be refused: it is then evaluated uncompiled, never wrong."""
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)) or a.shape != b.shape or a.dtype != b.dtype:
        return False
    if not (a.is_floating_point() or a.is_complex()):
        return bool(torch.equal(a, b))
    scale = float(b.abs().nan_to_num(0.0, 0.0, 0.0).max()) if b.numel() else 0.0
    tol = 1e-6 if a.dtype in (torch.float64, torch.complex128) else max(1e-3, 8 * torch.finfo(a.dtype).eps)
    return bool(torch.isclose(a, b, rtol=tol, atol=tol * scale, equal_nan=True).all())


def parts_agree(got, want, same: Callable) -> bool:
    """Whether ``same(g, w)`` holds for every part of the products ``got`` and ``want`` (a tensor, or
    a tuple of them such as ``value_grad_hvp``'s), compared detached."""
    gots, wants = (got, want) if isinstance(want, tuple) else ((got,), (want,))
    return (isinstance(gots, tuple) and len(gots) == len(wants)
            and all(same(g.detach(), w.detach()) for g, w in zip(gots, wants)))


def _first(out):
    return out[0] if isinstance(out, (list, tuple)) and len(out) == 1 else out


_OFFSET_OPS = ("as_strided", "as_strided_", "as_strided_scatter", "as_strided_copy")


def reads_storage_offsets(gm: torch.fx.GraphModule) -> bool:
    """Whether ``gm`` applies an op that counts from its input's storage rather than from its
    first element (``as_strided`` and kin): its kernels depend on the inputs' storage offsets."""
    for n in gm.graph.nodes:
        if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload):
            if n.target.overloadpacket.__name__ in _OFFSET_OPS:
                return True
    return False


class _QuietSave(logging.Filter):
    """Drops Inductor's notice that an artifact compiled with its caches off cannot be saved."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "artifact generation failed" not in record.getMessage()


def _inductor(gm: torch.fx.GraphModule, example_inputs, *, caches: bool = True):
    """``torch._inductor.standalone_compile`` of the graph (static shapes). ``caches=False``:
    generated afresh, with Inductor's FX-graph and AOTAutograd caches off (their keys hold the
    inputs' shapes and strides, not their storage offsets: for a graph that reads storage offsets
    they can serve kernels compiled for another offset, which read other elements). Such an
    artifact cannot be saved."""
    from torch._inductor import standalone_compile

    # Inductor's configuration is the process's: one compilation at a time, so that one with the
    # caches off never overlaps another thread's
    with _COMPILE_LOCK:
        import torch._functorch.config as functorch_config
        import torch._inductor.config as inductor_config

        if caches:
            with inductor_config.patch(kernel_options(gm)):
                return standalone_compile(gm, list(example_inputs), dynamic_shapes="from_example_inputs")

        logger, quiet = logging.getLogger("torch._inductor.standalone_compile"), _QuietSave()
        logger.addFilter(quiet)
        try:
            with inductor_config.patch(force_disable_caches=True, fx_graph_cache=False, **kernel_options(gm)), \
                    functorch_config.patch(enable_autograd_cache=False):
                return standalone_compile(gm, list(example_inputs), dynamic_shapes="from_example_inputs")
        finally:
            logger.removeFilter(quiet)


def _load(path: str):
    from torch._inductor import CompiledArtifact

    return CompiledArtifact.load(path=path, format="binary")


def _aoti_available() -> bool:
    """Whether AOTInductor packages can be loaded here: the loader is called directly (no Inductor
    import), with the signature of the torch versions it was tested on. On torch 2.11 in a process
    that had used CUDA, constructing that loader for a CPU package killed the process (a
    segmentation fault, on an H200 machine): packages are used from torch 2.13 on, and not in a
    process that has initialized CUDA; elsewhere Inductor's own artifact is stored instead.
    (:data:`AOTI` ``= False`` stops compiling packages; stored ones are still loaded.)"""
    if not (hasattr(torch._C, "_aoti") and hasattr(torch._C._aoti, "AOTIModelPackageLoader")):
        return False
    if _torch_version() < (2, 13):
        return False
    return not torch.cuda.is_initialized()  # never asks the driver in a process that did not


def _torch_version() -> tuple[int, int]:
    try:
        major, minor = torch.__version__.split(".")[:2]
        return int(major), int("".join(ch for ch in minor if ch.isdigit()) or 0)
    except ValueError:
        return (0, 0)


def _aoti_compile(gm: torch.fx.GraphModule, example_inputs, path: str) -> None:
    """AOTInductor: the graph compiled into a self-contained package (kernels and their C++ caller)."""
    import torch._inductor.config as inductor_config
    from torch._inductor import aoti_compile_and_package

    with _COMPILE_LOCK, torch.no_grad(), warnings.catch_warnings(), inductor_config.patch(kernel_options(gm)):
        warnings.simplefilter("ignore")  # torch's own deprecation notices about its internals
        program = torch.export.export(gm, tuple(example_inputs), strict=False)
        aoti_compile_and_package(program, package_path=path)


def _aoti_load(path: str) -> Callable:
    """A package written by :func:`_aoti_compile`, loaded without Python-side Inductor (milliseconds)."""
    loader = torch._C._aoti.AOTIModelPackageLoader(path, "model", False, 1, -1)
    run = loader.run

    def call(*args):
        return run(list(args))[0]

    call.loader = loader  # keeps the loaded library alive with the callable
    return call


def _callable(artifact) -> Callable:
    """The artifact's compiled function, called without the artifact's own wrapper."""
    fn = getattr(artifact, "_compiled_fn", None)
    if fn is None:
        return lambda *args: _first(artifact(*args))
    return lambda *args: _first(fn(*args))


def _kernel_call(fn: Callable, example_inputs, expected) -> Callable | None:
    """Inductor's own entry point inside ``fn`` (AOTAutograd's runtime wrapper around it handles
    input mutations, aliased outputs and autograd, none of which a specialized products graph has:
    it costs 3 us per call), or ``None``. Found by walking the wrapper's closures; used only when it
    returns what the wrapper returns on the example inputs."""
    from torch._inductor.output_code import CompiledFxGraph

    seen, stack, found = set(), [fn], []
    while stack and len(seen) < 64:
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, CompiledFxGraph):
            found.append(obj)
            continue
        for cell in getattr(obj, "__closure__", None) or ():
            try:
                stack.append(cell.cell_contents)
            except ValueError:
                pass
        for attr in ("compiled_fn", "__wrapped__"):
            inner = getattr(obj, attr, None)
            if inner is not None:
                stack.append(inner)
    if len(found) != 1 or found[0].current_callable is None:
        return None
    call = found[0].current_callable

    def kernel(*args):
        out = call(list(args))
        return out[0] if isinstance(out, (list, tuple)) and len(out) == 1 else out

    try:
        with torch.no_grad():
            got = kernel(*example_inputs)
    except Exception:  # noqa: BLE001 - another calling convention: keep the wrapper
        return None
    if not (isinstance(got, torch.Tensor) and isinstance(expected, torch.Tensor)
            and got.shape == expected.shape and got.dtype == expected.dtype and torch.equal(got, expected)):
        return None
    return kernel


def _fast(fn: Callable, example_inputs) -> Callable:
    try:
        with torch.no_grad():
            reference = fn(*example_inputs)
        return _kernel_call(fn, example_inputs, reference) or fn
    except Exception:  # noqa: BLE001
        return fn


def _try_load(path: str, load: Callable, example_inputs, expected):
    """``(callable, None)`` from the artifact at ``path``, or ``(None, why not)`` (and the file is removed)."""
    try:
        fn = load(path)
        if expected is not None and not _close(fn(*example_inputs), expected):
            raise RuntimeError("its result differs from the graph's")
        return fn, None
    except Exception as exc:  # noqa: BLE001 - a corrupt or foreign artifact: compile again
        STATS.failed_loads += 1
        try:
            os.remove(path)
        except OSError:
            pass
        return None, f"cached artifact not used ({type(exc).__name__}: {str(exc).splitlines()[0][:120] if str(exc) else ''})"


def compile_graph(gm: torch.fx.GraphModule, example_inputs, *, expected: torch.Tensor | None = None) -> Compiled:
    """``gm`` compiled by Inductor for inputs like ``example_inputs``, from the on-disk cache when a
    previous process compiled the same graph. ``expected``: ``gm``'s result on the example inputs;
    an artifact must reproduce it (a loaded one is otherwise compiled again).

    The artifact is an AOTInductor package (``<key>.pt2``: loading it imports nothing of Inductor,
    a few milliseconds); where AOTInductor cannot compile the graph, Inductor's own artifact
    (``<key>.bin``, ``torch._inductor.standalone_compile``; loading it imports Inductor's compiler)."""
    t0 = time.perf_counter()
    key = graph_key(gm, example_inputs)
    with _LOCK:
        fn = _MEMORY.get(key)
    if fn is not None:
        return Compiled(fn, key, "memory", time.perf_counter() - t0)
    folder = cache_dir()
    notes = []
    stored = ([(os.path.join(folder, f"{key}.pt2"), _aoti_load if _aoti_available() else None),
               (os.path.join(folder, f"{key}.bin"), lambda p: _fast(_callable(_load(p)), example_inputs))]
              if folder else [])
    for path, load in stored:
        if load is None or not os.path.isfile(path):
            continue
        fn, note = _try_load(path, load, example_inputs, expected)
        if fn is not None:
            try:
                os.utime(path)  # recently used: the last to be evicted
            except OSError:
                pass
            seconds = time.perf_counter() - t0
            STATS.loaded += 1
            STATS.load_seconds += seconds
            with _LOCK:
                _MEMORY[key] = fn
            return Compiled(fn, key, "loaded", seconds, path)
        notes.append(note)
    fn, path = None, None
    cpu = all(t.device.type == "cpu" for t in example_inputs if isinstance(t, torch.Tensor))
    if AOTI and _aoti_available() and cpu:
        tmp = tempfile.mkdtemp(prefix="asd-aoti-")
        try:
            package = os.path.join(tmp, "model.pt2")
            _aoti_compile(gm, example_inputs, package)
            fn = _aoti_load(package)
            if expected is not None and not _close(fn(*example_inputs), expected):
                raise RuntimeError("its result differs from the graph's")
            if folder:
                try:
                    os.makedirs(folder, exist_ok=True)
                    path = os.path.join(folder, f"{key}.pt2")
                    part = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"  # one per writer
                    shutil.copyfile(package, part)
                    os.replace(part, path)  # readers see the old file or the whole new one
                except OSError as exc:
                    notes.append(f"not saved ({exc})")
                    path = None
        except Exception as exc:  # noqa: BLE001 - AOTInductor refused: Inductor's own artifact
            fn = None
            notes.append(f"AOTInductor: {type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}")
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    if fn is None:
        fresh = "the graph reads storage offsets" if reads_storage_offsets(gm) else None
        artifact = _inductor(gm, example_inputs, caches=fresh is None)
        fn = _fast(_callable(artifact), example_inputs)
        right = expected is None or _close(fn(*example_inputs), expected)
        if not right and fresh is None:
            # served from Inductor's caches under a key that misses something this graph depends on
            fresh = "Inductor's cached kernels computed something else"
            artifact = _inductor(gm, example_inputs, caches=False)
            fn = _fast(_callable(artifact), example_inputs)
            right = _close(fn(*example_inputs), expected)
        if not right:
            raise RuntimeError("Inductor's compiled graph computes something else than the graph")
        if fresh is not None:
            notes.append(f"compiled with Inductor's caches off ({fresh}): not saved")
        elif folder:
            try:
                os.makedirs(folder, exist_ok=True)
                path = os.path.join(folder, f"{key}.bin")
                part = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
                artifact.save(path=part, format="binary")
                os.replace(part, path)
            except Exception as exc:  # noqa: BLE001 - not saved: the next process compiles again
                path = None
                notes.append(f"not saved ({type(exc).__name__})")
                warnings.warn(f"asd: the compiled products could not be saved to {folder} ({exc}); the next "
                              "process compiles them again", RuntimeWarning, stacklevel=2)
    if path is not None:
        _evict(folder, keep=path)
    seconds = time.perf_counter() - t0
    STATS.compiled += 1
    STATS.compile_seconds += seconds
    with _LOCK:
        _MEMORY[key] = fn
    return Compiled(fn, key, "compiled", seconds, path, "; ".join(notes) or None)


def tensor_layout(t: torch.Tensor) -> tuple:
    """What compiled kernels are specialized on besides a tensor's values: shape, strides, storage
    offset (an ``as_strided`` in ``f`` counts from the storage, the kernels from the pointer they
    are given), dtype, device, and PyTorch's lazy negation and conjugation bits."""
    return (tuple(t.shape), t.stride(), t.storage_offset(), t.dtype, t.device, t.is_neg(), t.is_conj())


class CompiledProducts:
    """A recorded products graph ``gm(x, seeds)``, specialized on its constants and compiled:
    called as ``products(x, seeds)`` with the seeds it was specialized on."""

    def __init__(self, compiled: Compiled, runtime: list[int], extras: list, notes: list[str],
                 by_reference: list[int] | None = None, gather: torch.Tensor | None = None):
        self.compiled = compiled
        self.runtime = runtime
        self.extras = extras
        #: the tensors in ``extras`` read by reference (``f``'s parameters and captured tensors; all
        #: of them where ``by_reference`` is ``None``); the others are the specialization's own
        self.watched = tuple(t for i, t in enumerate(extras) if isinstance(t, torch.Tensor)
                             and (by_reference is None or i in by_reference))
        #: their layouts the kernels were compiled for (a tensor whose strides change under the same
        #: object, ``W.t_()``, must not meet them)
        self.layouts = [tensor_layout(t) for t in self.watched]
        self.notes = notes
        #: the index of the stored entries when the kernels return the flat products and
        #: :func:`asd.backends.cpu_kernels.take` gathers them (one of ``extras``)
        self.gather = gather
        fn = compiled.fn
        if gather is not None:
            from .cpu_kernels import take

            if runtime == [0]:
                self._call = lambda x, seeds: take(fn(x, *extras), gather)
            else:
                self._call = lambda x, seeds: take(fn(*[(x, seeds)[i] for i in runtime], *extras), gather)
        elif runtime == [0]:
            self._call = lambda x, seeds: fn(x, *extras)
        else:
            self._call = lambda x, seeds: fn(*[(x, seeds)[i] for i in runtime], *extras)

    def layouts_hold(self) -> bool:
        """Whether the watched tensors still have the layouts the kernels were compiled for."""
        return not self.layouts or [tensor_layout(t) for t in self.watched] == self.layouts

    def __call__(self, x: torch.Tensor, seeds: torch.Tensor) -> torch.Tensor:
        return self._call(x, seeds)


def compile_products(gm: torch.fx.GraphModule, x: torch.Tensor, seeds: torch.Tensor, *, constant_seeds: bool = True,
                     owned=()) -> CompiledProducts:
    """Specialize the recorded graph ``gm(x, seeds)`` on the seed rows (when ``constant_seeds``) and
    the tensors in ``owned`` (see :mod:`asd.backends.specialize`), then compile it (cached)."""
    from .specialize import functional, lift, specialize

    if x.device.type == "cpu":
        gm = functional(gm, [x, seeds])
        spec = specialize(gm, [x, seeds], constant_inputs=[1] if constant_seeds else [], owned=owned)
    else:  # measured and tested on the CPU only: elsewhere the recorded graph as it is
        spec = lift(gm, [x, seeds])
    args = spec.arguments([x, seeds])
    lazy = [a for a in args if isinstance(a, torch.Tensor) and (a.is_neg() or a.is_conj())]
    if lazy:
        # (conj().imag, a view with the negation bit): Inductor's kernels, and torch.compile's,
        # read such a tensor without its sign
        raise RuntimeError("a tensor f reads carries PyTorch's lazy negation or conjugation bit, which "
                           "compiled kernels do not apply")
    with torch.no_grad():
        expected = spec.gm(*args)
    gm, gather = spec.gm, None
    if x.device.type == "cpu":
        gm, gather, expected = _for_cpu(spec, args, expected)
    compiled = compile_graph(gm, args, expected=expected)
    return CompiledProducts(compiled, spec.runtime, spec.extras, spec.notes, spec.by_reference, gather)


def _for_cpu(spec, args, expected):
    """``(graph, gather index or None, its expected result)``: the specialized graph with the
    rewrites of :mod:`asd.backends.cpu_kernels` where they give its values on ``args`` and on
    a second input nearby; else the specialized graph as it is. The final gather is split off
    only where the kernels are generated for one thread."""
    from .cpu_kernels import split_final_gather, split_padded_sums, take, with_meta

    graph = torch.fx.Graph()
    graph.output(graph.graph_copy(spec.gm.graph, {}))
    gm = torch.fx.GraphModule(spec.gm, graph)  # a copy: spec.gm stays the specialized computation
    nrun = len(spec.runtime)
    # the gather index must be one of the specialization's own constants, never a tensor of f's
    constants = set() if spec.by_reference is None else {
        nrun + i for i in range(len(spec.extras)) if i not in spec.by_reference}
    try:
        sums = split_padded_sums(gm)
        if sums:
            with torch.no_grad():
                with_meta(gm, args)  # the new nodes' values, which the gather's rewrite reads
        # on one thread the gather after the kernels (Numba) is the faster; on more, the kernels'
        # own gather is: it runs on every thread, where the Numba loop runs on one and reads what
        # the other threads have just written (B3 n=10^5 at 2 threads: 170 against 250 us, and
        # 850 us in this machine's slow stretches)
        threads = kernel_threads()
        split = split_final_gather(gm, args, constants)
        inside = split is not None and threads > 1
        products, index = split if split is not None and not inside else (gm, None)
        if not sums and index is None:
            if inside:
                spec.notes.append(f"gather in the kernels ({threads} threads)")
            return spec.gm, None, expected
        other = [a * 1.5 - 0.25 if i < nrun and isinstance(a, torch.Tensor) and a.is_floating_point() else a
                 for i, a in enumerate(args)]
        with torch.no_grad():
            flat = with_meta(products, args)
            want_other = spec.gm(*other)
            got_other = products(*other)
        # the same additions in the same order (a zero term dropped) and the same gather: the same values
        for got, want in ((flat, expected), (got_other, want_other)):
            if not _same(got if index is None else take(got, index), want):
                raise RuntimeError("the rewritten graph disagrees with the specialized one")
    except Exception as exc:  # noqa: BLE001 - an optimization: keep the specialized graph
        spec.notes.append(f"CPU rewrites not used ({type(exc).__name__}: {str(exc).splitlines()[0][:120] if str(exc) else ''})")
        return spec.gm, None, expected
    spec.notes.append("CPU rewrites: " + ", ".join(
        ([f"{sums} padded sum{'s' if sums > 1 else ''} as segments"] if sums else [])
        + (["gather after the kernels"] if index is not None else [])
        + ([f"gather in the kernels ({threads} threads)"] if inside else [])))
    return products, index, flat


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal shapes, dtypes and values, NaN where the other has NaN (-0.0 equals 0.0)."""
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)) or a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.is_complex():
        a, b = torch.view_as_real(a), torch.view_as_real(b)
    if not a.is_floating_point():
        return bool(torch.equal(a, b))
    nan = a.isnan()
    return bool(torch.equal(nan, b.isnan()) and torch.equal(a.masked_fill(nan, 0.0), b.masked_fill(nan, 0.0)))
