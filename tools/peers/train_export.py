"""Records PyTorch eager CPU training for kiln's training peer checks (tests/peers/
train_check.cpp): the same model, initial weights and batches, and the parameters after a few
SGD steps, plus PyTorch's training throughput.

For each model it writes OUT/train_<name>/:
  init/<param>.npy    every parameter and buffer before training (PyTorch names, float32)
  step1_f64/<param>.npy
                      its change in the first step computed in float64 (the model and batch
                      in double precision: the reference for the first step's gradients)
  final/<param>.npy   every parameter and buffer after the steps
  x<i>.npy, y<i>.npy  batch i (float32 images, int64 class labels)
  meta.json           steps, batch, image size, optimizer settings, versions, and
                      first_step_f32_error: per tensor, how far PyTorch's own float32 first step
                      is from the float64 one (max |difference| / max |f64 change|), the
                      furthest of its four summation orders (f32_variants) for ONE_STEP's
                      ill-conditioned model

Training mode as kiln's peer check runs it: BatchNorm in train() (batch statistics, running
statistics updated with momentum 0.1), dropout off (its random masks cannot be matched), SGD
with momentum, cross-entropy loss.

Usage: python train_export.py OUT [--only name,name] [--force]
       python train_export.py --bench NAME --batch B [--image S] [--steps N]  (throughput only)
"""
import argparse
import json
import os
import sys
import time

import numpy as np
import torch
import torchvision
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import models  # noqa: E402

MOMENTUM, STEPS = 0.9, 5

# name -> (constructor, batch, image size, channels, learning rate).
MODELS = {
    "mnist_cnn": (models.MnistCnn, 16, 28, 1, 0.01),
    "resnet18": (lambda: torchvision.models.resnet18(weights=None), 4, 64, 3, 0.001),
    "resnet50": (lambda: torchvision.models.resnet50(weights=None), 4, 64, 3, 0.001),
}

# resnet50 at batch 4 and 64x64 is ill-conditioned: its BatchNorms in layer3 and layer4
# normalize 64 and 16 values per channel, and PyTorch's own float32 gradient of
# layer3.2.conv1.weight is 0.31 of its size away from the float64 one (torch 2.15, AMD Zen 3).
# Its steps compound that into noise, so it records one step, judged by the float64 step; and
# as its ReLUs see about 8 million inputs a step, no batch seed keeps them all RELU_MARGIN from 0
# (a flip moves one input's share of a gradient, far less than that float32 noise).
ONE_STEP = {"resnet50"}


def steps_of(name):
    return 1 if name in ONE_STEP else STEPS


def build(name):
    torch.manual_seed(0)
    model = MODELS[name][0]()
    model.train()
    for m in model.modules():
        if isinstance(m, nn.Dropout):
            m.eval()  # Dropout off; BatchNorm stays in training mode.
    return model


# A ReLU input within f32 rounding of 0 lands on either side in two correct implementations,
# and the gradient sums behind it (BatchNorm biases, whose terms nearly cancel) move by percents.
# As a finite-difference check keeps off kinks, the recorded batches are drawn (seed 1, 2, ...)
# until every nn.ReLU input in the steps is at least this far from 0.
RELU_MARGIN = 1e-6


def batches(name, steps, batch=None, image=None, seed=1):
    _, b, s, c, _ = MODELS[name]
    b, s = batch or b, image or s
    g = torch.Generator().manual_seed(seed)
    return [(torch.rand((b, c, s, s), generator=g) * 2 - 1,
             torch.randint(0, 10, (b,), generator=g)) for _ in range(steps)]


def state(model):
    # Parameters and buffers, by PyTorch name; the batch counters are not kiln state.
    return {k: v.detach().numpy().astype(np.float32).copy()
            for k, v in model.state_dict().items() if not k.endswith("num_batches_tracked")}


def train(model, data, lr, first=None):
    """SGD steps; returns the losses and the smallest |input| of an nn.ReLU module seen, and
    fills `first` (a dict) with the state after the first step."""
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=MOMENTUM)
    loss_fn = nn.CrossEntropyLoss()
    losses = []
    margin = [float("inf")]

    def watch(mod, inp):
        margin[0] = min(margin[0], inp[0].detach().abs().min().item())

    for m in model.modules():
        if isinstance(m, nn.ReLU):
            m.register_forward_pre_hook(watch)
    for x, y in data:
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if first is not None and len(losses) == 1:
            first.update(state(model))
    return losses, margin[0]


def bench(name, batch, image, steps):
    """Median samples/s of PyTorch eager CPU training steps (after 2 warm-up steps), and how
    far the process's peak resident memory rose above what the model and a batch took before
    the first step (activations, gradients, optimizer state: an upper bound on PyTorch's
    training memory, as the allocator's high-water mark is not exposed on the CPU)."""
    import resource
    model = build(name)
    data = batches(name, 1, batch, image)
    opt = torch.optim.SGD(model.parameters(), lr=MODELS[name][4], momentum=MOMENTUM)
    loss_fn = nn.CrossEntropyLoss()
    base_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    times = []
    for i in range(steps + 2):
        t = time.perf_counter()
        opt.zero_grad()
        loss_fn(model(data[0][0]), data[0][1]).backward()
        opt.step()
        if i >= 2:
            times.append(time.perf_counter() - t)
    med = float(np.median(times))
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"model": name, "batch": batch, "image": image, "steps": steps,
            "median_step_ms": med * 1e3, "samples_per_s": batch / med,
            "peak_rss_increase_bytes": (peak_kb - base_kb) * 1024,
            "threads": torch.get_num_threads()}


