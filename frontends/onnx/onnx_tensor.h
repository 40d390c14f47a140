// ONNX tensors and types to kiln's: element types, TensorProto data (raw_data, typed fields and
// external-data files, every size checked before anything is allocated) and value types.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "frontends/onnx/onnx_proto.h"
#include "ir/tensor_data.h"

namespace kiln::frontends::onnx_import {

// kiln's dtype for an ONNX TensorProto::DataType, or nullopt when kiln has none (uint16,
// string, complex, ...).
std::optional<ir::DType> dtypeFromOnnx(int32_t elemType);
// The ONNX element type of a kiln dtype (dtypeFromOnnx's inverse), 0 (UNDEFINED) for none.
int32_t onnxElemTypeOf(ir::DType dtype);
// "FLOAT", "UINT16", ...: how error messages name an ONNX element type.
std::string onnxTypeName(int32_t elemType);

// Checks an external-data tensor's entries against the file they name, relative to `modelDir`:
// the location must stay inside the model's directory, the file must exist, and offset and
// length must lie within it and hold exactly the tensor's bytes. Rewrites the entries to the
// resolved path and explicit offset and length (so that the ONNX checker, which looks the file
// up relative to the working directory, finds it, and tensorFromProto reads it).
Status resolveExternalData(::onnx::TensorProto& tensor, const std::string& modelDir,
                           const std::string& what);

// Checks, allocating nothing, that a tensor proto's element type is one kiln reads and that its
// data (raw_data or the typed field) holds exactly what its dims need; external data is
// checked by resolveExternalData. The importer runs this on every tensor before libonnx's
// checker and shape inference, which read tensor data without such checks.
Status checkTensorData(const ::onnx::TensorProto& tensor, const std::string& what);

// The data of a tensor proto (which must have passed resolveExternalData when external).
// `what` names the tensor in errors ("initializer 'conv1.weight'").
Expected<ir::TensorData> tensorFromProto(const ::onnx::TensorProto& tensor,
                                         const std::string& what);

}  // namespace kiln::frontends::onnx_import
