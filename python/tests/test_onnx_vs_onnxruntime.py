"""ONNX ops that kiln composes from its own, through kiln (compiled and eager) against ONNX
Runtime on configurations beyond the conformance suite's: the recurrent layers (RNN, GRU, LSTM),
whose semantics kiln takes from ONNX Runtime where the specification is silent (clip,
sequence_lens, activation parameters, input_forget), PyTorch's nn.LSTM / nn.GRU exported by
torch.onnx, LpPool / GlobalLpPool and GridSample (every mode, padding and align_corners, 2-D
and 3-D, against ONNX Runtime and PyTorch's grid_sample), GatherND, ReverseSequence and
MaxUnpool; the opset-27 LinearAttention and CausalConvWithState against ONNX's reference
evaluator (ONNX Runtime has neither); Scan, Loop and If unrolled or inlined at import; the integer
and quantized products (MatMulInteger, ConvInteger, QLinearMatMul, QLinearConv,
DynamicQuantizeLinear), TensorScatter; STFT against torch.stft, MelWeightMatrix against ONNX's
reference; Resize's cubic, antialiased and crop-and-resize modes; and DFT against NumPy's FFT in f64 (ONNX Runtime's and
ONNX's reference compute in f32). Run by ctest ("python: pytest") in the peer venv."""

import numpy as np
import pytest

import kiln

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper  # noqa: E402

GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}

# (op, attributes, inputs given, sequence_lens) -- each config exercises a rule kiln's mapper
# implements: directions, layouts, lengths that cut sequences (0 included) in both directions,
# initial states, clip, peepholes, input_forget, linear_before_reset, activations with their
# alpha/beta.
CONFIGS = [
    ("RNN", {}, "xwr", None),
    ("RNN", {"direction": "bidirectional", "activations": ["Relu", "Tanh"]}, "xwrbh", None),
    ("RNN", {"direction": "reverse", "clip": 0.5}, "xwrbh", [3, 0, 1, 5]),
    ("RNN", {"activations": ["HardSigmoid"], "activation_alpha": [0.3],
             "activation_beta": [0.4], "layout": 1}, "xwrbh", [5, 2, 4, 1]),
    ("GRU", {}, "xwrb", None),
    ("GRU", {"linear_before_reset": 1}, "xwrbh", None),
    ("GRU", {"linear_before_reset": 1}, "xwrb", None),  # Rb_h reaches the first step.
    ("GRU", {"direction": "bidirectional", "linear_before_reset": 1}, "xwrbh", [5, 3, 0, 2]),
    ("GRU", {"direction": "reverse", "layout": 1, "clip": 0.7}, "xwrbh", [2, 5, 1, 4]),
    ("GRU", {"activations": ["LeakyRelu", "ScaledTanh"], "activation_alpha": [0.2, 0.9],
             "activation_beta": [1.5]}, "xwrb", None),
    ("LSTM", {}, "xwrb", None),
    ("LSTM", {"direction": "bidirectional"}, "xwrbhcp", [5, 1, 0, 3]),
    ("LSTM", {"direction": "reverse", "clip": 0.6}, "xwrbhcp", [4, 5, 2, 3]),
    ("LSTM", {"input_forget": 1, "layout": 1}, "xwrbhc", [1, 5, 3, 2]),
    ("LSTM", {"activations": ["Sigmoid", "Elu", "Softsign"], "activation_alpha": [0.5]},
     "xwrbp", None),
]


def recurrent_model(op, attrs, given, seq_lens, seed=0, T=5, B=4, I=3, H=6):
    """The node as a model, and its input values in the model's layout."""
    dirs = 2 if attrs.get("direction") == "bidirectional" else 1
    g = GATES[op]
    layout = attrs.get("layout", 0)
    rng = np.random.default_rng(seed)
    shapes = {
        "X": [T, B, I],
        "W": [dirs, g * H, I],
        "R": [dirs, g * H, H],
        "B": [dirs, 2 * g * H],
        "initial_h": [dirs, B, H],
        "initial_c": [dirs, B, H],
        "P": [dirs, 3 * H],
    }
    batch_first = {"X": (1, 0, 2), "initial_h": (1, 0, 2), "initial_c": (1, 0, 2)}
    order = ["X", "W", "R", "B", "sequence_lens", "initial_h", "initial_c", "P"]
    letter = {"X": "x", "W": "w", "R": "r", "B": "b", "initial_h": "h", "initial_c": "c",
              "P": "p"}
    if op != "LSTM":
        order = order[:6]
    names, inputs, feeds = [], [], {}
    for name in order:
        present = seq_lens is not None if name == "sequence_lens" else letter[name] in given
        if not present:
            names.append("")
            continue
        names.append(name)
        if name == "sequence_lens":
            inputs.append(helper.make_tensor_value_info(name, TensorProto.INT32, [B]))
            feeds[name] = np.array(seq_lens, np.int32)
            continue
        v = rng.uniform(-1, 1, shapes[name]).astype(np.float32)
        if layout == 1 and name in batch_first:
            v = np.ascontiguousarray(v.transpose(batch_first[name]))
        inputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, list(v.shape)))
        feeds[name] = v
    while names and names[-1] == "":
        names.pop()
    outs = ["Y", "Y_h"] + (["Y_c"] if op == "LSTM" else [])
    node = helper.make_node(op, names, outs, hidden_size=H, **attrs)
    ydims = [T, dirs, B, H] if layout == 0 else [B, T, dirs, H]
    sdims = [dirs, B, H] if layout == 0 else [B, dirs, H]
    outputs = [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ydims)]
    outputs += [helper.make_tensor_value_info(n, TensorProto.FLOAT, sdims) for n in outs[1:]]
    graph = helper.make_graph([node], "recurrent", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 22)])
    model.ir_version = 10
    onnx.checker.check_model(model)
    present = [n for n in names if n]
    return model, [feeds[n] for n in present], present


def onnxruntime_run(tmp_path, model, values, names):
    path = tmp_path / "peer.onnx"
    onnx.save(model, str(path))
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, dict(zip(names, values)))


def check_kiln(tmp_path, model, values, expected, atol):
    """kiln's outputs, compiled and eager, equal `expected`."""
    path = tmp_path / "kiln.onnx"
    onnx.save(model, str(path))
    m = kiln.load(str(path))
    for run in (kiln.compile(m), kiln.eager(m)):
        got = run(*values)
        got = got if isinstance(got, (list, tuple)) else [got]
        assert len(got) == len(expected)
        for g, e in zip(got, expected):
            np.testing.assert_allclose(g, e, rtol=1e-5, atol=atol(e))


