"""Times PyTorch eager and ONNX Runtime on the peer models, for side-by-side tables with
`kiln bench` (tools/peers/bench.sh runs both). Prints one JSON object per model.

Usage: python bench.py PEERS_DIR --threads T --runs R --warmup W --batch B [--only a,b]
"""
import argparse
import json
import os
import statistics
import sys
import time

import onnxruntime as ort
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import export  # noqa: E402


def median_ms(fn, runs, warmup):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("peers_dir")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--only", default="")
    args = parser.parse_args()
    names = [n for n in args.only.split(",") if n] or list(export.MODELS)
    torch.set_num_threads(args.threads)
    for name in names:
        ctor, shape = export.MODELS[name]
        torch.manual_seed(0)
        model = ctor().eval()
        x = torch.randn(args.batch, *shape[1:], generator=torch.Generator().manual_seed(2))
        with torch.inference_mode():
            torch_ms = median_ms(lambda: model(x), args.runs, args.warmup)
        options = ort.SessionOptions()
        options.intra_op_num_threads = args.threads
        options.inter_op_num_threads = 1
        session = ort.InferenceSession(os.path.join(args.peers_dir, name, "model.onnx"), options,
                                       providers=["CPUExecutionProvider"])
        feed = {"input": x.numpy()}
        ort_ms = median_ms(lambda: session.run(None, feed), args.runs, args.warmup)
        print(json.dumps({"model": name, "batch": args.batch, "threads": args.threads,
                          "torch_eager_ms": round(torch_ms, 3),
                          "onnxruntime_ms": round(ort_ms, 3)}), flush=True)


if __name__ == "__main__":
    main()
