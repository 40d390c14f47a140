"""kiln against its peers, side by side in one run (scripts/bench-peers.sh runs this): for each
model and batch, PyTorch eager, torch.compile (Inductor, CPU freezing on; default mode, and
max-autotune with --max-autotune), ONNX Runtime and kiln eager / compiled, all on the same
export (PyTorch's default exporter, tools/peers/export.py), thread count and input shapes. This
machine's FMA peak and copy bandwidth (`kiln bench-kernels --peak`) are measured in the same run.
Writes OUT/bench-peers.json and OUT/bench-peers.md and prints the table.

Usage: python bench_peers.py --kiln KILN --kiln-python BUILD/python --peers-dir DIR --out OUT [--threads T] [--runs R]
           [--warmup W] [--min-round-s S] [--block-s S] [--gap-s S] [--rounds N] [--cases name:batch,...] [--max-autotune]
"""
import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

import onnxruntime as ort
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import export  # noqa: E402


def default_cases():
    """Every peer model at batch 1; resnet50 also at 32 and the BERT layer at 8."""
    cases = [(name, 1) for name in export.MODELS]
    cases.insert(cases.index(("resnet50", 1)) + 1, ("resnet50", 32))
    cases.insert(cases.index(("bert_layer", 1)) + 1, ("bert_layer", 8))
    return cases


def round_medians(engines, runs, warmup, min_s, block_s, gap_s):
    """One round: each engine's median time in ms. After each engine's `warmup` runs, the engines
    take turns in blocks of about `block_s` seconds of runs (one engine's block, the next
    engine's, and so on) until each has at least `runs` runs and `min_s` seconds of them (at most
    5000 runs; timeit's autorange, for models of a fraction of a millisecond). The VM's slow
    spells (one vCPU 1.6x slower for a fraction of a second to seconds) then fall on every engine
    alike instead of on the one that ran in them: with each engine timed alone for 0.25 s,
    mnist_cnn read 0.19, 0.31 and 0.26 ms for kiln in three rounds and 0.19, 0.22 and 0.19 for ONNX
    Runtime, where either alone reads 0.14. After every block the benchmark sleeps `gap_s`
    seconds, so that the next engine does not run beside the last one's helper threads: ONNX
    Runtime's workers spin for about 40 ms of CPU after its runs return (its default), which made
    kiln's mnist_cnn 0.21 ms instead of 0.14 in blocks right after ONNX Runtime's (the other
    engines' threads: under 10 ms)."""
    times, block = {}, {}
    for key, fn in engines.items():
        for _ in range(max(warmup, 1)):
            start = time.perf_counter()
            fn()
            once = time.perf_counter() - start
        times[key] = []
        block[key] = max(1, int(block_s / max(once, 1e-6)))
        time.sleep(gap_s)

    def done(key):
        t = times[key]
        return len(t) >= 5000 or (len(t) >= runs and sum(t) >= min_s * 1e3)

    while not all(done(key) for key in engines):
        for key, fn in engines.items():
            if done(key):
                continue
            for _ in range(block[key]):
                start = time.perf_counter()
                fn()
                times[key].append((time.perf_counter() - start) * 1e3)
            time.sleep(gap_s)
    return {key: statistics.median(t) for key, t in times.items()}


def cpu_description():
    model, flags = platform.processor(), set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") and model in ("", "x86_64"):
                    model = line.split(":", 1)[1].strip()
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    isa = [f for f in ("avx512f", "avx512_bf16", "avx512_vnni", "amx_tile", "avx2", "fma")
           if f in flags]
    return model, isa


def torch_engines(name, batch, args):
    """PyTorch eager and torch.compile (default mode, and max-autotune when asked) as callables (to
    be called under torch.inference_mode), and each compile's first call in seconds (the compile
    itself, as a user waits for it)."""
    ctor, _ = export.MODELS[name]
    torch.manual_seed(0)
    model = ctor().eval()
    x = export.make_input(name, batch)

    engines, first = {"torch_eager": lambda: model(x)}, {}
    modes = ["default"] + (["max-autotune"] if args.max_autotune else [])
    for mode in modes:
        torch._dynamo.reset()
        key = "torch_compile" if mode == "default" else "torch_compile_max_autotune"
        compiled = torch.compile(model, mode=mode)
        start = time.perf_counter()
        with torch.inference_mode():
            compiled(x)
        first[f"{key}_first_call_s"] = time.perf_counter() - start
        engines[key] = lambda compiled=compiled: compiled(x)
    return engines, first


