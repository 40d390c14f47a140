// Wall-clock helpers shared by every layer (compile reports, plan statistics, the tools).
#pragma once

#include <chrono>

namespace kiln {

// Milliseconds from `from` to `to` (default: now), on the steady clock.
inline double msBetween(std::chrono::steady_clock::time_point from,
                        std::chrono::steady_clock::time_point to) {
  return std::chrono::duration<double, std::milli>(to - from).count();
}
inline double msSince(std::chrono::steady_clock::time_point from) {
  return msBetween(from, std::chrono::steady_clock::now());
}

}  // namespace kiln
