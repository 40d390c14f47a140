"""kiln: a deep-learning graph compiler (Python API).

    import kiln
    model = kiln.load("model.onnx")          # ONNX, kiln JSON, a zoo name or a .kiln artifact
    fast = kiln.compile(model, batch=1)      # a compiled model, called like a function
    y = fast(x)                              # NumPy arrays or PyTorch tensors in, the same out

Tensors cross by DLPack: C-contiguous CPU inputs are read where they lie, outputs are handed over
without a copy (non-contiguous inputs are copied once, to a contiguous tensor). The GIL is
released while kiln compiles and runs, so Python threads may call one model at once. Errors are
`kiln.Error`; those the caller can fix (a wrong shape or dtype, a missing file, an unsupported
op) are `kiln.UserError`, which is also a `ValueError`. See docs/python.md.
"""

from __future__ import annotations

import os
import time as _time

import numpy as np

from . import _kiln
from ._kiln import Error, UserError

__all__ = [
    "Error",
    "UserError",
    "Model",
    "StagedModel",
    "CompiledModel",
    "StagedCompiledModel",
    "EagerModel",
    "JitModel",
    "load",
    "compile",
    "jit",
    "eager",
    "bench",
    "from_torch",
]
__version__ = _kiln.version()


def _is_torch(x) -> bool:
    return type(x).__module__.startswith("torch")


def _is_cuda(x) -> bool:
    return _is_torch(x) and x.device.type == "cuda"


def _arrays(args):
    """The call's inputs as contiguous CPU arrays kiln can read, and whether they were torch."""
    arrays = []
    torch_in = False
    for i, a in enumerate(args):
        if _is_torch(a):
            torch_in = True
            if a.device.type != "cpu":
                raise UserError(
                    f"input {i}: a tensor on '{a.device}'; CUDA tensors go to a model compiled "
                    "with device='cuda' (kiln.compile or kiln.load), every input on cuda:0; "
                    "elsewhere move it with .cpu()"
                )
            if a.requires_grad:
                a = a.detach()
            if not a.is_contiguous():
                a = a.contiguous()
        else:
            if not isinstance(a, np.ndarray):
                a = np.asarray(a)
            if not a.flags.c_contiguous:
                a = np.ascontiguousarray(a)
        arrays.append(a)
    return arrays, torch_in


class _Callable:
    """Calls `self._impl.run` on DLPack arrays: NumPy in, NumPy out; torch in, torch out."""

    def __init__(self, impl, n_outputs: int):
        self._impl = impl
        self._single = n_outputs == 1

    def __call__(self, *args):
        if any(_is_cuda(a) for a in args) and hasattr(self._impl, "run_cuda"):
            outs = self._impl.run_cuda(_cuda_capsules(args), _LEGACY_STREAM, True)
        else:
            arrays, torch_in = _arrays(args)
            outs = self._impl.run(arrays, torch_in)
        return outs[0] if self._single and len(outs) == 1 else tuple(outs)


# DLPack's `stream` for CUDA's legacy default stream. PyTorch's __dlpack__(stream=1) makes that
# stream wait for its current one (where the tensor was written), and kiln's run waits for it.
_LEGACY_STREAM = 1


def _cuda_capsules(args):
    """DLPack capsules of CUDA torch tensors, ordered after the work that wrote them."""
    capsules = []
    for i, a in enumerate(args):
        if not _is_cuda(a):
            raise UserError(
                f"input {i}: not a CUDA tensor while others are; give every input on cuda:0"
            )
        if a.requires_grad:
            a = a.detach()
        if not a.is_contiguous():
            a = a.contiguous()  # Documented: a non-contiguous input is copied once.
        capsules.append(a.__dlpack__(stream=_LEGACY_STREAM))
    return capsules


