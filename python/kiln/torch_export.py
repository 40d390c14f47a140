"""PyTorch capture: torch.export's core ATen graph translated to a kiln graph.

    model = kiln.from_torch(module, (x,), dynamic_shapes=({0: torch.export.Dim("batch")},))
    y = model(x)

`from_torch` exports `module` with torch.export, decomposes to the core ATen op set, and
translates each node to kiln ops (`Translator`). Parameters and buffers are shared with the
module, not copied (kiln reads them where they lie; a 64-byte misaligned one is copied). kiln
compiles for static shapes, as XLA does: a symbolic dim (torch.export.Dim) is checked against
its range at each call and the graph is translated again and compiled once per size it meets.
Every ATen op kiln cannot express is reported together, each with its source line.

The same Translator turns the ATen graphs that the torch.compile backend (kiln.dynamo) gets
into kiln graphs.
"""

from __future__ import annotations

import math
import operator
import re

import numpy as np
import torch

from . import _NUMPY_DTYPES as _NP  # kiln dtype name -> NumPy dtype name
from . import CompiledModel, Model, UserError, _kiln

aten = torch.ops.aten

TORCH_TO_KILN = {
    torch.float32: "f32",
    torch.float64: "f64",
    torch.float16: "f16",
    torch.bfloat16: "bf16",
    torch.int64: "i64",
    torch.int32: "i32",
    torch.int16: "i16",
    torch.int8: "i8",
    torch.uint8: "u8",
    torch.bool: "bool",
}
KILN_TO_TORCH = {v: k for k, v in TORCH_TO_KILN.items()}


class Unsupported(Exception):
    """A node kiln cannot express; `reason` says what of it."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def source_line(node) -> str:
    """The user's source line of an fx node ("model.py:12: x = torch.foo(y)"), or ""."""
    trace = node.meta.get("stack_trace") or ""
    frames = re.findall(r'File "([^"]+)", line (\d+), in \S+\n\s*(.*)', trace)
    if not frames:
        return ""
    path, line, code = frames[-1]
    return f"{path}:{line}: {code.strip()}"


def describe(node) -> str:
    where = source_line(node)
    return f"{node.target} (node '{node.name}'" + (f", {where})" if where else ")")


class _Value:
    """A kiln value: its name in the graph under construction, dtype and (concrete) shape."""

    __slots__ = ("name", "dtype", "shape")

    def __init__(self, name: str, dtype: str, shape):
        self.name = name
        self.dtype = dtype
        self.shape = list(shape)


def _ident(name: str) -> str:
    s = re.sub(r"[^A-Za-z0-9_]", "_", name)
    return s if s and not s[0].isdigit() else "v_" + s


class Translator:
    """Builds a kiln graph from an ATen fx graph, node by node, for concrete input shapes.

    `bind(node, tensor)` gives a placeholder either as a graph input (`tensor` a shape/dtype
    spec: (dtype, shape)) or as a constant parameter (`tensor` a torch.Tensor, shared)."""

    def __init__(self, name: str = "torch"):
        self.b = _kiln.GraphBuilder(_ident(name))
        self.env = {}
        self.counter = 0
        self.transposed = {}  # Value name -> the 2-D value it is the transpose of.
        self.seed = None  # The i64 scalar input that random ops draw from (random_seed()).
        self.random_ops = 0

    # ---- values -------------------------------------------------------------------------

    def _fresh(self, base: str) -> str:
        self.counter += 1
        return f"{_ident(base)}__{self.counter}"

    def _wrap(self, name: str) -> _Value:
        t = self.b.type(name)
        return _Value(name, t["dtype"], t["shape"])

    def input(self, name: str, dtype: torch.dtype, shape) -> _Value:
        if dtype not in TORCH_TO_KILN:
            raise UserError(f"input '{name}': dtype {dtype} is not supported by kiln")
        n = self.b.input(_ident(name), TORCH_TO_KILN[dtype], [int(d) for d in shape])
        return self._wrap(n)

    def constant(self, name: str, tensor: torch.Tensor) -> _Value:
        t = tensor.detach()
        if t.dtype not in TORCH_TO_KILN:
            raise Unsupported(f"a constant of dtype {t.dtype}")
        if not t.is_contiguous():
            t = t.contiguous()
        n = self.b.parameter(name, tensor, t, False)
        return self._wrap(n)

    def scalar(self, value, dtype: str) -> _Value:
        # NumPy has no bfloat16: such a constant is a torch tensor.
        arr = (torch.tensor(value, dtype=torch.bfloat16) if dtype == "bf16"
               else np.array(value, dtype=_NP[dtype]))
        name = self._fresh("const")
        n = self.b.parameter(name, arr, arr, False)
        return self._wrap(n)

    def array(self, arr: np.ndarray) -> _Value:
        arr = np.ascontiguousarray(arr)
        n = self.b.parameter(self._fresh("const"), arr, arr, False)
        return self._wrap(n)

    def random_seed(self) -> _Value:
        """The graph's last input, made at its first use: an i64 scalar the caller draws anew
        for every run (kiln.dynamo from torch's generator, so torch.manual_seed repeats it)."""
        if self.seed is None:
            self.seed = self._wrap(self.b.input("kiln_random_seed", "i64", []))
        return self.seed

    def op(self, op: str, inputs, attrs=None, name: str = "") -> _Value:
        outs = self.b.node(op, [v.name for v in inputs], attrs or {}, [], name)
        return self._wrap(outs[0])

    def window3d(self, kind: str, inputs, attrs):
        """A 3-D convolution or pooling, or its gradient, through the lowering onto kiln's 2-D
        ops that the ONNX importer uses (frontends/window3d.h; kinds in GraphBuilder.window3d).
        Returns the output, or for conv3d_backward the three gradients (None where not wanted)."""
        outs = [self._wrap(n) if n else None
                for n in self.b.window3d(kind, [v.name for v in inputs], attrs)]
        return outs if kind == "conv3d_backward" else outs[0]

    def cast(self, v: _Value, dtype: str) -> _Value:
        return v if v.dtype == dtype else self.op("cast", [v], {"to": dtype})

    # ---- the graph ----------------------------------------------------------------------

    def run(self, graph, bindings: dict):
        """Translates every node of `graph`; `bindings` maps each placeholder's name to a torch
        tensor (a constant) or (torch.dtype, shape) (an input). Returns the output values.
        Raises UserError listing every unsupported node."""
        unsupported = []
        failed = {}  # Node name -> why it did not translate.
        for node in graph.nodes:
            if node.op == "placeholder":
                bound = bindings[node.name]
                if isinstance(bound, (int, float, bool)):
                    self.env[node] = bound  # A SymInt's value, constant for this signature.
                elif isinstance(bound, torch.Tensor):
                    self.env[node] = self.constant(node.name, bound)
                else:
                    self.env[node] = self.input(node.name, *bound)
            elif node.op == "call_function":
                try:
                    self.env[node] = self.call(node)
                except (Unsupported, UserError) as e:
                    failed[node.name] = e.reason if isinstance(e, Unsupported) else str(e)
                    unsupported.append(f"{describe(node)}: {failed[node.name]}")
                    self.env[node] = None
                except _Missing:
                    self.env[node] = None  # An input was unsupported: reported there.
            elif node.op == "output":
                if unsupported:
                    err = UserError(
                        f"kiln cannot translate {len(unsupported)} node(s) of the PyTorch "
                        "graph:\n  " + "\n  ".join(unsupported))
                    err.failed = failed  # For kiln.dynamo, which leaves just these to PyTorch.
                    raise err
                outs = node.args[0]
                return [self.arg(o) for o in (outs if isinstance(outs, (list, tuple)) else [outs])]
            elif node.op == "get_attr":
                raise UserError(f"get_attr node '{node.name}' (lift constants first)")
        raise UserError("the graph has no output node")

    def arg(self, a):
        """An fx argument as a kiln value, Python number or list."""
        if isinstance(a, torch.fx.Node):
            v = self.env[a]
            if v is None:
                raise _Missing()
            return v
        if isinstance(a, (list, tuple)):
            return type(a)(self.arg(x) for x in a)
        return a

    def call(self, node):
        handler = handler_of(node.target)
        if handler is None:
            if node.target in SKIP:
                return None
            raise Unsupported("no kiln translation for this op")
        args = [self.arg(a) for a in node.args]
        kwargs = {k: self.arg(v) for k, v in node.kwargs.items()}
        self.node = node
        return handler(self, *args, **kwargs)

    def finish(self, outputs):
        for o in outputs:
            if not isinstance(o, _Value):
                raise UserError(f"a graph output is not a tensor ({type(o).__name__})")
        names = [o.name for o in outputs]
        # kiln outputs are values computed by nodes: an input or parameter returned as is
        # passes through an identity.
        return Model(self.b.finish(names))


class _Missing(Exception):
    pass


_FLOATS = ("f32", "f64", "f16", "bf16")


def _is_float(dtype: str) -> bool:
    return dtype in _FLOATS


# ---- handlers: one per ATen op (args as ATen's schema) ------------------------------------

HANDLERS = {}
SKIP = {
    aten._assert_tensor_metadata.default,
    aten._assert_scalar.default,
    torch.ops.aten.sym_constrain_range_for_size.default,
}


def handles(*targets):
    """Registers a translation for ATen overloads, or for another library's op by its name
    ("torchvision::roi_align"), so that kiln need not import that library."""
    def register(fn):
        for t in targets:
            HANDLERS[t] = fn
        return fn

    return register


def handler_of(target):
    """The translation of an fx call target, None where kiln has none."""
    h = HANDLERS.get(target)
    if h is None and isinstance(target, torch._ops.OpOverload) and target.namespace != "aten":
        h = HANDLERS.get(target.name())
    return h


