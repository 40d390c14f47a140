"""kiln's Python API on kiln's own models: compiled == eager, DLPack without copies, errors,
threads, artifacts, JIT. Run by ctest ("python: pytest") with PYTHONPATH=build/python."""

import os
import threading

import numpy as np
import pytest

import kiln

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def mlp():
    return kiln.load("mlp", batch=2)


@pytest.fixture(scope="module")
def mlp_compiled(mlp):
    return kiln.compile(mlp)


def test_compiled_matches_eager_numpy_and_torch(mlp, mlp_compiled):
    x = np.random.default_rng(0).uniform(-1, 1, (2, 784)).astype(np.float32)
    y = mlp_compiled(x)
    assert isinstance(y, np.ndarray) and y.shape == (2, 10) and y.dtype == np.float32
    ref = kiln.eager(mlp)(x)
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-6)
    yt = mlp_compiled(torch.from_numpy(x))
    assert isinstance(yt, torch.Tensor) and yt.dtype == torch.float32
    np.testing.assert_allclose(yt.numpy(), ref, rtol=1e-5, atol=1e-6)
    assert np.abs(ref).max() > 0.01  # A check of something.


def test_zero_copy_inputs_and_outputs(mlp_compiled):
    x = torch.rand(2, 784)
    # Inputs: kiln reads the tensor's own bytes.
    assert kiln._kiln.data_pointer(x) == x.data_ptr()
    a = np.random.rand(2, 784).astype(np.float32)
    assert kiln._kiln.data_pointer(a) == a.ctypes.data
    # Outputs: the returned tensor is kiln's tensor, not a copy of it.
    (out, kiln_ptr), = mlp_compiled._impl.run_with_pointers([x], True)
    assert isinstance(out, torch.Tensor) and out.data_ptr() == kiln_ptr
    (out, kiln_ptr), = mlp_compiled._impl.run_with_pointers([a], False)
    assert isinstance(out, np.ndarray) and out.ctypes.data == kiln_ptr
    # Two calls give two distinct outputs (no arena slot is handed out twice).
    y1, y2 = mlp_compiled(x), mlp_compiled(x)
    assert y1.data_ptr() != y2.data_ptr() and torch.equal(y1, y2)


def test_non_contiguous_input_is_copied_once(mlp_compiled):
    x = torch.rand(784, 2).t()  # A transposed view.
    assert not x.is_contiguous()
    torch.testing.assert_close(mlp_compiled(x), mlp_compiled(x.contiguous()))


def test_bad_inputs_raise_kiln_errors(mlp_compiled):
    with pytest.raises(kiln.UserError, match=r"input 'input' \(#0\): expected f32\[2,784\], got "
                                             r"f32\[3,784\]") as e:
        mlp_compiled(np.zeros((3, 784), np.float32))
    assert isinstance(e.value, ValueError) and isinstance(e.value, kiln.Error)
    with pytest.raises(kiln.Error, match=r"expected f32\[2,784\], got f64\[2,784\]"):
        mlp_compiled(np.zeros((2, 784), np.float64))
    with pytest.raises(kiln.UserError, match="unsupported DLPack dtype"):
        mlp_compiled(torch.zeros(2, 784, dtype=torch.complex64))
    with pytest.raises(kiln.UserError, match="takes 1 inputs, got 2"):
        mlp_compiled(np.zeros((2, 784), np.float32), np.zeros((2, 784), np.float32))
    with pytest.raises(kiln.UserError, match="does not exist"):
        kiln.load("no/such/model.onnx")
    with pytest.raises(kiln.UserError, match="expected 'fusion'"):
        mlp_compiled.explain("everything")
    with pytest.raises(kiln.UserError, match="precision"):
        kiln.compile("mlp", precision="fp8")


def test_concurrent_calls_from_python_threads():
    model = kiln.load("mnist_cnn", batch=4)
    compiled = kiln.compile(model)
    eager = kiln.eager(model)
    rng = np.random.default_rng(1)
    inputs = [rng.uniform(-1, 1, (4, 1, 28, 28)).astype(np.float32) for _ in range(8)]
    expected = [eager(x) for x in inputs]
    errors = []

    def worker(k):
        try:
            for _ in range(10):
                for i in range(k, len(inputs), 4):
                    np.testing.assert_allclose(compiled(inputs[i]), expected[i], rtol=1e-4,
                                               atol=1e-5)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]