class Model:
    """A model graph (loaded from a file or the zoo, or built by kiln.from_torch)."""

    def __init__(self, graph: "_kiln.Graph"):
        self._graph = graph

    @property
    def name(self) -> str:
        return self._graph.name

    @property
    def inputs(self):
        """[{name, dtype, shape[, dim_names]}] of the graph's inputs."""
        return self._graph.inputs

    @property
    def outputs(self):
        return self._graph.outputs

    def text(self) -> str:
        """The graph in kiln's text IR."""
        return self._graph.text()

    def save_json(self, path: str) -> None:
        """Writes the graph as a kiln JSON graph (path) and its weights (.safetensors beside)."""
        self._graph.save_json(path)

    def __repr__(self) -> str:
        ins = ", ".join(f"{i['name']}: {i['dtype']}{i['shape']}" for i in self.inputs)
        return f"<kiln.Model {self.name!r} ({ins}), {self._graph.num_nodes} nodes>"


class CompiledModel(_Callable):
    """A compiled model (kiln.compile) or a loaded artifact (kiln.load("x.kiln"))."""

    def __init__(self, impl: "_kiln.Compiled"):
        super().__init__(impl, len(impl.outputs))

    @property
    def inputs(self):
        return self._impl.inputs

    @property
    def outputs(self):
        return self._impl.outputs

    @property
    def report(self) -> dict:
        """Compile (or load) times in ms, kernels, library steps, arena and parameter bytes."""
        return self._impl.report()

    def explain(self, what: str = "fusion") -> str:
        """'fusion' (what fused, and why not), 'algos' (convolution algorithms), 'cache'
        (kernel cache hits and misses), 'graph' (the optimized graph) or 'remarks'."""
        return self._impl.explain(what)

    def save(self, path: str, name: str = "model") -> None:
        """Writes an AOT artifact (.kiln) that kiln.load and the C++ runtime load."""
        self._impl.save(path, name)

    def __repr__(self) -> str:
        r = self.report
        return f"<kiln.CompiledModel ({r['kind']}), {len(self.inputs)} inputs>"


class EagerModel(_Callable):
    """The same graph run op by op (no fusion, no planning): the baseline."""


class JitModel(_Callable):
    """Compiles at the first call of each input signature (dtypes and shapes are the guards)."""

    @property
    def compiles(self) -> int:
        return self._impl.compiles

    @property
    def log(self):
        """One line per compile: the signature and, for recompiles, the guard that failed."""
        return self._impl.log


class StagedModel:
    """An ONNX model with nodes whose output size depends on values (NonZero, Compress,
    NonMaxSuppression, Unique), or with an If or Loop that its values decide (a computed condition
    or trip count): kiln compiles for static shapes and graphs without control flow, so it runs in
    stages, each made and compiled when a call's values give its sizes and branches (docs/onnx.md,
    "Sizes known at run time").
    kiln.compile, kiln.jit and kiln.eager take it; it has no single graph to print or save."""

    def __init__(self, staged: "_kiln.Staged", path: str):
        self._graph = staged
        self._path = path  # Absolute: kiln.compile(..., batch=) imports it again.

    @property
    def name(self) -> str:
        return self._graph.source

    @property
    def inputs(self):
        """[{name, dtype, shape}]: the declared types (a symbolic dim at `batch`); a call may
        give other sizes."""
        return self._graph.inputs

    @property
    def outputs(self):
        """[{name}]: an output's shape is known once a call computed it."""
        return self._graph.outputs

    def __repr__(self) -> str:
        ins = ", ".join(f"{i['name']}: {i['dtype']}{i['shape']}" for i in self.inputs)
        return f"<kiln.StagedModel {self.name!r} ({ins}), run in stages>"


