#include "codegen/render.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <set>
#include <sstream>

#include "codegen/prelude.h"

namespace kiln::codegen {

namespace {

// What a dialect prints, as data: the two renderers share one printer (as tinygrad's
// CStyleLanguage does) and differ only in these tables.
struct DialectTable {
  // Scalar types, indexed by ScalarType.
  std::array<std::string_view, 9> types;
  // Before the kernel's name.
  std::string_view kernelPrefix;
  // true: the CPU ABI (one void* const* argument array, a range of work units); false: one
  // typed pointer parameter per argument.
  bool argArray;
  // Qualifies each argument pointer: no-alias promises.
  std::string_view pointerQualifier;
  // Before an elementwise inner loop whose iterations are independent.
  std::string_view independentLoopPragma;
  // Pointwise kernels: loop over chunked work units with a vectorizable inner loop (true), or
  // one grid-stride loop over every element (false).
  bool chunkedPointwise;
  // The loop over elements of a grid-stride kernel, "{n}" being the element count.
  std::string_view elementLoop;
  // The loop over the rows of a reduction, "{n}" being the row count.
  std::string_view rowLoop;
  // The first index and the step of a loop along the reduced dim.
  std::string_view reducedBegin, reducedStep;
  // Reductions fold into kLanes partial results per thread (true), or into one per thread then
  // a block reduction through shared memory (false).
  bool laneReduction;
  // Declares a block-shared array: "KILN_SHARED(T, name, n);" (the preludes' macro: __shared__
  // on a GPU, the block's memory on the emu device), or empty where the dialect has none.
  std::string_view sharedPrefix;
  std::string_view leaderGuard;  // Only one thread stores a row value.
  std::string_view barrier;      // Ends a row: the shared scratch is reused by the next.
};

// f16 and bf16 are stored as their bits (the kernels convert with the prelude's functions, so
// that neither dialect needs a half-precision header).
constexpr std::array<std::string_view, 9> kCTypes = {"float", "double",         "long long",
                                                     "int",   "signed char",    "unsigned char",
                                                     "bool",  "unsigned short", "unsigned short"};

constexpr DialectTable kCpuTable = {
    .types = kCTypes,
    .kernelPrefix = "extern \"C\" void ",
    .argArray = true,
    // __restrict lets loops vectorize without runtime overlap checks. An output may share an
    // input's memory only in place (the memory plan's in-place reuse), where the kernel reads
    // every element of that input at the store's own index before storing it, so no read ever
    // sees a store of another element.
    .pointerQualifier = "__restrict ",
    // The arguments are restrict-qualified locals, which LLVM does not take as a no-alias
    // promise: without the pragma it checks at run time whether the output overlaps an input
    // and, for an in-place step (the memory planner's reuse of a dying input, same index map),
    // falls back to the scalar loop, 6x slower. Each element is independent, so this is safe.
    .independentLoopPragma = "#pragma clang loop vectorize(assume_safety)",
    .chunkedPointwise = true,
    .elementLoop = "",
    .rowLoop = "for (long long kiln_u = kiln_begin; kiln_u < kiln_end; ++kiln_u) {",
    .reducedBegin = "0",
    .reducedStep = "++r",
    .laneReduction = true,
    .sharedPrefix = "",
    .leaderGuard = "",
    .barrier = "",
};

constexpr DialectTable kCudaTable = {
    .types = kCTypes,
    .kernelPrefix = "extern \"C\" __global__ void ",
    .argArray = false,
    .pointerQualifier = "",
    .independentLoopPragma = "",
    .chunkedPointwise = false,
    .elementLoop =
        "for (long long kiln_t = (long long)blockIdx.x * blockDim.x + threadIdx.x; "
        "kiln_t < {n}LL; kiln_t += (long long)gridDim.x * blockDim.x) {",
    .rowLoop = "for (long long kiln_u = blockIdx.x; kiln_u < {n}LL; kiln_u += gridDim.x) {",
    .reducedBegin = "(long long)threadIdx.x",
    .reducedStep = "r += blockDim.x",
    .laneReduction = false,
    .sharedPrefix = "KILN_SHARED(",
    .leaderGuard = "if (threadIdx.x == 0)",
    .barrier = "__syncthreads();",
};

const DialectTable& tableOf(Dialect d) {
  return d == Dialect::kCuda ? kCudaTable : kCpuTable;
}

// `pattern` with "{n}" replaced by `n`.
std::string withCount(std::string_view pattern, int64_t n) {
  std::string s(pattern);
  if (size_t at = s.find("{n}"); at != std::string::npos) s.replace(at, 3, std::to_string(n));
  return s;
}

std::string literal(double v, ScalarType t) {
  const bool f32 = t == ScalarType::kF32;
  if (std::isnan(v)) return f32 ? "kiln_nan_f32()" : "kiln_nan_f64()";
  if (std::isinf(v)) {
    std::string inf = f32 ? "kiln_inf_f32()" : "kiln_inf_f64()";
    return v < 0 ? "(-" + inf + ")" : inf;
  }
  char buf[64];
  if (t == ScalarType::kF32 || t == ScalarType::kF64) {
    // Hex floats are exact and valid C++17 in both dialects.
    std::snprintf(buf, sizeof buf, "%a", f32 ? static_cast<double>(static_cast<float>(v)) : v);
    return std::string("(") + std::string(cType(t)) + ")" + buf;
  }
  std::snprintf(buf, sizeof buf, "(%s)%lld", std::string(cType(t)).c_str(),
                static_cast<long long>(v));
  return buf;
}

// A float4 access: f32, contiguous along the innermost dim, every vector starting on a multiple
// of 4 elements (offset and outer strides multiples of 4).
bool vectorAccess(const Kernel& k, const Access& a, ScalarType type) {
  if (k.isReduction() || k.domain.empty() || type != ScalarType::kF32) return false;
  const size_t inner = k.domain.size() - 1;
  if (a.strides[inner] != 1 || a.offset % 4 != 0) return false;
  for (size_t d = 0; d < inner; ++d)
    if (a.strides[d] % 4 != 0) return false;
  return true;
}

bool vectorLoad(const Kernel& k, size_t i) {
  return vectorAccess(k, k.loads[i], k.args[static_cast<size_t>(k.loads[i].arg)].type);
}

bool vectorStore(const Kernel& k, size_t i) {
  const Access& a = k.stores[i].access;
  return vectorAccess(k, a, k.args[static_cast<size_t>(a.arg)].type);
}

// The dims other than a reduction's reduced dim, in order.
std::vector<int> rowDimsOf(const Kernel& k) {
  std::vector<int> dims;
  for (int d = 0; d < static_cast<int>(k.domain.size()); ++d)
    if (d != k.reduceDim) dims.push_back(d);
  return dims;
}

// Whether a CPU reduction runs column-wise: its units are one dim along which every access is
// contiguous (or constant), and its loads walk the reduced dim with a stride. A reduction over
// the pixels of a channels-last tensor per channel (squeeze-excite's mean, global pooling) is
// one: row by row, each unit would read one float of every 64-byte line.
bool columnar(const Kernel& k, const std::vector<int>& rowDims) {
  if (rowDims.size() != 1) return false;
  const int ud = rowDims[0], rd = k.reduceDim;
  bool contiguous = false, strided = false;
  auto check = [&](const Access& a) {
    if (a.strides[ud] != 0 && a.strides[ud] != 1) return false;
    contiguous = contiguous || a.strides[ud] == 1;
    return true;
  };
  for (const Access& a : k.loads) {
    if (!check(a)) return false;
    strided = strided || (a.strides[rd] != 0 && a.strides[rd] != 1);
  }
  for (const Store& st : k.stores)
    if (!check(st.access)) return false;
  return contiguous && strided;
}

// A row-split reduction's partial results per chunk: its columns rounded up to 64 bytes, so
// that chunks (threads) never share a cache line.
int64_t paddedColumns(const Kernel& k) {
  const int64_t perLine =
      k.exprs[static_cast<size_t>(k.stages[0].value)].type == ScalarType::kF64 ? 8 : 16;
  return (k.numUnits() + perLine - 1) / perLine * perLine;
}

// The highest stage each expression depends on (-1: none).
std::vector<int> stageDependencies(const Kernel& k) {
  std::vector<int> dep(k.exprs.size(), -1);
  for (size_t i = 0; i < k.exprs.size(); ++i) {
    const Expr& e = k.exprs[i];
    int s = e.kind == ExprKind::kStage ? e.stage : -1;
    for (int a : e.args) s = std::max(s, dep[static_cast<size_t>(a)]);
    dep[i] = s;
  }
  return dep;
}

class Printer {
 public:
  static constexpr int kLanes = 16;  // Partial results per CPU reduction.