def _out_dtype(t: Translator) -> str | None:
    val = t.node.meta.get("val")
    if isinstance(val, torch.Tensor):
        return TORCH_TO_KILN.get(val.dtype)
    return None


def _operands(t: Translator, a, b, dtype: str | None = None):
    """Both operands of a binary op as kiln values of one dtype (numbers become constants)."""
    if dtype is None:
        dtype = _out_dtype(t)
    if dtype is None:
        dtype = a.dtype if isinstance(a, _Value) else b.dtype
    a = t.scalar(a, dtype) if not isinstance(a, _Value) else t.cast(a, dtype)
    b = t.scalar(b, dtype) if not isinstance(b, _Value) else t.cast(b, dtype)
    return a, b


def _binary(kiln_op):
    def fn(t, a, b, alpha=1):
        if not isinstance(a, _Value) and not isinstance(b, _Value):
            raise Unsupported("both operands are numbers")
        a, b = _operands(t, a, b)
        if alpha != 1:
            b = t.op("mul", [b, t.scalar(alpha, b.dtype)])
        return t.op(kiln_op, [a, b])

    return fn


handles(aten.add.Tensor, aten.add.Scalar)(_binary("add"))
handles(aten.sub.Tensor, aten.sub.Scalar)(_binary("sub"))
handles(aten.mul.Tensor, aten.mul.Scalar)(_binary("mul"))
handles(aten.maximum.default)(_binary("maximum"))
handles(aten.minimum.default)(_binary("minimum"))
handles(aten.pow.Tensor_Tensor, aten.pow.Tensor_Scalar)(_binary("pow"))


@handles(aten.fmod.Scalar, aten.fmod.Tensor, aten.remainder.Scalar, aten.remainder.Tensor)
def _mod(t, a, b):
    """fmod: C's, the dividend's sign; remainder: Python's %, the divisor's, where a float's
    nonzero remainder moves by b and a zero one keeps fmod's sign (PyTorch's; kiln's fmod=0, as
    ONNX's, gives a zero the divisor's sign)."""
    if not isinstance(a, _Value) and not isinstance(b, _Value):
        raise Unsupported("both operands are numbers")
    a, b = _operands(t, a, b)
    if t.node.target in (aten.fmod.Scalar, aten.fmod.Tensor):
        return t.op("mod", [a, b], {"fmod": 1})
    if not _is_float(a.dtype):
        return t.op("mod", [a, b], {"fmod": 0})
    r = t.op("mod", [a, b], {"fmod": 1})
    return t.op("where", [_remainder_moves(t, r, b), t.op("add", [r, b]), r])


def _remainder_moves(t, r, b):
    """Where fmod's remainder r of a / b is not Python's: nonzero with a sign other than b's
    (Python's remainder is r + b there, and its floor quotient one less than the truncated)."""
    zero = t.scalar(0, r.dtype)
    return t.op("logical_and", [t.op("logical_not", [t.op("equal", [r, zero])]),
                                t.op("logical_xor", [t.op("less", [r, zero]),
                                                     t.op("less", [b, zero])])])


@handles(aten.rsub.Scalar, aten.rsub.Tensor)
def _rsub(t, a, b, alpha=1):
    return _binary("sub")(t, b, a, 1) if alpha == 1 else _binary("sub")(
        t, b, t.op("mul", [a, t.scalar(alpha, a.dtype)]))


@handles(aten.div.Tensor, aten.div.Scalar, aten.div.Tensor_mode)
def _div(t, a, b, rounding_mode=None):
    a, b = _operands(t, a, b)
    y = t.op("div", [a, b])
    if rounding_mode is None:
        return y
    if rounding_mode == "floor" and _is_float(y.dtype):
        return t.op("floor", [y])
    if rounding_mode == "trunc" and _is_float(y.dtype):
        return t.op("where", [t.op("less", [y, t.scalar(0, y.dtype)]), t.op("ceil", [y]),
                              t.op("floor", [y])])
    if y.dtype == "bool":
        raise Unsupported(f"division with rounding_mode={rounding_mode!r} on bool")
    if rounding_mode == "trunc":  # kiln's integer division truncates (a zero divisor: an error).
        return y
    if rounding_mode == "floor":  # Toward -inf: one less where the remainder's sign is not b's.
        r = t.op("mod", [a, b], {"fmod": 1})
        return t.op("sub", [y, t.cast(_remainder_moves(t, r, b), y.dtype)])
    raise Unsupported(f"division with rounding_mode={rounding_mode!r} on {y.dtype}")


def _compare(kiln_op):
    def fn(t, a, b):
        da = a.dtype if isinstance(a, _Value) else None
        db = b.dtype if isinstance(b, _Value) else None
        if da and db and da != db:
            common = TORCH_TO_KILN[torch.promote_types(KILN_TO_TORCH[da], KILN_TO_TORCH[db])]
        else:
            common = da or db
            other = b if da else a
            if not _is_float(common) and isinstance(other, float):
                common = "f32"
        a, b = _operands(t, a, b, common)
        return t.op(kiln_op, [a, b])

    return fn


for _ops, _k in [((aten.eq.Tensor, aten.eq.Scalar), "equal"), ((aten.lt.Tensor, aten.lt.Scalar), "less"),
                 ((aten.le.Tensor, aten.le.Scalar), "less_equal"),
                 ((aten.gt.Tensor, aten.gt.Scalar), "greater"),
                 ((aten.ge.Tensor, aten.ge.Scalar), "greater_equal")]:
    handles(*_ops)(_compare(_k))


@handles(aten.ne.Tensor, aten.ne.Scalar)
def _ne(t, a, b):
    return t.op("logical_not", [_compare("equal")(t, a, b)])


for _op, _k in [(aten.logical_and.default, "logical_and"), (aten.logical_or.default, "logical_or"),
                (aten.logical_xor.default, "logical_xor")]:
    handles(_op)(lambda t, a, b, _k=_k: t.op(_k, [t.cast(a, "bool"), t.cast(b, "bool")]))


@handles(aten.logical_not.default)
def _logical_not(t, a):
    return t.op("logical_not", [t.cast(a, "bool")])


def _bitwise(kiln_op):
    def fn(t, a, b=None):
        if b is None:
            return t.op("logical_not" if a.dtype == "bool" else kiln_op, [a])
        a, b = _operands(t, a, b)
        if a.dtype == "bool":
            return t.op(kiln_op.replace("bitwise", "logical"), [a, b])
        if _is_float(a.dtype):
            raise Unsupported(f"{kiln_op} of {a.dtype}")
        return t.op(kiln_op, [a, b])

    return fn


handles(aten.bitwise_and.Tensor, aten.bitwise_and.Scalar)(_bitwise("bitwise_and"))
handles(aten.bitwise_or.Tensor, aten.bitwise_or.Scalar)(_bitwise("bitwise_or"))
handles(aten.bitwise_xor.Tensor, aten.bitwise_xor.Scalar)(_bitwise("bitwise_xor"))
handles(aten.bitwise_not.default)(_bitwise("bitwise_not"))


def _unary(kiln_op):
    return lambda t, x: t.op(kiln_op, [x])


for _op, _k in [(aten.relu.default, "relu"), (aten.sigmoid.default, "sigmoid"),
                (aten.tanh.default, "tanh"), (aten.exp.default, "exp"), (aten.log.default, "log"),
                (aten.sqrt.default, "sqrt"), (aten.rsqrt.default, "rsqrt"),
                (aten.neg.default, "neg"), (aten.abs.default, "abs"), (aten.erf.default, "erf"),
                (aten.silu.default, "silu"), (aten.mish.default, "mish"),
                (aten.floor.default, "floor"), (aten.ceil.default, "ceil"),
                (aten.sin.default, "sin"), (aten.cos.default, "cos"),
                (aten.sign.default, "sign"), (aten.round.default, "round")]:
    handles(_op)(_unary(_k))


@handles(aten.gelu.default)
def _gelu(t, x, approximate="none"):
    return t.op("gelu", [x], {"approximate": approximate})


@handles(aten.leaky_relu.default)
def _leaky_relu(t, x, negative_slope=0.01):
    return t.op("leaky_relu", [x], {"alpha": float(negative_slope)})


@handles(aten.elu.default)
def _elu(t, x, alpha=1.0, scale=1.0, input_scale=1.0):
    if scale != 1.0 or input_scale != 1.0:
        raise Unsupported("elu with scale or input_scale other than 1")
    return t.op("elu", [x], {"alpha": float(alpha)})


@handles(aten.clamp.default, aten.clamp_min.default, aten.clamp_max.default,
         aten.hardtanh.default)
def _clamp(t, x, lo=None, hi=None):
    if t.node.target == aten.clamp_max.default:
        lo, hi = None, lo
    if t.node.target == aten.hardtanh.default:
        lo = -1.0 if lo is None else lo
        hi = 1.0 if hi is None else hi
    attrs = {}
    if lo is not None:
        attrs["min"] = float(lo)
    if hi is not None:
        attrs["max"] = float(hi)
    return t.op("clip", [x], attrs)


@handles(aten.hardsigmoid.default)
def _hardsigmoid(t, x):
    y = t.op("add", [t.op("div", [x, t.scalar(6.0, x.dtype)]), t.scalar(0.5, x.dtype)])
    return t.op("clip", [y], {"min": 0.0, "max": 1.0})


@handles(aten.hardswish.default)
def _hardswish(t, x):
    return t.op("mul", [x, _hardsigmoid(t, x)])


@handles(aten.view.dtype)
def _view_dtype(t, x, dtype):
    """x.view(dtype) of the same element size: its bits as that dtype (kiln's bitcast)."""
    if dtype not in TORCH_TO_KILN or dtype.itemsize != KILN_TO_TORCH[x.dtype].itemsize:
        raise Unsupported(f"view of {x.dtype} as {dtype} (kiln reinterprets same-size dtypes)")
    return t.op("bitcast", [x], {"to": TORCH_TO_KILN[dtype]})


