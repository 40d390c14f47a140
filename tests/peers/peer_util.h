// Shared by the peer checks (peer_check.cpp, train_check.cpp): where the exports live, how a
// failure is reported, and the relative error they compare with.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "ir/tensor_data.h"

namespace kiln::peers {

inline constexpr int kSkip = 77;  // ctest's SKIP_RETURN_CODE.

// The exports' folder: $KILN_PEERS_DIR, which ctest sets through tools/peers/with-env.sh (the
// folder is keyed by the peer pins, tools/peers/env.sh); empty when unset.
inline std::filesystem::path peersRoot() {
  const char* env = std::getenv("KILN_PEERS_DIR");
  return env && *env ? std::filesystem::path(env) : std::filesystem::path();
}

// Why a check is skipped when a file it needs is absent.
inline int skipMissing(const std::filesystem::path& root, const std::filesystem::path& file) {
  if (root.empty())
    std::printf(
        "peer: skipped: KILN_PEERS_DIR is not set (run through ctest, or set it to the output "
        "of tools/peers/setup.sh --print-dir)\n");
  else
    std::printf(
        "peer: skipped: %s not found. The peer exports come from tools/peers/setup.sh (a "
        "Python venv with PyTorch and ONNX Runtime from PyPI, under ~/.cache/kiln).\n",
        file.c_str());
  return kSkip;
}

inline int fail(const std::string& what, const Status& st) {
  std::fprintf(stderr, "peer: %s: %s\n", what.c_str(), st.message().c_str());
  return 1;
}

// max |got - ref| / max |ref| over f32 tensors; +inf when the shapes or dtypes differ or a
// difference is NaN.
inline double relativeError(const ir::TensorData& got, const ir::TensorData& ref) {
  if (got.shape() != ref.shape() || ref.dtype() != ir::DType::kF32 ||
      got.dtype() != ir::DType::kF32)
    return INFINITY;
  double scale = 0, diff = 0;
  for (int64_t i = 0; i < ref.numElements(); ++i) {
    scale = std::max(scale, std::fabs(static_cast<double>(ref.as<float>()[i])));
    const double d = std::fabs(static_cast<double>(got.as<float>()[i]) - ref.as<float>()[i]);
    diff = std::isnan(d) ? INFINITY : std::max(diff, d);
  }
  return diff / std::max(scale, 1e-30);
}

}  // namespace kiln::peers