  // `prefix`: before the name instead of the dialect's kernel prefix (a horizontal kernel's
  // parts are static functions).
  Printer(const Kernel& k, Dialect d, std::string_view prefix = {})
      : k_(k), t_(tableOf(d)), prefix_(prefix.empty() ? t_.kernelPrefix : prefix) {
    stageDep_ = stageDependencies(k);
  }

  std::string run() {
    signature();
    if (k_.isReduction())
      reductionBody();
    else
      pointwiseBody();
    out_ << "}\n";
    return out_.str();
  }

 private:
  void line(int indent, const std::string& s) { out_ << std::string(2 * indent, ' ') << s << "\n"; }

  std::string arg(int i) const { return "a" + std::to_string(i); }

  std::string type(ScalarType t) const { return std::string(t_.types[static_cast<size_t>(t)]); }

  void signature() {
    out_ << prefix_ << k_.name << "(";
    auto pointee = [&](size_t i) {
      return std::string(k_.args[i].output ? "" : "const ") + type(k_.args[i].type);
    };
    if (!t_.argArray) {
      for (size_t i = 0; i < k_.args.size(); ++i)
        out_ << (i ? ", " : "") << "kiln_gptr<" << pointee(i) << "> " << t_.pointerQualifier
             << arg(static_cast<int>(i));
      out_ << ") {\n";
      return;
    }
    out_ << "void* const* kiln_args, long long kiln_begin, long long kiln_end) {\n";
    for (size_t i = 0; i < k_.args.size(); ++i)
      line(1, pointee(i) + "* " + std::string(t_.pointerQualifier) + arg(static_cast<int>(i)) +
                  " = (" + pointee(i) + "*)kiln_args[" + std::to_string(i) + "];");
  }

  // Declares the index of every dim in `dims` from the flat unit index `var` (innermost
  // dim fastest), then a base offset per access.
  void decompose(int indent, const std::string& var, const std::vector<int>& dims) {
    line(indent, "long long kiln_q = " + var + ";");
    for (size_t i = dims.size(); i-- > 0;) {
      const std::string idx = "i" + std::to_string(dims[i]);
      const std::string size = std::to_string(k_.domain[dims[i]]);
      if (i == 0)
        line(indent, "const long long " + idx + " = kiln_q;");
      else
        line(indent,
             "const long long " + idx + " = kiln_q % " + size + "; kiln_q /= " + size + ";");
    }
  }

  std::string offsetExpr(const Access& a, const std::vector<int>& dims) const {
    std::string s = std::to_string(a.offset);
    for (int d : dims)
      if (a.strides[d] != 0)
        s += " + i" + std::to_string(d) + " * " + std::to_string(a.strides[d]) + "LL";
    return s;
  }

  // Base offsets of every load and store over `dims` (the dims fixed per unit/element).
  void bases(int indent, const std::vector<int>& dims) {
    for (size_t i = 0; i < k_.loads.size(); ++i)
      line(indent,
           "const long long l" + std::to_string(i) + " = " + offsetExpr(k_.loads[i], dims) + ";");
    for (size_t i = 0; i < k_.stores.size(); ++i)
      line(indent, "const long long s" + std::to_string(i) + " = " +
                       offsetExpr(k_.stores[i].access, dims) + ";");
  }