class StagedCompiledModel(_Callable):
    """A StagedModel's runner (kiln.compile, kiln.jit or kiln.eager of one): each stage is
    compiled (or run op by op) for the call's input types and the sizes its values give, and
    kept (64 stages, the least recently used evicted); a new size compiles the stages after it, as a new shape does for
    kiln.jit. Safe to call from many threads."""

    def __init__(self, impl: "_kiln.StagedModule", eager: bool):
        super().__init__(impl, len(impl.outputs))
        self.eager = eager

    def __call__(self, *args):
        for i, a in enumerate(args):
            if _is_cuda(a):
                raise UserError(
                    f"input {i}: a CUDA tensor; a model run in stages takes host tensors (its "
                    "stages' values cross between them on the host, whatever the device it was "
                    "compiled for); move it with .cpu()"
                )
        return super().__call__(*args)

    @property
    def inputs(self):
        return self._impl.inputs

    @property
    def outputs(self):
        return self._impl.outputs

    @property
    def stages_made(self) -> int:
        """Stages made (imported and compiled) so far, over every call."""
        return self._impl.stages_made

    @property
    def log(self):
        """One line per stage made: where it begins, its sizes and what it computes."""
        return self._impl.log

    @property
    def report(self) -> dict:
        return {"kind": "staged", "eager": self.eager, "stages_made": self.stages_made}

    def explain(self, what: str = "stages") -> str:
        """'stages': the stages made so far (log). Each stage is a graph of its own, made per
        call signature: fusion and algorithms are decided per stage, not for the model."""
        if what != "stages":
            raise UserError(
                f"explain({what!r}): a model run in stages explains 'stages' (each stage is "
                "compiled on its own, for the sizes a call's values give)"
            )
        return "".join(line + "\n" for line in self.log)

    def save(self, path: str, name: str = "model") -> None:
        raise UserError(
            f"save({path!r}): this model runs in stages (its output sizes or its control flow "
            "depend on values), "
            "and an artifact holds one compiled graph; load the ONNX model where it runs instead"
        )

    def __repr__(self) -> str:
        mode = "eager" if self.eager else "compiled"
        return f"<kiln.StagedCompiledModel ({mode}), {self.stages_made} stages made>"


def _staged(model: StagedModel, batch, device, eager: bool, **options) -> StagedCompiledModel:
    if batch is not None:
        model = load(model._path, batch=batch)
    impl = _kiln.run_staged(model._graph, device=device, eager=eager, **options)
    return StagedCompiledModel(impl, eager)


def _model(model, batch: int = 1):
    if isinstance(model, (Model, StagedModel)):
        return model
    if isinstance(model, str):
        loaded = load(model, batch=batch)
        if isinstance(loaded, CompiledModel):
            raise UserError(f"{model}: an artifact is compiled already; call kiln.load on it")
        return loaded
    raise UserError(
        f"expected a kiln.Model or a model path, got {type(model).__name__} "
        "(a torch.nn.Module goes through kiln.from_torch(module, example_inputs) first)"
    )


def load(path: str, batch: int = 1, seed: int = 0, device: str = "cpu", threads: int = 0,
         warmup: bool = True):
    """Loads an ONNX model, a kiln JSON graph or a zoo model (a kiln.Model), or a .kiln
    artifact (a kiln.CompiledModel, ready to run). An ONNX model with nodes whose output size
    depends on values (NonZero, Compress, NonMaxSuppression, Unique) is a kiln.StagedModel.
    `batch` sizes an unnamed symbolic first dim (ONNX) or a zoo model; `seed` draws a zoo
    model's weights. An artifact runs once on zero inputs before it is returned (`warmup`), so
    that the first real call is not the slow one."""
    if str(path).endswith(".kiln"):
        return CompiledModel(_kiln.load_artifact(str(path), device=device, threads=threads,
                                                 warmup=warmup))
    g = _kiln.load_graph(str(path), batch, seed)
    if isinstance(g, _kiln.Staged):
        return StagedModel(g, os.path.abspath(str(path)))
    return Model(g)


def compile(
    model,
    batch: int | None = None,
    device: str = "cpu",
    autotune: bool = False,
    precision: str = "fp32",
    threads: int = 0,
    target_cpu: str = "",
    max_memory: int = 0,
) -> CompiledModel:
    """Compiles `model` (a kiln.Model or a path) for its input shapes, or for `batch` (a file or
    zoo model is loaded again at that batch). device: "cpu", "cuda" or "emu"; precision: fp32,
    tf32, bf16 or fp16; threads: 0 for every core; target_cpu: "" for this CPU, or a CPU name
    ("x86-64-v3") for portable artifacts; max_memory: a bound in bytes, 0 for none."""
    m = _model(model)
    if isinstance(m, StagedModel):
        return _staged(m, batch, device, False, autotune=autotune, precision=precision,
                       threads=threads, target_cpu=target_cpu, max_memory=max_memory)
    impl = _kiln.compile(
        m._graph,
        batch=batch,
        device=device,
        autotune=autotune,
        precision=precision,
        threads=threads,
        target_cpu=target_cpu,
        max_memory=max_memory,
    )
    return CompiledModel(impl)


