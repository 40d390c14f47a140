"""Records PyTorch's optimizers for kiln's optimizer peer checks (tests/peers/train_check.cpp):
mnist_cnn trained 5 steps from train_export.py's initial weights and batches, with
  adamw     torch.optim.AdamW(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
  nesterov  torch.optim.SGD(lr=0.01, momentum=0.9, nesterov=True, weight_decay=5e-4)
into OUT/train_mnist_cnn_<variant>/ (the layout of train_export.py, meta.json naming the zoo
model and the optimizer). Each folder keeps the hash of this script and is made again when it
changes, so the exports' key (tools/peers/env.sh) need not include it.

Usage: python optim_export.py OUT
"""
import hashlib
import json
import os
import sys

import numpy as np
import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train_export as te  # noqa: E402

VARIANTS = {
    "adamw": {"kind": "adamw", "lr": 1e-3, "betas": [0.9, 0.999], "eps": 1e-8,
              "weight_decay": 0.01},
    "nesterov": {"kind": "sgd", "lr": 0.01, "momentum": 0.9, "nesterov": True,
                 "weight_decay": 5e-4},
}


def optimizer(params, o):
    if o["kind"] == "adamw":
        return torch.optim.AdamW(params, lr=o["lr"], betas=tuple(o["betas"]), eps=o["eps"],
                                 weight_decay=o["weight_decay"])
    return torch.optim.SGD(params, lr=o["lr"], momentum=o["momentum"], nesterov=o["nesterov"],
                           weight_decay=o["weight_decay"])


def train(model, data, o):
    """The steps; returns the losses and the smallest |input| of an nn.ReLU module seen."""
    opt = optimizer(model.parameters(), o)
    loss_fn = nn.CrossEntropyLoss()
    losses, margin = [], [float("inf")]
    for m in model.modules():
        if isinstance(m, nn.ReLU):
            m.register_forward_pre_hook(
                lambda mod, inp: margin.__setitem__(0, min(margin[0], inp[0].abs().min().item())))
    for x, y in data:
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, margin[0]


def export(out, name, variant, sha):
    d = os.path.join(out, f"train_{name}_{variant}")
    meta_path = os.path.join(d, "meta.json")
    if os.path.exists(meta_path):
        with open(meta_path) as f:
            if json.load(f).get("script_sha") == sha:
                print(f"peers: train_{name}_{variant}: present")
                return
    for sub in ("init", "final"):
        os.makedirs(os.path.join(d, sub), exist_ok=True)
    _, b, s, _, _ = te.MODELS[name]
    o = VARIANTS[variant]
    # Batches drawn (seed 1, 2, ...) until every nn.ReLU input stays te.RELU_MARGIN from 0, as
    # train_export.py draws them: a kink within rounding would flip either way.
    for seed in range(1, 201):
        model = te.build(name)
        init = te.state(model)
        data = te.batches(name, te.STEPS, seed=seed)
        losses, margin = train(model, data, o)
        if margin >= te.RELU_MARGIN:
            break
    else:
        sys.exit(f"peers: train_{name}_{variant}: no batch seed keeps the ReLU inputs away from 0")
    for k, v in init.items():
        np.save(os.path.join(d, "init", k + ".npy"), v)
    for i, (x, y) in enumerate(data):
        np.save(os.path.join(d, f"x{i}.npy"), x.numpy())
        np.save(os.path.join(d, f"y{i}.npy"), y.numpy().astype(np.int64))
    for k, v in te.state(model).items():
        np.save(os.path.join(d, "final", k + ".npy"), v)
    meta = {"model": name, "steps": te.STEPS, "batch": b, "image": s, "optimizer": o,
            "losses": losses, "batch_seed": seed, "torch": torch.__version__, "script_sha": sha}
    with open(meta_path, "w") as f:
        json.dump(meta, f, indent=1)
    print(f"peers: train_{name}_{variant}: {te.STEPS} steps, losses "
          f"{['%.4f' % l for l in losses]}")


def main():
    out = sys.argv[1]
    with open(os.path.abspath(__file__), "rb") as f:
        sha = hashlib.sha256(f.read()).hexdigest()[:16]
    torch.set_num_threads(int(os.environ.get("KILN_THREADS", os.cpu_count() or 1)))
    for variant in VARIANTS:
        export(out, "mnist_cnn", variant, sha)


if __name__ == "__main__":
    main()
