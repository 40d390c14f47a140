"""Exports the peer models to ONNX with fixed random weights and records what PyTorch eager and
ONNX Runtime compute on fixed inputs, for kiln's `peer` tests (tests/peers).

For each model it writes OUT/<name>/:
  model.onnx, model.onnx.data
                    PyTorch's default exporter (torch.onnx.export with dynamo=True, its default:
                    torch.export, opset 20, IR 10, the weights as external data)
  legacy.onnx       the legacy TorchScript exporter (dynamo=False), opset 17
                    (both with the batch dim symbolic, "batch")
  input.npy         the input (float32, seeded; int64 token ids for gpt2_block)
  torch.npy         PyTorch eager's output on the CPU, in float32
  onnxruntime.npy   ONNX Runtime's output on model.onnx (CPUExecutionProvider)
  onnxruntime_legacy.npy   the same on legacy.onnx
  meta.json         shapes, versions, opsets, and the max |torch - onnxruntime| differences

Usage: python export.py OUT [--only name,name] [--force]
"""
import argparse
import json
import os
import sys
import time
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import torch
import torchvision
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import models  # noqa: E402

LEGACY_OPSET = 17  # The newest the TorchScript exporter writes.


# The inference fast path of nn.MultiheadAttention (one fused aten op with no ONNX symbolic) is
# off, so that the exporters see the layers' real ops, as they do in training mode.
torch.backends.mha.set_fastpath_enabled(False)


def transformer_encoder():
    layer = nn.TransformerEncoderLayer(d_model=256, nhead=4, dim_feedforward=1024, dropout=0.1,
                                       batch_first=True)
    return nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)


def vision(name):
    return lambda: getattr(torchvision.models, name)(weights=None)


def vit_small():
    # A small vision transformer (ViT-S/16's width, 4 of its 12 layers): torchvision's
    # VisionTransformer, the architecture of vit_b_16.
    model = torchvision.models.VisionTransformer(image_size=224, patch_size=16, num_layers=4,
                                                 num_heads=6, hidden_dim=384, mlp_dim=1536)
    # torchvision initializes the classifier head to zeros (for fine-tuning): every output
    # would be 0 and the check empty.
    nn.init.normal_(model.heads.head.weight, std=0.02)
    nn.init.normal_(model.heads.head.bias, std=0.02)
    return model


# name -> (constructor, input shape). Batch 1; the batch dim is exported as symbolic.
MODELS = {
    "resnet18": (vision("resnet18"), (1, 3, 224, 224)),
    "resnet50": (vision("resnet50"), (1, 3, 224, 224)),
    "mobilenet_v2": (vision("mobilenet_v2"), (1, 3, 224, 224)),
    "mobilenet_v3_small": (vision("mobilenet_v3_small"), (1, 3, 224, 224)),
    "efficientnet_b0": (vision("efficientnet_b0"), (1, 3, 224, 224)),
    "squeezenet1_1": (vision("squeezenet1_1"), (1, 3, 224, 224)),
    "densenet121": (vision("densenet121"), (1, 3, 224, 224)),
    "mnist_cnn": (models.MnistCnn, (1, 1, 28, 28)),
    "bert_layer": (models.BertLayer, (1, 128, 768)),
    "transformer_encoder": (transformer_encoder, (1, 64, 256)),
    "vit_small": (vit_small, (1, 3, 224, 224)),
    "gpt2_block": (models.Gpt2Block, (1, 128)),  # Token ids: [batch, sequence] int64.
}

# Models whose input is integer token ids, and their vocabulary.
TOKEN_MODELS = {"gpt2_block": 32000}


def make_input(name, batch):
    """The seeded input of `name` at `batch`: uniform token ids below the vocabulary for the
    token models, standard normal floats for the others."""
    _, shape = MODELS[name]
    gen = torch.Generator().manual_seed(2)
    if name in TOKEN_MODELS:
        return torch.randint(0, TOKEN_MODELS[name], (batch, *shape[1:]), generator=gen)
    return torch.randn(batch, *shape[1:], generator=gen)


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
    x = make_input(name, shape[0])

    os.makedirs(out_dir, exist_ok=True)
    names = {"input_names": ["input"], "output_names": ["output"],
             "dynamic_axes": {"input": {0: "batch"}, "output": {0: "batch"}}}
    with torch.no_grad():
        expected = model(x)
        # PyTorch's default exporter; only the names and the symbolic batch are chosen here
        # (dynamic_axes, which it turns into torch.export dynamic shapes, with a warning).
        warnings.filterwarnings("ignore", message=".*'dynamic_axes' is not recommended")
        torch.onnx.export(model, (x,), os.path.join(out_dir, "model.onnx"), **names)
        torch.onnx.export(model, (x,), os.path.join(out_dir, "legacy.onnx"), dynamo=False,
                          opset_version=LEGACY_OPSET, **names)
    ref = expected.numpy()
    np.save(os.path.join(out_dir, "input.npy"), x.numpy())
    np.save(os.path.join(out_dir, "torch.npy"), ref)
    meta = {
        "model": name,
        "input_shape": list(shape),
        "output_shape": list(ref.shape),
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "onnx": onnx.__version__,
        "onnxruntime": ort.__version__,
        "max_abs_output": float(np.abs(ref).max()),
        "parameters": sum(p.numel() for p in model.parameters()),
    }
    for file, suffix in (("model.onnx", ""), ("legacy.onnx", "_legacy")):
        path = os.path.join(out_dir, file)
        onnx.checker.check_model(path)
        header = onnx.load(path, load_external_data=False)
        session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        (got,) = session.run(None, {"input": x.numpy()})
        np.save(os.path.join(out_dir, f"onnxruntime{suffix}.npy"), got)
        meta[f"opset{suffix}"] = next(o.version for o in header.opset_import if o.domain == "")
        meta[f"ir_version{suffix}"] = header.ir_version
        meta[f"max_abs_diff_torch_onnxruntime{suffix}"] = float(np.abs(ref - got).max())
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
        print(f"peers: {name}: exported in {time.time() - start:.1f} s (opset {meta['opset']} "
              f"and legacy {meta['opset_legacy']}), output {meta['output_shape']}, "
              f"max |torch - onnxruntime| {meta['max_abs_diff_torch_onnxruntime']:.3g} "
              f"(legacy {meta['max_abs_diff_torch_onnxruntime_legacy']:.3g}, max |out| "
              f"{meta['max_abs_output']:.3g})")


if __name__ == "__main__":
    main()
