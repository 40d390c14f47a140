// Static memory planning for compiled models: assigns every intermediate buffer of a linear
// schedule an offset into one arena, and checks such plans independently.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "ir/status.h"

namespace kiln::compiler {

// One intermediate buffer of a compiled plan. Steps index the linear schedule; a buffer is
// written by step `firstStep` and last read by step `lastStep` (inclusive; lastStep >= firstStep).
struct BufferRequest {
  int64_t bytes = 0;
  int firstStep = 0;
  int lastStep = 0;
  // When >= 0: this buffer may reuse the memory of buffer `inplaceOf` (a pointwise op writing its
  // output over an input that dies at this op). Honoured only when the hint is legal: inplaceOf
  // names another valid request, requests[inplaceOf].lastStep == firstStep and
  // bytes <= requests[inplaceOf].bytes. The planner also ignores a legal hint when honouring it
  // would make two buffers that are live together share memory: a buffer is taken over in place
  // by at most one other buffer, and a one-step buffer (firstStep == lastStep) cannot both take
  // over another buffer and be taken over itself. Conflicts are settled in request order.
  int inplaceOf = -1;
};

struct MemoryPlan {
  std::vector<int64_t> offsets;  // Per request, into one arena; multiples of the alignment.
  int64_t arenaBytes = 0;        // The arena size.
  int64_t lowerBound = 0;        // Max over steps of the sum of (aligned) bytes live at that step,
                                 // counting an honoured in-place pair once at its hand-off step.
  int inplaceReuses = 0;         // How many in-place hints were honoured.
};

// Every buffer's size is rounded up to `alignment`. Zero-byte buffers occupy nothing; they get
// offset 0, or their in-place partner's offset.
//
// planMemory never fails and never crashes on bad input; it plans what it can:
// - an alignment < 1 is treated as 1;
// - a request with negative bytes is planned as a zero-byte buffer, and one with
//   lastStep < firstStep as live only at firstStep; in-place hints from or onto such a request
//   are ignored. validateBufferRequests (and so checkMemoryPlan) reports these requests as
//   invalid arguments, so callers that validate first never see a plan for them;
// - offsets and arena sizes that would overflow int64 saturate, and checkMemoryPlan reports the
//   buffers that do not fit.
//
// Algorithm: honoured in-place hints link buffers into chains; a chain is placed as one block at
// one offset, a staircase whose steps are its members' sizes (each member from the step after
// its hand-off). Three placements run: a skyline best fit (the lowest level of used memory takes
// the longest-lived block that fits within its steps) and two greedy best fits (blocks by size, as
// TFLite, and by size times the square root of the lifetime, each at the tightest gap among the
// placed blocks live at the same time). The smallest arena wins; reaching lowerBound ends the
// search. O(n^2) time at worst; 5,000 buffers plan in 10-40 ms.
MemoryPlan planMemory(std::span<const BufferRequest> requests, int64_t alignment = 64);

// Returns an invalid-argument error naming the first request with negative bytes or
// lastStep < firstStep.
Status validateBufferRequests(std::span<const BufferRequest> requests);

// Independent checker (it shares no code with the planner): the requests are valid, there is one
// offset per request, every offset is aligned, every buffer lies inside the arena, no two buffers
// whose lifetimes overlap share a byte, except a legal in-place pair (one buffer's inplaceOf names
// the other and the hint is legal), which may share memory only at exactly the same offset, and
// plan.inplaceReuses is no more than the in-place pairs that do share an offset. Sizes are the
// requested bytes; with aligned offsets that is the same as checking the aligned sizes. Errors
// name both buffers, their step intervals and byte ranges.
Status checkMemoryPlan(std::span<const BufferRequest> requests, const MemoryPlan& plan,
                       int64_t alignment = 64);

}  // namespace kiln::compiler