  // CPU rows reduced in several passes: in the second (the first pass brought the row into
  // cache), a prefetch of the next row's contiguous f32 loads, a cache line (16 floats) each
  // vector step, so that the next row's first pass does not wait on memory between compute
  // passes (softmax over 4096-wide rows: 3.55 -> 3.15 ms on 2 threads). Rows over 64 KB leave
  // the cache between passes anyway: none.
  std::vector<std::string> nextRowPrefetches(int rd, const std::vector<int>& rowDims,
                                             const std::string& r) const {
    std::vector<std::string> out;
    if (rowDims.empty() || k_.domain[static_cast<size_t>(rd)] * 4 > (int64_t{64} << 10)) return out;
    for (size_t i = 0; i < k_.loads.size(); ++i) {
      const Access& a = k_.loads[i];
      const int64_t next = a.strides[static_cast<size_t>(rowDims.back())];
      if (a.strides[static_cast<size_t>(rd)] != 1 || next == 0 ||
          k_.args[static_cast<size_t>(a.arg)].type != ScalarType::kF32)
        continue;
      out.push_back("__builtin_prefetch(&" + arg(a.arg) + "[l" + std::to_string(i) + " + " +
                    std::to_string(next) + "LL + " + r + "], 0, 3);");
    }
    return out;
  }

  std::string index(int64_t stride, const std::string& var) const {
    if (var.empty() || stride == 0) return "";
    return " + " + var + (stride == 1 ? "" : " * " + std::to_string(stride) + "LL");
  }

  std::string exprText(int i, const std::string& loopVar, int loopDim) const {
    const Expr& e = k_.exprs[i];
    auto ref = [](int a) { return "e" + std::to_string(a); };
    switch (e.kind) {
      case ExprKind::kLoad: {
        const Access& a = k_.loads[e.load];
        return arg(a.arg) + "[l" + std::to_string(e.load) +
               (loopDim >= 0 ? index(a.strides[loopDim], loopVar) : "") + "]";
      }
      case ExprKind::kConst:
        return literal(e.value, e.type);
      case ExprKind::kCall: {
        std::string s = e.fn + "(";
        for (size_t j = 0; j < e.args.size(); ++j) s += (j ? ", " : "") + ref(e.args[j]);
        return s + ")";
      }
      case ExprKind::kSelect:
        return "(" + ref(e.args[0]) + " ? " + ref(e.args[1]) + " : " + ref(e.args[2]) + ")";
      case ExprKind::kCast:
        return "(" + type(e.type) + ")" + ref(e.args[0]);
      case ExprKind::kStage:
        return "kiln_s" + std::to_string(e.stage);
    }
    return "?";
  }

  void emitExpr(int indent, int i, const std::string& loopVar, int loopDim) {
    line(indent, "const " + type(k_.exprs[i].type) + " e" + std::to_string(i) + " = " +
                     exprText(i, loopVar, loopDim) + ";");
  }

  // Emits, in order, the element-level expressions that `roots` need and that are not
  // emitted yet in this scope.
  void emitNeeded(int indent, const std::vector<int>& roots, std::set<int> emitted,
                  const std::string& loopVar, int loopDim) {
    std::set<int> need;
    std::vector<int> stack(roots.begin(), roots.end());
    while (!stack.empty()) {
      const int e = stack.back();
      stack.pop_back();
      if (emitted.count(e) || !need.insert(e).second) continue;
      for (int a : k_.exprs[e].args) stack.push_back(a);
    }
    for (int e : need) emitExpr(indent, e, loopVar, loopDim);
  }

  // The stored form of expression text `value` (f32) in argument `a`: f16/bf16 bits.
  std::string stored(int a, const std::string& value) const {
    switch (k_.args[static_cast<size_t>(a)].type) {
      case ScalarType::kF16:
        return "kiln_f32_to_f16(" + value + ")";
      case ScalarType::kBF16:
        return "kiln_f32_to_bf16(" + value + ")";
      default:
        return value;
    }
  }

  void store(int indent, const Store& s, size_t i, const std::string& loopVar, int loopDim) {
    line(indent, arg(s.access.arg) + "[s" + std::to_string(i) +
                     (loopDim >= 0 ? index(s.access.strides[loopDim], loopVar) : "") +
                     "] = " + stored(s.access.arg, "e" + std::to_string(s.value)) + ";");
  }

  void pointwiseBody() {
    const int rank = static_cast<int>(k_.domain.size());
    const int inner = rank - 1;
    std::vector<int> outerDims;
    for (int d = 0; d < inner; ++d) outerDims.push_back(d);
    std::vector<int> all;
    std::vector<int> roots;
    for (const auto& s : k_.stores) roots.push_back(s.value);
    if (!t_.chunkedPointwise) {
      for (int d = 0; d < rank; ++d) all.push_back(d);
      if (cudaVectorWidth(k_) == 4) vectorLoop(all, roots);
      line(1, withCount(t_.elementLoop, k_.numElements()));
      decompose(2, "kiln_t", all);
      bases(2, all);
      emitNeeded(2, roots, {}, "", -1);
      for (size_t i = 0; i < k_.stores.size(); ++i) store(2, k_.stores[i], i, "", -1);
      line(1, "}");
      return;
    }
    const int64_t chunks = (k_.domain[inner] + Kernel::kChunk - 1) / Kernel::kChunk;
    line(1, "for (long long kiln_u = kiln_begin; kiln_u < kiln_end; ++kiln_u) {");
    line(2, "long long kiln_o = kiln_u;");
    if (chunks > 1) {
      line(2, "const long long kiln_c = kiln_o % " + std::to_string(chunks) +
                  "LL; kiln_o /= " + std::to_string(chunks) + "LL;");
      line(2, "const long long kiln_jb = kiln_c * " + std::to_string(Kernel::kChunk) + "LL;");
      line(2, "const long long kiln_je = kiln_jb + " + std::to_string(Kernel::kChunk) + "LL < " +
                  std::to_string(k_.domain[inner]) + "LL ? kiln_jb + " +
                  std::to_string(Kernel::kChunk) + "LL : " + std::to_string(k_.domain[inner]) +
                  "LL;");
    } else {
      line(2, "const long long kiln_jb = 0, kiln_je = " + std::to_string(k_.domain[inner]) + "LL;");
    }
    if (!outerDims.empty()) decompose(2, "kiln_o", outerDims);
    bases(2, outerDims);
    // Expressions that do not vary along the inner dim are hoisted out of the loop.
    std::set<int> hoisted;
    for (size_t i = 0; i < k_.exprs.size(); ++i) {
      bool invariant = k_.exprs[i].kind == ExprKind::kConst;
      if (k_.exprs[i].kind == ExprKind::kLoad)
        invariant = k_.loads[k_.exprs[i].load].strides[inner] == 0;
      if (k_.exprs[i].kind == ExprKind::kCall || k_.exprs[i].kind == ExprKind::kCast ||
          k_.exprs[i].kind == ExprKind::kSelect) {
        invariant = true;
        for (int a : k_.exprs[i].args) invariant = invariant && hoisted.count(a);
      }
      if (invariant) {
        emitExpr(2, static_cast<int>(i), "", -1);
        hoisted.insert(static_cast<int>(i));
      }
    }
    independentLoop(2);
    line(2, "for (long long j = kiln_jb; j < kiln_je; ++j) {");
    emitNeeded(3, roots, hoisted, "j", inner);
    for (size_t i = 0; i < k_.stores.size(); ++i) store(3, k_.stores[i], i, "j", inner);
    line(2, "}");
    line(1, "}");
  }

