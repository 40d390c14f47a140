#!/usr/bin/env python3
"""ONNX Runtime on the same backend node tests kiln's conformance runner reads (written by
gen_node_tests.py), compared the same way (numpy.testing.assert_allclose at each case's
rtol/atol): the peer figure for kiln's count. A benchmark-style comparison, not a test.

  ~/.cache/kiln/peers-venv-*/bin/python tools/onnx/ort_conformance.py CASES
"""
import pathlib
import sys
import warnings

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper


def load(path):
    t = onnx.TensorProto()
    t.ParseFromString(path.read_bytes())
    return numpy_helper.to_array(t)


def run_case(d):
    rtol, atol = (float(x) for x in (d / "tolerance.txt").read_text().split())
    so = ort.SessionOptions()
    so.log_severity_level = 4
    sess = ort.InferenceSession(str(d / "model.onnx"), so, providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]
    k = 0
    while (d / f"test_data_set_{k}").exists():
        s = d / f"test_data_set_{k}"
        ins = sorted(s.glob("input_*.pb"), key=lambda p: int(p.stem.split("_")[1]))
        outs = sorted(s.glob("output_*.pb"), key=lambda p: int(p.stem.split("_")[1]))
        feeds = {n: load(p) for n, p in zip(names, ins)}
        got = sess.run(None, feeds)
        for g, p in zip(got, outs):
            w = load(p)
            if w.dtype == object or g.dtype == object:
                assert list(np.ravel(g)) == list(np.ravel(w))
            else:
                np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)
        k += 1


def main():
    cases = pathlib.Path(sys.argv[1])
    names = (cases / "cases.txt").read_text().split()
    passed = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for n in names:
            try:
                run_case(cases / n)
                passed += 1
            except Exception:  # noqa: BLE001 - every failure counts the same here
                pass
    print(f"onnxruntime {ort.__version__}: {passed} of {len(names)} cases pass")


if __name__ == "__main__":
    main()
