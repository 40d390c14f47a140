// The x86-64 psABI's microarchitecture level x86-64-v3 in LLVM's feature names: what every
// machine of that level is guaranteed to have, written from the psABI (not from LLVM's tables,
// which the code under test uses), so that tests can check what a portable target records.
#pragma once

#include <algorithm>
#include <string>
#include <vector>

namespace kiln::test {

inline const std::vector<std::string>& x86_64V3Features() {
  static const std::vector<std::string> features = {
      // Baseline (x86-64) and x86-64-v2.
      "x87", "cx8", "fxsr", "mmx", "sse", "sse2", "cx16", "sahf", "popcnt", "sse3", "sse4.1",
      "sse4.2", "ssse3", "crc32",
      // x86-64-v3.
      "avx", "avx2", "bmi", "bmi2", "f16c", "fma", "lzcnt", "movbe", "xsave"};
  return features;
}

// The "+f" entries of a "+f,-g" list that x86-64-v3 does not guarantee (empty: portable).
inline std::vector<std::string> beyondX86_64V3(const std::string& list) {
  std::vector<std::string> extra;
  const auto& v3 = x86_64V3Features();
  for (size_t start = 0; start < list.size();) {
    size_t comma = list.find(',', start);
    if (comma == std::string::npos) comma = list.size();
    const std::string f = list.substr(start, comma - start);
    if (f.size() > 1 && f[0] == '+' && std::find(v3.begin(), v3.end(), f.substr(1)) == v3.end())
      extra.push_back(f);
    start = comma + 1;
  }
  return extra;
}

}  // namespace kiln::test
