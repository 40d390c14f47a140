"""kiln from Python, measured side by side in one process (scripts/bench-python.sh runs it):

1. call overhead: kiln.compile'd mlp at batch 1 called from Python (NumPy and torch inputs)
   against the C++ API's own per-call time (`kiln bench mlp --only compiled`, same machine, same
   threads, run just before);
2. torch.compile(backend="kiln") against backend="inductor" and eager on resnet18, resnet50 and
   the BERT layer: first call (capture + compile + run) and steady-state medians, under no_grad;
3. resnet18 with one graph break (an op kiln leaves to PyTorch) under backend="kiln" against
   eager: the shared OpenMP pool around the break.

Prints a markdown table and writes JSON when given a path:
    python tools/peers/bench_python.py [--threads 2] [--json out.json] [--skip-inductor]
"""

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np
import torch

import kiln
import kiln.dynamo  # noqa: F401

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import export as peers  # noqa: E402


def median_ms(fn, iters, warmup=3):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return float(np.median(times))


def call_overhead(kiln_bin, threads):
    out = subprocess.run([kiln_bin, "bench", "mlp", "--only", "compiled", "--threads",
                          str(threads), "--runs", "2000", "--json"], check=True,
                         capture_output=True, text=True).stdout
    cpp_ms = json.loads(out)["compiled"]["median_ms"]
    c = kiln.compile(kiln.load("mlp"), threads=threads)
    x = np.random.default_rng(0).uniform(-1, 1, (1, 784)).astype(np.float32)
    xt = torch.from_numpy(x)
    np_ms = median_ms(lambda: c(x), 2000, 200)
    torch_ms = median_ms(lambda: c(xt), 2000, 200)
    return {"cpp_us": cpp_ms * 1e3, "python_numpy_us": np_ms * 1e3,
            "python_torch_us": torch_ms * 1e3}


class GraphBreak(torch.nn.Module):
    """resnet18 with one op kiln leaves to PyTorch after layer2 (a Bessel function, which kiln
    has no translation for): two kiln subgraphs around one PyTorch op."""

    def __init__(self, base):
        super().__init__()
        self.base = base

    def forward(self, x):
        b = self.base
        x = b.maxpool(b.relu(b.bn1(b.conv1(x))))
        x = b.layer2(b.layer1(x))
        x = torch.special.bessel_j0(x) + x  # kiln: no Bessel function; PyTorch runs it.
        x = b.layer4(b.layer3(x))
        return b.fc(torch.flatten(b.avgpool(x), 1))


def backends(name, module, x, iters, skip_inductor, threads):
    row = {"model": name, "batch": x.shape[0]}
    with torch.no_grad():
        row["eager_ms"] = median_ms(lambda: module(x), iters)
        for backend in ["kiln"] + ([] if skip_inductor else ["inductor"]):
            torch._dynamo.reset()
            opts = {"threads": threads} if backend == "kiln" else None
            compiled = torch.compile(module, backend=backend, options=opts)
            t0 = time.perf_counter()
            y = compiled(x)
            row[f"{backend}_first_s"] = time.perf_counter() - t0
            ref = module(x)
            row[f"{backend}_maxdiff"] = float((y - ref).abs().max())
            row[f"{backend}_ms"] = median_ms(lambda: compiled(x), iters)
    return row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--json")
    ap.add_argument("--skip-inductor", action="store_true")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--cold-inductor", action="store_true",
                    help="time Inductor's first call without its caches (FX graph and AOTAutograd "
                         "caches off, a fresh cache directory), as on a new machine")
    ap.add_argument("--kiln", default=os.path.join(os.path.dirname(__file__), "..", "..",
                                                   "build", "tools", "kiln"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.cold_inductor:
        import tempfile

        os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="inductor-cold-")
        torch._inductor.config.fx_graph_cache = False
        torch._functorch.config.enable_autograd_cache = False
    result = {"threads": args.threads, "cpu": _cpu(), "cold_inductor": args.cold_inductor}

    result["call_overhead"] = co = call_overhead(args.kiln, args.threads)
    print(f"## Call overhead, mlp batch 1 ({args.threads} threads)\n")
    print("| C++ API | Python, NumPy | Python, torch |\n|---|---|---|")
    print(f"| {co['cpp_us']:.1f} us | {co['python_numpy_us']:.1f} us "
          f"(+{co['python_numpy_us'] - co['cpp_us']:.1f}) | {co['python_torch_us']:.1f} us "
          f"(+{co['python_torch_us'] - co['cpp_us']:.1f}) |\n")

    rows = []
    torch.manual_seed(0)
    for name, batch in [("resnet18", 1), ("resnet50", 1), ("bert_layer", 1)]:
        module = peers.MODELS[name][0]().eval()
        rows.append(backends(name, module, peers.make_input(name, batch), args.iters,
                             args.skip_inductor, args.threads))
    module = GraphBreak(peers.MODELS["resnet18"][0]().eval()).eval()
    rows.append(backends("resnet18 + graph break", module, peers.make_input("resnet18", 1),
                         args.iters, True, args.threads))
    result["backends"] = rows
    print(f"## torch.compile backends ({args.threads} threads; medians in ms, first call in s)\n")
    print("| model | eager | kiln | inductor | kiln vs inductor | first call kiln | inductor |")
    print("|---|---|---|---|---|---|---|")
    def fmt(v, spec=".2f", suffix=""):
        return "-" if v is None else format(v, spec) + suffix

    for r in rows:
        ind = r.get("inductor_ms")
        ratio = ind / r["kiln_ms"] if ind else None
        print(f"| {r['model']} | {r['eager_ms']:.2f} | {r['kiln_ms']:.2f} | {fmt(ind)} | "
              f"{fmt(ratio, '.2f', 'x')} | {r['kiln_first_s']:.2f} | "
              f"{fmt(r.get('inductor_first_s'))} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


def _cpu():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "?"


if __name__ == "__main__":
    main()