  // CUDA: four elements per iteration with float4 loads and stores where the buffers they touch
  // are 16-byte aligned (else the scalar loop after it runs); other accesses stay scalar, per lane.
  void vectorLoop(const std::vector<int>& all, const std::vector<int>& roots) {
    const int inner = static_cast<int>(k_.domain.size()) - 1;
    std::set<int> vecArgs;
    std::vector<bool> vecLoad(k_.loads.size()), vecStore(k_.stores.size());
    for (size_t i = 0; i < k_.loads.size(); ++i)
      if ((vecLoad[i] = vectorLoad(k_, i))) vecArgs.insert(k_.loads[i].arg);
    for (size_t i = 0; i < k_.stores.size(); ++i)
      if ((vecStore[i] = vectorStore(k_, i))) vecArgs.insert(k_.stores[i].access.arg);
    std::string aligned;
    for (int a : vecArgs)
      aligned += (aligned.empty() ? "" : " && ") + ("kiln_aligned16(" + arg(a) + ")");
    line(1, "if (" + aligned + ") {");
    line(2, withCount(t_.elementLoop, k_.numElements() / 4));  // kiln_t counts vectors here.
    line(3, "const long long kiln_e = kiln_t * 4LL;");
    decompose(3, "kiln_e", all);
    bases(3, all);
    for (size_t i = 0; i < k_.loads.size(); ++i)
      if (vecLoad[i])
        line(3, "const float4 kiln_x" + std::to_string(i) + " = kiln_ld4(" + arg(k_.loads[i].arg) +
                    ", l" + std::to_string(i) + ");");
    std::set<int> need;
    std::vector<int> stack(roots.begin(), roots.end());
    while (!stack.empty()) {
      const int e = stack.back();
      stack.pop_back();
      if (!need.insert(e).second) continue;
      for (int a : k_.exprs[e].args) stack.push_back(a);
    }
    static constexpr char kLane[] = "xyzw";
    for (int lane = 0; lane < 4; ++lane) {
      const std::string L = std::to_string(lane);
      auto ref = [&](int a) { return "e" + std::to_string(a) + "_" + L; };
      for (int i : need) {
        const Expr& e = k_.exprs[i];
        std::string text;
        switch (e.kind) {
          case ExprKind::kLoad: {
            const Access& a = k_.loads[e.load];
            text = vecLoad[e.load] ? "kiln_x" + std::to_string(e.load) + "." + kLane[lane]
                                   : arg(a.arg) + "[l" + std::to_string(e.load) +
                                         index(a.strides[inner], L) + "]";
            break;
          }
          case ExprKind::kConst:
            text = literal(e.value, e.type);
            break;
          case ExprKind::kCall: {
            text = e.fn + "(";
            for (size_t j = 0; j < e.args.size(); ++j) text += (j ? ", " : "") + ref(e.args[j]);
            text += ")";
            break;
          }
          case ExprKind::kSelect:
            text = "(" + ref(e.args[0]) + " ? " + ref(e.args[1]) + " : " + ref(e.args[2]) + ")";
            break;
          case ExprKind::kCast:
            text = "(" + type(e.type) + ")" + ref(e.args[0]);
            break;
          case ExprKind::kStage:
            text = "?";  // Reductions only; cudaVectorWidth excludes them.
            break;
        }
        line(3, "const " + type(e.type) + " " + ref(i) + " = " + text + ";");
      }
    }
    for (size_t i = 0; i < k_.stores.size(); ++i) {
      const Store& st = k_.stores[i];
      const std::string v = "e" + std::to_string(st.value) + "_";
      if (vecStore[i]) {
        line(3, "kiln_st4(" + arg(st.access.arg) + ", s" + std::to_string(i) + ", make_float4(" +
                    v + "0, " + v + "1, " + v + "2, " + v + "3));");
        continue;
      }
      for (int lane = 0; lane < 4; ++lane)
        line(3, arg(st.access.arg) + "[s" + std::to_string(i) +
                    index(st.access.strides[inner], std::to_string(lane)) +
                    "] = " + stored(st.access.arg, v + std::to_string(lane)) + ";");
    }
    line(2, "}");
    line(2, "return;");
    line(1, "}");
  }

  void independentLoop(int indent) {
    if (!t_.independentLoopPragma.empty()) line(indent, std::string(t_.independentLoopPragma));
  }

