// The word of a device index check (runtime::IndexWord, runtime/plan.h): a kernel that reads an
// index out of range atomically lowers it (atomicMin, unsigned) to the report encode() gives: the
// index's flat position in bits 63..33 (saturated at kMaxPosition), bit 32 set when the value lies
// outside int32's range, and the value clamped to that range and biased by 2^31 in bits 31..0;
// so the lowest position wins, and one value that position read. kClear (all bits set) means
// none was. The definition both sides use: the runtime decodes the words with these, and the
// kernels' kiln_report_index (codegen/prelude.cpp) is printed from them in CUDA C.
#pragma once

#include <algorithm>
#include <cstdint>

namespace kiln::ir::index_word {

inline constexpr uint64_t kClear = ~uint64_t{0};
inline constexpr int kPositionShift = 33;
inline constexpr int kOutsideInt32Bit = 32;
inline constexpr int64_t kValueBias = int64_t{1} << 31;
inline constexpr int64_t kMaxPosition = (int64_t{1} << 31) - 2;
inline constexpr int64_t kMinValue = INT32_MIN, kMaxValue = INT32_MAX;

constexpr uint64_t encode(int64_t position, int64_t value) {
  const auto p = static_cast<uint64_t>(std::clamp<int64_t>(position, 0, kMaxPosition));
  const int64_t v = std::clamp<int64_t>(value, kMinValue, kMaxValue);
  return p << kPositionShift | uint64_t{v != value} << kOutsideInt32Bit |
         static_cast<uint64_t>(v + kValueBias);
}

}  // namespace kiln::ir::index_word
