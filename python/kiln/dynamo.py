"""torch.compile(model, backend="kiln"): a TorchDynamo backend.

Dynamo hands each captured graph to `kiln_backend`, which runs AOTAutograd over it (core ATen
decompositions; forward and backward graphs for training, one inference graph under no_grad).
Each ATen graph is partitioned (torch.fx's CapabilityBasedPartitioner) into the subgraphs kiln
translates (kiln.torch_export.Translator) and the nodes it does not, which stay in PyTorch; each
kiln subgraph is compiled at its first call for its input shapes and again for new ones.
`KILN_LOG=fallback` prints every node left to PyTorch with the reason (also on the `kiln`
logger at INFO).

Under no_grad the module's parameters and buffers are frozen into the kiln graph (shared, not
copied), so that BatchNorm folds into convolutions and weights are reordered once, as
Inductor's freezing does; each call checks their version counters and compiles again after an
in-place change (an optimizer step, load_state_dict). In training they stay inputs.

The backend is registered under the `torch_dynamo_backends` entry point (python/pyproject.toml,
and the dist-info the build writes into build/python/), so `backend="kiln"` works without an
import; importing kiln.dynamo registers it too.
"""

from __future__ import annotations

import atexit
import copy
import logging
import operator
import os
import sys
import weakref

import torch
from torch.fx.node import _get_qualified_name as _qualified_name
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.utils.fuser_utils import fuse_by_partitions
from torch.fx.passes.operator_support import OperatorSupport

from . import UserError
from .torch_export import SKIP, TORCH_TO_KILN, Translator, describe, handler_of

log = logging.getLogger("kiln")
aten = torch.ops.aten

# Ops whose further outputs (inference BatchNorm's empty statistics) kiln does not compute: the
# node is kiln's only where every user reads output 0.
_FIRST_OUTPUT_ONLY = {
    aten._native_batch_norm_legit_no_training.default,
}
# Movement and constant ops: a partition made of these alone is left to PyTorch (a kiln call
# would cost more than it saves).
_NON_COMPUTE = [
    "aten.view.default", "aten._unsafe_view.default", "aten.reshape.default",
    "aten.permute.default", "aten.t.default", "aten.transpose.int", "aten.expand.default",
    "aten.clone.default", "aten.alias.default", "aten.unsqueeze.default", "aten.squeeze.dim",
    "aten.squeeze.dims", "aten.slice.Tensor", "aten.select.int", "aten.detach.default",
    "_operator.getitem", "aten.sym_size.int", "aten.full.default", "aten.scalar_tensor.default",
    "aten.arange.start_step", "aten.full_like.default", "aten.empty.memory_format",
    "aten.empty_permuted.default", "aten.new_empty_strided.default", "aten.new_empty.default",
    "aten.empty_like.default",
]


def _fallback_enabled() -> bool:
    return "fallback" in os.environ.get("KILN_LOG", "").split(",")


def _report_fallback(node, reason: str) -> None:
    msg = f"kiln: fallback to PyTorch: {describe(node)}: {reason}"
    log.info(msg)
    if _fallback_enabled():
        print(msg, file=sys.stderr)


def _tensor_ok(v) -> str | None:
    if isinstance(v, torch.Tensor):
        if v.dtype not in TORCH_TO_KILN:
            return f"dtype {v.dtype}"
        if v.device.type != "cpu":
            return f"device {v.device}"
        if v.layout != torch.strided:
            return f"layout {v.layout}"
    return None