  void reductionBody() {
    const bool lanes = t_.laneReduction;
    const int rd = k_.reduceDim;
    const std::string R = std::to_string(k_.domain[rd]) + "LL";
    std::vector<int> rowDims;
    for (int d = 0; d < static_cast<int>(k_.domain.size()); ++d)
      if (d != rd) rowDims.push_back(d);
    if (!lanes) {
      // Block reductions combine one partial result per warp (at most 32) in shared memory.
      std::set<ScalarType> types;
      for (const Stage& s : k_.stages) types.insert(k_.exprs[s.value].type);
      for (ScalarType t : types)
        line(1, std::string(t_.sharedPrefix) + type(t) + ", kiln_smem_" +
                    std::string(scalarTypeName(t)) + ", 32);");
    }
    if (lanes && columnar(k_, rowDims)) {
      if (const CpuRowSplit split = cpuRowSplit(k_); split.chunks > 0)
        splitColumnarBody(rowDims, split.chunks);
      else
        columnarReductionBody(rowDims);
      return;
    }
    const std::pair<int, int> spill = lanes ? spillOf() : std::pair{-1, -1};
    line(1, withCount(t_.rowLoop, k_.numUnits()));
    if (!rowDims.empty()) decompose(2, "kiln_u", rowDims);
    bases(2, rowDims);
    const std::string rBegin(t_.reducedBegin), rStep(t_.reducedStep);
    std::set<int> emitted;  // Row expressions emitted at the unit level.
    auto emitRowExprs = [&](int maxStage) {
      for (size_t i = 0; i < k_.exprs.size(); ++i)
        if (k_.exprs[i].row && !emitted.count(static_cast<int>(i)) && stageDep_[i] <= maxStage) {
          emitExpr(2, static_cast<int>(i), "", -1);
          emitted.insert(static_cast<int>(i));
        }
    };
    for (size_t s = 0; s < k_.stages.size(); ++s) {
      emitRowExprs(static_cast<int>(s) - 1);
      const Stage& st = k_.stages[s];
      const ScalarType t = k_.exprs[st.value].type;
      const std::string init =
          st.op == ReduceOp::kSum
              ? literal(0, t)
              : "(-" + std::string(t == ScalarType::kF32 ? "kiln_inf_f32()" : "kiln_inf_f64()") +
                    ")";
      const std::string acc = "kiln_s" + std::to_string(s);
      const std::string v = "e" + std::to_string(st.value);
      if (!lanes) {
        line(2, type(t) + " " + acc + " = " + init + ";");
        line(2, "for (long long r = " + rBegin + "; r < " + R + "; " + rStep + ") {");
        emitNeeded(3, {st.value}, emitted, "r", rd);
        if (st.op == ReduceOp::kSum)
          line(3, acc + " += " + v + ";");
        else
          line(3, acc + " = kiln_maximum(" + acc + ", " + v + ");");
        line(2, "}");
      } else {
        // On the CPU, kLanes independent partial results (a tree of partial sums, as BLAS
        // libraries sum) let the loop vectorize; max keeps NaN in a flag, since a vector
        // max drops it.
        const std::string T = type(t);
        const std::string lanes = std::to_string(kLanes);
        line(2, T + " " + acc + "_v[" + lanes + "];");
        line(2, "bool " + acc + "_nan[" + lanes + "];");
        line(2, "for (int j = 0; j < " + lanes + "; ++j) { " + acc + "_v[j] = " + init + "; " +
                    acc + "_nan[j] = false; }");
        auto body = [&](int indent, const std::string& lane) {
          emitNeeded(indent, {st.value}, emitted, "r", rd);
          if (spill.second == st.value && s + 1 == k_.stages.size()) {
            const Store& out = k_.stores[static_cast<size_t>(spill.first)];
            line(indent, arg(out.access.arg) + "[s" + std::to_string(spill.first) +
                             index(out.access.strides[rd], "r") + "] = " + v + ";");
          }
          if (st.op == ReduceOp::kSum) {
            line(indent, acc + "_v[" + lane + "] += " + v + ";");
          } else {
            line(indent, acc + "_v[" + lane + "] = " + v + " > " + acc + "_v[" + lane + "] ? " + v +
                             " : " + acc + "_v[" + lane + "];");
            line(indent, acc + "_nan[" + lane + "] |= " + v + " != " + v + ";");
          }
        };
        line(2, "long long " + acc + "_r = 0;");
        line(2, "for (; " + acc + "_r + " + lanes + " <= " + R + "; " + acc + "_r += " + lanes +
                    ") {");
        if (s == 1)
          for (const std::string& p : nextRowPrefetches(rd, rowDims, acc + "_r")) line(3, p);
        // Each lane reads and writes only its own element (an output planned over an input
        // reads it at the same index: plan_builder's in-place rule), so no lane depends on
        // another's memory. Without the pragma LLVM checks the output against the inputs at run
        // time and keeps a scalar copy of the loop, which holds the partial results in memory
        // in both (softmax's exponential stage: 4.6 -> 3.7 ms a thread on 2048 x 4096).
        independentLoop(3);
        line(3, "for (int j = 0; j < " + lanes + "; ++j) {");
        line(4, "const long long r = " + acc + "_r + j;");
        body(4, "j");
        line(3, "}");
        line(2, "}");
        line(2, "for (long long r = " + acc + "_r; r < " + R + "; ++r) {");
        body(3, "0");
        line(2, "}");
        line(2, T + " " + acc + " = " + acc + "_v[0];");
        line(2, "bool " + acc + "_isnan = " + acc + "_nan[0];");
        line(2, "for (int j = 1; j < " + lanes + "; ++j) {");
        if (st.op == ReduceOp::kSum)
          line(3, acc + " += " + acc + "_v[j];");
        else
          line(3, acc + " = " + acc + "_v[j] > " + acc + " ? " + acc + "_v[j] : " + acc + ";");
        line(3, acc + "_isnan |= " + acc + "_nan[j];");
        line(2, "}");
        if (st.op == ReduceOp::kMax)
          line(2, "if (" + acc + "_isnan) " + acc + " = kiln_nan_" +
                      std::string(scalarTypeName(t)) + "();");
      }
      if (!lanes)
        line(2, acc + " = kiln_block_reduce(" + acc + ", " + init + ", " +
                    (st.op == ReduceOp::kSum ? "kiln_sum_op()" : "kiln_max_op()") + ", kiln_smem_" +
                    std::string(scalarTypeName(t)) + ");");
    }
    emitRowExprs(static_cast<int>(k_.stages.size()));
    bool elementStores = false;
    const int spillStore = spill.first, spilled = spill.second;
    for (const Store& s : k_.stores) elementStores = elementStores || !s.row;
    // The one element store is the spilled value itself: the last stage wrote it already.
    if (spilled >= 0 && k_.stores[static_cast<size_t>(spillStore)].value == spilled)
      elementStores = false;
    if (elementStores) {
      std::vector<int> roots;
      for (const Store& s : k_.stores)
        if (!s.row) roots.push_back(s.value);
      independentLoop(2);
      line(2, "for (long long r = " + rBegin + "; r < " + R + "; " + rStep + ") {");
      std::set<int> done = emitted;
      if (spilled >= 0) {  // Read back what the last stage stored, instead of computing it again.
        const Store& st = k_.stores[static_cast<size_t>(spillStore)];
        line(3, "const " + type(k_.exprs[spilled].type) + " e" + std::to_string(spilled) + " = " +
                    arg(st.access.arg) + "[s" + std::to_string(spillStore) +
                    index(st.access.strides[rd], "r") + "];");
        done.insert(spilled);
      }
      emitNeeded(3, roots, done, "r", rd);
      for (size_t i = 0; i < k_.stores.size(); ++i)
        if (!k_.stores[i].row) store(3, k_.stores[i], i, "r", rd);
      line(2, "}");
    }
    for (size_t i = 0; i < k_.stores.size(); ++i) {
      if (!k_.stores[i].row) continue;
      const bool guarded = !t_.leaderGuard.empty();
      if (guarded) line(2, std::string(t_.leaderGuard));
      store(guarded ? 3 : 2, k_.stores[i], i, "", -1);
    }
    if (!t_.barrier.empty()) line(2, std::string(t_.barrier));
    line(1, "}");
  }