@handles(aten.where.self)
def _where(t, c, a, b):
    a, b = _operands(t, a, b)
    return t.op("where", [t.cast(c, "bool"), a, b])


# ---- products and convolutions ------------------------------------------------------------


def _weight_of_transpose(t, v: _Value):
    """The [out, in] matrix W when `v` was made as W.t() (a permute [1, 0] of a 2-D value)."""
    return t.transposed.get(v.name)


@handles(aten.permute.default)
def _permute(t, x, dims):
    dims = [d % len(x.shape) for d in dims]
    y = t.op("transpose", [x], {"perm": dims})
    if dims == [1, 0]:
        t.transposed[y.name] = x
    return y


@handles(aten.t.default)
def _t(t, x):
    return _permute(t, x, [1, 0]) if len(x.shape) == 2 else x


@handles(aten.transpose.int)
def _transpose(t, x, d0, d1):
    perm = list(range(len(x.shape)))
    perm[d0], perm[d1] = perm[d1], perm[d0]
    return _permute(t, x, perm)


@handles(aten.addmm.default)
def _addmm(t, bias, a, b, beta=1, alpha=1):
    w = _weight_of_transpose(t, b)
    if w is not None and beta == 1 and alpha == 1 and len(bias.shape) == 1:
        return t.op("linear", [a, w, bias])  # torch.nn.Linear: x W^T + b, one library call.
    return t.op("gemm", [a, b, bias], {"alpha": float(alpha), "beta": float(beta)})


@handles(aten.mm.default)
def _mm(t, a, b):
    w = _weight_of_transpose(t, b)
    if w is not None:
        return t.op("linear", [a, w])
    return t.op("matmul", [a, b])


@handles(aten.bmm.default, aten.matmul.default)
def _bmm(t, a, b):
    return t.op("matmul", [a, b])


@handles(aten.linear.default)
def _linear(t, x, w, b=None):
    return t.op("linear", [x, w] + ([b] if b is not None else []))


def _conv_attrs(stride, padding, dilation, groups):
    return {"strides": [int(s) for s in stride],
            "pads": [int(padding[0]), int(padding[1]), int(padding[0]), int(padding[1])],
            "dilations": [int(d) for d in dilation], "group": int(groups)}


def _conv_dims(w, stride, padding, dilation, output_padding):
    """A convolution's parameters for kiln's 2-D ops: a 1-D one (weight [M,C/g,k]) runs over
    [N,C,1,L], a 1 (a 0 pad) before each of its parameters. Also whether it is 1-D."""
    if len(w.shape) not in (3, 4):
        raise Unsupported(f"a {len(w.shape) - 2}-D convolution (kiln has 1-D, 2-D and 3-D)")
    if len(w.shape) == 4:
        return stride, padding, dilation, output_padding, False
    return ([1] + list(stride), [0] + list(padding), [1] + list(dilation),
            [0] + list(output_padding), True)


def _with_dim2(t, v):
    """[N,C,L] as [N,C,1,L] (a 1-D convolution's operands)."""
    return _view(t, v, list(v.shape[:2]) + [1] + list(v.shape[2:]))


def _without_dim2(t, v):
    return None if v is None else _view(t, v, list(v.shape[:2]) + list(v.shape[3:]))


def _conv3d_attrs(stride, padding, dilation, groups):
    """A 3-D convolution's window for GraphBuilder.window3d (PyTorch's symmetric padding)."""
    return {"strides": [int(s) for s in stride], "pads": [int(p) for p in padding] * 2,
            "dilations": [int(d) for d in dilation], "group": int(groups)}


@handles(aten.convolution.default)
def _convolution(t, x, w, b, stride, padding, dilation, transposed, output_padding, groups):
    if len(w.shape) == 5:
        attrs = _conv3d_attrs(stride, padding, dilation, groups)
        if not transposed:
            return t.window3d("conv3d", [x, w] + ([b] if b is not None else []), attrs)
        attrs["output_padding"] = [int(p) for p in output_padding]
        y = t.window3d("conv_transpose3d", [x, w], attrs)
        return y if b is None else t.op("add", [y, _view(t, b, [b.shape[0], 1, 1, 1])])
    stride, padding, dilation, output_padding, one_d = _conv_dims(w, stride, padding, dilation,
                                                                  output_padding)
    if one_d:
        x, w = _with_dim2(t, x), _with_dim2(t, w)
    attrs = _conv_attrs(stride, padding, dilation, groups)
    if not transposed:
        y = t.op("conv2d", [x, w] + ([b] if b is not None else []), attrs)
    else:
        attrs["output_padding"] = [int(p) for p in output_padding]
        y = t.op("conv_transpose2d", [x, w], attrs)
        if b is not None:
            y = t.op("add", [y, _view(t, b, [b.shape[0], 1, 1])])
    return _without_dim2(t, y) if one_d else y


# ---- torchvision's detection ops -----------------------------------------------------

@handles("torchvision::deform_conv2d")
def _deform_conv2d(t, x, w, offset, mask, bias, stride_h, stride_w, pad_h, pad_w, dilation_h,
                   dilation_w, groups, offset_groups, use_mask):
    """torchvision.ops.deform_conv2d (DeformConv2d): the lowering ONNX DeformConv takes
    (frontends/sampling.h): bilinear columns at the offset taps, times the mask, then a matmul.
    torchvision passes a mask (empty without use_mask) and a bias (zeros) always."""
    attrs = {"strides": [stride_h, stride_w], "pads": [pad_h, pad_w, pad_h, pad_w],
             "dilations": [dilation_h, dilation_w], "group": groups,
             "offset_group": offset_groups}
    names = [x.name, w.name, offset.name, mask.name if use_mask else "", bias.name]
    return t._wrap(t.b.deform_conv2d(names, attrs))


@handles("torchvision::roi_align")
def _roi_align(t, x, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned):
    """torchvision.ops.roi_align (MultiScaleRoIAlign's pooling): kiln's roi_align, whose boxes
    and image indices are the rows (image, x1, y1, x2, y2) of rois split; a sampling_ratio <= 0
    (torchvision's default -1) is the adaptive grid, kiln's 0."""
    def column(lo, hi):
        return t.op("slice", [rois], {"starts": [lo], "ends": [hi], "axes": [1]})

    image = t.cast(t.op("squeeze", [column(0, 1)], {"axes": [1]}), "i64")
    return t.op("roi_align", [x, column(1, 5), image],
                {"output_height": pooled_height, "output_width": pooled_width,
                 "sampling_ratio": max(sampling_ratio, 0), "spatial_scale": float(spatial_scale),
                 "aligned": int(aligned)})


# ---- normalization, softmax, pooling, reductions ----------------------------------------

@handles(aten._native_batch_norm_legit_no_training.default)
def _batch_norm(t, x, w, b, mean, var, momentum, eps):
    c = x.shape[1]
    # An f16/bf16 x with f32 statistics (autocast): computed in f32, y in x's dtype.
    at = mean.dtype
    w = t.cast(w, at) if w is not None else _filled(t, [c], 1, at)
    b = t.cast(b, at) if b is not None else _filled(t, [c], 0, at)
    y = t.op("batch_norm", [t.cast(x, at), w, b, mean, t.cast(var, at)], {"epsilon": float(eps)})
    return (t.cast(y, x.dtype), None, None)


def _stat_acc(dtype: str) -> str:
    """The dtype normalization statistics are computed in: f64 for f64, else f32."""
    return "f64" if dtype == "f64" else "f32"


def _stat_dtype(t, i: int) -> str:
    """The dtype PyTorch gives output `i` of the node (f32 statistics of f16/bf16 inputs)."""
    val = t.node.meta.get("val")
    return TORCH_TO_KILN.get(val[i].dtype, "f32") if isinstance(val, (list, tuple)) else "f32"


@handles(aten._native_batch_norm_legit.no_stats)
def _batch_norm_no_stats(t, x, w, b, training, momentum, eps):
    """BatchNorm with batch statistics and no running ones (instance norm's, over x reshaped to
    [1, N*C, ...]): (y, batch mean, 1/sqrt(biased var + eps))."""
    if not training:
        raise Unsupported("BatchNorm without running statistics outside training")
    return _batch_norm_training(t, x, w, b, None, None, True, momentum, eps)[:3]


@handles(aten._native_batch_norm_legit_functional.default)
def _batch_norm_training(t, x, w, b, running_mean, running_var, training, momentum, eps):
    """Training BatchNorm: (y, batch mean, 1/sqrt(biased var + eps), the running mean and
    variance updated with the unbiased variance), as PyTorch computes them; kiln's
    batch_norm_stats and batch_norm_train. Without running statistics, those two are None."""
    if not training:
        raise Unsupported("BatchNorm with running statistics under autograd")
    c = x.shape[1]
    # Under autocast, x is f16/bf16 and the parameters and statistics f32: computed in f32, y
    # in x's dtype, as PyTorch's kernel does.
    dtype = x.dtype
    x = t.cast(x, running_mean.dtype if running_mean is not None else dtype)
    w = t.cast(w, x.dtype) if w is not None else _filled(t, [c], 1, x.dtype)
    b = t.cast(b, x.dtype) if b is not None else _filled(t, [c], 0, x.dtype)
    stats = t.op("batch_norm_stats", [x])
    row = lambda i: t.op("reshape", [t.op("slice", [stats], {"starts": [i], "ends": [i + 1],
                                                             "axes": [0]})], {"shape": [c]})
    mean, var = row(0), row(1)
    y = t.cast(t.op("batch_norm_train", [x, w, b, mean, var], {"epsilon": float(eps)}), dtype)
    acc = _stat_acc(x.dtype)
    invstd = t.op("rsqrt", [t.op("add", [t.cast(var, acc), t.scalar(float(eps), acc)])])
    n = math.prod(x.shape) // c

    def running(old, batch, scale):
        if old is None:
            return None
        keep = t.op("mul", [old, t.scalar(1.0 - momentum, old.dtype)])
        new = t.op("mul", [t.cast(batch, old.dtype), t.scalar(momentum * scale, old.dtype)])
        return t.op("add", [keep, new])

    return (y, t.cast(t.cast(mean, acc), _stat_dtype(t, 1)), t.cast(invstd, _stat_dtype(t, 2)),
            running(running_mean, mean, 1.0), running(running_var, var, n / max(n - 1, 1)))