def unsupported_reason(node) -> str | None:
    """Why kiln does not take `node` (None: it does)."""
    if node.op != "call_function":
        return "not a function call"
    if node.target is operator.getitem:
        src = node.args[0]
        if src.target in _FIRST_OUTPUT_ONLY and node.args[1] != 0:
            return f"output {node.args[1]} of {src.target} (kiln computes output 0 only)"
        return unsupported_reason(src) if isinstance(src, torch.fx.Node) else None
    if handler_of(node.target) is None and node.target not in SKIP:
        return "no kiln translation for this op"
    if node.target in _FIRST_OUTPUT_ONLY:
        for u in node.users:
            if u.target is not operator.getitem or u.args[1] != 0:
                return "its further outputs are used (kiln computes output 0 only)"
    val = node.meta.get("val")
    vals = val if isinstance(val, (list, tuple)) else [val]
    for v in vals:
        r = _tensor_ok(v)
        if r:
            return f"an output of {r}"
    for a in node.all_input_nodes:
        r = _tensor_ok(a.meta.get("val"))
        if r:
            return f"an input of {r}"
    conv = {aten.convolution.default: 1, aten.convolution_backward.default: 2}
    if node.target in conv:
        w = node.args[conv[node.target]].meta.get("val")
        # 3-D convolutions, transposed or not, and their gradients are lowered onto the 2-D ops.
        if w is not None and w.dim() not in (3, 4, 5):
            return f"a {w.dim() - 2}-D convolution (kiln has 1-D, 2-D and 3-D)"
    if node.target == aten.threshold_backward.default and node.args[2] != 0:
        return "threshold_backward away from 0 (kiln has ReLU's)"
    if node.target == aten._native_batch_norm_legit_functional.default and not node.args[5]:
        return "BatchNorm with running statistics under autograd"
    return None



class _Support(OperatorSupport):
    def __init__(self, excluded: dict | None = None):
        super().__init__()
        self.excluded = excluded or {}  # Node name -> why its translation failed.

    def is_node_supported(self, submodules, node) -> bool:
        return node.name not in self.excluded and unsupported_reason(node) is None


_LIVE_SUBGRAPHS = weakref.WeakSet()


@atexit.register
def _release_compiled_models():
    """Dynamo's caches keep the compiled subgraphs alive until the interpreter is torn down,
    after nanobind counts what is left as leaked; they are dropped first."""
    for sub in list(_LIVE_SUBGRAPHS):
        sub.cache.clear()


class KilnSubgraph(torch.nn.Module):
    """One partition: translated and compiled by kiln per input signature; falls back to the
    PyTorch subgraph (logged) if translation fails."""

    def __init__(self, gm: torch.fx.GraphModule, frozen: list[bool], name: str, options: dict):
        super().__init__()
        self.gm = gm
        self.frozen = frozen
        self.name = name
        self.options = options
        # Signature of the runtime inputs -> (compiled model, their indices, draws a seed).
        self.cache = {}
        self.frozen_state = None  # (data_ptr, version) of each frozen tensor the cache is for.
        self.fallback = False
        out = next(n for n in gm.graph.nodes if n.op == "output")
        self.single = not isinstance(out.args[0], (list, tuple))
        _LIVE_SUBGRAPHS.add(self)

    def _compile(self, args):
        from . import compile as kiln_compile

        t = Translator(self.name)
        bindings = {}
        placeholders = [n for n in self.gm.graph.nodes if n.op == "placeholder"]
        for node, a, f in zip(placeholders, args, self.frozen):
            if not isinstance(a, torch.Tensor) or f:
                bindings[node.name] = a  # A SymInt's value or a frozen tensor: constants.
            else:
                bindings[node.name] = (a.dtype, list(a.shape))
        model = t.finish(t.run(self.gm.graph, bindings))
        compiled = kiln_compile(model, **self.options)
        index = [i for i, (a, f) in enumerate(zip(args, self.frozen))
                 if isinstance(a, torch.Tensor) and not f]
        return compiled, index, t.seed is not None

    def _split(self, error: UserError, args):
        """After nodes failed to translate at these shapes (an adaptive pooling that does not
        divide): this subgraph partitioned again without them, the rest still kiln's (a module
        for this signature); None, with every node reported, where nothing else is left."""
        failed = getattr(error, "failed", None)
        if failed:
            gm = copy.deepcopy(self.gm)
            placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
            frozen = {p.name for p, f in zip(placeholders, self.frozen) if f}
            split = _partition(gm, frozen, self.options, self.name, excluded=failed)
            if any(isinstance(m, KilnSubgraph) for m in split.children()):
                return split
        self.fallback = True
        for n in self.gm.graph.nodes:
            if n.op == "call_function":
                _report_fallback(n, f"its subgraph {self.name} did not translate: {error}")
        return None

    def forward(self, *args):
        if self.fallback:
            return self.gm(*args)
        frozen_state = tuple((a.data_ptr(), a._version)
                             for a, f in zip(args, self.frozen) if f)
        if frozen_state != self.frozen_state:
            self.cache.clear()  # Frozen weights changed in place: compile again.
            self.frozen_state = frozen_state
        key = tuple((a.dtype, tuple(a.shape)) if isinstance(a, torch.Tensor) else a
                    for a, f in zip(args, self.frozen) if not f)
        entry = self.cache.get(key)
        if entry is None:
            try:
                entry = self._compile(args)
            except UserError as e:
                entry = self._split(e, args)
                if entry is None:
                    return self.gm(*args)
            self.cache[key] = entry
        if isinstance(entry, torch.fx.GraphModule):
            return entry(*args)
        compiled, index, random = entry
        inputs = []
        for i in index:
            a = args[i].detach()
            inputs.append(a if a.is_contiguous() else a.contiguous())
        if random:  # The run's random seed (Translator.random_seed), from torch's generator.
            inputs.append(torch.randint(0, 2**62, (), dtype=torch.int64))
        outs = compiled._impl.run(inputs, True)
        return outs[0] if self.single else tuple(outs)