  // (store, expression): the last stage's value, when the element stores need it again, to be
  // stored by the stage's loop into the kernel's one element store (f32, where that store will
  // write anyway) and read back by the element loop instead of computed twice: softmax's
  // exponential (the kernel was compute-bound: 13.4 -> 9.6 ms a thread on 4096 x 4096). Only
  // where the element loop then reads no input at all, since the output may be planned over an
  // input (an in-place reduction) that the spill has overwritten. (-1, -1): none.
  std::pair<int, int> spillOf() const {
    if (k_.stages.empty()) return {-1, -1};
    const int v = k_.stages.back().value;
    if (k_.exprs[v].kind == ExprKind::kLoad) return {-1, -1};  // A load is no cheaper read back.
    int store = -1;
    std::vector<int> roots;
    for (size_t i = 0; i < k_.stores.size(); ++i) {
      if (k_.stores[i].row) continue;
      if (store >= 0) return {-1, -1};  // One element store only.
      store = static_cast<int>(i);
      roots.push_back(k_.stores[i].value);
    }
    if (store < 0 || k_.exprs[v].type != ScalarType::kF32 ||
        k_.args[static_cast<size_t>(k_.stores[store].access.arg)].type != ScalarType::kF32)
      return {-1, -1};
    // What the element loop computes with v read back: v must be among it, and no load.
    bool needsV = false;
    std::set<int> seen;
    std::vector<int> stack = roots;
    while (!stack.empty()) {
      const int e = stack.back();
      stack.pop_back();
      if (!seen.insert(e).second) continue;
      if (e == v) {
        needsV = true;
        continue;
      }
      if (k_.exprs[e].kind == ExprKind::kLoad) return {-1, -1};
      if (k_.exprs[e].kind == ExprKind::kStage) continue;
      for (int a : k_.exprs[e].args) stack.push_back(a);
    }
    return needsV ? std::pair{store, v} : std::pair{-1, -1};
  }