def ort_engine(name, batch, args):
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = args.threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    start = time.perf_counter()
    session = ort.InferenceSession(os.path.join(args.peers_dir, name, "model.onnx"), options,
                                   providers=["CPUExecutionProvider"])
    load_s = time.perf_counter() - start
    feed = {"input": export.make_input(name, batch).numpy()}
    return (lambda: session.run(None, feed)), {"onnxruntime_session_s": load_s}


def kiln_engines(name, batch, args):
    """kiln eager and compiled as callables in this process (the kiln Python package, built
    into the build folder by bench-peers.sh), as ONNX Runtime and PyTorch run: one long-lived
    process, the model compiled once, its inputs NumPy arrays."""
    import kiln
    path = os.path.join(args.peers_dir, name, "model.onnx")
    model = kiln.load(path, batch=batch)
    compiled = kiln.compile(model, threads=args.threads)
    eager = kiln.eager(model)
    x = export.make_input(name, batch).numpy()
    return {"kiln_eager": lambda: eager(x), "kiln_compiled": lambda: compiled(x)}


def kiln_compile_figures(name, batch, args):
    """What a new process sees (kiln bench --only compiled): the cold compile and the first
    run against that process's own median."""
    cmd = [args.kiln, "bench", os.path.join(args.peers_dir, name, "model.onnx"), "--batch",
           str(batch), "--threads", str(args.threads), "--runs", str(args.runs), "--warmup",
           str(args.warmup), "--only", "compiled", "--json"]
    if name in export.TOKEN_MODELS:
        cmd += ["--int-range", f"0:{export.TOKEN_MODELS[name]}"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        return {"kiln_error": (r.stderr or r.stdout).strip().splitlines()[-1]}
    j = json.loads(r.stdout)["compiled"]
    return {"kiln_compile_s": j["compile_cold_ms"] / 1e3,
            "kiln_first_run_ratio": j["first_run_ms"] / j["median_ms"]}


def measure_case(name, batch, args):
    """Every engine's median, `args.rounds` rounds (round_medians: the engines take turns in
    blocks of runs), all in this process. Each time is the median over rounds; `*_rounds_ms`
    keeps every round's."""
    r = {"model": name, "batch": batch}
    import kiln
    engines = {}
    try:
        engines.update(kiln_engines(name, batch, args))
    except kiln.Error as e:  # Reported in the table; the peers are still measured.
        r["kiln_error"] = str(e).strip().splitlines()[-1]
    ort_fn, info = ort_engine(name, batch, args)
    r.update(info)
    engines["onnxruntime"] = ort_fn
    torch_fns, info = torch_engines(name, batch, args)
    r.update(info)
    engines.update(torch_fns)
    rounds, figures = {}, {}
    for _ in range(args.rounds):
        if "kiln_error" not in r:
            for key, v in kiln_compile_figures(name, batch, args).items():
                if key == "kiln_error":
                    r[key] = v
                else:
                    figures.setdefault(key, []).append(v)
        with torch.inference_mode():  # PyTorch's engines are timed under it (the others ignore it).
            medians = round_medians(engines, args.runs, args.warmup, args.min_round_s,
                                    args.block_s, args.gap_s)
        for key, ms in medians.items():
            rounds.setdefault(f"{key}_ms", []).append(ms)
    for key, values in rounds.items():
        r[key] = statistics.median(values)
        r[key[:-3] + "_rounds_ms"] = values
    for key, values in figures.items():
        r[key] = statistics.median(values)
    # kiln's speedup over each peer: the median over rounds of the round's ratio (each pair timed
    # seconds apart, so that a slower spell of the machine divides out).
    kiln_ms = rounds.get("kiln_compiled_ms")
    for key in engines:
        if kiln_ms and not key.startswith("kiln"):
            r[f"kiln_vs_{key}"] = statistics.median(
                p / k for p, k in zip(rounds[f"{key}_ms"], kiln_ms))
    return r


def peak(args):
    r = subprocess.run([args.kiln, "bench-kernels", "--peak", "--threads", str(args.threads),
                        "--rows", "64", "--cols", "64", "--runs", "1", "--json"],
                       capture_output=True, text=True, check=True)
    return json.loads(r.stdout)["peak"]


def geomean(xs):
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def write_atomically(path, text):
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path) or ".", prefix=".bench-peers-")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def table(results, meta, max_autotune):
    f = lambda v, d=2: "-" if v is None else f"{v:.{d}f}"
    cols = ["model", "batch", "torch eager", "torch.compile"]
    if max_autotune:
        cols.append("torch.compile max-autotune")
    cols += ["ONNX Runtime", "kiln eager", "kiln compiled", "kiln vs ORT",
             "kiln vs torch.compile", "kiln vs torch eager", "kiln compile s",
             "kiln first run / median", "torch.compile first call s"]
    lines = [
        f"CPU: {meta['cpu']} ({', '.join(meta['isa'])}); {meta['threads']} threads for every "
        f"engine; fp32 FMA peak {meta['peak']['fma_gflops']:.0f} GFLOP/s, copy "
        f"{meta['peak']['copy_gb_per_s']:.1f} GB/s (kiln bench-kernels --peak, this run).",
        f"PyTorch {meta['torch']} eager (inference_mode) and torch.compile (Inductor, "
        f"freezing on, mode default{', and max-autotune' if max_autotune else ''}); ONNX Runtime "
        f"{meta['onnxruntime']} (CPUExecutionProvider, ORT_ENABLE_ALL, intra_op_num_threads "
        f"{meta['threads']}, inter_op 1, sequential, spinning on: its default); kiln "
        f"{meta['kiln']} (compiled with its default heuristics, through its Python package on NumPy "
        f"arrays). Every engine in this one process on PyTorch's default exporter's file (kiln, "
        f"ONNX Runtime) or the PyTorch module it came from; {meta['rounds']} rounds, in each the "
        f"engines take turns in blocks of about {meta['block_s'] * 1e3:.0f} ms of runs, "
        f"{meta['gap_s'] * 1e3:.0f} ms apart (ONNX Runtime's workers spin for some 40 ms after "
        f"its runs), until each "
        f"has {meta['runs']} runs and {meta['min_round_s']} s of them, after {meta['warmup']} "
        f"warm-up runs. Milliseconds: the median over rounds of each round's median; "
        f"'kiln vs X' is the median over "
        f"rounds of X's time over kiln compiled's in the same round (above 1: kiln faster). Compile times: kiln's cold (an empty kernel "
        f"cache) and its first run over the median of the same new process (kiln bench --only "
        f"compiled); torch.compile's first call with Inductor's on-disk caches as earlier runs left "
        f"them (cold, it takes several times longer).", "",
        "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in results:
        k = r.get("kiln_compiled_ms")
        ratio = lambda key: speedup(r, key[:-3])
        row = [r["model"], str(r["batch"]), f(r.get("torch_eager_ms")),
               f(r.get("torch_compile_ms"))]
        if max_autotune:
            row.append(f(r.get("torch_compile_max_autotune_ms")))
        row += [f(r.get("onnxruntime_ms")), f(r.get("kiln_eager_ms")),
                f(k) if k else "error: " + r.get("kiln_error", "?"),
                f(ratio("onnxruntime_ms")), f(ratio("torch_compile_ms")),
                f(ratio("torch_eager_ms")), f(r.get("kiln_compile_s")),
                f(r.get("kiln_first_run_ratio")),
                f(r.get("torch_compile_first_call_s"), 1)]
        lines.append("| " + " | ".join(row) + " |")
    g = meta["geomeans"]
    lines += ["", f"Geometric means of kiln compiled's speedup: over ONNX Runtime "
              f"{f(g['onnxruntime'])}x, over torch.compile {f(g['torch_compile'])}x, over PyTorch "
              f"eager {f(g['torch_eager'])}x; slowest against ONNX Runtime "
              f"{f(g['min_onnxruntime'])}x ({g['min_onnxruntime_case']})."]
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kiln", required=True)
    ap.add_argument("--kiln-python", required=True,
                    help="the folder holding the built kiln package (BUILD/python)")
    ap.add_argument("--peers-dir", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--kiln-version", default="(this build)", help="for the table's header")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--min-round-s", type=float, default=0.25,
                    help="each engine's runs in a round fill at least this many seconds")
    ap.add_argument("--block-s", type=float, default=0.1,
                    help="the engines take turns in blocks of about this many seconds of runs")
    ap.add_argument("--gap-s", type=float, default=0.05,
                    help="seconds of sleep after each block (other engines' threads go idle)")
    ap.add_argument("--rounds", type=int, default=3,
                    help="times every engine is measured, in turn (the median is reported)")
    ap.add_argument("--cases", default="", help="name:batch,... (default: every model)")
    ap.add_argument("--max-autotune", action="store_true",
                    help="also torch.compile(mode='max-autotune') (slow to compile)")
    args = ap.parse_args()
    cases = ([(c.split(":")[0], int(c.split(":")[1]) if ":" in c else 1)
              for c in args.cases.split(",") if c] or default_cases())
    unknown = [n for n, _ in cases if n not in export.MODELS]
    if unknown:
        ap.error(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(export.MODELS)}")
    torch.set_num_threads(args.threads)
    # kiln's OpenMP (the system's; its eager runs use all of its threads) reads this when the
    # kiln package is first imported, after this.
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    sys.path.insert(0, args.kiln_python)
    torch._inductor.config.freezing = True  # Constant weights folded, as for inference.
    cpu, isa = cpu_description()
    meta = {"cpu": cpu, "isa": isa, "threads": args.threads, "runs": args.runs,
            "warmup": args.warmup, "min_round_s": args.min_round_s, "block_s": args.block_s, "gap_s": args.gap_s, "rounds": args.rounds, "torch": torch.__version__, "onnxruntime": ort.__version__,
            "kiln": args.kiln_version, "peak": peak(args)}
    results = []
    for name, batch in cases:
        r = measure_case(name, batch, args)
        results.append(r)
        print(json.dumps(r), flush=True)
    meta["geomeans"] = summary(results)
    os.makedirs(args.out, exist_ok=True)
    write_atomically(os.path.join(args.out, "bench-peers.json"),
                     json.dumps({"meta": meta, "results": results}, indent=2) + "\n")
    md = table(results, meta, args.max_autotune)
    write_atomically(os.path.join(args.out, "bench-peers.md"), md)
    print(md)


def speedup(r, key):
    """kiln compiled's speedup over engine `key` in result `r`: the median of the rounds' ratios,
    or (a result without rounds) the ratio of the medians; None where either is missing."""
    if r.get(f"kiln_vs_{key}"):
        return r[f"kiln_vs_{key}"]
    k = r.get("kiln_compiled_ms")
    return r[f"{key}_ms"] / k if k and r.get(f"{key}_ms") else None


def summary(results):
    """Geometric means of kiln's speedups, and the case slowest against ONNX Runtime."""
    speedups = {key: [speedup(r, key) for r in results if speedup(r, key)]
                for key in ("onnxruntime", "torch_compile", "torch_eager")}
    worst = min((r for r in results if speedup(r, "onnxruntime")),
                key=lambda r: speedup(r, "onnxruntime"), default=None)
    g = {key: geomean(v) for key, v in speedups.items()}
    g["min_onnxruntime"] = speedup(worst, "onnxruntime") if worst else None
    g["min_onnxruntime_case"] = f"{worst['model']} batch {worst['batch']}" if worst else "-"
    return g


if __name__ == "__main__":
    main()
