#!/usr/bin/env python3
"""Writes the ONNX backend node tests (the conformance suite inside the `onnx` package,
onnx.backend.test.case.node) as files kiln's conformance runner reads:

  OUT/<case>/model.onnx
  OUT/<case>/tolerance.txt                       "rtol atol"
  OUT/<case>/test_data_set_<k>/input_<i>.pb      TensorProto, graph-input order
  OUT/<case>/test_data_set_<k>/output_<i>.pb     TensorProto, graph-output order
  OUT/cases.txt                                  the tensor cases written, one per line
  OUT/skipped.txt                                "<case> <reason>": sequence, optional or
                                                 map values, which kiln has no form for

  python tools/onnx/gen_node_tests.py OUT
"""
import os
import pathlib
import sys
import warnings

import numpy as np
import onnx
from onnx import numpy_helper


def as_tensor(value, name):
    """A TensorProto for a tensor value, or None for a sequence, optional or map."""
    if isinstance(value, onnx.TensorProto):
        t = onnx.TensorProto()
        t.CopyFrom(value)
        t.name = name
        return t
    if isinstance(value, (np.ndarray, np.generic)):
        return numpy_helper.from_array(np.asarray(value), name)
    return None


def main() -> None:
    out = pathlib.Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from onnx.backend.test.case import node

        cases = node.collect_testcases(None)
    written, skipped = [], []
    for case in sorted(cases, key=lambda c: c.name):
        sets = []
        reason = ""
        for inputs, outputs in case.data_sets or []:
            ins = [as_tensor(v, f"input_{i}") for i, v in enumerate(inputs)]
            outs = [as_tensor(v, f"output_{i}") for i, v in enumerate(outputs)]
            if any(t is None for t in ins + outs):
                reason = "a sequence, optional or map value"
                break
            sets.append((ins, outs))
        if not sets and not reason:
            reason = "no data sets"
        if reason:
            skipped.append(f"{case.name} {reason}")
            continue
        d = out / case.name
        d.mkdir(exist_ok=True)
        (d / "model.onnx").write_bytes(case.model.SerializeToString())
        (d / "tolerance.txt").write_text(f"{case.rtol!r} {case.atol!r}\n")
        for k, (ins, outs) in enumerate(sets):
            s = d / f"test_data_set_{k}"
            s.mkdir(exist_ok=True)
            for i, t in enumerate(ins):
                (s / f"input_{i}.pb").write_bytes(t.SerializeToString())
            for i, t in enumerate(outs):
                (s / f"output_{i}.pb").write_bytes(t.SerializeToString())
        written.append(case.name)
    (out / "cases.txt").write_text("\n".join(written) + "\n")
    (out / "skipped.txt").write_text("\n".join(skipped) + ("\n" if skipped else ""))
    print(f"onnx {onnx.__version__}: {len(written)} tensor cases written to {out}, "
          f"{len(skipped)} skipped (skipped.txt)")


if __name__ == "__main__":
    main()