  // The column-wise form: kColumnBlock adjacent units at a time, each stage a loop over the
  // reduced dim around a loop over the units that the compiler vectorizes (contiguous loads, one
  // accumulator per unit, summed in order). Row-level expressions are recomputed from the
  // stages' results wherever a later loop needs them.
  static constexpr int kColumnBlock = 64;
  void columnarReductionBody(const std::vector<int>& rowDims) {
    const int rd = k_.reduceDim;
    const std::pair<int, int> spill = spillOf();
    const std::string R = std::to_string(k_.domain[rd]) + "LL";
    const std::string B = std::to_string(kColumnBlock);
    // Inside a loop over kiln_j: the unit, its bases, and stages [0, upTo) as scalars.
    auto unit = [&](int indent, int upTo) {
      line(indent, "const long long kiln_u = kiln_u0 + kiln_j;");
      decompose(indent, "kiln_u", rowDims);
      bases(indent, rowDims);
      for (int s = 0; s < upTo; ++s) {
        const std::string acc = "kiln_s" + std::to_string(s);
        line(indent, "const " + type(k_.exprs[k_.stages[s].value].type) + " " + acc + " = " + acc +
                         "_b[kiln_j];");
      }
    };
    line(1, "for (long long kiln_u0 = kiln_begin; kiln_u0 < kiln_end; kiln_u0 += " + B + "LL) {");
    line(2, "const long long kiln_nb = kiln_end - kiln_u0 < " + B +
                "LL ? kiln_end - kiln_u0 : " + B + "LL;");
    for (size_t s = 0; s < k_.stages.size(); ++s) {
      const Stage& st = k_.stages[s];
      const ScalarType t = k_.exprs[st.value].type;
      const std::string T = type(t), acc = "kiln_s" + std::to_string(s);
      const std::string init =
          st.op == ReduceOp::kSum
              ? literal(0, t)
              : "(-" + std::string(t == ScalarType::kF32 ? "kiln_inf_f32()" : "kiln_inf_f64()") +
                    ")";
      const std::string v = "e" + std::to_string(st.value), a = acc + "_b[kiln_j]";
      line(2, T + " " + acc + "_b[" + B + "];");
      line(2, "bool " + acc + "_n[" + B + "];");
      line(2, "for (int kiln_j = 0; kiln_j < " + B + "; ++kiln_j) { " + a + " = " + init + "; " +
                  acc + "_n[kiln_j] = false; }");
      line(2, "for (long long r = 0; r < " + R + "; ++r) {");
      independentLoop(3);
      line(3, "for (long long kiln_j = 0; kiln_j < kiln_nb; ++kiln_j) {");
      unit(4, static_cast<int>(s));
      emitNeeded(4, {st.value}, {}, "r", rd);
      if (spill.second == st.value && s + 1 == k_.stages.size()) {
        const Store& out = k_.stores[static_cast<size_t>(spill.first)];
        line(4, arg(out.access.arg) + "[s" + std::to_string(spill.first) +
                    index(out.access.strides[rd], "r") + "] = " + v + ";");
      }
      if (st.op == ReduceOp::kSum) {
        line(4, a + " += " + v + ";");
      } else {  // A vector max drops NaN: a flag keeps it.
        line(4, a + " = " + v + " > " + a + " ? " + v + " : " + a + ";");
        line(4, acc + "_n[kiln_j] |= " + v + " != " + v + ";");
      }
      line(3, "}");
      line(2, "}");
      if (st.op == ReduceOp::kMax)
        line(2, "for (int kiln_j = 0; kiln_j < " + B + "; ++kiln_j) if (" + acc + "_n[kiln_j]) " +
                    a + " = kiln_nan_" + std::string(scalarTypeName(t)) + "();");
    }
    const int stages = static_cast<int>(k_.stages.size());
    std::vector<int> rowRoots, elementRoots;
    for (const Store& st : k_.stores) (st.row ? rowRoots : elementRoots).push_back(st.value);
    if (!rowRoots.empty()) {
      line(2, "for (long long kiln_j = 0; kiln_j < kiln_nb; ++kiln_j) {");
      unit(3, stages);
      emitNeeded(3, rowRoots, {}, "", -1);
      for (size_t i = 0; i < k_.stores.size(); ++i)
        if (k_.stores[i].row) store(3, k_.stores[i], i, "", -1);
      line(2, "}");
    }
    // The element store is the spilled value itself (SiLU before squeeze-excite's mean): the
    // last stage wrote it already.
    const bool stored = spill.second >= 0 && elementRoots == std::vector<int>{spill.second};
    if (!elementRoots.empty() && !stored) {
      line(2, "for (long long r = 0; r < " + R + "; ++r) {");
      independentLoop(3);
      line(3, "for (long long kiln_j = 0; kiln_j < kiln_nb; ++kiln_j) {");
      unit(4, stages);
      std::set<int> done;
      if (spill.second >= 0) {  // Read back what the last stage stored.
        const Store& st = k_.stores[static_cast<size_t>(spill.first)];
        line(4, "const " + type(k_.exprs[spill.second].type) + " e" + std::to_string(spill.second) +
                    " = " + arg(st.access.arg) + "[s" + std::to_string(spill.first) +
                    index(st.access.strides[rd], "r") + "];");
        done.insert(spill.second);
      }
      emitNeeded(4, elementRoots, done, "r", rd);
      for (size_t i = 0; i < k_.stores.size(); ++i)
        if (!k_.stores[i].row) store(4, k_.stores[i], i, "r", rd);
      line(3, "}");
      line(2, "}");
    }
    line(1, "}");
  }

  // The row-split column-wise form (cpuRowSplit): units are chunks of rows, each reducing its
  // rows for every column into its row of partial results (kiln_part, after the arguments),
  // its element outputs stored on the way; the call with begin = chunks adds the partial results
  // in chunk order and writes the row outputs.
  void splitColumnarBody(const std::vector<int>& rowDims, int64_t chunks) {
    const int rd = k_.reduceDim;
    const Stage& st = k_.stages[0];
    const std::string T = type(k_.exprs[st.value].type);
    const std::string C = std::to_string(k_.numUnits()) + "LL";
    const std::string R = std::to_string(k_.domain[rd]) + "LL";
    const std::string K = std::to_string(chunks) + "LL";
    const std::string pad = std::to_string(paddedColumns(k_)) + "LL";
    line(1, T + "* __restrict kiln_part = (" + T + "*)kiln_args[" + std::to_string(k_.args.size()) +
                "];");
    std::vector<int> rowRoots, elementRoots{st.value};
    for (const Store& s : k_.stores) (s.row ? rowRoots : elementRoots).push_back(s.value);
    line(1, "if (kiln_begin >= " + K + ") {");
    line(2, "for (long long kiln_j = 0; kiln_j < " + C + "; ++kiln_j) {");
    line(3, T + " kiln_s0 = kiln_part[kiln_j];");
    line(3, "for (long long kiln_c = 1; kiln_c < " + K +
                "; ++kiln_c) kiln_s0 += kiln_part[kiln_c * " + pad + " + kiln_j];");
    decompose(3, "kiln_j", rowDims);
    bases(3, rowDims);
    emitNeeded(3, rowRoots, {}, "", -1);
    for (size_t i = 0; i < k_.stores.size(); ++i)
      if (k_.stores[i].row) store(3, k_.stores[i], i, "", -1);
    line(2, "}");
    line(2, "return;");
    line(1, "}");
    line(1, "for (long long kiln_c = kiln_begin; kiln_c < kiln_end; ++kiln_c) {");
    line(2, T + "* __restrict kiln_acc = kiln_part + kiln_c * " + pad + ";");
    line(2, "for (long long kiln_j = 0; kiln_j < " + C +
                "; ++kiln_j) kiln_acc[kiln_j] = " + literal(0, k_.exprs[st.value].type) + ";");
    line(2, "for (long long r = kiln_c * " + R + " / " + K + "; r < (kiln_c + 1) * " + R + " / " +
                K + "; ++r) {");
    independentLoop(3);
    line(3, "for (long long kiln_j = 0; kiln_j < " + C + "; ++kiln_j) {");
    decompose(4, "kiln_j", rowDims);
    bases(4, rowDims);
    emitNeeded(4, elementRoots, {}, "r", rd);
    for (size_t i = 0; i < k_.stores.size(); ++i)
      if (!k_.stores[i].row) store(4, k_.stores[i], i, "r", rd);
    line(4, "kiln_acc[kiln_j] += e" + std::to_string(st.value) + ";");
    line(3, "}");
    line(2, "}");
    line(1, "}");
  }

