# Roofline prediction of kiln's CUDA plan for resnet50 (fp32, no TF32) on an H100 SXM5, per
# layer group, for comparing the first real run of scripts/gpu-check.sh against:
#   python3 tools/gpu/predict_resnet50.py
# Each convolution: 2*N*K*P*Q*C*R*S FLOPs and its input, filters and output once from HBM. Its
# bias, ReLU and the block's residual add are the cuDNN call's epilogue (fused: the residual is
# read once more, nothing else moves); with --unfused, what kiln does where cuDNN's fused ReLU
# fails the NaN check (or before epilogues existed): the ReLUs and add+ReLU read and write their
# activations once more, as separate steps. Time = max(compute, memory) + a per-step floor under
# CUDA-graph replay.
# --tf32: kiln's --precision tf32, the convolutions on TF32 tensor cores (dense peak), NHWC.
# --bf16: kiln's --precision bf16 (autocast): convolutions on BF16 tensor cores, NHWC, every
# activation and weight moving as 2 bytes (the ReLUs and residual adds stay bf16 and are the
# convolutions' epilogues); the input's cast, the pool and the classifier's casts are 4 small
# generated kernels.
import sys
UNFUSED = "--unfused" in sys.argv
TF32 = "--tf32" in sys.argv
BF16 = "--bf16" in sys.argv
PEAK_FP32 = 67e12      # FP32 FMA (non-tensor) FLOP/s, H100 SXM5 datasheet
PEAK_TF32 = 494.7e12   # TF32 tensor-core FLOP/s, dense, same datasheet
PEAK_BF16 = 989.4e12   # BF16 tensor-core FLOP/s, dense, same datasheet
PEAK = PEAK_BF16 if BF16 else PEAK_TF32 if TF32 else PEAK_FP32
E = 2 if BF16 else 4   # bytes per element
HBM = 3.35e12          # bytes/s
EFF_C, EFF_M = 0.70, 0.80   # achievable fractions assumed for cuDNN fp32 convs and streaming kernels
LAUNCH = 2.5e-6        # per step floor with CUDA-graph replay (kernel ~2-3 us minimum on Hopper)
def conv(n, c, h, k, r, stride):
    p = (h + 2 * (r // 2) - r) // stride + 1
    flops = 2 * n * k * p * p * c * r * r
    byts = E * (n * c * h * h + k * c * r * r + n * k * p * p + k)
    return flops, byts, p
def rows(n):
    out = []  # (name, count, flops, bytes, elementwise bytes after it)
    f, b, p = conv(n, 3, 224, 64, 7, 2); out.append(("conv1 7x7/2 3->64 @224", 1, f, b, 0 if not UNFUSED else 2 * E * n * 64 * p * p))
    out.append(("maxpool 3x3/2 @112", 1, 0, E * n * 64 * (112 * 112 + 56 * 56), 0))
    h, cin = 56, 64
    for stage, (w, blocks) in enumerate([(64, 3), (128, 4), (256, 6), (512, 3)]):
        cout = 4 * w
        for bi in range(blocks):
            s = 2 if (bi == 0 and stage > 0) else 1
            f1, b1, _ = conv(n, cin, h, w, 1, 1)
            f2, b2, p2 = conv(n, w, h, w, 3, s)
            f3, b3, _ = conv(n, w, p2, cout, 1, 1)
            ew = E * n * (2 * w * h * h + 2 * w * p2 * p2 + 3 * cout * p2 * p2)  # relu, relu, add+relu
            if not UNFUSED:
                b3 += E * n * cout * p2 * p2  # The residual, read by the last conv's epilogue.
                ew = 0
            fd = bd = 0
            if bi == 0:
                fd, bd, _ = conv(n, cin, h, cout, 1, s)
            key = f"layer{stage+1} {'first' if bi == 0 else 'rest'} (1x1 {cin}->{w}, 3x3/{s} {w}, 1x1 ->{cout}{', downsample' if bi == 0 else ''}) @{h}"
            out.append((key, 1, f1 + f2 + f3 + fd, b1 + b2 + b3 + bd, ew))
            cin, h = cout, p2
    out.append(("global avg pool + fc 2048->1000", 1, 2 * n * 2048 * 1000, E * (n * 2048 * 49 + 2048 * 1000 + n * 1000), 0))
    if BF16:  # The input cast (f32 in, bf16 NHWC out) and the output's cast back to f32.
        out.append(("input and output casts", 1, 0, 6 * n * 3 * 224 * 224 + 6 * n * 1000, 0))
    return out
for n in (1, 32):
    merged = {}
    for name, c, f, b, e in rows(n):
        m = merged.setdefault(name, [0, 0, 0, 0]); m[0] += c; m[1] += f; m[2] += b; m[3] += e
    total = tf = tb = 0
    print(f"\nresnet50 batch {n}: layer | blocks | GFLOP | MB (library) | MB (generated) | compute us | memory us | predicted us")
    for name, (c, f, b, e) in merged.items():
        tc = f / (PEAK * EFF_C); tm = (b + e) / (HBM * EFF_M)
        steps = 1 if f == 0 else (4 if 'first' in name else 3) * c + (3 * c if UNFUSED else 0)
        if name.startswith("global") and BF16: steps = 3  # Pool kernel, flatten+cast, linear.
        t = max(tc, tm) + steps * LAUNCH
        total += t; tf += f; tb += b + e
        print(f"| {name} | {c} | {f/1e9:.2f} | {b/1e6:.1f} | {e/1e6:.1f} | {tc*1e6:.0f} | {tm*1e6:.0f} | {t*1e6:.0f} |")
    print(f"total ({'unfused' if UNFUSED else 'fused'} epilogues, {'bf16' if BF16 else 'tf32' if TF32 else 'fp32'}): {tf/1e9:.1f} GFLOP, {tb/1e6:.0f} MB, predicted {total*1e3:.2f} ms ({tf/total/1e12:.1f} TFLOP/s)")