@handles(aten.repeat.default)
def _repeat(t, x, repeats):
    """x tiled repeats[i] times along each dim (leading dims added): each dim d as [1, d]
    expanded to [r, d], then merged."""
    reps = [int(r) for r in repeats]
    if len(reps) < len(x.shape):
        raise Unsupported(f"repeat {reps} of fewer dims than {x.shape}")
    shape = [1] * (len(reps) - len(x.shape)) + list(x.shape)
    pairs = [v for d in shape for v in (1, d)]
    tiled = [v for r, d in zip(reps, shape) for v in (r, d)]
    return _view(t, _expand(t, _view(t, x, pairs), tiled), [r * d for r, d in zip(reps, shape)])


@handles(aten.native_group_norm.default)
def _group_norm(t, x, w, b, n, c, hw, groups, eps):
    """(y, mean, 1/sqrt(var + eps)) of group norm, the statistics [N, G]: each image's channels
    in G groups normalized as one row (kiln's layer_norm over [N, G, C/G * HxW]), then the
    per-channel affine parameters."""
    n, c, groups = int(n), int(c), int(groups)
    at = w.dtype if w is not None else x.dtype  # Autocast: f16/bf16 x, f32 parameters.
    rows = _view(t, t.cast(x, at), [n, groups, math.prod(x.shape) // (n * groups)])
    y = _view(t, t.op("layer_norm", [rows], {"axis": -1, "epsilon": float(eps)}), list(x.shape))
    per_channel = [c] + [1] * (len(x.shape) - 2)
    if w is not None:
        y = t.op("mul", [y, _view(t, t.cast(w, at), per_channel)])
    if b is not None:
        y = t.op("add", [y, _view(t, t.cast(b, at), per_channel)])
    acc = _stat_acc(x.dtype)
    rf = t.cast(rows, acc)
    mean = t.op("reduce_mean", [rf], {"axes": [2], "keepdims": 1})
    d = t.op("sub", [rf, mean])
    var = t.op("reduce_mean", [t.op("mul", [d, d])], {"axes": [2], "keepdims": 0})
    rstd = t.op("rsqrt", [t.op("add", [var, t.scalar(float(eps), acc)])])
    return (t.cast(y, x.dtype), t.cast(_view(t, mean, [n, groups]), _stat_dtype(t, 1)),
            t.cast(rstd, _stat_dtype(t, 2)))


@handles(aten.native_layer_norm.default)
def _layer_norm(t, x, shape, w, b, eps):
    """(y, mean, 1/sqrt(var + eps)) over the last len(shape) dims, the statistics shaped
    [..., 1, ...] (the backward reads them; kiln drops them when nothing does). Over several dims
    (nn.LayerNorm([C, H, W])) the normalization runs on x with those dims flattened into one."""
    if w is None and b is not None:
        raise Unsupported("layer norm with a bias but no weight")
    k = len(shape)
    full = list(x.shape)
    lead = full[:len(full) - k]
    if k != 1:
        n = math.prod(full[len(full) - k:])
        x = _view(t, x, lead + [n])
        w, b = (None if v is None else _view(t, v, [n]) for v in (w, b))
    # f16/bf16 x with f32 parameters (autocast): computed in f32, y in x's dtype, as PyTorch's.
    at = w.dtype if w is not None else x.dtype
    inputs = [t.cast(x, at)] + [t.cast(v, at) for v in (w, b) if v is not None]
    y = t.cast(t.op("layer_norm", inputs, {"axis": -1, "epsilon": float(eps)}), x.dtype)
    acc = _stat_acc(x.dtype)
    xf = t.cast(x, acc)
    mean = t.op("reduce_mean", [xf], {"axes": [len(x.shape) - 1], "keepdims": 1})
    d = t.op("sub", [xf, mean])
    var = t.op("reduce_mean", [t.op("mul", [d, d])], {"axes": [len(x.shape) - 1], "keepdims": 1})
    rstd = t.op("rsqrt", [t.op("add", [var, t.scalar(float(eps), acc)])])
    if k != 1:
        y = _view(t, y, full)
        mean, rstd = (_view(t, v, lead + [1] * k) for v in (mean, rstd))
    return (y, t.cast(mean, _stat_dtype(t, 1)), t.cast(rstd, _stat_dtype(t, 2)))


@handles(aten.native_dropout.default)
def _native_dropout(t, x, p, train):
    """(x * mask / (1 - p), mask), as PyTorch multiplies by the scale: kiln's dropout_train of
    ones, whose counter-based hash of (seed, the run's random seed, element) draws the mask; each
    dropout node has its own seed. Not PyTorch's random stream (as with Inductor), but drawn from
    it: torch.manual_seed repeats it."""
    if train is False or p == 0:  # None: training, as PyTorch reads it.
        return (x, _filled(t, x.shape, True, "bool"))
    if not 0 < p < 1:
        raise Unsupported(f"dropout with p={p}")
    scale, kept = _kept(t, x.shape, _random_attrs(t, float(p)), x.dtype)
    return (t.op("mul", [x, scale]), kept)


def _random_attrs(t, ratio: float) -> dict:
    """dropout_train's attributes for one more random node of the graph: its own seed."""
    t.random_ops += 1
    return {"ratio": ratio, "seed": t.random_ops}


def _kept(t, shape, attrs: dict, dtype: str = "f32"):
    """dropout_train with `attrs` of ones in `dtype` (1 / (1 - ratio) where kept, else 0) and
    its bool mask."""
    scale = t.op("dropout_train", [_filled(t, shape, 1, dtype), t.random_seed()], attrs)
    return scale, t.op("logical_not", [t.op("equal", [scale, t.scalar(0, dtype)])])


@handles(aten.bernoulli.p)
def _bernoulli(t, x, p=0.5, generator=None):
    """1 with probability p, else 0, shaped and typed like x: the mask kiln's dropout_train
    keeps of ones at ratio 1 - p (drawn as _native_dropout's are)."""
    if generator is not None:
        raise Unsupported("bernoulli with a generator of its own")
    if not 0 <= p <= 1:
        raise Unsupported(f"bernoulli with p={p}")
    if p == 0:
        return _filled(t, x.shape, 0, x.dtype)
    return t.cast(_kept(t, x.shape, _random_attrs(t, 1.0 - float(p)))[1], x.dtype)


def _last_two_swapped(t, x: _Value) -> _Value:
    r = len(x.shape)
    return t.op("transpose", [x], {"perm": list(range(r - 2)) + [r - 1, r - 2]})


def _attention_probs(t, q, k, is_causal, attn_mask, scale):
    """(softmax(scale q k^T + mask), the scores, scale) as PyTorch's attention computes them: a
    bool mask (and the causal one, the lower triangle) keeps where true, a float mask adds.
    Scores and probabilities are f32 for f16/bf16 inputs (the CPU kernel's accumulation)."""
    if q.shape[:-2] != k.shape[:-2]:
        raise Unsupported(f"attention with query {q.shape} and key {k.shape} batch dims")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    acc = _stat_acc(q.dtype)
    s = t.op("mul", [t.cast(t.op("matmul", [q, _last_two_swapped(t, k)]), acc),
                     t.scalar(scale, acc)])
    hidden = t.scalar(float("-inf"), acc)
    if is_causal:
        tril = np.tril(np.ones((q.shape[-2], k.shape[-2]), dtype=bool))
        s = t.op("where", [t.array(tril), s, hidden])
    if attn_mask is not None:
        s = (t.op("where", [attn_mask, s, hidden]) if attn_mask.dtype == "bool"
             else t.op("add", [s, t.cast(attn_mask, acc)]))
    return t.op("softmax", [s], {"axis": -1}), s, scale


@handles(aten._scaled_dot_product_flash_attention_for_cpu.default)
def _flash_attention_cpu(t, q, k, v, dropout_p=0.0, is_causal=False, attn_mask=None,
                         scale=None):
    """The CPU flash kernel that training keeps whole (kiln.dynamo): (softmax(scores) v, the
    scores' logsumexp [..., L], which PyTorch's backward would read)."""
    if dropout_p:
        raise Unsupported(f"attention with dropout_p={dropout_p}")
    probs, s, _ = _attention_probs(t, q, k, is_causal, attn_mask, scale)
    top = t.op("reduce_max", [s], {"axes": [len(s.shape) - 1], "keepdims": 1})
    total = t.op("reduce_sum", [t.op("exp", [t.op("sub", [s, top])])],
                 {"axes": [len(s.shape) - 1], "keepdims": 1})
    lse = t.op("add", [t.op("log", [total]), top])
    lse = t.op("squeeze", [lse], {"axes": [len(s.shape) - 1]})
    out = t.op("matmul", [t.cast(probs, v.dtype), v])
    return (out, t.cast(lse, _stat_dtype(t, 1)))


@handles(aten._scaled_dot_product_flash_attention_for_cpu_backward.default)
def _flash_attention_cpu_backward(t, grad, q, k, v, out, logsumexp, dropout_p, is_causal,
                                  attn_mask=None, scale=None):
    """(dq, dk, dv) with the probabilities computed again from q and k: dv = p^T g,
    ds = p (g v^T - rowsum(g out)), dq = scale ds k, dk = scale ds^T q (ds and the scaling in
    f32 for f16/bf16 inputs)."""
    if dropout_p:
        raise Unsupported(f"attention with dropout_p={dropout_p}")
    probs, _, scale = _attention_probs(t, q, k, is_causal, attn_mask, scale)
    acc = probs.dtype
    dv = t.op("matmul", [_last_two_swapped(t, t.cast(probs, grad.dtype)), grad])
    dp = t.cast(t.op("matmul", [grad, _last_two_swapped(t, v)]), acc)
    rows = t.op("reduce_sum", [t.op("mul", [t.cast(grad, acc), t.cast(out, acc)])],
                {"axes": [len(out.shape) - 1], "keepdims": 1})
    ds = t.cast(t.op("mul", [probs, t.op("sub", [dp, rows])]), q.dtype)

    def scaled(x):
        return t.cast(t.op("mul", [t.cast(x, acc), t.scalar(scale, acc)]), q.dtype)

    return (scaled(t.op("matmul", [ds, k])),
            scaled(t.op("matmul", [_last_two_swapped(t, ds), q])), dv)


@handles(aten._softmax.default)
def _softmax(t, x, dim, half_to_float=False):
    return t.op("softmax", [x], {"axis": int(dim)})


@handles(aten._log_softmax.default)
def _log_softmax(t, x, dim, half_to_float=False):
    return t.op("log_softmax", [x], {"axis": int(dim)})


def _dims(v, n, default=None):
    """A window parameter (an int, or a list of one or n) as n ints; `default` when absent."""
    if v is None or (isinstance(v, (list, tuple)) and len(v) == 0):
        return default
    if isinstance(v, int):
        return [v] * n
    return [int(v[0])] * n if len(v) == 1 else [int(d) for d in v[:n]]


def _pair(v, default=None):
    return _dims(v, 2, default)


def _triple(v, default=None):
    return _dims(v, 3, default)


@handles(aten.max_pool2d_with_indices.default, aten.max_pool2d.default)
def _max_pool(t, x, kernel, stride=None, padding=0, dilation=1, ceil_mode=False):
    k = _pair(kernel)
    p = _pair(padding, [0, 0])
    attrs = {"kernel": k, "strides": _pair(stride, k), "pads": p + p,
             "dilations": _pair(dilation, [1, 1]), "ceil_mode": int(bool(ceil_mode))}
    y = t.op("max_pool2d", [x], attrs)
    if t.node.target != aten.max_pool2d_with_indices.default:
        return y
    # The indices (each window's maximum's offset in its plane, as PyTorch's) where a node reads
    # them: a training forward returns them for PyTorch's backward.
    read = any(u.target is operator.getitem and u.args[1] == 1 for u in t.node.users)
    return (y, t.op("max_pool2d_indices", [x], attrs) if read else None)


@handles(aten.avg_pool2d.default)
def _avg_pool(t, x, kernel, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
              divisor_override=None):
    if divisor_override is not None:
        raise Unsupported("avg_pool2d with divisor_override")
    k = _pair(kernel)
    p = _pair(padding, [0, 0])
    return t.op("avg_pool2d", [x], {"kernel": k, "strides": _pair(stride, k), "pads": p + p,
                                    "ceil_mode": int(bool(ceil_mode)),
                                    "count_include_pad": int(bool(count_include_pad))})


def _max_pool3d_attrs(kernel, stride, padding, dilation, ceil_mode):
    k = _triple(kernel)
    p = _triple(padding, [0, 0, 0])
    return {"kernel": k, "strides": _triple(stride, k), "pads": p + p,
            "dilations": _triple(dilation, [1, 1, 1]), "ceil_mode": int(bool(ceil_mode))}


@handles(aten.max_pool3d_with_indices.default, aten.max_pool3d.default)
def _max_pool3d(t, x, kernel, stride=None, padding=0, dilation=1, ceil_mode=False):
    attrs = _max_pool3d_attrs(kernel, stride, padding, dilation, ceil_mode)
    y = t.window3d("max_pool3d", [x], attrs)
    if t.node.target == aten.max_pool3d.default:
        return y
    # The indices where a node reads them (a training forward returns them for the backward).
    read = any(u.target is operator.getitem and u.args[1] == 1 for u in t.node.users)
    return (y, t.window3d("max_pool3d_indices", [x], attrs) if read else None)


def _avg_pool3d_attrs(kernel, stride, padding, ceil_mode, count_include_pad, divisor_override):
    if divisor_override is not None:
        raise Unsupported("avg_pool3d with divisor_override")
    k = _triple(kernel)
    p = _triple(padding, [0, 0, 0])
    return {"kernel": k, "strides": _triple(stride, k), "pads": p + p,
            "ceil_mode": int(bool(ceil_mode)), "count_include_pad": int(bool(count_include_pad))}


@handles(aten.avg_pool3d.default)
def _avg_pool3d(t, x, kernel, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
                divisor_override=None):
    return t.window3d("avg_pool3d", [x], _avg_pool3d_attrs(kernel, stride, padding, ceil_mode,
                                                           count_include_pad, divisor_override))


def _adaptive_kernel3d(x, out):
    """The avg_pool3d kernel (= stride) of an adaptive pooling to `out`, whose windows must tile
    x."""
    dims = x.shape[2:]
    if any(n % o for n, o in zip(dims, out)):
        raise Unsupported(f"adaptive_avg_pool3d of {list(dims)} to {list(out)} with overlapping "
                          "windows (kiln has the ones that tile the input)")
    return [n // o for n, o in zip(dims, out)]


@handles(aten._adaptive_avg_pool3d.default, aten.adaptive_avg_pool3d.default)
def _adaptive_avg_pool3d(t, x, size):
    out = [int(d) for d in size]
    if out == [1, 1, 1]:
        return t.op("reduce_mean", [x], {"axes": [2, 3, 4], "keepdims": 1})
    k = _adaptive_kernel3d(x, out)
    return t.window3d("avg_pool3d", [x], {"kernel": k, "strides": k})


def _adaptive_matrix(n, out):
    """Adaptive average pooling along a dim of n to out as a matrix [out, n]: PyTorch's window i
    averages [floor(i n / out), ceil((i + 1) n / out)) (windows overlap where out does not divide
    n), so that pooling x [N,C,H,W] is rows @ x @ columns^T."""
    a = np.zeros((out, n), dtype=np.float64)
    for i in range(out):
        lo, hi = (i * n) // out, -(-(i + 1) * n // out)
        a[i, lo:hi] = 1.0 / (hi - lo)
    return a


def _float_constant(t, a, dtype):
    """A float64 NumPy array as a constant of the float dtype `dtype`."""
    return t.array(a) if dtype == "f64" else t.cast(t.array(a.astype(np.float32)), dtype)


def _adaptive_kernel(x, out_h, out_w):
    """The avg_pool2d kernel (= stride) of an adaptive pooling whose windows tile x, else None."""
    h, w = x.shape[2], x.shape[3]
    return None if h % out_h or w % out_w else [h // out_h, w // out_w]


@handles(aten._adaptive_avg_pool2d.default, aten.adaptive_avg_pool2d.default)
def _adaptive_avg_pool(t, x, size):
    oh, ow = int(size[0]), int(size[1])
    if [oh, ow] == [1, 1]:
        return t.op("reduce_mean", [x], {"axes": [2, 3], "keepdims": 1})
    k = _adaptive_kernel(x, oh, ow)
    if k is not None:
        return t.op("avg_pool2d", [x], {"kernel": k, "strides": k})
    # Overlapping windows (vgg's head on a small image, 4x4 -> 7x7).
    rows = _float_constant(t, _adaptive_matrix(x.shape[2], oh), x.dtype)
    cols_t = _float_constant(t, _adaptive_matrix(x.shape[3], ow).T, x.dtype)
    return t.op("matmul", [rows, t.op("matmul", [x, cols_t])])


def _reduce(kiln_op):
    def fn(t, x, dims=None, keepdim=False, dtype=None):
        axes = [] if dims is None else ([dims] if isinstance(dims, int) else list(dims))
        if not axes:
            axes = list(range(len(x.shape)))
        if dtype is not None:
            x = t.cast(x, TORCH_TO_KILN[dtype])
        return t.op(kiln_op, [x], {"axes": [a % max(len(x.shape), 1) for a in axes],
                                   "keepdims": int(bool(keepdim))})

    return fn


handles(aten.mean.dim, aten.mean.default)(_reduce("reduce_mean"))
handles(aten.sum.dim_IntList, aten.sum.default)(_reduce("reduce_sum"))
handles(aten.amax.default)(_reduce("reduce_max"))


@handles(aten.any.dim, aten.any.dims, aten.any.default)
def _any(t, x, dim=None, keepdim=False):
    f = t.cast(t.cast(x, "bool"), "f32")
    y = _reduce("reduce_max")(t, f, dim, keepdim)
    return t.cast(y, "bool")


@handles(aten.argmax.default)
def _argmax(t, x, dim=None, keepdim=False):
    if dim is None:
        raise Unsupported("argmax over all dims")
    return t.op("argmax", [x], {"axis": int(dim), "keepdims": int(bool(keepdim))})


# ---- backward ops (AOTAutograd's backward graphs) -----------------------------------------


@handles(aten.convolution_backward.default)
def _convolution_backward(t, grad, x, w, bias_sizes, stride, padding, dilation, transposed,
                          output_padding, groups, output_mask):
    if len(w.shape) == 5:
        attrs = _conv3d_attrs(stride, padding, dilation, groups)
        mask = [int(bool(m)) for m in output_mask]
        if not transposed:
            return tuple(t.window3d("conv3d_backward", [grad, x, w],
                                    dict(attrs, output_mask=mask)))
        # y = conv_transpose3d(x, w) is the input gradient of a 3-D convolution of y-shaped
        # inputs: dx = conv3d(dy, w); dw that convolution's weight gradient with x as its
        # output's gradient and dy as its input.
        gi = t.window3d("conv3d", [grad, w], attrs) if mask[0] else None
        gw = (t.window3d("conv3d_backward", [x, grad, w], dict(attrs, output_mask=[0, 1, 0]))[1]
              if mask[1] else None)
        gb = (t.op("reduce_sum", [grad], {"axes": [0, 2, 3, 4], "keepdims": 0})
              if mask[2] else None)
        return (gi, gw, gb)
    stride, padding, dilation, output_padding, one_d = _conv_dims(w, stride, padding, dilation,
                                                                  output_padding)
    if one_d:
        grad, x, w = _with_dim2(t, grad), _with_dim2(t, x), _with_dim2(t, w)
    attrs = _conv_attrs(stride, padding, dilation, groups)
    if transposed:  # y = conv2d_backward_data(x, w): dx = conv2d(dy, w), dw from (x, dy).
        gi = t.op("conv2d", [grad, w], attrs) if output_mask[0] else None
        gw = t.op("conv2d_backward_weight", [x, grad, w], attrs) if output_mask[1] else None
    else:
        gi = t.op("conv2d_backward_data", [grad, w, x], attrs) if output_mask[0] else None
        gw = t.op("conv2d_backward_weight", [grad, x, w], attrs) if output_mask[1] else None
    gb = (t.op("reduce_sum", [grad], {"axes": [0, 2, 3], "keepdims": 0})
          if output_mask[2] else None)
    if one_d:
        gi, gw = _without_dim2(t, gi), _without_dim2(t, gw)
    return (gi, gw, gb)


@handles(aten.max_pool2d_with_indices_backward.default)
def _max_pool_backward(t, grad, x, kernel, stride, padding, dilation, ceil_mode, indices):
    # kiln routes each window's gradient to its first maximum, the element `indices` records
    # (max_pool2d_indices, PyTorch's forward), read again from x instead of the indices, which
    # keeps its NHWC library kernel; with NaNs in a window, to its first NaN (the indices name the
    # last).
    k = _pair(kernel)
    p = _pair(padding, [0, 0])
    return t.op("max_pool2d_backward", [grad, x],
                {"kernel": k, "strides": _pair(stride, k), "pads": p + p,
                 "dilations": _pair(dilation, [1, 1]), "ceil_mode": int(bool(ceil_mode))})


@handles(aten.max_pool3d_with_indices_backward.default)
def _max_pool3d_backward(t, grad, x, kernel, stride, padding, dilation, ceil_mode, indices):
    # As the 2-D one: read again from x (each window's first maximum, where the indices point).
    return t.window3d("max_pool3d_backward", [grad, x],
                      _max_pool3d_attrs(kernel, stride, padding, dilation, ceil_mode))


@handles(aten.avg_pool3d_backward.default)
def _avg_pool3d_backward(t, grad, x, kernel, stride, padding, ceil_mode, count_include_pad,
                         divisor_override):
    return t.window3d("avg_pool3d_backward", [grad, x],
                      _avg_pool3d_attrs(kernel, stride, padding, ceil_mode, count_include_pad,
                                        divisor_override))


@handles(aten._adaptive_avg_pool3d_backward.default)
def _adaptive_avg_pool3d_backward(t, grad, x):
    k = _adaptive_kernel3d(x, grad.shape[2:])
    return t.window3d("avg_pool3d_backward", [grad, x], {"kernel": k, "strides": k})


@handles(aten._adaptive_avg_pool2d_backward.default)
def _adaptive_avg_pool_backward(t, grad, x):
    oh, ow = grad.shape[2], grad.shape[3]
    k = _adaptive_kernel(x, oh, ow)
    if k is not None:
        return t.op("avg_pool2d_backward", [grad, x], {"kernel": k, "strides": k})
    # The forward's rows^T @ grad @ columns.
    rows_t = _float_constant(t, _adaptive_matrix(x.shape[2], oh).T, grad.dtype)
    cols = _float_constant(t, _adaptive_matrix(x.shape[3], ow), grad.dtype)
    return t.op("matmul", [rows_t, t.op("matmul", [grad, cols])])


@handles(aten.avg_pool2d_backward.default)
def _avg_pool_backward(t, grad, x, kernel, stride, padding, ceil_mode, count_include_pad,
                       divisor_override):
    if divisor_override is not None:
        raise Unsupported("avg_pool2d with divisor_override")
    k = _pair(kernel)
    p = _pair(padding, [0, 0])
    return t.op("avg_pool2d_backward", [grad, x],
                {"kernel": k, "strides": _pair(stride, k), "pads": p + p,
                 "ceil_mode": int(bool(ceil_mode)),
                 "count_include_pad": int(bool(count_include_pad))})


@handles(aten.threshold_backward.default)
def _threshold_backward(t, grad, x, threshold):
    if threshold != 0:
        raise Unsupported(f"threshold_backward at {threshold} (kiln has ReLU's, at 0)")
    return t.op("relu_backward", [grad, x])


@handles(aten.gelu_backward.default)
def _gelu_backward(t, grad, x, approximate="none"):
    return t.op("gelu_backward", [grad, x], {"approximate": approximate})


@handles(aten._softmax_backward_data.default)
def _softmax_backward(t, grad, y, dim, input_dtype):
    # dx = y * (grad - sum(grad * y, dim))
    s = t.op("reduce_sum", [t.op("mul", [grad, y])], {"axes": [dim % len(y.shape)],
                                                      "keepdims": 1})
    return t.op("mul", [y, t.op("sub", [grad, s])])


@handles(aten._log_softmax_backward_data.default)
def _log_softmax_backward(t, grad, y, dim, input_dtype):
    # dx = grad - exp(y) * sum(grad, dim)
    s = t.op("reduce_sum", [grad], {"axes": [dim % len(y.shape)], "keepdims": 1})
    return t.op("sub", [grad, t.op("mul", [t.op("exp", [y]), s])])


# ---- movement ---------------------------------------------------------------------------


@handles(aten.view.default, aten._unsafe_view.default, aten.reshape.default)
def _view(t, x, shape):
    return t.op("reshape", [x], {"shape": [int(s) for s in shape]})


@handles(aten.expand.default)
def _expand(t, x, shape, implicit=False):
    shape = [int(s) for s in shape]
    off = len(shape) - len(x.shape)
    shape = [x.shape[i - off] if s == -1 else s for i, s in enumerate(shape)]
    if shape == x.shape:
        return x
    return t.op("expand", [x], {"shape": shape})


@handles(aten.clone.default, aten.alias.default, aten.detach.default, aten.lift_fresh_copy.default,
         aten.contiguous.default)
def _identity(t, x, memory_format=None):
    return x


@handles(aten._to_copy.default)
def _to_copy(t, x, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False,
             memory_format=None):
    if device is not None and torch.device(device).type != "cpu":
        raise Unsupported(f"a copy to {device}")
    return x if dtype is None else t.cast(x, TORCH_TO_KILN[dtype])


@handles(aten.cat.default)
def _cat(t, tensors, dim=0):
    tensors = [v for v in tensors if not (len(v.shape) == 1 and v.shape[0] == 0)]
    if len(tensors) == 1:
        return tensors[0]
    dtype = _out_dtype(t) or tensors[0].dtype
    return t.op("concat", [t.cast(v, dtype) for v in tensors], {"axis": int(dim)})


@handles(aten.unsqueeze.default)
def _unsqueeze(t, x, dim):
    return t.op("unsqueeze", [x], {"axes": [dim % (len(x.shape) + 1)]})


@handles(aten.squeeze.dims, aten.squeeze.dim, aten.squeeze.default)
def _squeeze(t, x, dims=None):
    if dims is None:
        dims = [i for i, s in enumerate(x.shape) if s == 1]
    elif isinstance(dims, int):
        dims = [dims]
    dims = [d % len(x.shape) for d in dims if x.shape[d % len(x.shape)] == 1]
    return t.op("squeeze", [x], {"axes": dims}) if dims else x


@handles(aten.slice.Tensor)
def _slice(t, x, dim=0, start=None, end=None, step=1):
    n = x.shape[dim]
    start = 0 if start is None else start
    end = n if end is None else min(end, n)
    if start == 0 and end >= n and step == 1:
        return x
    return t.op("slice", [x], {"starts": [int(start)], "ends": [int(end)],
                               "axes": [dim % len(x.shape)], "steps": [int(step)]})


@handles(aten.select.int)
def _select(t, x, dim, index):
    dim %= len(x.shape)
    index %= x.shape[dim]
    y = t.op("slice", [x], {"starts": [index], "ends": [index + 1], "axes": [dim]})
    return t.op("squeeze", [y], {"axes": [dim]})


@handles(aten.split_with_sizes.default, aten.split.Tensor)
def _split(t, x, sizes, dim=0):
    dim %= len(x.shape)
    if isinstance(sizes, int):
        n = x.shape[dim]
        sizes = [min(sizes, n - s) for s in range(0, n, sizes)]
    outs, start = [], 0
    for s in sizes:
        outs.append(_slice(t, x, dim, start, start + s, 1))
        start += s
    return tuple(outs)


@handles(aten.constant_pad_nd.default)
def _constant_pad(t, x, pad, value=0):
    """F.pad's constant mode: pads (last dim first) as concats of filled blocks, negative ones
    as slices."""
    r = len(x.shape)
    for i in range(len(pad) // 2):
        d = r - 1 - i
        lo, hi = int(pad[2 * i]), int(pad[2 * i + 1])
        x = _slice(t, x, d, max(-lo, 0), x.shape[d] - max(-hi, 0))
        parts = []
        for n in (lo, None, hi):
            if n is None:
                parts.append(x)
            elif n > 0:
                parts.append(_filled(t, x.shape[:d] + [n] + x.shape[d + 1:], value, x.dtype))
        if len(parts) > 1:
            x = t.op("concat", parts, {"axis": d})
    return x


def _strided_positions(size, stride, storage_offset):
    """The storage position of each element of a strided view, as an int64 array of `size`."""
    size, stride = [int(s) for s in size], [int(s) for s in stride]
    at = np.full(size, int(storage_offset or 0), dtype=np.int64)
    for d, (n, step) in enumerate(zip(size, stride)):
        at += (np.arange(n, dtype=np.int64) * step).reshape([-1 if e == d else 1
                                                             for e in range(len(size))])
    return at


@handles(aten.as_strided.default)
def _as_strided(t, x, size, stride, storage_offset=None):
    """A strided view of x's storage, where that is x's elements in order (x contiguous from
    its storage's start): the elements it picks, by a gather of constant positions (a reshape
    where they are all of them in order, as adaptive pooling's decomposition gives)."""
    src = t.node.args[0].meta.get("val") if isinstance(t.node.args[0], torch.fx.Node) else None
    if not (isinstance(src, torch.Tensor) and src.is_contiguous() and src.storage_offset() == 0):
        raise Unsupported("as_strided of a view (kiln has no storage to index)")
    size = [int(s) for s in size]
    at = _strided_positions(size, stride, storage_offset)
    total = math.prod(x.shape)
    if at.size and (at.min() < 0 or at.max() >= total):
        raise Unsupported("as_strided beyond the tensor's own elements")
    flat = _view(t, x, [total])
    if np.array_equal(at.ravel(), np.arange(at.size)):
        return _view(t, flat, size)
    return t.op("gather", [flat, t.array(at)], {"axis": 0})


@handles(aten.as_strided_scatter.default)
def _as_strided_scatter(t, x, src, size, stride, storage_offset=None):
    """x with the elements of as_strided(x, size, stride, offset) replaced by src's (x contiguous
    from its storage's start, as AOTAutograd's gradient of a view chain gives it: a zero tensor
    and the view's gradient): a reshape where they are all of x in order, else a scatter to
    their positions, which must not repeat (PyTorch leaves overlapping writes unordered)."""
    base = t.node.args[0].meta.get("val") if isinstance(t.node.args[0], torch.fx.Node) else None
    if not (isinstance(base, torch.Tensor) and base.is_contiguous() and
            base.storage_offset() == 0):
        raise Unsupported("as_strided_scatter into a view (kiln has no storage to index)")
    at = _strided_positions(size, stride, storage_offset)
    total = math.prod(x.shape)
    if at.size and (at.min() < 0 or at.max() >= total):
        raise Unsupported("as_strided_scatter beyond the tensor's own elements")
    src = t.cast(src, x.dtype)
    if np.array_equal(at.ravel(), np.arange(total)):
        return _view(t, src, list(x.shape))
    if np.unique(at).size != at.size:
        raise Unsupported("as_strided_scatter onto positions that repeat (writes in no order)")
    if at.size == 0:
        return x
    flat = t.op("scatter_elements", [_view(t, x, [total]), t.array(at.ravel()),
                                     _view(t, src, [at.size])], {"axis": 0})
    return _view(t, flat, list(x.shape))


@handles(aten.index_select.default)
def _index_select(t, x, dim, index):
    if not x.shape:
        raise Unsupported("index_select of a 0-d tensor")
    index = index if index.dtype in ("i64", "i32") else t.cast(index, "i64")
    if not index.shape:  # A 0-d index keeps the dim, of size 1.
        index = _view(t, index, [1])
    return t.op("gather", [x, index], {"axis": dim % len(x.shape)})


@handles(aten.slice_scatter.default)
def _slice_scatter(t, x, src, dim=0, start=None, end=None, step=1):
    """x with x[start:end:step] along dim replaced by src: concats for step 1, else an
    index_put."""
    dim %= len(x.shape)
    n = x.shape[dim]
    start = 0 if start is None else min(max(start + n if start < 0 else start, 0), n)
    end = n if end is None else min(max(end + n if end < 0 else end, 0), n)
    if end <= start:  # An empty slice: src is empty, x unchanged.
        return x
    src = t.cast(src, x.dtype)
    if step != 1:
        rows = t.array(np.arange(start, end, step, dtype=np.int64))
        return _index_put(t, x, [None] * dim + [rows], src)
    parts = (([_slice(t, x, dim, 0, start)] if start > 0 else []) + [src] +
             ([_slice(t, x, dim, end, n)] if end < n else []))
    return parts[0] if len(parts) == 1 else t.op("concat", parts, {"axis": dim})


@handles(aten.embedding.default)
def _embedding(t, weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    return t.op("gather", [weight, indices], {"axis": 0})


def _index_tensors(t, indices, what: str):
    """The dims and index tensors of an advanced index x[indices] (None: a whole dim)."""
    dims = [d for d, v in enumerate(indices) if v is not None]
    if not dims:
        raise Unsupported(f"{what} without an index tensor")
    if dims != list(range(dims[0], dims[0] + len(dims))):
        raise Unsupported(f"{what} by index tensors on dims that are not adjacent ({dims})")
    tensors = [indices[d] for d in dims]
    for v in tensors:
        if v.dtype in ("bool", "u8"):  # PyTorch reads a u8 index as a mask too.
            raise Unsupported(f"{what} by a boolean mask")
        if _is_float(v.dtype):
            raise Unsupported(f"{what} by {v.dtype} indices")
    return dims, [v if v.dtype in ("i64", "i32") else t.cast(v, "i64") for v in tensors]


@handles(aten.index.Tensor, aten._unsafe_index.Tensor)
def _index(t, x, indices):
    """x[indices]: a gather along the indexed dim; several index tensors (on adjacent dims, as
    upsampling's decomposition gives them) broadcast into one index of those dims flattened, each
    wrapped if negative, and an index out of range made one past the flattened dim so that the
    gather reports it."""
    dims, tensors = _index_tensors(t, indices, "index")
    if len(dims) == 1:
        return t.op("gather", [x, tensors[0]], {"axis": dims[0]})
    first, sizes = dims[0], [x.shape[d] for d in dims]
    total = math.prod(sizes)
    flat, ok = None, None
    for v, size in zip(tensors, sizes):
        v = t.cast(v, "i64")
        zero, n = t.scalar(0, "i64"), t.scalar(size, "i64")
        v = t.op("where", [t.op("less", [v, zero]), t.op("add", [v, n]), v])
        inside = t.op("logical_and", [t.op("logical_not", [t.op("less", [v, zero])]),
                                      t.op("less", [v, n])])
        ok = inside if ok is None else t.op("logical_and", [ok, inside])
        flat = v if flat is None else t.op("add", [t.op("mul", [flat, n]), v])
    flat = t.op("where", [ok, flat, t.scalar(total, "i64")])  # Broadcast: the indices' shape.
    merged = _view(t, x, list(x.shape[:first]) + [total] + list(x.shape[first + len(dims):]))
    return t.op("gather", [merged, flat], {"axis": first})


@handles(aten.index_put.default, aten._unsafe_index_put.default)
def _index_put(t, x, indices, values, accumulate=False):
    """x[indices] = values (or += with accumulate) as a scatter_nd over x with its indexed dims
    moved first: repeated indices add in index order, or the last one wins."""
    dims, tensors = _index_tensors(t, indices, "index_put")
    r, first, k = len(x.shape), dims[0], len(dims)
    batch = list(torch.broadcast_shapes(*[tuple(v.shape) for v in tensors]))
    cols = [t.op("unsqueeze", [_expand(t, t.cast(v, "i64"), batch)], {"axes": [len(batch)]})
            for v in tensors]
    where = cols[0] if k == 1 else t.op("concat", cols, {"axis": len(batch)})
    # The values broadcast to x[indices]'s shape, then its index dims first, as `where` has them.
    target = x.shape[:first] + batch + x.shape[first + k:]
    v = t.cast(values, x.dtype)
    lead = len(v.shape) - len(target)
    if lead > 0:
        if any(s != 1 for s in v.shape[:lead]):
            raise Unsupported(f"values {v.shape} for an index_put into {target}")
        v = _view(t, v, v.shape[lead:])
    v = _expand(t, v, target)
    if first > 0:
        nb = len(batch)
        v = t.op("transpose", [v], {"perm": list(range(first, first + nb)) + list(range(first)) +
                                    list(range(first + nb, len(target)))})
    perm = dims + [d for d in range(r) if d not in dims]
    moved = x if perm == list(range(r)) else t.op("transpose", [x], {"perm": perm})
    y = t.op("scatter_nd", [moved, where, v], {"reduction": "add" if accumulate else "none"})
    if moved is x:
        return y
    return t.op("transpose", [y], {"perm": [perm.index(d) for d in range(r)]})


@handles(aten.embedding_dense_backward.default)
def _embedding_dense_backward(t, grad, indices, num_weights, padding_idx, scale_grad_by_freq):
    """An embedding's weight gradient: each grad row added at its index, in index order (kiln's
    gather_backward), rows at padding_idx left out, in f32 for f16/bf16 grads as PyTorch does."""
    g = t.cast(grad, "f32") if grad.dtype in ("f16", "bf16") else grad
    idx = indices if indices.dtype in ("i64", "i32") else t.cast(indices, "i64")
    per_row = idx.shape + [1] * (len(g.shape) - len(idx.shape))  # idx broadcast against g.
    if scale_grad_by_freq:
        counts = t.op("gather_backward", [_filled(t, idx.shape + [1], 1, g.dtype), idx,
                                          _filled(t, [num_weights, 1], 0, g.dtype)], {"axis": 0})
        freq = t.op("gather", [counts, idx], {"axis": 0})
        g = t.op("div", [g, _view(t, freq, per_row)])
    if padding_idx >= 0:
        pad = t.op("equal", [idx, t.scalar(padding_idx, idx.dtype)])
        g = t.op("where", [_view(t, pad, per_row), t.scalar(0, g.dtype), g])
    zeros = _filled(t, [num_weights] + g.shape[len(idx.shape):], 0, g.dtype)
    return t.cast(t.op("gather_backward", [g, idx, zeros], {"axis": 0}), grad.dtype)


@handles(aten.flatten.using_ints)
def _flatten(t, x, start=0, end=-1):
    r = len(x.shape)
    start, end = start % r, end % r
    shape = x.shape[:start] + [math.prod(x.shape[start:end + 1])] + x.shape[end + 1:]
    return _view(t, x, shape)


# ---- constants made from shapes (concrete at translation) --------------------------------


def _np_dtype(dtype, default="f32"):
    k = TORCH_TO_KILN[dtype] if dtype is not None else default
    if k == "bf16":
        raise Unsupported("a bfloat16 constant")
    return _NP[k]


def _kiln_dtype(dtype: torch.dtype) -> str:
    if dtype not in TORCH_TO_KILN:
        raise Unsupported(f"a tensor of dtype {dtype}")
    return TORCH_TO_KILN[dtype]


def _filled(t, shape, value, dtype: str) -> _Value:
    """A tensor of one value: a scalar constant expanded (kiln folds it when small; a large one,
    an embedding gradient's zeros, stays an expand instead of a constant the size of the table)."""
    s = t.scalar(value, dtype)
    return _expand(t, s, [int(d) for d in shape])


@handles(aten.full.default)
def _full(t, size, value, dtype=None, layout=None, device=None, pin_memory=None):
    default = "f32" if isinstance(value, float) else ("bool" if isinstance(value, bool) else "i64")
    return _filled(t, size, value, _kiln_dtype(dtype) if dtype is not None else default)


@handles(aten.full_like.default)
def _full_like(t, x, value, dtype=None, layout=None, device=None, pin_memory=None,
               memory_format=None):
    return _filled(t, x.shape, value, _kiln_dtype(dtype) if dtype is not None else x.dtype)


@handles(aten.empty.memory_format, aten.empty_permuted.default, aten.new_empty_strided.default,
         aten.new_empty.default, aten.empty_like.default)
def _empty(t, *args, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None,
           **kw):
    """A tensor whose contents PyTorch leaves undefined (written by what follows, e.g.
    bernoulli_): zeros of its size and dtype."""
    like = args[0] if args and isinstance(args[0], _Value) else None
    size = like.shape if like is not None and len(args) == 1 else (args[1] if like else args[0])
    default = like.dtype if like is not None else "f32"
    return _filled(t, size, 0, _kiln_dtype(dtype) if dtype is not None else default)


@handles(aten.copy.default)
def _copy(t, dst, src, non_blocking=False):
    """The functional copy: src cast to dst's dtype and broadcast to its shape."""
    return _expand(t, t.cast(src, dst.dtype), dst.shape)


@handles(aten.scalar_tensor.default)
def _scalar_tensor(t, value, dtype=None, layout=None, device=None, pin_memory=None):
    return t.scalar(value, _kiln_dtype(dtype) if dtype is not None else "f32")


@handles(aten.arange.start_step, aten.arange.default, aten.arange.start)
def _arange(t, *args, dtype=None, layout=None, device=None, pin_memory=None):
    if len(args) == 1:
        start, end, step = 0, args[0], 1
    else:
        start, end, step = (list(args) + [1])[:3]
    ints = all(isinstance(v, int) for v in (start, end, step))
    default = "i64" if ints else "f32"
    return t.array(np.arange(start, end, step, dtype=_np_dtype(dtype, default)))


@handles(aten.sym_size.int)
def _sym_size(t, x, dim):
    return x.shape[dim]


for _op in (operator.mul, operator.add, operator.sub, operator.floordiv, operator.truediv,
            operator.mod, operator.neg):
    handles(_op)(lambda t, *a, _op=_op: _op(*a))


@handles(operator.getitem)
def _getitem(t, seq, i):
    v = seq[i]
    if v is None:
        raise Unsupported(f"output {i} of a multi-output op (kiln computes only the first)")
    return v


# ---- exported programs ------------------------------------------------------------------


def _export_decompositions():
    """torch.export's core ATen decompositions, and upsampling's (nearest and bilinear, kept
    whole by the core table) into the index and arithmetic ops kiln translates, as
    torch.compile's AOTAutograd gives them."""
    from torch._decomp import get_decompositions

    table = torch.export.default_decompositions()
    upsampling = get_decompositions([aten.upsample_nearest2d.vec, aten.upsample_bilinear2d.vec,
                                     aten.upsample_nearest2d.default,
                                     aten.upsample_bilinear2d.default])
    for op, fn in upsampling.items():
        table[op] = fn
    return table


def _check_dims(ep, user_nodes, args):
    """The call's inputs against the export's: static dims equal, symbolic dims in range and
    consistent. Errors name the input and dim."""
    sizes = {}
    for i, (node, a) in enumerate(zip(user_nodes, args)):
        val = node.meta["val"]
        if not isinstance(a, torch.Tensor):
            raise UserError(f"input {i} ('{node.name}'): expected a tensor, got {type(a).__name__}")
        if a.dtype != val.dtype:
            raise UserError(f"input {i} ('{node.name}'): expected dtype {val.dtype}, got {a.dtype}")
        if a.dim() != val.dim():
            raise UserError(f"input {i} ('{node.name}'): expected {val.dim()} dims, got "
                            f"{a.dim()} (shape {list(a.shape)})")
        for d, (want, got) in enumerate(zip(val.shape, a.shape)):
            if isinstance(want, int):
                if want != got:
                    raise UserError(
                        f"input {i} ('{node.name}') dim {d}: expected {want}, got {got} (this dim "
                        "was exported as static; give it a torch.export.Dim to vary it)")
                continue
            sym = want.node.expr
            rng = ep.range_constraints.get(sym)
            if rng is not None and not (int(rng.lower) <= got <= _upper(rng.upper)):
                raise UserError(f"input {i} ('{node.name}') dim {d} ({sym}): {got} is outside "
                                f"its range [{rng.lower}, {rng.upper}]")
            if sizes.setdefault(str(sym), got) != got:
                raise UserError(f"input {i} ('{node.name}') dim {d} ({sym}): {got}, but another "
                                f"input has {sym} = {sizes[str(sym)]}")


def _upper(v):
    """A range's upper bound as a number: infinity for a Dim without max (sympy's oo, torch's
    int_oo)."""
    if getattr(v, "is_finite", True) is False:
        return float("inf")
    try:
        return int(v)
    except Exception:  # noqa: BLE001 - any other symbolic bound: no bound to check.
        return float("inf")


class TorchModel:
    """A PyTorch module captured by kiln.from_torch: called like the module on tensors of the
    exported signature (symbolic dims may vary within their ranges). Compiles once per input
    shape; `.model(...)` and `.compiled(...)` give the kiln graph and compiled model."""

    def __init__(self, ep, compile_options):
        self.exported = ep
        self._options = compile_options
        self._compiled = {}
        sig = ep.graph_signature
        self._user = []
        self._bindings = {}
        consts = {**ep.state_dict, **ep.constants}
        for spec in sig.input_specs:
            name = spec.arg.name
            if spec.kind.name == "USER_INPUT":
                self._user.append(name)
            else:
                self._bindings[name] = consts[spec.target]
        nodes = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
        self._user_nodes = [nodes[n] for n in self._user]

    def model(self, *args) -> Model:
        """The kiln graph for inputs shaped like `args` (torch tensors)."""
        _check_dims(self.exported, self._user_nodes, args)
        t = Translator(type(self).__name__)
        bindings = dict(self._bindings)
        for name, a in zip(self._user, args):
            bindings[name] = (a.dtype, list(a.shape))
        outs = t.run(self.exported.graph, bindings)
        if t.seed is not None:
            raise UserError("the exported module draws random numbers (training-mode dropout): "
                            "export it in eval mode (module.eval())")
        return t.finish(outs)

    def compiled(self, *args) -> CompiledModel:
        key = tuple((a.dtype, tuple(a.shape)) for a in args)
        c = self._compiled.get(key)
        if c is None:
            from . import compile as _compile

            c = _compile(self.model(*args), **self._options)
            self._compiled[key] = c
        return c

    def __call__(self, *args):
        if len(args) != len(self._user):
            raise UserError(f"expected {len(self._user)} inputs, got {len(args)}")
        return self.compiled(*args)(*args)

    @property
    def compiles(self) -> int:
        return len(self._compiled)


def from_torch(module, example_inputs, dynamic_shapes=None, **compile_options) -> TorchModel:
    """Exports `module` with torch.export (strict=False), decomposes to core ATen, translates to
    kiln and compiles for `example_inputs`. compile_options go to kiln.compile (threads,
    autotune, precision, ...). Returns a TorchModel; unsupported ATen ops raise UserError, each
    named with its source line."""
    if not isinstance(example_inputs, tuple):
        example_inputs = tuple(example_inputs) if isinstance(example_inputs, list) else (example_inputs,)
    was_training = getattr(module, "training", False)
    if was_training:
        module.eval()
    try:
        ep = torch.export.export(module, example_inputs, dynamic_shapes=dynamic_shapes,
                                 strict=False)
        ep = ep.run_decompositions(_export_decompositions())
    except Exception as e:  # torch.export's own errors: say where they come from.
        raise UserError(f"torch.export could not capture {type(module).__name__}: {e}") from e
    finally:
        if was_training:
            module.train()
    tm = TorchModel(ep, compile_options)
    tm.compiled(*example_inputs)
    return tm