def onnxruntime_outputs(tmp_path, op, attrs, given, seq_lens, seed):
    """ONNX Runtime's outputs for the node, in its layout. ONNX Runtime has no batch-first layout
    (it refuses layout=1): such a node is run time-major and its outputs transposed."""
    layout = attrs.get("layout", 0)
    major = {k: v for k, v in attrs.items() if k != "layout"}
    outs = onnxruntime_run(tmp_path, *recurrent_model(op, major, given, seq_lens, seed))
    if layout == 1:
        outs = [outs[0].transpose(2, 0, 1, 3)] + [o.transpose(1, 0, 2) for o in outs[1:]]
    return outs


@pytest.mark.parametrize("seed", range(len(CONFIGS)),
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(CONFIGS)])
def test_recurrent_matches_onnxruntime(tmp_path, seed):
    op, attrs, given, seq_lens = CONFIGS[seed]
    expected = onnxruntime_outputs(tmp_path, op, attrs, given, seq_lens, seed)
    model, values, _ = recurrent_model(op, attrs, given, seq_lens, seed)
    # f32 rounding of the states, scaled by their size (LeakyRelu gates grow them).
    check_kiln(tmp_path, model, values, expected, lambda e: 1e-6 * max(1, np.abs(e).max()))
    # The outputs hold something: a mapper that dropped a term would not pass by zeros.
    assert np.abs(expected[1]).max() > 0.05


def test_sequence_lens_out_of_range_is_an_error(tmp_path):
    model, _, _ = recurrent_model("LSTM", {}, "xwr", [1, 1, 1, 1])
    lens = helper.make_tensor("sequence_lens", TensorProto.INT32, [4], [1, 7, 2, 3])
    model.graph.initializer.append(lens)
    model.graph.input.remove(next(i for i in model.graph.input if i.name == "sequence_lens"))
    path = tmp_path / "bad.onnx"
    onnx.save(model, str(path))
    with pytest.raises(kiln.UserError, match=r"LSTM .*sequence_lens\[1\] is 7, outside 0\.\.5"):
        kiln.load(str(path))


torch = pytest.importorskip("torch")


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_torch_exported_recurrent_layer_matches_torch(tmp_path, kind):
    torch.manual_seed(0)
    layer = getattr(torch.nn, kind)(input_size=8, hidden_size=16, num_layers=2,
                                    bidirectional=True, batch_first=True).eval()
    x = torch.randn(3, 7, 8)
    path = tmp_path / f"{kind}.onnx"
    torch.onnx.export(layer, (x,), str(path), input_names=["x"], dynamo=True)
    with torch.no_grad():
        expected = layer(x)[0].numpy()
    got = kiln.compile(kiln.load(str(path)))(x.numpy())
    got = got[0] if isinstance(got, (list, tuple)) else got
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)


# (op, input shape, attributes): orders 1, 2 and 3, 1-D and 2-D, pads, strides, dilations,
# auto_pad, and ceil_mode keeping a last partial window.
LP_POOLS = [
    ("LpPool", [2, 3, 10, 9], {"kernel_shape": [3, 2], "p": 3, "strides": [2, 2], "ceil_mode": 1}),
    ("LpPool", [2, 3, 9, 8], {"kernel_shape": [2, 2], "p": 1, "pads": [1, 0, 0, 1]}),
    ("LpPool", [1, 2, 7, 7], {"kernel_shape": [2, 3], "dilations": [2, 1], "strides": [1, 2]}),
    ("LpPool", [1, 2, 7, 6], {"kernel_shape": [3, 3], "auto_pad": "SAME_LOWER", "strides": [2, 2]}),
    ("LpPool", [2, 4, 12], {"kernel_shape": [3], "p": 3, "strides": [2], "ceil_mode": 1}),
    ("GlobalLpPool", [2, 3, 5, 4], {"p": 3}),
    ("GlobalLpPool", [2, 3, 6], {}),
]