def jit(model, device: str = "cpu", autotune: bool = False, precision: str = "fp32",
        threads: int = 0, recompile_limit: int | None = None) -> JitModel:
    """Compiles at the first call for each input signature and reuses it after (an ONNX model
    is imported again for new symbolic dims); past `recompile_limit` signatures (default 8) it
    errors. A kiln.StagedModel makes its stages per call signature already, and keeps the 64
    latest: it takes no recompile_limit."""
    m = _model(model)
    if isinstance(m, StagedModel):
        if recompile_limit is not None:
            raise UserError(
                "recompile_limit: a model run in stages makes each stage for the sizes a call's "
                "values give and keeps the 64 latest stages; it has no limit to set"
            )
        return _staged(m, None, device, False, autotune=autotune, precision=precision,
                       threads=threads)
    limit = 8 if recompile_limit is None else recompile_limit
    impl = _kiln.jit(m._graph, device=device, autotune=autotune, precision=precision,
                     threads=threads, recompile_limit=limit)
    return JitModel(impl, len(m.outputs))


def eager(model, device: str = "cpu") -> EagerModel:
    """Runs `model` op by op, as PyTorch eager does: the baseline for every comparison."""
    m = _model(model)
    if isinstance(m, StagedModel):
        return _staged(m, None, device, True)
    return EagerModel(_kiln.eager(m._graph, device=device), len(m.outputs))


def _random_inputs(types, seed: int = 0):
    rng = np.random.default_rng(seed)
    out = []
    for t in types:
        dt = np.dtype("float32" if t["dtype"] == "bf16" else _NUMPY_DTYPES[t["dtype"]])
        if dt.kind == "f":
            out.append(rng.uniform(-1, 1, t["shape"]).astype(dt))
        elif dt.kind == "b":
            out.append(rng.integers(0, 2, t["shape"]).astype(dt))
        else:
            out.append(rng.integers(0, 10, t["shape"]).astype(dt))
    return out


_NUMPY_DTYPES = {
    "f32": "float32", "f64": "float64", "f16": "float16", "i64": "int64", "i32": "int32",
    "i16": "int16", "i8": "int8", "u8": "uint8", "u16": "uint16", "u32": "uint32",
    "u64": "uint64", "bool": "bool",
}


def _median_ms(fn, args, iters: int, warmup: int) -> float:
    for _ in range(warmup):
        fn(*args)
    times = []
    for _ in range(iters):
        t0 = _time.perf_counter()
        fn(*args)
        times.append((_time.perf_counter() - t0) * 1e3)
    times.sort()
    return times[len(times) // 2]


def bench(model, batch: int | None = None, iters: int = 20, warmup: int = 3, threads: int = 0,
          autotune: bool = False, inputs=None) -> dict:
    """Times `model` eager and compiled on the same inputs (seeded random ones unless given):
    medians in ms, compile time, the first compiled run, and the speedup."""
    m = _model(model, batch or 1)
    t0 = _time.perf_counter()
    c = compile(m, batch=batch, threads=threads, autotune=autotune)
    compile_ms = (_time.perf_counter() - t0) * 1e3
    args = inputs if inputs is not None else _random_inputs(c.inputs)
    t0 = _time.perf_counter()
    c(*args)
    first_ms = (_time.perf_counter() - t0) * 1e3
    e = eager(m) if batch is None else eager(_model(m._graph.source, batch))
    eager_ms = _median_ms(e, args, iters, warmup)
    compiled_ms = _median_ms(c, args, iters, warmup)
    return {
        "model": m.name,
        "iters": iters,
        "eager_ms": eager_ms,
        "compiled_ms": compiled_ms,
        "speedup": eager_ms / compiled_ms,
        "compile_ms": compile_ms,
        "first_run_ms": first_ms,
    }


def from_torch(module, example_inputs, dynamic_shapes=None, **compile_options):
    """Captures a torch.nn.Module with torch.export and translates its core ATen graph to
    kiln (kiln.torch_export.from_torch has the details)."""
    from .torch_export import from_torch as _from_torch

    return _from_torch(module, example_inputs, dynamic_shapes=dynamic_shapes, **compile_options)
