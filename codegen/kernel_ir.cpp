#include "codegen/kernel_ir.h"

#include <map>
#include <set>

namespace kiln::codegen {

Expected<ScalarType> scalarTypeOf(ir::DType t) {
  switch (t) {
    case ir::DType::kF32:
      return ScalarType::kF32;
    case ir::DType::kF64:
      return ScalarType::kF64;
    case ir::DType::kI64:
      return ScalarType::kI64;
    case ir::DType::kI32:
      return ScalarType::kI32;
    case ir::DType::kI8:
      return ScalarType::kI8;
    case ir::DType::kU8:
      return ScalarType::kU8;
    case ir::DType::kBool:
      return ScalarType::kBool;
    case ir::DType::kF16:
      return ScalarType::kF16;
    case ir::DType::kBF16:
      return ScalarType::kBF16;
    default:
      return unimplemented("dtype " + std::string(ir::dtypeName(t)) +
                           " is not supported by generated kernels");
  }
}

std::string_view scalarTypeName(ScalarType t) {
  switch (t) {
    case ScalarType::kF32:
      return "f32";
    case ScalarType::kF64:
      return "f64";
    case ScalarType::kI64:
      return "i64";
    case ScalarType::kI32:
      return "i32";
    case ScalarType::kI8:
      return "i8";
    case ScalarType::kU8:
      return "u8";
    case ScalarType::kBool:
      return "bool";
    case ScalarType::kF16:
      return "f16";
    case ScalarType::kBF16:
      return "bf16";
  }
  return "?";
}

bool isHalf(ScalarType t) {
  return t == ScalarType::kF16 || t == ScalarType::kBF16;
}

ScalarType computeType(ScalarType t) {
  return isHalf(t) ? ScalarType::kF32 : t;
}

int64_t Kernel::numElements() const {
  if (isHorizontal()) {
    int64_t n = 0;
    for (const Kernel& p : parts) n += p.numElements();
    return n;
  }
  int64_t n = 1;
  for (int64_t d : domain) n *= d;
  return n;
}

int64_t Kernel::numUnits() const {
  if (isHorizontal()) {
    int64_t n = 0;
    for (const Kernel& p : parts) n += p.numUnits();
    return n;
  }
  if (domain.empty()) return 1;
  if (isReduction())
    return domain[reduceDim] == 0 ? numElements() : numElements() / domain[reduceDim];
  int64_t outer = 1;
  for (size_t d = 0; d + 1 < domain.size(); ++d) outer *= domain[d];
  const int64_t inner = domain.back();
  return outer * ((inner + kChunk - 1) / kChunk);
}

Expected<Kernel> horizontalKernel(std::string name, std::vector<Kernel> parts) {
  std::vector<Kernel> flat;
  for (Kernel& k : parts) {
    if (k.isReduction() || k.isOpKernel())
      return invalidArgument("horizontal kernel " + name + ": part " + k.name + " is " +
                             (k.isOpKernel() ? "an op kernel" : "a reduction"));
    if (k.isHorizontal())
      for (Kernel& p : k.parts) flat.push_back(std::move(p));
    else
      flat.push_back(std::move(k));
  }
  Kernel h;
  h.name = std::move(name);
  std::map<std::string, int> inputIndex;
  std::set<std::string> written;
  for (const Kernel& k : flat)
    for (const KernelArg& a : k.args)
      if (a.output && !written.insert(a.value).second)
        return invalidArgument("horizontal kernel " + h.name + ": two parts write " + a.value);
  // Inputs first (each value once), then outputs: the order the plan passes them in.
  h.partArgs.resize(flat.size());
  for (size_t i = 0; i < flat.size(); ++i)
    for (const KernelArg& a : flat[i].args) {
      if (a.output) continue;
      if (written.count(a.value))
        return invalidArgument("horizontal kernel " + h.name + ": part " + flat[i].name +
                               " reads " + a.value + ", which another part writes");
      auto [it, fresh] = inputIndex.emplace(a.value, static_cast<int>(h.args.size()));
      if (fresh) h.args.push_back(a);
    }
  for (size_t i = 0; i < flat.size(); ++i)
    for (const KernelArg& a : flat[i].args) {
      if (a.output) {
        h.partArgs[i].push_back(static_cast<int>(h.args.size()));
        h.args.push_back(a);
      } else {
        h.partArgs[i].push_back(inputIndex.at(a.value));
      }
    }
  h.parts = std::move(flat);
  std::string hname = h.name;
  return renamedKernel(std::move(h), std::move(hname));
}

Kernel renamedKernel(Kernel k, std::string name) {
  k.name = std::move(name);
  for (size_t i = 0; i < k.parts.size(); ++i) k.parts[i].name = k.name + "_p" + std::to_string(i);
  return k;
}

}  // namespace kiln::codegen