def change(first, init):
    """Every tensor's change in the first step (train()'s `first` minus the state before it)."""
    return {k: first[k].astype(np.float64) - init[k] for k in first}


def first_step_f64(name, x, y, lr):
    """PyTorch's first step in float64 from build(name)'s weights on batch (x, y): every
    parameter's and buffer's change, by name."""
    model = build(name).double()
    before = {k: v.detach().clone() for k, v in model.state_dict().items()
              if not k.endswith("num_batches_tracked")}
    train(model, [(x.double(), y)], lr)
    return {k: model.state_dict()[k].detach() - v for k, v in before.items()}


def f32_variants(name, x, y, lr):
    """PyTorch's float32 first step from build(name)'s weights on batch (x, y) in its other
    summation orders: at 1 thread, and channels-last at 1 thread and at the default thread
    count (the default-thread contiguous step is train()'s own). An ill-conditioned model's
    step lands differently in each (resnet50 at batch 4, 64x64, on an Intel Xeon with AVX-512:
    layer3.2.conv1.weight 0.0078 of its f64 update at 2 threads, 0.313 at 1 thread, 0.023
    channels-last), so no single one of them bounds what a correct f32 step may give."""
    threads = torch.get_num_threads()
    out = []
    try:
        for t, cl in ((1, False), (1, True), (threads, True)):
            torch.set_num_threads(t)
            model = build(name)
            init = state(model)
            xv = x.contiguous(memory_format=torch.channels_last) if cl else x
            if cl:
                model = model.to(memory_format=torch.channels_last)
            first = {}
            train(model, [(xv, y)], lr, first)
            out.append(change(first, init))
    finally:
        torch.set_num_threads(threads)
    return out


def export(name, out, force):
    d = os.path.join(out, "train_" + name)
    if os.path.exists(os.path.join(d, "meta.json")) and not force:
        print(f"peers: train_{name}: present (--force to export again)")
        return
    for sub in ("init", "step1_f64", "final"):
        os.makedirs(os.path.join(d, sub), exist_ok=True)
    _, b, s, _, lr = MODELS[name]
    steps = steps_of(name)
    for seed in range(1, 201):
        model = build(name)
        init = state(model)
        data = batches(name, steps, seed=seed)
        first = {}
        losses, margin = train(model, data, lr, first)
        if margin >= RELU_MARGIN or name in ONE_STEP:
            break
    else:
        sys.exit(f"peers: train_{name}: no batch seed in 1..200 keeps the ReLU inputs "
                 f"{RELU_MARGIN} from 0")
    for k, v in init.items():
        np.save(os.path.join(d, "init", k + ".npy"), v)
    for i, (x, y) in enumerate(data):
        np.save(os.path.join(d, f"x{i}.npy"), x.numpy())
        np.save(os.path.join(d, f"y{i}.npy"), y.numpy().astype(np.int64))
    f32_error = {}
    variants = [change(first, init)]
    if name in ONE_STEP:  # The ill-conditioned model; the others' one order is their bound.
        variants += f32_variants(name, *data[0], lr)
    for k, u in first_step_f64(name, *data[0], lr).items():
        ref = u.numpy()
        np.save(os.path.join(d, "step1_f64", k + ".npy"), ref.astype(np.float32))
        f32_error[k] = max(float(np.abs(v[k] - ref).max() / max(np.abs(ref).max(), 1e-30))
                           for v in variants)
    for k, v in state(model).items():
        np.save(os.path.join(d, "final", k + ".npy"), v)
    meta = {"model": name, "steps": steps, "batch": b, "image": s, "lr": lr, "momentum": MOMENTUM,
            "losses": losses, "batch_seed": seed, "first_step_f32_error": f32_error,
            "min_abs_relu_input": margin if margin != float("inf") else None, "torch": torch.__version__}
    with open(os.path.join(d, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1)
    worst = max(f32_error, key=f32_error.get)
    print(f"peers: train_{name}: {steps} SGD steps, losses {['%.4f' % l for l in losses]}, "
          f"batch seed {seed}, min |nn.ReLU input| {margin:.3g}; PyTorch's f32 first step within "
          f"{f32_error[worst]:.3g} of the f64 one ({worst})")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out", nargs="?")
    p.add_argument("--only", default="")
    p.add_argument("--force", action="store_true")
    p.add_argument("--bench")
    p.add_argument("--batch", type=int)
    p.add_argument("--image", type=int)
    p.add_argument("--steps", type=int, default=10)
    a = p.parse_args()
    torch.set_num_threads(int(os.environ.get("KILN_THREADS", os.cpu_count() or 1)))
    if a.bench:
        print(json.dumps(bench(a.bench, a.batch or MODELS[a.bench][1], a.image or MODELS[a.bench][2],
                               a.steps)))
        return
    if not a.out:
        p.error("OUT is required")
    # --only names the models of export.py too: those without a training reference are skipped.
    only = [n for n in a.only.split(",") if n]
    names = [n for n in only if n in MODELS] if only else list(MODELS)
    for n in names:
        export(n, a.out, a.force)


if __name__ == "__main__":
    main()