def _is_write_back(node) -> bool:
    """A copy_ into a graph input: AOTAutograd's write-back of a mutated buffer (BatchNorm's
    running statistics), which PyTorch does after kiln computed the value; not a fallback."""
    return node.target is aten.copy_.default and node.args[0].op == "placeholder"


def _op_name(node) -> str:
    """A call node's op as _NON_COMPUTE names it ("aten.view.default", "_operator.getitem")."""
    name = _qualified_name(node.target)
    return name[len("torch.ops."):] if name.startswith("torch.ops.") else name


def _between(taken: list, left: list) -> bool:
    """Whether a node of `left` is downstream of a node of `taken` and upstream of another (so
    that one partition of all of `taken` would depend on itself through PyTorch)."""
    def reach(start, step):
        seen, stack = set(start), list(start)
        while stack:
            for m in step(stack.pop()):
                if m not in seen:
                    seen.add(m)
                    stack.append(m)
        return seen

    down = reach(taken, lambda n: n.users)
    up = reach(taken, lambda n: n.all_input_nodes)
    return any(n in down and n in up for n in left)


def _partition(gm: torch.fx.GraphModule, frozen_inputs: set, options: dict, tag: str,
               excluded: dict | None = None):
    """`gm` with kiln's partitions replaced by KilnSubgraph modules; reports the rest.
    `excluded`: nodes (by name) whose translation failed, with why."""
    excluded = excluded or {}
    taken, left = [], []  # Call nodes kiln takes and those it leaves, in graph order.
    for node in gm.graph.nodes:
        if node.op == "call_function":
            r = excluded.get(node.name) or unsupported_reason(node)
            (left if r else taken).append(node)
            if r and node.target is not operator.getitem and not _is_write_back(node):
                _report_fallback(node, r)
    if not left or not _between(taken, left):
        # Nothing PyTorch keeps lies on a path from a node kiln takes to another (write-backs,
        # sinks, sources): kiln's nodes are one partition. CapabilityBasedPartitioner finds the
        # same in time quadratic in the graph (densenet121's training graphs: 6 s of its 31 s
        # first step).
        partitions = [dict.fromkeys(taken)] if taken else []
    else:
        partitioner = CapabilityBasedPartitioner(gm, _Support(excluded),
                                                 allows_single_node_partition=True)
        partitions = [p.nodes for p in partitioner.propose_partitions()]
    # A partition of movement and constant ops alone stays PyTorch's (a kiln call would cost more
    # than it saves).
    partitions = [p for p in partitions if any(_op_name(n) not in _NON_COMPUTE for n in p)]
    if not partitions:
        return gm
    fused = fuse_by_partitions(gm, partitions, prefix="kiln_")
    for node in list(fused.graph.nodes):
        if node.op == "call_module" and node.target.startswith("kiln_"):
            sub = getattr(fused, node.target)
            frozen = [isinstance(a, torch.fx.Node) and a.op == "placeholder"
                      and a.name in frozen_inputs for a in node.args]
            setattr(fused, node.target, KilnSubgraph(sub, frozen, f"{tag}_{node.target}", options))
    fused.recompile()
    return fused