@pytest.mark.parametrize("case", range(len(LP_POOLS)), ids=[c[0] for c in LP_POOLS])
def test_lp_pool_matches_onnxruntime(tmp_path, case):
    op, shape, attrs = LP_POOLS[case]
    x = np.random.default_rng(case).uniform(-2, 2, shape).astype(np.float32)
    node = helper.make_node(op, ["x"], ["y"], **attrs)
    graph = helper.make_graph([node], "lp", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                          shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    # ONNX Runtime implements GlobalLpPool up to version 2.
    opset = 22 if op == "LpPool" else 18
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    expected = onnxruntime_run(tmp_path, model, [x], ["x"])
    check_kiln(tmp_path, model, [x], expected, lambda e: 1e-6 * np.abs(e).max())


# (opset, input shape, attributes, axis, dft_length): real and complex inputs, each axis, forward
# and inverse, onesided both ways (irfft of even and odd lengths), dft_length truncating and
# zero-padding.
DFTS = [
    (20, [2, 12, 5, 1], {}, 1, None),
    (20, [2, 12, 5, 2], {"inverse": 1}, -2, None),
    (20, [3, 7, 2], {"onesided": 1}, 1, None),
    (20, [2, 9, 6, 2], {"onesided": 1}, 2, 8),
    (20, [2, 4, 7, 2], {"inverse": 1, "onesided": 1}, 2, None),
    (20, [2, 4, 7, 2], {"inverse": 1, "onesided": 1}, 2, 13),
    (20, [2, 6, 2], {}, 1, 10),
    (17, [2, 5, 8, 2], {"axis": 2}, None, None),
    (17, [2, 5, 8, 1], {"axis": 1, "inverse": 1}, None, 4),
]


def numpy_dft(x, axis, n, inverse, onesided):
    sig = x[..., 0].astype(np.float64)
    if x.shape[-1] == 2:
        sig = sig + 1j * x[..., 1].astype(np.float64)
    if inverse and onesided:
        return np.fft.irfft(sig, n=n, axis=axis)[..., np.newaxis]
    y = (np.fft.ifft if inverse else np.fft.fft)(sig, n=n, axis=axis)
    if onesided:
        y = np.take(y, range(y.shape[axis] // 2 + 1), axis=axis)
    return np.stack([y.real, y.imag], -1)


@pytest.mark.parametrize("case", range(len(DFTS)))
def test_dft_matches_numpy(tmp_path, case):
    opset, shape, attrs, axis, length = DFTS[case]
    x = np.random.default_rng(case).uniform(-1, 1, shape).astype(np.float32)
    inputs, values = [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)], [x]
    init = []
    if length is not None:
        init.append(helper.make_tensor("len", TensorProto.INT64, [], [length]))
    if axis is not None:
        init.append(helper.make_tensor("axis", TensorProto.INT64, [], [axis]))
    node_inputs = ["x", "len" if length is not None else ""] + (["axis"] if axis is not None else [])
    node = helper.make_node("DFT", node_inputs, ["y"], **attrs)
    graph = helper.make_graph([node], "dft", inputs,
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], init)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    a = (axis if axis is not None else attrs.get("axis", 1)) % len(shape)
    inverse, onesided = attrs.get("inverse", 0), attrs.get("onesided", 0)
    n = length if length is not None else (2 * (shape[a] - 1) if inverse and onesided else shape[a])
    expected = [numpy_dft(x, a, n, inverse, onesided).astype(np.float32)]
    # kiln computes in f64 and rounds once: within f32 rounding of the largest coefficient.
    check_kiln(tmp_path, model, values, expected, lambda e: 2e-7 * np.abs(e).max())


GRID_SAMPLES = [(mode, padding, align, dims)
                for dims in (2, 3)
                for mode in ("linear", "nearest", "cubic")
                for padding in ("zeros", "border", "reflection")
                for align in (0, 1)
                if not (dims == 3 and mode == "cubic")]


@pytest.mark.parametrize("case", range(len(GRID_SAMPLES)),
                         ids=["-".join(map(str, c)) for c in GRID_SAMPLES])
def test_grid_sample_matches_onnxruntime_and_torch(tmp_path, case):
    mode, padding, align, dims = GRID_SAMPLES[case]
    rng = np.random.default_rng(case)
    xshape = [2, 3, 5, 6] if dims == 2 else [2, 3, 4, 5, 3]
    gshape = [2, 4, 7, 2] if dims == 2 else [2, 3, 4, 2, 3]
    x = rng.uniform(-1, 1, xshape).astype(np.float32)
    # Beyond [-1, 1] too: every padding rule is exercised, reflection more than once.
    grid = rng.uniform(-2.5, 2.5, gshape).astype(np.float32)
    node = helper.make_node("GridSample", ["x", "grid"], ["y"], mode=mode, padding_mode=padding,
                            align_corners=align)
    graph = helper.make_graph(
        [node], "gs", [helper.make_tensor_value_info("x", TensorProto.FLOAT, xshape),
                       helper.make_tensor_value_info("grid", TensorProto.FLOAT, gshape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    model.ir_version = 10
    torch = pytest.importorskip("torch")
    expected = torch.nn.functional.grid_sample(
        torch.from_numpy(x), torch.from_numpy(grid),
        mode={"linear": "bilinear", "cubic": "bicubic"}.get(mode, mode), padding_mode=padding,
        align_corners=bool(align)).numpy()
    if dims == 2:  # ONNX Runtime's CPU kernel is 2-D.
        peer = onnxruntime_run(tmp_path, model, [x, grid], ["x", "grid"])[0]
        np.testing.assert_allclose(peer, expected, rtol=1e-5, atol=1e-5)
    check_kiln(tmp_path, model, [x, grid], [expected], lambda e: 1e-5)


def single_node_model(op, inputs, attrs, opset, initializers=()):
    """A model of one node: `inputs` as (name, numpy value) graph inputs, output y of the first
    input's type."""
    node = helper.make_node(op, [n for n, _ in inputs] + [i.name for i in initializers], ["y"],
                            **attrs)
    graph = helper.make_graph(
        [node], op, [helper.make_tensor_value_info(
            n, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape) for n, v in inputs],
        [helper.make_tensor_value_info("y", helper.np_dtype_to_tensor_dtype(inputs[0][1].dtype),
                                       None)], list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    return model


INDEXING = [
    # GatherND: negative indices, whole slices, batch_dims 1 and 2.
    ("GatherND", lambda r: [("data", r.uniform(-1, 1, (4, 5, 3)).astype(np.float32)),
                            ("indices", np.array([[[1, -2]], [[-4, 4]], [[3, 0]]]))], {}),
    ("GatherND", lambda r: [("data", r.uniform(-1, 1, (4, 5, 3)).astype(np.float32)),
                            ("indices", np.array([[2], [-1], [0]]))], {}),
    ("GatherND", lambda r: [("data", r.integers(-9, 9, (2, 3, 4, 5)).astype(np.int64)),
                            ("indices", np.array([[[1, 3], [0, -1]], [[2, 2], [1, 0]]]))],
     {"batch_dims": 1}),
    ("GatherND", lambda r: [("data", r.uniform(-1, 1, (2, 3, 4, 5)).astype(np.float32)),
                            ("indices", r.integers(-4, 4, (2, 3, 6, 1)))], {"batch_dims": 2}),
    # ReverseSequence: both axis orders, lengths 0, 1 and the whole sequence.
    ("ReverseSequence", lambda r: [("x", r.uniform(-1, 1, (5, 4, 3)).astype(np.float32)),
                                   ("sequence_lens", np.array([5, 0, 1, 3]))],
     {"time_axis": 0, "batch_axis": 1}),
    ("ReverseSequence", lambda r: [("x", r.uniform(-1, 1, (4, 6)).astype(np.float32)),
                                   ("sequence_lens", np.array([2, 6, 1, 4]))],
     {"time_axis": 1, "batch_axis": 0}),
]


@pytest.mark.parametrize("case", range(len(INDEXING)), ids=[c[0] for c in INDEXING])
def test_indexing_matches_onnxruntime(tmp_path, case):
    op, make, attrs = INDEXING[case]
    inputs = make(np.random.default_rng(case))
    model = single_node_model(op, inputs, attrs, 13 if op == "GatherND" else 22)
    values = [v for _, v in inputs]
    expected = onnxruntime_run(tmp_path, model, values, [n for n, _ in inputs])
    check_kiln(tmp_path, model, values, expected, lambda e: 0)


def test_gather_nd_index_out_of_range_is_an_error(tmp_path):
    data = np.zeros((4, 5), np.float32)
    model = single_node_model("GatherND", [("data", data), ("indices", np.array([[1, 5]]))], {},
                              13)
    path = tmp_path / "bad.onnx"
    onnx.save(model, str(path))
    with pytest.raises(kiln.UserError, match=r"index 5 .*out of range for dim 0 of size 5"):
        kiln.compile(kiln.load(str(path)))(data, np.array([[1, 5]]))


@pytest.mark.parametrize("output_shape", [None, [2, 3, 7, 9]])
def test_max_unpool_inverts_onnxruntime_max_pool(tmp_path, output_shape):
    x = np.random.default_rng(0).uniform(-1, 1, (2, 3, 6, 8)).astype(np.float32)
    pool = single_node_model("MaxPool", [("x", x)], {"kernel_shape": [2, 2], "strides": [2, 2]},
                             22)
    pool.graph.node[0].output.append("i")
    pool.graph.output.append(helper.make_tensor_value_info("i", TensorProto.INT64, None))
    pooled, indices = onnxruntime_run(tmp_path, pool, [x], ["x"])
    inits = ()
    if output_shape:
        inits = (helper.make_tensor("output_shape", TensorProto.INT64, [4], output_shape),)
    model = single_node_model("MaxUnpool", [("xT", pooled), ("xI", indices)],
                              {"kernel_shape": [2, 2], "strides": [2, 2]}, 22, inits)
    # With output_shape larger than the unpooled shape, ONNX (its reference and the conformance
    # case test_maxunpool_export_with_output_shape) scatters into the unpooled shape and pads;
    # ONNX Runtime reads the indices in output_shape's layout and fails that case. kiln is
    # ONNX's, checked against ONNX's reference there and against ONNX Runtime otherwise.
    from onnx.reference import ReferenceEvaluator
    expected = ReferenceEvaluator(model).run(None, {"xT": pooled, "xI": indices})
    if not output_shape:
        peer = onnxruntime_run(tmp_path, model, [pooled, indices], ["xT", "xI"])
        np.testing.assert_array_equal(peer[0], expected[0])
    assert np.count_nonzero(expected[0]) == pooled.size
    check_kiln(tmp_path, model, [pooled, indices], expected, lambda e: 0)


@pytest.mark.parametrize("rule", ["linear", "gated", "delta", "gated_delta"])
def test_linear_attention_matches_onnx_reference(tmp_path, rule):
    from onnx.reference import ReferenceEvaluator
    rng = np.random.default_rng(len(rule))
    b, t, hq, hkv, dk, dv = 2, 6, 4, 2, 3, 5
    inputs = [("query", rng.uniform(-1, 1, (b, t, hq * dk))),
              ("key", rng.uniform(-1, 1, (b, t, hkv * dk)) / 2),
              ("value", rng.uniform(-1, 1, (b, t, hkv * dv))),
              ("past_state", rng.uniform(-1, 1, (b, hkv, dk, dv)))]
    if rule in ("gated", "gated_delta"):  # Per key dim for one rule, per head for the other.
        inputs.append(("decay", -rng.uniform(0, 0.5, (b, t, hkv * dk if rule == "gated" else hkv))))
    if rule in ("delta", "gated_delta"):
        inputs.append(("beta", rng.uniform(0, 1, (b, t, hkv))))
    inputs = [(n, v.astype(np.float32)) for n, v in inputs]
    names = [n for n, _ in inputs]
    if rule == "delta":  # beta is input 5: leave decay (4) out by name.
        names.insert(4, "")
    node = helper.make_node("LinearAttention", names, ["y", "state"], update_rule=rule,
                            q_num_heads=hq, kv_num_heads=hkv)
    graph = helper.make_graph(
        [node], "la", [helper.make_tensor_value_info(n, TensorProto.FLOAT, v.shape)
                       for n, v in inputs],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("state", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 27)])
    model.ir_version = 10
    values = [v for _, v in inputs]
    expected = ReferenceEvaluator(model).run(None, dict(inputs))
    check_kiln(tmp_path, model, values, expected, lambda e: 1e-6 * np.abs(e).max())


@pytest.mark.parametrize("past,bias,activation", [(True, True, "silu"), (False, False, "none"),
                                                  (True, False, "swish")])
def test_causal_conv_with_state_matches_onnx_reference(tmp_path, past, bias, activation):
    from onnx.reference import ReferenceEvaluator
    rng = np.random.default_rng(int(past) + 2 * int(bias))
    b, c, length, k = 2, 3, 7, 4
    inputs = [("x", rng.uniform(-1, 1, (b, c, length))), ("w", rng.uniform(-1, 1, (c, 1, k)))]
    names = ["x", "w"]
    if bias:
        inputs.append(("bias", rng.uniform(-1, 1, (c,))))
    names.append("bias" if bias else "")
    if past:
        inputs.append(("past", rng.uniform(-1, 1, (b, c, k - 1))))
        names.append("past")
    inputs = [(n, v.astype(np.float32)) for n, v in inputs]
    while names[-1] == "":
        names.pop()
    node = helper.make_node("CausalConvWithState", names, ["y", "state"], activation=activation)
    graph = helper.make_graph(
        [node], "cc", [helper.make_tensor_value_info(n, TensorProto.FLOAT, v.shape)
                       for n, v in inputs],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("state", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 27)])
    model.ir_version = 10
    expected = ReferenceEvaluator(model).run(None, dict(inputs))
    check_kiln(tmp_path, model, [v for _, v in inputs], expected, lambda e: 1e-6)


def _vi(name, shape, t=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, t, shape)


def test_scan_with_axes_directions_and_an_outer_value_matches_onnxruntime(tmp_path):
    # State s (running sum) and a scan output per step; the scan input runs along axis 1 in
    # reverse, the scan output is stacked along axis 1 in reverse; the body reads `w` from the
    # outer graph and holds an If whose condition is known (a constant) reading the body's value.
    then_g = helper.make_graph([helper.make_node("Mul", ["t", "w"], ["r"])], "then", [],
                               [_vi("r", [3])])
    else_g = helper.make_graph([helper.make_node("Neg", ["t"], ["r2"])], "else", [],
                               [_vi("r2", [3])])
    body = helper.make_graph(
        [helper.make_node("Add", ["s_in", "x_t"], ["s_out"]),
         helper.make_node("Tanh", ["s_out"], ["t"]),
         helper.make_node("Constant", [], ["c"], value=helper.make_tensor("c", TensorProto.BOOL,
                                                                          [], [True])),
         helper.make_node("If", ["c"], ["y_t"], then_branch=then_g, else_branch=else_g)],
        "body", [_vi("s_in", [3]), _vi("x_t", [3])], [_vi("s_out", [3]), _vi("y_t", [3])])
    node = helper.make_node("Scan", ["s0", "x"], ["s_final", "ys"], body=body, num_scan_inputs=1,
                            scan_input_axes=[1], scan_input_directions=[1],
                            scan_output_axes=[1], scan_output_directions=[1])
    graph = helper.make_graph([node], "scan", [_vi("s0", [3]), _vi("x", [3, 5]), _vi("w", [3])],
                              [_vi("s_final", [3]), _vi("ys", [3, 5])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    rng = np.random.default_rng(0)
    values = [rng.uniform(-1, 1, s).astype(np.float32) for s in ([3], [3, 5], [3])]
    expected = onnxruntime_run(tmp_path, model, values, ["s0", "x", "w"])
    check_kiln(tmp_path, model, values, expected, lambda e: 1e-6)


def test_loop_stopped_by_its_condition_matches_onnxruntime(tmp_path):
    # Up to 10 iterations; the body's condition (iteration < 3, known at import) stops it
    # after 4; a loop-carried value and a scan output of each iteration.
    body = helper.make_graph(
        [helper.make_node("Constant", [], ["three"],
                          value=helper.make_tensor("three", TensorProto.INT64, [], [3])),
         helper.make_node("Less", ["i", "three"], ["cond_out"]),
         helper.make_node("Cast", ["i"], ["fi"], to=TensorProto.FLOAT),
         helper.make_node("Mul", ["v_in", "fi"], ["scaled"]),
         helper.make_node("Add", ["v_in", "scaled"], ["v_out"]),
         helper.make_node("Identity", ["v_out"], ["scan"])],
        "body", [_vi("i", [], TensorProto.INT64), _vi("cond_in", [], TensorProto.BOOL),
                 _vi("v_in", [2])],
        [_vi("cond_out", [], TensorProto.BOOL), _vi("v_out", [2]), _vi("scan", [2])])
    trip = helper.make_tensor("trip", TensorProto.INT64, [], [10])
    cond = helper.make_tensor("cond", TensorProto.BOOL, [], [True])
    node = helper.make_node("Loop", ["trip", "cond", "v0"], ["v", "scans"], body=body)
    graph = helper.make_graph([node], "loop", [_vi("v0", [2])], [_vi("v", [2]), _vi("scans", None)],
                              [trip, cond])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    v0 = np.array([0.5, -1.25], np.float32)
    expected = onnxruntime_run(tmp_path, model, [v0], ["v0"])
    assert expected[1].shape == (4, 2)
    check_kiln(tmp_path, model, [v0], expected, lambda e: 1e-6)


def test_if_and_loop_on_computed_values_run_in_stages(tmp_path):
    # y = If(sum(x) > 0, then: concat(x, x), else: -x); z = Loop(int(max(x)) trips) { v * 1.5 }
    # from x, with a scan output of each iteration's value.
    then = helper.make_graph([helper.make_node("Concat", ["x", "x"], ["t"], axis=0)], "then", [],
                             [_vi("t", None)])
    other = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [], [_vi("e", None)])
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Mul", ["v_in", "k"], ["v_out"]),
         helper.make_node("Identity", ["v_out"], ["scan"])],
        "body", [_vi("i", [], TensorProto.INT64), _vi("cond_in", [], TensorProto.BOOL),
                 _vi("v_in", [3])],
        [_vi("cond_out", [], TensorProto.BOOL), _vi("v_out", [3]), _vi("scan", [3])])
    nodes = [
        helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
        helper.make_node("Greater", ["s", "zero"], ["c"]),
        helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other),
        helper.make_node("ReduceMax", ["x"], ["most"], keepdims=0),
        helper.make_node("Cast", ["most"], ["trips"], to=TensorProto.INT64),
        helper.make_node("Loop", ["trips", "", "x"], ["z", "steps"], body=body),
    ]
    inits = [helper.make_tensor("zero", TensorProto.FLOAT, [], [0.0]),
             helper.make_tensor("k", TensorProto.FLOAT, [], [1.5])]
    graph = helper.make_graph(nodes, "control", [_vi("x", [3])],
                              [_vi("y", None), _vi("z", [3]), _vi("steps", None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    path = tmp_path / "control.onnx"
    onnx.save(model, str(path))
    m = kiln.load(str(path))
    assert isinstance(m, kiln.StagedModel)
    runs = (kiln.compile(m), kiln.eager(m))
    # The last: no iteration, an empty scan output of the shape the body declares, [0, 3].
    for x in ([1.0, 2.5, -0.5], [-3.0, 1.0, 0.5], [4.0, 3.0, 2.0], [1.0, 2.5, -0.5],
              [-1.0, -2.0, -3.0]):
        x = np.array(x, np.float32)
        expected = onnxruntime_run(tmp_path, model, [x], ["x"])
        for run in runs:
            got = run(x)
            assert [g.shape for g in got] == [e.shape for e in expected]
            for g, e in zip(got, expected):
                np.testing.assert_allclose(g, e, rtol=1e-6)
    assert "then If (opset 21) node" in runs[0].explain("stages")


def test_torchvision_detection_model_runs_in_stages_as_onnxruntime(tmp_path):
    # Faster R-CNN as torch.onnx.export writes it (opset 17): NonZero after the RPN's score
    # filter, NonMaxSuppression inside an If (`boxes.numel() == 0`) whose branch kiln splices,
    # RoiAlign, TopK. Random weights, the score layers scaled so that scores spread.
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    m = torchvision.models.detection.fasterrcnn_mobilenet_v3_large_320_fpn(
        weights=None, weights_backbone=None, num_classes=5, box_score_thresh=0.0).eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in m.parameters():
            fan = p[0].numel() if p.dim() > 1 else 1
            p.copy_(torch.randn(p.shape, generator=g) * (0.3 if p.dim() > 1 else 0.1) / fan ** 0.5)
    x = torch.rand(3, 320, 320, generator=g)
    path = tmp_path / "frcnn.onnx"
    torch.onnx.export(m, ([x],), str(path), opset_version=17, dynamo=False,
                      input_names=["image"], output_names=["boxes", "labels", "scores"])
    expected = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(
        None, {"image": x.numpy()})
    model = kiln.load(str(path))
    assert isinstance(model, kiln.StagedModel)
    run = kiln.compile(model)
    boxes, labels, scores = run(x.numpy())
    assert boxes.shape == expected[0].shape and labels.shape == expected[1].shape
    # Scores come sorted: equal to ONNX Runtime's whatever the order of near-equal ones (their
    # boxes' order differs between ONNX Runtime and PyTorch too).
    np.testing.assert_allclose(scores, expected[2], rtol=0, atol=1e-5)
    assert np.all((boxes >= 0) & (boxes <= 320)) and np.all((labels >= 1) & (labels < 5))
    log = run.explain("stages")
    assert "branch of" in log and "NonMaxSuppression" in log


@pytest.mark.parametrize("size,align", [([2, 3, 4, 5], 0), ([2, 3, 4, 5], 1), ([1, 2, 3, 1, 4], 0),
                                        ([1, 2, 3, 4, 2], 1)])
def test_affine_grid_matches_torch(tmp_path, size, align):
    torch = pytest.importorskip("torch")
    spatial = len(size) - 2
    theta = np.random.default_rng(len(size) + align).uniform(
        -1, 1, (size[0], spatial, spatial + 1)).astype(np.float32)
    init = helper.make_tensor("size", TensorProto.INT64, [len(size)], size)
    node = helper.make_node("AffineGrid", ["theta", "size"], ["grid"], align_corners=align)
    graph = helper.make_graph([node], "ag", [_vi("theta", list(theta.shape))], [_vi("grid", None)],
                              [init])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    model.ir_version = 10
    expected = torch.nn.functional.affine_grid(torch.from_numpy(theta), size,
                                               align_corners=bool(align)).numpy()
    check_kiln(tmp_path, model, [theta], [expected], lambda e: 1e-6)


def _quantized(rng, shape, dtype):
    lo, hi = (-128, 128) if dtype == np.int8 else (0, 256)
    return rng.integers(lo, hi, shape).astype(dtype)


QUANTIZED = ["qlinearmatmul-u8", "qlinearmatmul-i8-per-column", "qlinearconv-per-channel",
             "matmulinteger-per-column", "convinteger", "dynamicquantize"]


@pytest.mark.parametrize("case", QUANTIZED)
def test_quantized_ops_match_onnxruntime(tmp_path, case):
    rng = np.random.default_rng(QUANTIZED.index(case))
    f = lambda *v: np.array(v, np.float32)  # noqa: E731
    if case.startswith("qlinearmatmul"):
        dt = np.uint8 if "u8" in case else np.int8
        per = "per-column" in case
        a, b = _quantized(rng, (2, 3, 16), dt), _quantized(rng, (16, 5), dt)
        bs = rng.uniform(0.01, 0.05, 5).astype(np.float32) if per else f(0.02)
        bz = _quantized(rng, (5,), dt) if per else np.array(3, dt)
        inputs = [("a", a), ("a_scale", f(0.03)), ("a_zero_point", np.array(7, dt)), ("b", b),
                  ("b_scale", bs), ("b_zero_point", bz), ("y_scale", f(0.9)),
                  ("y_zero_point", np.array(2, dt))]
        op, attrs = "QLinearMatMul", {}
    elif case == "qlinearconv-per-channel":
        # 7-bit weights: ONNX Runtime's u8 x s8 kernels on AVX2 without VNNI add pairs of
        # products in int16 with saturation (vpmaddubsw), which |x w| <= 255 * 64 cannot reach
        # (full-range weights differ by tens of quanta there); kiln's sums are exact.
        x = _quantized(rng, (1, 4, 7, 6), np.uint8)
        w = (_quantized(rng, (6, 2, 3, 3), np.int8) // 2).astype(np.int8)
        inputs = [("x", x), ("x_scale", f(0.05)), ("x_zero_point", np.array(9, np.uint8)),
                  ("w", w), ("w_scale", rng.uniform(0.005, 0.02, 6).astype(np.float32)),
                  ("w_zero_point", np.zeros(6, np.int8)), ("y_scale", f(0.4)),
                  ("y_zero_point", np.array(120, np.uint8)),
                  ("B", rng.integers(-500, 500, 6).astype(np.int32))]
        op, attrs = "QLinearConv", {"group": 2, "pads": [1, 0, 1, 1], "strides": [2, 1]}
    elif case == "matmulinteger-per-column":
        a, b = _quantized(rng, (4, 9), np.uint8), _quantized(rng, (9, 3), np.uint8)
        inputs = [("A", a), ("B", b), ("a_zero_point", np.array(12, np.uint8)),
                  ("b_zero_point", _quantized(rng, (3,), np.uint8))]
        op, attrs = "MatMulInteger", {}
    elif case == "convinteger":
        inputs = [("x", _quantized(rng, (2, 3, 6, 5), np.uint8)),
                  ("w", _quantized(rng, (4, 3, 2, 2), np.uint8)),
                  ("x_zero_point", np.array(100, np.uint8))]
        op, attrs = "ConvInteger", {"pads": [1, 1, 0, 0], "dilations": [2, 1]}
    else:
        inputs = [("x", rng.uniform(-3, 5, (3, 7)).astype(np.float32))]
        op, attrs = "DynamicQuantizeLinear", {}
    model = single_node_model(op, inputs, attrs, 21 if op == "QLinearMatMul" else 13)
    if op == "DynamicQuantizeLinear":
        del model.graph.output[:]
        model.graph.node[0].output[:] = ["y", "scale", "zp"]
        model.graph.output.extend([_vi("y", None, TensorProto.UINT8), _vi("scale", None),
                                   _vi("zp", None, TensorProto.UINT8)])
    elif op in ("MatMulInteger", "ConvInteger"):
        model.graph.output[0].type.tensor_type.elem_type = TensorProto.INT32
    values = [v for _, v in inputs]
    expected = onnxruntime_run(tmp_path, model, values, [n for n, _ in inputs])
    check_kiln(tmp_path, model, values, expected, lambda e: 0)


@pytest.mark.parametrize("fmt", ["dynamic", "qdq"])
def test_onnxruntime_quantized_cnn_matches_onnxruntime(tmp_path, fmt):
    # A small CNN quantized by ONNX Runtime's own tools: dynamic (DynamicQuantizeLinear,
    # ConvInteger, MatMulInteger) and QDQ (QuantizeLinear / DequantizeLinear around Conv and
    # Gemm, which kiln compiles with its integer casts reading plain memory).
    torch = pytest.importorskip("torch")
    quant = pytest.importorskip("onnxruntime.quantization")
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(),
                              torch.nn.Flatten(), torch.nn.Linear(8 * 8 * 8, 32), torch.nn.ReLU(),
                              torch.nn.Linear(32, 10)).eval()
    x = np.random.default_rng(1).standard_normal((2, 3, 8, 8)).astype(np.float32)
    fp32, q = str(tmp_path / "fp32.onnx"), str(tmp_path / f"{fmt}.onnx")
    torch.onnx.export(net, (torch.from_numpy(x),), fp32, input_names=["x"], dynamo=False,
                      opset_version=17)
    if fmt == "dynamic":
        quant.quantize_dynamic(fp32, q, weight_type=quant.QuantType.QUInt8)
    else:
        class Reader(quant.CalibrationDataReader):
            def __init__(self):
                rng = np.random.default_rng(2)
                self.batches = iter([{"x": rng.standard_normal((2, 3, 8, 8)).astype(np.float32)}
                                     for _ in range(4)])

            def get_next(self):
                return next(self.batches, None)
        # 7-bit weights (reduce_range), as ONNX Runtime advises for machines without VNNI: its
        # u8 x s8 kernels there saturate pairs of products in int16 (above).
        quant.quantize_static(fp32, q, Reader(), quant_format=quant.QuantFormat.QDQ,
                              reduce_range=True)
    expected = ort.InferenceSession(q, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    m = kiln.load(q)
    for run in (kiln.compile(m), kiln.eager(m)):
        np.testing.assert_allclose(run(x), expected[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("symmetric", [True, False])
def test_onnxruntime_int4_weight_only_mlp_matches_onnxruntime(tmp_path, symmetric):
    # ONNX Runtime's 4-bit weight-only quantizer in its QDQ form (the standard ops, as LLM
    # exports ship): blockwise int4 / uint4 DequantizeLinear (packed two to a byte) feeding each
    # MatMul. Compared with ONNX Runtime running the graph as written (no fusion): its
    # MatMulNBits fusion computes the products another way (8.6e-3 of 4.5 apart on bert_layer).
    torch = pytest.importorskip("torch")
    nbits = pytest.importorskip("onnxruntime.quantization.matmul_nbits_quantizer")
    quant = pytest.importorskip("onnxruntime.quantization")
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(64, 96, bias=False), torch.nn.GELU(),
                              torch.nn.Linear(96, 32)).eval()
    x = np.random.default_rng(3).standard_normal((4, 64)).astype(np.float32)
    fp32, q = str(tmp_path / "fp32.onnx"), str(tmp_path / "q4.onnx")
    torch.onnx.export(net, (torch.from_numpy(x),), fp32, input_names=["x"], dynamo=False,
                      opset_version=21)
    cfg = nbits.DefaultWeightOnlyQuantConfig(block_size=32, is_symmetric=symmetric,
                                             quant_format=quant.QuantFormat.QDQ)
    quantizer = nbits.MatMulNBitsQuantizer(onnx.load(fp32), algo_config=cfg)
    quantizer.process()
    onnx.save(quantizer.model.model, q)
    types = {t.data_type for t in onnx.load(q).graph.initializer}
    assert (TensorProto.INT4 if symmetric else TensorProto.UINT4) in types
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    expected = ort.InferenceSession(q, so, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    m = kiln.load(q)
    for run in (kiln.compile(m), kiln.eager(m)):
        np.testing.assert_allclose(run(x), expected[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("window,onesided", [(True, 1), (False, 0)])
def test_stft_matches_torch(tmp_path, window, onesided):
    torch = pytest.importorskip("torch")
    x = np.random.default_rng(int(window)).standard_normal((2, 100)).astype(np.float32)
    n_fft, hop = 16, 5
    w = torch.hann_window(n_fft).numpy() if window else np.ones(n_fft, np.float32)
    inits = [helper.make_tensor("step", TensorProto.INT64, [], [hop])]
    names = ["signal", "step"]
    if window:
        inits.append(helper.make_tensor("window", TensorProto.FLOAT, [n_fft], w))
        names.append("window")
    else:
        inits.append(helper.make_tensor("length", TensorProto.INT64, [], [n_fft]))
        names += ["", "length"]
    node = helper.make_node("STFT", names, ["y"], onesided=onesided)
    graph = helper.make_graph([node], "stft", [_vi("signal", [2, 100, 1])], [_vi("y", None)],
                              inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    spec = torch.stft(torch.from_numpy(x), n_fft, hop_length=hop, window=torch.from_numpy(w),
                      center=False, onesided=bool(onesided), return_complex=True)
    expected = torch.view_as_real(spec).permute(0, 2, 1, 3).numpy()  # [B, frames, bins, 2]
    check_kiln(tmp_path, model, [x[..., None]], [expected], lambda e: 1e-6 * np.abs(e).max())


def test_tensor_scatter_matches_onnx_reference(tmp_path):
    from onnx.reference import ReferenceEvaluator
    rng = np.random.default_rng(0)
    for mode, starts in (("linear", [0, 3, 5]), ("circular", [6, 7, 2])):
        cache = rng.standard_normal((3, 2, 8, 4)).astype(np.float32)
        update = rng.standard_normal((3, 2, 3, 4)).astype(np.float32)
        idx = np.array(starts, np.int64)
        node = helper.make_node("TensorScatter", ["cache", "update", "idx"], ["y"], mode=mode)
        graph = helper.make_graph([node], "ts", [_vi("cache", cache.shape), _vi("update", update.shape),
                                                 _vi("idx", [3], TensorProto.INT64)],
                                  [_vi("y", cache.shape)])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 24)])
        model.ir_version = 10
        expected = ReferenceEvaluator(model).run(None, {"cache": cache, "update": update,
                                                        "idx": idx})
        check_kiln(tmp_path, model, [cache, update, idx], expected, lambda e: 0)


@pytest.mark.parametrize("edge_type", [TensorProto.FLOAT, TensorProto.DOUBLE])
def test_mel_weight_matrix_matches_onnx_reference(tmp_path, edge_type):
    from onnx.reference import ReferenceEvaluator
    i64 = lambda n, v: helper.make_tensor(n, TensorProto.INT64, [], [v])  # noqa: E731
    inits = [i64("bins", 10), i64("dft", 64), i64("rate", 16000),
             helper.make_tensor("lo", edge_type, [], [30.0]),
             helper.make_tensor("hi", edge_type, [], [7600.0])]
    node = helper.make_node("MelWeightMatrix", ["bins", "dft", "rate", "lo", "hi"], ["w"])
    graph = helper.make_graph([node], "mel", [], [_vi("w", None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    expected = ReferenceEvaluator(model).run(None, {})
    assert np.count_nonzero(expected[0]) > 10
    check_kiln(tmp_path, model, [], expected, lambda e: 1e-7)


RESIZES = [
    ({"mode": "cubic"}, [1, 2, 5, 7], [1, 1, 1.6, 2.3], None),
    ({"mode": "cubic", "cubic_coeff_a": -0.5, "exclude_outside": 1}, [1, 2, 8, 9], [1, 1, 0.6, 0.5],
     None),
    ({"mode": "cubic", "coordinate_transformation_mode": "align_corners"}, [2, 1, 6, 5],
     [1, 1, 1.5, 2.0], None),
    ({"mode": "linear", "antialias": 1}, [1, 3, 12, 10], [1, 1, 0.4, 0.7], None),
    ({"mode": "cubic", "antialias": 1}, [1, 2, 11, 9], [1, 1, 0.55, 0.3], None),
    ({"mode": "linear", "coordinate_transformation_mode": "half_pixel_symmetric"}, [1, 1, 7, 6],
     [1, 1, 1.7, 0.6], None),
    ({"mode": "linear", "coordinate_transformation_mode": "tf_crop_and_resize",
      "extrapolation_value": 9.0}, [1, 2, 6, 7], [1, 1, 1.5, 1.3], [0, 0, -0.2, 0.3, 1, 1, 0.9, 1.4]),
    ({"mode": "nearest", "coordinate_transformation_mode": "tf_crop_and_resize"}, [1, 1, 5, 5],
     [1, 1, 2.0, 1.4], [0, 0, 0.1, 0.2, 1, 1, 0.8, 0.9]),
]


@pytest.mark.parametrize("case", range(len(RESIZES)))
def test_resize_modes_match_onnxruntime(tmp_path, case):
    attrs, shape, scales, roi = RESIZES[case]
    x = np.random.default_rng(case).uniform(-1, 1, shape).astype(np.float32)
    inits = [helper.make_tensor("roi", TensorProto.FLOAT, [len(roi)], roi) if roi else None,
             helper.make_tensor("scales", TensorProto.FLOAT, [4], scales)]
    names = ["x", "roi" if roi else "", "scales"]
    node = helper.make_node("Resize", names, ["y"], **attrs)
    graph = helper.make_graph([node], "resize", [_vi("x", shape)], [_vi("y", None)],
                              [i for i in inits if i is not None])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    model.ir_version = 10
    expected = onnxruntime_run(tmp_path, model, [x], ["x"])
    if roi and max(roi) > 1 or min(roi or [0]) < 0:
        # A region reaching past the image: ONNX Runtime's output differs there from ONNX's
        # reference (whose formula, output length scale * input unrounded, kiln and the
        # conformance cases follow).
        from onnx.reference import ReferenceEvaluator
        expected = ReferenceEvaluator(model).run(None, {"x": x})
    check_kiln(tmp_path, model, [x], expected, lambda e: 2e-6)


LEGACY_RESIZES = [
    # (op, opset, mode, scales): YOLOv3-era exports' 2x nearest, fractional and shrinking scales,
    # and linear (asymmetric: x_in = x_out / scale).
    ("Upsample", 9, "nearest", [1, 1, 2, 2]),
    ("Upsample", 9, "nearest", [1, 1, 1.5, 2.5]),
    ("Upsample", 7, "nearest", [1, 1, 2, 3]),
    ("Upsample", 9, "linear", [1, 1, 2, 1.5]),
    ("Resize", 10, "nearest", [1, 1, 0.5, 0.6]),
    ("Resize", 10, "linear", [1, 1, 1.75, 0.5]),
]


@pytest.mark.parametrize("case", range(len(LEGACY_RESIZES)),
                         ids=[f"{c[0]}{c[1]}-{c[2]}-{c[3][2]}x{c[3][3]}" for c in LEGACY_RESIZES])
def test_upsample_and_resize10_match_onnxruntime(tmp_path, case):
    op, opset, mode, scales = LEGACY_RESIZES[case]
    x = np.random.default_rng(case).uniform(-1, 1, (1, 2, 5, 6)).astype(np.float32)
    if opset == 7:
        node = helper.make_node(op, ["x"], ["y"], mode=mode, scales=[float(s) for s in scales])
        inits = []
    else:
        node = helper.make_node(op, ["x", "scales"], ["y"], mode=mode)
        inits = [helper.make_tensor("scales", TensorProto.FLOAT, [4], scales)]
    graph = helper.make_graph([node], "legacy", [_vi("x", x.shape)], [_vi("y", None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 7
    expected = onnxruntime_run(tmp_path, model, [x], ["x"])
    check_kiln(tmp_path, model, [x], expected, lambda e: 2e-6)


@pytest.mark.parametrize("op", ["ReduceMin", "ReduceMax"])
@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.int8, np.uint8, np.bool_])
def test_integer_and_bool_min_max_reductions_match_onnxruntime(tmp_path, op, dtype):
    # Integers' extremes included (ReduceMin is ~max(~x) there: no negation of INT_MIN); bool's
    # max is any, its min all.
    rng = np.random.default_rng(7)
    if dtype == np.bool_:
        x = rng.integers(0, 2, (3, 4, 5)).astype(np.bool_)
        x[0] = True
        x[1] = False
    else:
        info = np.iinfo(dtype)
        x = rng.integers(info.min, info.max, (3, 4, 5), endpoint=True).astype(dtype)
        x[0, 0, :2] = [info.min, info.max]
    axes = helper.make_tensor("axes", TensorProto.INT64, [1], [2])
    model = single_node_model(op, [("x", x)], {"keepdims": 0}, 20, [axes])  # bool from 20.
    expected = onnxruntime_run(tmp_path, model, [x], ["x"])
    check_kiln(tmp_path, model, [x], expected, lambda e: 0)
