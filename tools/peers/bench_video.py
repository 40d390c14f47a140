"""3-D convolution networks side by side in one process: torchvision's R3D-18 (Conv3d 3x3x3,
BatchNorm3d) and R(2+1)D-18 (Conv3d 1x3x3 and 3x1x1), at one Kinetics clip [1,3,16,112,112] by
default: PyTorch eager, ONNX Runtime on PyTorch's default ONNX export, and kiln compiled from that
export, the engines in turns (bench_peers.round_medians), with each model's FLOPs and this
machine's FMA peak (`kiln bench-kernels --peak`) in the same run. A benchmark, not a test.

Usage (the peer environment, after scripts/build.sh --target kiln --target kiln_python):
  PYTHONPATH=build/python python tools/peers/bench_video.py --kiln build/tools/kiln
      [--threads 2] [--frames 16] [--size 112] [--rounds 3] [--models r3d_18,r2plus1d_18]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import onnxruntime as ort
import torch
from torch.utils.flop_counter import FlopCounterMode
from torchvision.models import video

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_peers  # noqa: E402
import export  # noqa: E402


def measure(name, args, tmp):
    import kiln

    torch.manual_seed(0)
    model = getattr(video, name)().eval()
    export.randomize_batchnorm(model, torch.Generator().manual_seed(0))
    x = torch.randn(1, 3, args.frames, args.size, args.size)
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(x)
    path = os.path.join(tmp, f"{name}.onnx")
    torch.onnx.export(model, (x,), path, input_names=["input"], output_names=["output"])

    options = ort.SessionOptions()
    options.intra_op_num_threads = args.threads
    options.inter_op_num_threads = 1
    start = time.perf_counter()
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    ort_s = time.perf_counter() - start
    start = time.perf_counter()
    compiled = kiln.compile(kiln.load(path), threads=args.threads)
    feed = x.numpy()
    compiled(feed)
    kiln_s = time.perf_counter() - start
    want = model(x).detach().numpy()
    got = compiled(feed)
    engines = {"kiln_compiled": lambda: compiled(feed),
               "onnxruntime": lambda: session.run(None, {"input": feed}),
               "torch_eager": lambda: model(x)}
    rounds = {}
    for _ in range(args.rounds):
        with torch.inference_mode():
            medians = bench_peers.round_medians(engines, args.runs, 1, args.min_round_s, 1.0, 0.1)
        for key, ms in medians.items():
            rounds.setdefault(key, []).append(ms)
    r = {"model": name, "input": list(x.shape), "gflop": counter.get_total_flops() / 1e9,
         "max_abs_diff_vs_torch": float(abs(got - want).max()),
         "kiln_compile_and_first_run_s": kiln_s, "onnxruntime_session_s": ort_s}
    for key, values in rounds.items():
        r[f"{key}_ms"] = statistics.median(values)
        r[f"{key}_rounds_ms"] = values
    for key in ("onnxruntime", "torch_eager"):
        r[f"kiln_vs_{key}"] = statistics.median(
            p / k for p, k in zip(rounds[key], rounds["kiln_compiled"]))
    return r


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--kiln", required=True)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--frames", type=int, default=16)
    p.add_argument("--size", type=int, default=112)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--min-round-s", type=float, default=3.0)
    p.add_argument("--models", default="r3d_18,r2plus1d_18")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    peak = json.loads(subprocess.run([args.kiln, "bench-kernels", "--peak", "--json"],
                                     capture_output=True, text=True, check=True).stdout)
    print(json.dumps({"peak": peak}))
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            r = measure(name, args, tmp)
            print(json.dumps(r))
            print(f"{name}: {r['gflop']:.1f} GFLOP; kiln {r['kiln_compiled_ms']:.1f} ms, "
                  f"ONNX Runtime {r['onnxruntime_ms']:.1f} ms, PyTorch eager "
                  f"{r['torch_eager_ms']:.1f} ms; kiln {r['kiln_vs_onnxruntime']:.2f}x ONNX "
                  f"Runtime, {r['kiln_vs_torch_eager']:.2f}x PyTorch eager; compile "
                  f"{r['kiln_compile_and_first_run_s']:.1f} s", flush=True)


if __name__ == "__main__":
    main()
