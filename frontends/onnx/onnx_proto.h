// The ONNX protobuf classes (namespace ::onnx). Debian's CMake targets `onnx` and `onnx_proto`
// define ONNX_ML=1 for their users; files built without those targets (the tests, which build
// models through the protobuf API) get the same header through this one.
#pragma once

#ifndef ONNX_ML
#define ONNX_ML 1
#endif
#include <onnx/onnx_pb.h>