def test_jit_compiles_per_signature():
    j = kiln.jit(kiln.load("mlp", batch=1))
    rng = np.random.default_rng(2)
    for batch in (1, 3, 1):
        x = rng.uniform(-1, 1, (batch, 784)).astype(np.float32)
        np.testing.assert_allclose(j(x), kiln.eager(kiln.load("mlp", batch=batch))(x), rtol=1e-5,
                                   atol=1e-6)
    assert j.compiles == 2
    assert len(j.log) == 2


MASKED_SELECT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests",
                             "data", "onnx", "masked_select.onnx")


def test_onnx_model_in_stages_compiled_eager_and_from_threads(tmp_path):
    # y = x[x > 0], z = y[y > 0.5] (NonZero, then Compress): sizes known only from the values.
    m = kiln.load(MASKED_SELECT)
    assert isinstance(m, kiln.StagedModel)
    assert [o["name"] for o in m.outputs] == ["y", "z"]
    compiled, eager = kiln.compile(m), kiln.eager(m)
    rng = np.random.default_rng(4)
    # Counts 0, some, all, and a batch of another size; a count seen before makes no stage.
    xs = [-np.ones((3, 4), np.float32), rng.standard_normal((3, 4)).astype(np.float32),
          np.full((3, 4), 2.0, np.float32), rng.standard_normal((6, 4)).astype(np.float32)]
    for x in xs + xs[:1]:
        want_y = x[x > 0]
        for run in (compiled, eager):
            y, z = run(x)
            np.testing.assert_array_equal(y, want_y)
            np.testing.assert_array_equal(z, want_y[want_y > 0.5])
    # One stage per input shape, per (shape, count of x > 0), per (shape, both counts).
    counts = [(x.shape, int((x > 0).sum()), int((x[x > 0] > 0.5).sum())) for x in xs]
    made = compiled.stages_made
    assert made == len({c[:1] for c in counts}) + len({c[:2] for c in counts}) + len(set(counts))
    assert len(compiled.log) == made and eager.stages_made == made
    y, _ = compiled(torch.from_numpy(xs[1]))
    assert isinstance(y, torch.Tensor) and torch.equal(y, torch.from_numpy(xs[1][xs[1] > 0]))
    assert compiled.stages_made == made
    # Threads: each computes its own counts at once.
    errors = []

    def worker(k):
        try:
            for i in range(20):
                x = np.random.default_rng(100 * k + i).standard_normal((5, 4)).astype(np.float32)
                np.testing.assert_array_equal(compiled(x)[0], x[x > 0])
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
    # Clear errors: the model's fixed dim, a dtype, what a staged model cannot do.
    with pytest.raises(kiln.UserError, match="input 'x' has dim 1 fixed at 4"):
        compiled(np.zeros((3, 5), np.float32))
    with pytest.raises(kiln.UserError, match="input 'x' is declared f32 of rank 2"):
        compiled(np.zeros((3, 4), np.int64))
    never = str(tmp_path / "never_written.kiln")
    with pytest.raises(kiln.UserError, match="runs in stages"):
        compiled.save(never)
    assert not os.path.exists(never)
    with pytest.raises(kiln.UserError, match="recompile_limit: a model run in stages"):
        kiln.jit(m, recompile_limit=2)
    # kiln.compile(batch=) imports the file again: from its absolute path, wherever we are now.
    here = os.getcwd()
    try:
        os.chdir(tmp_path)
        rebatched = kiln.compile(m, batch=2)
    finally:
        os.chdir(here)
    x2 = xs[1][:2]
    np.testing.assert_array_equal(rebatched(x2)[0], x2[x2 > 0])
    assert "NonZero" in compiled.explain("stages")
    assert kiln.bench(m, iters=2, warmup=1)["compiled_ms"] > 0


