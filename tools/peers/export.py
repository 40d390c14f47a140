"""Exports the peer models to ONNX with fixed random weights and records what PyTorch eager and
ONNX Runtime compute on fixed inputs, for kiln's `peer` tests (tests/peers).

For each model it writes OUT/<name>/:
  model.onnx        opset 17, TorchScript exporter, the batch dim symbolic ("batch")
  input.npy         the input (float32, seeded)
  torch.npy         PyTorch eager's output on the CPU, in float32
  onnxruntime.npy   ONNX Runtime's output (CPUExecutionProvider)
  meta.json         shapes, versions, and the max |torch - onnxruntime| difference

Usage: python export.py OUT [--only name,name] [--force]
"""
import argparse
import json
import os
import sys
import time

import numpy as np
import onnx
import onnxruntime as ort
import torch
import torchvision
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import models  # noqa: E402

OPSET = 17  # The newest opset kiln reads (libonnx 1.12).


def transformer_encoder():
    # The inference fast path (one fused aten op with no ONNX symbolic) is off, so that the
    # exporter sees the layer's real ops, as it does in training mode.
    torch.backends.mha.set_fastpath_enabled(False)
    layer = nn.TransformerEncoderLayer(d_model=256, nhead=4, dim_feedforward=1024, dropout=0.1,
                                       batch_first=True)
    return nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)


def vision(name):
    return lambda: getattr(torchvision.models, name)(weights=None)


# name -> (constructor, input shape). Batch 1; the batch dim is exported as symbolic.
MODELS = {
    "resnet18": (vision("resnet18"), (1, 3, 224, 224)),
    "resnet50": (vision("resnet50"), (1, 3, 224, 224)),
    "mobilenet_v2": (vision("mobilenet_v2"), (1, 3, 224, 224)),
    "efficientnet_b0": (vision("efficientnet_b0"), (1, 3, 224, 224)),
    "squeezenet1_1": (vision("squeezenet1_1"), (1, 3, 224, 224)),
    "densenet121": (vision("densenet121"), (1, 3, 224, 224)),
    "mnist_cnn": (models.MnistCnn, (1, 1, 28, 28)),
    "bert_layer": (models.BertLayer, (1, 128, 768)),
    "transformer_encoder": (transformer_encoder, (1, 64, 256)),
}


def check_model_list():
    """tools/peers/models.txt names the models for CMake's `peer` tests: the same as MODELS."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "models.txt")
    with open(path) as f:
        listed = [line.strip() for line in f if line.strip()]
    if listed != list(MODELS):
        sys.exit(f"peers: {path} lists {listed}, export.py defines {list(MODELS)}")


def randomize_batchnorm(model, gen):
    """Fresh BatchNorm layers hold mean 0, variance 1, scale 1, shift 0, which folds into
    nothing; random statistics make the peers check BatchNorm for real."""
    for m in model.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            c = m.num_features
            m.running_mean.copy_(torch.rand(c, generator=gen) * 0.2 - 0.1)
            m.running_var.copy_(torch.rand(c, generator=gen) + 0.5)
            m.weight.data.copy_(torch.rand(c, generator=gen) + 0.5)
            m.bias.data.copy_(torch.rand(c, generator=gen) * 0.2 - 0.1)


def export_one(name, out_dir):
    ctor, shape = MODELS[name]
    torch.manual_seed(0)
    model = ctor().eval()
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        randomize_batchnorm(model, gen)
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(2))

    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "model.onnx")
    with torch.no_grad():
        expected = model(x)
        torch.onnx.export(model, (x,), path, dynamo=False, opset_version=OPSET,
                          input_names=["input"], output_names=["output"],
                          dynamic_axes={"input": {0: "batch"}, "output": {0: "batch"}})
    onnx.checker.check_model(path)

    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    (got,) = session.run(None, {"input": x.numpy()})

    np.save(os.path.join(out_dir, "input.npy"), x.numpy())
    np.save(os.path.join(out_dir, "torch.npy"), expected.numpy())
    np.save(os.path.join(out_dir, "onnxruntime.npy"), got)
    ref = expected.numpy()
    scale = float(np.abs(ref).max())
    diff = float(np.abs(ref - got).max())
    meta = {
        "model": name,
        "input_shape": list(shape),
        "output_shape": list(ref.shape),
        "opset": OPSET,
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "onnx": onnx.__version__,
        "onnxruntime": ort.__version__,
        "max_abs_output": scale,
        "max_abs_diff_torch_onnxruntime": diff,
        "parameters": sum(p.numel() for p in model.parameters()),
    }
    with open(os.path.join(out_dir, "meta.json"), "w") as f:
        json.dump(meta, f, indent=2)
    return meta


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out")
    parser.add_argument("--only", default="", help="comma-separated model names")
    parser.add_argument("--force", action="store_true", help="export models already present")
    args = parser.parse_args()
    check_model_list()
    names = [n for n in args.only.split(",") if n] or list(MODELS)
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(MODELS)}")
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    for name in names:
        out_dir = os.path.join(args.out, name)
        if not args.force and os.path.exists(os.path.join(out_dir, "meta.json")):
            print(f"peers: {name}: present (--force to export again)")
            continue
        start = time.time()
        meta = export_one(name, out_dir)
        print(f"peers: {name}: exported in {time.time() - start:.1f} s, output "
              f"{meta['output_shape']}, max |torch - onnxruntime| "
              f"{meta['max_abs_diff_torch_onnxruntime']:.3g} (max |out| "
              f"{meta['max_abs_output']:.3g})")


if __name__ == "__main__":
    main()
