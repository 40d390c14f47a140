"""PyTorch eager and torch.compile on the GPU, for scripts/gpu-check.sh: the zoo's models as
PyTorch defines them (torchvision's resnet18/resnet50; a BERT-base encoder layer as
nn.TransformerEncoderLayer with 768 hidden, 12 heads, 3072 intermediate, GELU, sequence 128),
fp32 with TF32 off (or, with --tf32, TF32 on: the comparison for kiln's --precision tf32; with
--bf16, under torch.autocast("cuda", torch.bfloat16): the comparison for kiln's --precision
bf16), medians of CUDA-event timings of the model call (the input already on the GPU).

    python tools/peers/torch_gpu_bench.py --out torch.json [--tf32 | --bf16]
"""
import argparse
import json
import statistics

import torch
import torchvision


def timed(fn, x, runs=20, warmup=3):
    for _ in range(warmup):
        fn(x)
    torch.cuda.synchronize()
    times = []
    for _ in range(runs):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn(x)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--tf32", action="store_true", help="allow TF32 in cuDNN and matmuls")
    ap.add_argument("--bf16", action="store_true", help="torch.autocast to bfloat16")
    args = ap.parse_args()
    torch.backends.cudnn.allow_tf32 = args.tf32
    torch.backends.cuda.matmul.allow_tf32 = args.tf32
    torch.set_float32_matmul_precision("high" if args.tf32 else "highest")
    dev = torch.device("cuda")
    cases = {
        "resnet18:1": (torchvision.models.resnet18(), (1, 3, 224, 224)),
        "resnet50:1": (torchvision.models.resnet50(), (1, 3, 224, 224)),
        "resnet50:32": (torchvision.models.resnet50(), (32, 3, 224, 224)),
        "bert_layer:1": (
            torch.nn.TransformerEncoderLayer(768, 12, 3072, activation="gelu", batch_first=True),
            (1, 128, 768),
        ),
    }
    results = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
               "precision": "bf16" if args.bf16 else "tf32" if args.tf32 else "fp32"}
    for key, (model, shape) in cases.items():
        model = model.eval().to(dev)
        x = torch.randn(*shape, device=dev)
        with torch.inference_mode(), torch.autocast("cuda", torch.bfloat16, enabled=args.bf16):
            eager = timed(model, x)
            compiled = torch.compile(model)
            comp = timed(compiled, x)
        results[key] = {"eager_ms": eager, "compile_ms": comp}
        print(f"{key}: torch eager {eager:.3f} ms, torch.compile {comp:.3f} ms", flush=True)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