  const Kernel& k_;
  const DialectTable& t_;
  std::string_view prefix_;
  std::vector<int> stageDep_;
  std::ostringstream out_;
};

}  // namespace

// C types are the same in both dialects; literals use them.
std::string_view cType(ScalarType t) {
  return kCTypes[static_cast<size_t>(t)];
}

CpuRowSplit cpuRowSplit(const Kernel& k) {
  if (!k.isReduction() || k.isHorizontal() || k.stages.size() != 1 ||
      k.stages[0].op != ReduceOp::kSum)
    return {};
  const ScalarType t = k.exprs[static_cast<size_t>(k.stages[0].value)].type;
  if (t != ScalarType::kF32 && t != ScalarType::kF64) return {};
  if (!columnar(k, rowDimsOf(k))) return {};
  const std::vector<int> dep = stageDependencies(k);
  for (const Store& s : k.stores)
    if (!s.row && dep[static_cast<size_t>(s.value)] >= 0) return {};
  // Chunks of at least 64 rows, as many as 32 (a power of two, so that common thread counts
  // divide them): 3136 pixels (56 x 56) are 32 chunks of 98.
  const int64_t rows = k.domain[static_cast<size_t>(k.reduceDim)];
  int64_t chunks = 32;
  while (chunks > 1 && rows / chunks < 64) chunks /= 2;
  if (chunks < 2) return {};
  const int64_t bytes = t == ScalarType::kF32 ? 4 : 8;
  return {chunks, chunks * paddedColumns(k) * bytes};
}

CudaLaunchGeometry cudaLaunchGeometry(const Kernel& k, int multiProcessors,
                                      int maxThreadsPerBlock) {
  const int64_t sms = std::max(1, multiProcessors);
  const int maxBlock = std::max(32, std::min(1024, maxThreadsPerBlock) / 32 * 32);
  auto roundWarps = [&](int64_t threads) {
    return static_cast<int>(std::clamp<int64_t>((threads + 31) / 32 * 32, 32, maxBlock));
  };
  CudaLaunchGeometry g;
  if (k.oneBlock) return {kCudaBlock, 1};
  if (k.isReduction()) {
    // Up to 512 threads per row; 2048 resident threads per SM, four waves.
    int64_t want = 32;
    while (want < k.domain[static_cast<size_t>(k.reduceDim)] && want < 512) want *= 2;
    g.block = roundWarps(want);
    g.grid = std::clamp<int64_t>(k.numUnits(), 1, sms * (2048 / g.block) * 4);
    return g;
  }
  const int64_t n = std::max<int64_t>(1, k.numElements() / cudaVectorWidth(k));
  g.block = roundWarps(std::min<int64_t>(n, kCudaBlock));
  g.grid = std::clamp<int64_t>((n + g.block - 1) / g.block, 1, sms * (2048 / g.block) * 4);
  return g;
}

int cudaVectorWidth(const Kernel& k) {
  if (k.isReduction() || k.domain.empty() || k.domain.back() % 4 != 0 || k.numElements() == 0)
    return 1;
  for (size_t i = 0; i < k.loads.size(); ++i)
    if (vectorLoad(k, i)) return 4;
  for (size_t i = 0; i < k.stores.size(); ++i)
    if (vectorStore(k, i)) return 4;
  return 1;
}

namespace {

// A horizontal kernel on the CPU: each part a static function of the CPU ABI, and the entry
// point handing each part the share of [begin, end) that falls in its units, with its arguments.
std::string renderHorizontal(const Kernel& k) {
  std::string s;
  for (const Kernel& p : k.parts) s += Printer(p, Dialect::kCpu, "static void ").run() + "\n";
  s += std::string(kCpuTable.kernelPrefix) + k.name +
       "(void* const* kiln_args, long long kiln_begin, long long kiln_end) {\n";
  int64_t first = 0;
  for (size_t i = 0; i < k.parts.size(); ++i) {
    const int64_t last = first + k.parts[i].numUnits();
    const std::string lo = std::to_string(first) + "LL", hi = std::to_string(last) + "LL";
    s += "  if (kiln_begin < " + hi + " && kiln_end > " + lo + ") {\n    void* const kiln_a[] = {";
    for (size_t j = 0; j < k.partArgs[i].size(); ++j)
      s += (j ? ", " : "") + std::string("kiln_args[") + std::to_string(k.partArgs[i][j]) + "]";
    s += "};\n    " + k.parts[i].name + "(kiln_a, (kiln_begin > " + lo + " ? kiln_begin : " + lo +
         ") - " + lo + ", (kiln_end < " + hi + " ? kiln_end : " + hi + ") - " + lo + ");\n  }\n";
    first = last;
  }
  return s + "}\n";
}

}  // namespace

std::string renderKernel(const Kernel& k, Dialect d) {
  if (k.isOpKernel())  // CUDA C only: the CPU runs these ops on its library and reference kernels.
    return d == Dialect::kCuda ? k.source
                               : "#error \"op kernel " + k.name + " has no CPU dialect\"\n";
  if (!k.isHorizontal()) return Printer(k, d).run();
  if (d == Dialect::kCpu) return renderHorizontal(k);
  // CUDA C: each part a kernel of its own. The scheduler joins kernels for the CPU only (a GPU
  // replays the launches from a CUDA graph; a grid over parts of different sizes would idle
  // blocks), so this serves the CUDA check of a CPU compile (--cuda-check, artifacts).
  std::string s;
  for (const Kernel& p : k.parts) s += Printer(p, d).run();
  return s;
}

std::string renderModule(std::span<const Kernel> kernels, Dialect d) {
  std::string s(kernelPrelude());
  for (const Kernel& k : kernels) s += "\n" + renderKernel(k, d);
  return s;
}

}  // namespace kiln::codegen
