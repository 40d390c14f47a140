// Short constructors of attribute values for the IR tests: I(3), F(0.5), S("tanh"),
// Is({1, 2}), Fs({0.5}).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "ir/attributes.h"

namespace kiln::ir::testing {

inline AttrValue I(int64_t v) {
  return AttrValue(v);
}
inline AttrValue F(double v) {
  return AttrValue(v);
}
inline AttrValue S(std::string v) {
  return AttrValue(std::move(v));
}
inline AttrValue Is(std::vector<int64_t> v) {
  return AttrValue(std::move(v));
}
inline AttrValue Fs(std::vector<double> v) {
  return AttrValue(std::move(v));
}

}  // namespace kiln::ir::testing
