"""The 1,797 handwritten digit scans bundled with scikit-learn (8x8, 16 grey levels, from the UCI
"Optical Recognition of Handwritten Digits" set) as an MNIST-format IDX dataset: each scan
resized to 20x20 (bilinear) and centred in 28x28 as MNIST's digits are, grey levels scaled to
0-255; a seeded permutation puts 1,500 in train-*-idx?-ubyte and 297 in t10k-*-idx?-ubyte.

    python tools/data/digits_to_idx.py OUT_DIR
"""

import os
import struct
import sys

import numpy as np
from scipy import ndimage
from sklearn.datasets import load_digits


def write_idx(path, array):
    array = np.ascontiguousarray(array, dtype=np.uint8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack(">BBBB", 0, 0, 0x08, array.ndim))
        for d in array.shape:
            f.write(struct.pack(">I", d))
        f.write(array.tobytes())
    os.replace(tmp, path)


def main(out):
    digits = load_digits()
    images = digits.images.astype(np.float64) / 16.0  # [1797, 8, 8] in [0, 1]
    big = np.stack([ndimage.zoom(im, 2.5, order=1) for im in images])  # [1797, 20, 20]
    canvas = np.zeros((len(images), 28, 28))
    canvas[:, 4:24, 4:24] = np.clip(big, 0, 1)
    pixels = np.round(canvas * 255).astype(np.uint8)
    labels = digits.target.astype(np.uint8)
    order = np.random.default_rng(0).permutation(len(images))
    train, test = order[:1500], order[1500:]
    os.makedirs(out, exist_ok=True)
    write_idx(os.path.join(out, "train-images-idx3-ubyte"), pixels[train])
    write_idx(os.path.join(out, "train-labels-idx1-ubyte"), labels[train])
    write_idx(os.path.join(out, "t10k-images-idx3-ubyte"), pixels[test])
    write_idx(os.path.join(out, "t10k-labels-idx1-ubyte"), labels[test])
    # The same split as a NumPy archive in Keras's mnist.npz layout (kiln train --data npz:).
    tmp = os.path.join(out, "digits.tmp.npz")
    # u8 images and u8 labels, as Keras's mnist.npz holds them.
    np.savez_compressed(tmp, x_train=pixels[train], y_train=labels[train],
                        x_test=pixels[test], y_test=labels[test])
    os.replace(tmp, os.path.join(out, "digits.npz"))
    print(f"{out}: {len(train)} training and {len(test)} validation digits, 28x28")


if __name__ == "__main__":
    main(sys.argv[1])