def test_artifact_round_trip(tmp_path, mlp, mlp_compiled):
    path = str(tmp_path / "mlp.kiln")
    mlp_compiled.save(path)
    loaded = kiln.load(path)
    assert isinstance(loaded, kiln.CompiledModel) and loaded.report["kind"] == "artifact"
    x = np.random.default_rng(3).uniform(-1, 1, (2, 784)).astype(np.float32)
    np.testing.assert_array_equal(loaded(x), mlp_compiled(x))
    with pytest.raises(kiln.UserError, match="loaded from an artifact"):
        loaded.save(str(tmp_path / "again.kiln"))


def test_explain_report_and_bench(mlp_compiled):
    assert "linear" in mlp_compiled.explain("graph")
    assert isinstance(mlp_compiled.explain("fusion"), str)
    r = mlp_compiled.report
    assert r["kind"] == "compiled" and r["parameter_bytes"] > 0
    b = kiln.bench("mlp", iters=3, warmup=1)
    assert b["compiled_ms"] > 0 and b["eager_ms"] > 0 and b["speedup"] > 0


def test_cuda_tensor_on_a_cpu_model_is_refused(mlp_compiled):
    # No GPU needed: the refusal happens before any CUDA call.
    class FakeCuda:  # Looks like a torch CUDA tensor to kiln's dispatch, which refuses it.
        __module__ = "torch"
        device = torch.device("cuda", 0)
        requires_grad = False

        def is_contiguous(self):
            return True

        def __dlpack__(self, stream=None):
            raise AssertionError("a CPU model must not ask for a CUDA capsule")

    with pytest.raises(kiln.UserError, match=r"compiled for device 'cpu'"):
        mlp_compiled._impl.run_cuda([], 1, True)
    with pytest.raises(kiln.UserError, match=r"CUDA tensors go to a model compiled with "
                                             r"device='cuda'"):
        kiln.eager(kiln.load("mlp", batch=2))(FakeCuda())


def test_gpu_device_names_reach_the_gpu_backends():
    # The emu device runs the CUDA backend's generated kernels on the host: device="emu" takes the
    # path device="cuda" takes on a GPU (it was refused as "no backend named" before it was made
    # on first use, as the CLI's --device does).
    m = kiln.load("mnist_cnn", batch=2)
    c = kiln.compile(m, device="emu")
    assert c._impl.device == "emu"
    x = np.random.default_rng(1).uniform(-1, 1, (2, 1, 28, 28)).astype(np.float32)
    np.testing.assert_allclose(c(x), kiln.compile(m)(x), rtol=1e-4, atol=1e-5)
    with pytest.raises(kiln.UserError, match=r"unknown device 'tpu'"):
        kiln.compile(m, device="tpu")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (scripts/gpu-check.sh)")
def test_cuda_tensors_in_and_out_without_copies_after_their_stream():
    m = kiln.load("mnist_cnn", batch=2)
    c = kiln.compile(m, device="cuda")
    assert c._impl.device == "cuda"
    x = torch.rand(2, 1, 28, 28) * 2 - 1
    want = kiln.compile(m)(x)
    # The input written on a side stream that is still busy (a 50 ms spin first): the run must
    # wait for that stream's work, not read the buffer before the copy lands.
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        xc = torch.empty(x.shape, device="cuda")
        torch.cuda._sleep(100_000_000)
        xc.copy_(x, non_blocking=True)
        assert kiln._kiln.data_pointer(xc.__dlpack__(stream=-1)) == xc.data_ptr()
        y = c(xc)
    assert isinstance(y, torch.Tensor) and y.device.type == "cuda"
    torch.testing.assert_close(y.cpu(), want, rtol=1e-3, atol=1e-4)
    # Outputs are kiln's device buffers handed over: two calls, two buffers, the same values.
    y2 = c(xc)
    assert y2.data_ptr() != y.data_ptr()
    torch.testing.assert_close(y2, y)
    # A CPU tensor still works on the CUDA model (copied in and out).
    torch.testing.assert_close(c(x), want, rtol=1e-3, atol=1e-4)
    with pytest.raises(kiln.UserError, match=r"expected f32\[2,1,28,28\]"):
        c(torch.zeros(3, 1, 28, 28, device="cuda"))
