"""ONNX Runtime served from client threads, the peer of `kiln bench MODEL --concurrency N`.

One InferenceSession (intra-op pool of --threads threads, as kiln's compute budget) shared by N
Python threads that call run() back to back for --duration seconds (ONNX Runtime releases the
GIL inside run(), and InferenceSession.run is safe to call concurrently). Prints one JSON line
per level: requests per second and p50/p90/p99/max latency per request in ms.
  serve_bench.py MODEL.onnx --concurrency 1,2,4 [--duration S] [--threads T]
"""
import argparse
import json
import threading
import time

import numpy as np
import onnxruntime as ort


def main():
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("--concurrency", default="1,2,4")
    p.add_argument("--duration", type=float, default=5.0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--batch", type=int, default=1)
    a = p.parse_args()
    so = ort.SessionOptions()
    so.intra_op_num_threads = a.threads
    so.inter_op_num_threads = 1
    sess = ort.InferenceSession(a.model, so, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(7)
    feeds = {}
    for i in sess.get_inputs():
        shape = [a.batch if not isinstance(d, int) else d for d in i.shape]
        feeds[i.name] = rng.uniform(-1, 1, size=shape).astype(np.float32)
    sess.run(None, feeds)  # Warm up.
    for level in [int(c) for c in a.concurrency.split(",")]:
        lat = [[] for _ in range(level)]
        deadline = time.perf_counter() + a.duration

        def client(k):
            while time.perf_counter() < deadline:
                t0 = time.perf_counter()
                sess.run(None, feeds)
                lat[k].append((time.perf_counter() - t0) * 1000)

        start = time.perf_counter()
        threads = [threading.Thread(target=client, args=(k,)) for k in range(level)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        seconds = time.perf_counter() - start
        all_ms = np.sort(np.concatenate([np.array(l) for l in lat]))
        pct = lambda q: float(all_ms[min(len(all_ms) - 1, int(q * len(all_ms)))])
        print(json.dumps({"concurrency": level, "requests": int(len(all_ms)),
                          "requests_per_s": len(all_ms) / seconds, "p50_ms": pct(0.5),
                          "p90_ms": pct(0.9), "p99_ms": pct(0.99),
                          "max_ms": float(all_ms[-1])}), flush=True)


if __name__ == "__main__":
    main()
