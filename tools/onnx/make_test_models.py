"""Writes the small ONNX models in tests/data/onnx/:
- make_model_ir14.onnx: a model as onnx 1.23's `helper.make_model` writes it by default (IR
  version 14, the newest opset it knows), for kiln's import test
  (tests/frontends/test_onnx_versions.cpp). y = Gelu(x @ w + b) over x: [2, 3], with w and b
  initializers, and a node with metadata_props (a field libonnx 1.12 does not know).
- masked_select.onnx: y = x[x > 0] and z = y[y > 0.5] (NonZero, then Compress) over x: [N, 4],
  for `kiln run` of a model in stages (tests/cli/cli_tests.sh).
- token_embedding.onnx: integer and boolean graph inputs, for `kiln run`/`kiln bench` without
  --input (tests/cli/cli_tests.sh): y = Where(mask, table[ids], 0) with ids int64 [2, 3] in
  [0, 10) and mask bool [2, 3].

  ~/.cache/kiln/onnx-venv-*/bin/python tools/onnx/make_test_models.py
"""
import os

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

w = np.array([[0.5, -1.0], [0.25, 2.0], [-0.75, 0.125]], dtype=np.float32)
b = np.array([0.1, -0.2], dtype=np.float32)
mm = helper.make_node("MatMul", ["x", "w"], ["xw"], name="matmul")
mm.metadata_props.add(key="source", value="make_ir14_model.py")
graph = helper.make_graph(
    [mm,
     helper.make_node("Add", ["xw", "b"], ["pre"], name="add"),
     helper.make_node("Gelu", ["pre"], ["y"], name="gelu")],
    "make_model_ir14",
    [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
    [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 2])],
    initializer=[numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")],
    doc_string="written by onnx.helper.make_model with its defaults")
model = helper.make_model(graph)
assert model.ir_version == onnx.IR_VERSION, model.ir_version
onnx.checker.check_model(model)
data = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "data", "onnx")
onnx.save(model, os.path.join(data, "make_model_ir14.onnx"))
print(f"wrote make_model_ir14.onnx: IR {model.ir_version}, opset {model.opset_import[0].version}")

table = np.arange(40, dtype=np.float32).reshape(10, 4) / 8
graph = helper.make_graph(
    [helper.make_node("Gather", ["table", "ids"], ["rows"], name="embed"),
     helper.make_node("Unsqueeze", ["mask", "last"], ["mask3"], name="unsqueeze"),
     helper.make_node("Where", ["mask3", "rows", "zero"], ["y"], name="where")],
    "token_embedding",
    [helper.make_tensor_value_info("ids", TensorProto.INT64, [2, 3]),
     helper.make_tensor_value_info("mask", TensorProto.BOOL, [2, 3])],
    [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, 4])],
    initializer=[numpy_helper.from_array(table, "table"),
                 numpy_helper.from_array(np.array([-1], dtype=np.int64), "last"),
                 numpy_helper.from_array(np.array(0, dtype=np.float32), "zero")])
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
onnx.checker.check_model(model)
onnx.save(model, os.path.join(data, "token_embedding.onnx"))
print("wrote token_embedding.onnx")

graph = helper.make_graph(
    [helper.make_node("Greater", ["x", "zero"], ["positive"], name="positive"),
     helper.make_node("NonZero", ["positive"], ["where"], name="nonzero"),
     helper.make_node("Transpose", ["where"], ["coords"], name="coords"),
     helper.make_node("GatherND", ["x", "coords"], ["y"], name="select"),
     helper.make_node("Greater", ["y", "half"], ["big"], name="big"),
     helper.make_node("Compress", ["y", "big"], ["z"], axis=0, name="compress")],
    "masked_select",
    [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
    [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["count"]),
     helper.make_tensor_value_info("z", TensorProto.FLOAT, ["big_count"])],
    initializer=[numpy_helper.from_array(np.array(0, dtype=np.float32), "zero"),
                 numpy_helper.from_array(np.array(0.5, dtype=np.float32), "half")])
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
onnx.checker.check_model(model)
onnx.save(model, os.path.join(data, "masked_select.onnx"))
print("wrote masked_select.onnx")