def _frozen_names(dynamo_gm, aten_gm) -> set:
    """Placeholders of the ATen graph that are the module's parameters or buffers (by Dynamo's
    names for them: L_self_..._parameters_... / _buffers_...), matched by position."""
    dyn = [n for n in dynamo_gm.graph.nodes if n.op == "placeholder"]
    at = [n for n in aten_gm.graph.nodes if n.op == "placeholder"]
    if len(dyn) != len(at):
        return set()
    out = set()
    for d, a in zip(dyn, at):
        dv, av = d.meta.get("example_value"), a.meta.get("val")
        if not (isinstance(dv, torch.Tensor) and isinstance(av, torch.Tensor)):
            continue
        if dv.dtype != av.dtype or tuple(dv.shape) != tuple(av.shape):
            return set()  # Not the same order after all: freeze nothing.
        if "_parameters_" in d.name or "_buffers_" in d.name:
            out.add(a.name)
    return out


def _make_compiler(dynamo_gm, options: dict, freeze: bool, tag: str):
    def compiler(aten_gm: torch.fx.GraphModule, example_inputs):
        frozen = _frozen_names(dynamo_gm, aten_gm) if freeze else set()
        fused = _partition(aten_gm, frozen, options, tag)

        def run(args):
            args = list(args)
            out = fused(*args)
            args.clear()
            return out

        run._boxed_call = True
        return run

    return compiler


_DECOMPOSITIONS = None


def kiln_backend(gm: torch.fx.GraphModule, example_inputs, **options):
    """The torch.compile backend: options (torch.compile(..., options={...})) go to
    kiln.compile (threads, autotune, precision)."""
    from torch._decomp import core_aten_decompositions
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.partitioners import min_cut_rematerialization_partition

    options = dict(options.get("options") or {}) if "options" in options else dict(options)
    training = torch.is_grad_enabled() and any(
        getattr(t, "requires_grad", False) for t in example_inputs)
    global _DECOMPOSITIONS
    if _DECOMPOSITIONS is None:  # Built once: making the table takes tens of ms.
        table = core_aten_decompositions()
        # For training, scaled_dot_product_attention's CPU flash kernel is not decomposed:
        # PyTorch 2.15 decomposes the forward into math ops but keeps the flash backward, which
        # then reads the probabilities as its logsumexp and gives wrong gradients (the same with
        # aot_eager and this table; tests/test_torch.py has the case). Forward and backward stay
        # PyTorch's flash kernels; in inference the math form is what kiln fuses into attention.
        # An embedding's backward stays whole too: kiln's gather_backward is that op, where the
        # decomposition masks every index (out of range, padding) into an index_put.
        kept = (aten._scaled_dot_product_flash_attention_for_cpu.default,
                aten.embedding_dense_backward.default)
        training_table = {k: v for k, v in table.items() if k not in kept}
        _DECOMPOSITIONS = (table, training_table)
    decomps = _DECOMPOSITIONS[1 if training else 0]
    return aot_autograd(
        fw_compiler=_make_compiler(gm, options, False, "fw"),
        bw_compiler=_make_compiler(gm, options, False, "bw"),
        inference_compiler=_make_compiler(gm, options, True, "inf"),
        decompositions=decomps,
        partition_fn=min_cut_rematerialization_partition,
        keep_inference_input_mutations=True,
    )(gm, example_inputs)


def register() -> None:
    from torch._dynamo.backends.registry import _BACKENDS, register_backend

    if "kiln" not in _BACKENDS or _BACKENDS["kiln"] is None:
        register_backend(name="kiln", compiler_fn=kiln_backend)


register()
