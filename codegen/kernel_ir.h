// Kernel IR: a loop-level description of one fused kernel, independent of the target: an
// iteration domain (optionally with one reduced dim), affine loads and stores into buffers,
// a scalar expression DAG, and reduction stages. Renderers print it as C++ or CUDA C.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ir/status.h"
#include "ir/types.h"

namespace kiln::codegen {

// kF16 and kBF16 are storage types only: a kernel loads them widened to f32 (exact), computes in
// f32, rounds the result of every op whose output is f16/bf16 once (to nearest even), and stores
// the rounded value narrowed (exact): the reference kernels' half-precision rule, op for op.
enum class ScalarType : uint8_t { kF32, kF64, kI64, kI32, kI8, kU8, kBool, kF16, kBF16 };
Expected<ScalarType> scalarTypeOf(ir::DType t);
std::string_view scalarTypeName(ScalarType t);  // For reports: "f32", "bool", ...
bool isHalf(ScalarType t);                      // f16 or bf16.
ScalarType computeType(ScalarType t);           // f32 for f16/bf16, else t.

// An affine map from a domain index to a buffer element: offset + sum(index[d] * strides[d]).
struct Access {
  int arg = 0;
  int64_t offset = 0;
  std::vector<int64_t> strides;  // One per domain dim, in elements; 0 broadcasts.
  bool operator==(const Access&) const = default;
};

enum class ExprKind : uint8_t {
  kLoad,    // loads[load]
  kConst,   // value
  kCall,    // fn(args...): a prelude function, e.g. "kiln_add", "kiln_exp"
  kSelect,  // args[0] ? args[1] : args[2]
  kCast,    // (type)args[0]
  kStage,   // The result of stages[stage] (a row value).
};

struct Expr {
  ExprKind kind = ExprKind::kConst;
  ScalarType type = ScalarType::kF32;
  std::string fn;
  std::vector<int> args;
  int load = -1;
  double value = 0;
  int stage = -1;
  // In a reduction kernel: the expression does not vary along the reduced dim, so it is
  // computed once per row (after the stages it depends on).
  bool row = false;
};

enum class ReduceOp : uint8_t { kSum, kMax };

// One pass over the reduced dim that folds an element expression into a row value.
struct Stage {
  int value = -1;  // An element-level expression (may read earlier stages).
  ReduceOp op = ReduceOp::kSum;
};

struct Store {
  Access access;
  int value = -1;
  bool row = false;  // Stored once per row (its access has stride 0 along the reduced dim).
};

// An op kernel's argument holding indices that it reads without an error path: class indices (a
// loss's targets: each in [0, limit) or equal to `ignore`, else the kernel writes NaN where it is
// used) or, with `position`, positions along dim `axis` (of size `limit`) of a gather's data,
// input `data` (each in [-limit, limit), else the kernel writes a filler, or adds nothing, and
// reads nothing). The
// compiler gives such kernels graph inputs, which the plan checks on the host
// (runtime::Plan::indexChecks), constants, which it checks itself, or indices the graph
// computes, which the kernel checks (Kernel::indexWord).
struct IndexArg {
  int arg = 0;
  bool position = false;
  int64_t limit = 0;
  int64_t ignore = 0;  // Class indices.
  int axis = 0;        // Positions.
  int data = 0;        // Positions: the argument holding the data (input 0 of a gather).
  // Not empty: a scatter's indices instead, each resolved along a dim as its reference kernel
  // does (runtime::IndexCheck::Kind::kResolved): component c of each tuple of limits.size() in
  // [-limits[c], limits[c]) along dim dims[c].
  std::vector<int64_t> limits;
  std::vector<int> dims;
  // Instead an integer div's or mod's divisor (runtime::IndexCheck::Kind::kNonZero): every
  // element non-zero, else the kernel writes 0 there.
  bool nonZero = false;
};

struct KernelArg {
  std::string value;  // The graph value it holds (for reports and the plan).
  ScalarType type = ScalarType::kF32;
  bool output = false;
};

struct Kernel {
  std::string name;
  std::vector<int64_t> domain;  // The iteration space, after dim coalescing.
  int reduceDim = -1;           // The reduced dim of a reduction kernel; -1 for pointwise.
  std::vector<KernelArg> args;
  std::vector<Access> loads;
  std::vector<Expr> exprs;  // Operands come before their users.
  std::vector<Stage> stages;
  std::vector<Store> stores;

  // A horizontal kernel (XLA's horizontal loop fusion, the kernels behind PyTorch's foreach
  // optimizers): independent pointwise kernels run as one, the work units of each part after
  // those of the part before it, so that one launch (on the CPU: one parallel region) updates
  // every parameter. `args` holds every part's arguments once (inputs, then outputs);
  // partArgs[i][j] is the index in `args` of parts[i]'s argument j. A horizontal kernel has no
  // domain, loads, expressions or stores of its own.
  std::vector<Kernel> parts;
  std::vector<std::vector<int>> partArgs;

  // A kernel written for one op (codegen/op_kernels.h) rather than lowered from a fusion group:
  // `source` is its whole CUDA C function (arguments as `args`, the CUDA ABI of render.h), a
  // grid-stride loop over the elements of `domain` (its output's), launched as a pointwise
  // kernel. It has no loads, expressions or stores, and no CPU dialect.
  std::string source;
  // An op kernel launched as one block of kCudaBlock threads, not over a grid (one that reduces
  // over all its rows: a loss's mean).
  bool oneBlock = false;
  std::vector<IndexArg> indexArgs;
  // Arguments after its output that name no value (an empty KernelArg::value), in this order:
  // with workspaceBytes > 0, a scratch buffer of that many bytes (the run's own, its contents
  // undefined when the op starts); with indexWord, the u64 word of a device index check
  // (runtime::IndexWord), where an index out of range is reported as well.
  int64_t workspaceBytes = 0;
  bool indexWord = false;
  // An op kernel in several launches: the kernels launched after this one, in order, each
  // taking the same arguments (its workspace carries what one leaves to the next).
  std::vector<Kernel> then;

  bool isReduction() const { return reduceDim >= 0; }
  bool isHorizontal() const { return !parts.empty(); }
  bool isOpKernel() const { return !source.empty(); }
  // Pointwise kernels split their innermost dim into chunks of this many elements, so that a
  // 1-D domain still spreads over threads.
  static constexpr int64_t kChunk = 4096;
  // The parallel work units the runtime splits over threads: rows (outer x inner indices) of
  // a reduction, or chunks of the innermost dim of a pointwise kernel.
  int64_t numUnits() const;
  int64_t numElements() const;
};

// Joins pointwise kernels (none reads what another writes) into one horizontal kernel named
// `name` (its parts `name`_p0, _p1, ...): arguments naming the same value are passed once.
// Horizontal parts are flattened. kInvalidArgument for a reduction, or where a part reads a
// value another part writes.
Expected<Kernel> horizontalKernel(std::string name, std::vector<Kernel> parts);

// `k` named `name`, its horizontal parts renamed as horizontalKernel names them. Two kernels
// that differ only in their names (the same layer repeated, a recurrence unrolled) render the
// same text once renamed alike, and may share one compiled function.
Kernel renamedKernel(Kernel k, std::string name);

}  // namespace kiln::codegen
