#include "ir/op_table.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <cstdlib>
#include <iostream>
#include <vector>

#include "ir/infer.h"

namespace kiln::ir {

namespace {

std::vector<AttrSpec> specsOrDie(std::string_view spec) {
  auto parsed = parseAttrSpecs(spec);
  if (!parsed) {
    // ops.def is compiled into kiln; a bad spec is a build-time bug, caught by every test.
    std::cerr << "kiln internal error in ops.def: " << parsed.status().message() << "\n";
    std::abort();
  }
  return std::move(parsed).value();
}

const std::array<OpInfo, kNumOps>& table() {
  static const std::array<OpInfo, kNumOps> t = {{
#define KILN_OP(E, name, minIn, maxIn, nOut, traits, attrs, infer) \
  {OpKind::E, name, minIn, maxIn, nOut, traits, specsOrDie(attrs), &infer},
#include "ir/ops.def"
#undef KILN_OP
  }};
  return t;
}

}  // namespace

const AttrSpec* OpInfo::findAttr(std::string_view attrName) const {
  for (const auto& a : attrs)
    if (a.name == attrName) return &a;
  return nullptr;
}

const OpInfo& opInfo(OpKind k) {
  return table()[static_cast<size_t>(k)];
}
std::string_view opName(OpKind k) {
  return opInfo(k).name;
}

bool isChannelsLastActivation(const OpInfo& op, int input, size_t rank) {
  if (!op.has(kChannelsLast) || rank != 4) return false;
  if (op.has(kFilterInput1) && input == 1) return false;
  return !(op.has(kFilterGradient) && (input < 0 || input == 2));
}

const OpInfo* findOp(std::string_view name) {
  for (const auto& op : table())
    if (op.name == name) return &op;
  return nullptr;
}

const AttrValue& AttrView::lookup(std::string_view name) const {
  if (auto it = attrs_.find(std::string(name)); it != attrs_.end()) return it->second;
  const AttrSpec* spec = op_.findAttr(name);
  if (!spec || !spec->defaultValue) {
    std::cerr << "kiln internal error: op '" << op_.name << "' read attribute '" << name
              << "' which is neither set nor defaulted\n";
    std::abort();
  }
  return *spec->defaultValue;
}

int64_t AttrView::getInt(std::string_view n) const {
  return std::get<int64_t>(lookup(n));
}
double AttrView::getFloat(std::string_view n) const {
  return std::get<double>(lookup(n));
}
const std::string& AttrView::getString(std::string_view n) const {
  return std::get<std::string>(lookup(n));
}
const std::vector<int64_t>& AttrView::getInts(std::string_view n) const {
  return std::get<std::vector<int64_t>>(lookup(n));
}
const std::vector<double>& AttrView::getFloats(std::string_view n) const {
  return std::get<std::vector<double>>(lookup(n));
}
const TensorData& AttrView::getTensor(std::string_view n) const {
  return std::get<TensorData>(lookup(n));
}

Status checkAttributes(const OpInfo& op, const AttrMap& attrs) {
  for (const auto& [name, value] : attrs) {
    const AttrSpec* spec = op.findAttr(name);
    if (!spec) {
      std::string known;
      for (const auto& a : op.attrs) known += (known.empty() ? "" : ", ") + a.name;
      return invalidArgument("op '" + std::string(op.name) + "' has no attribute '" + name +
                             "' (it takes: " + (known.empty() ? "none" : known) + ")");
    }
    if (kindOf(value) != spec->kind)
      return invalidArgument("attribute '" + name + "' of op '" + std::string(op.name) +
                             "' must be " + std::string(attrKindName(spec->kind)) + ", got " +
                             std::string(attrKindName(kindOf(value))));
  }
  for (const auto& spec : op.attrs)
    if (!spec.defaultValue && !attrs.count(spec.name))
      return invalidArgument("op '" + std::string(op.name) + "' requires attribute '" + spec.name +
                             "' (" + std::string(attrKindName(spec.kind)) + ")");
  return Status::ok();
}

Expected<std::vector<TensorType>> inferTypes(OpKind k, std::span<const TensorType> inputs,
                                             const AttrMap& attrs) {
  const OpInfo& op = opInfo(k);
  const int n = static_cast<int>(inputs.size());
  if (n < op.minInputs || (op.maxInputs >= 0 && n > op.maxInputs)) {
    std::string expected = op.minInputs == op.maxInputs ? std::to_string(op.minInputs)
                           : op.maxInputs < 0
                               ? "at least " + std::to_string(op.minInputs)
                               : std::to_string(op.minInputs) + ".." + std::to_string(op.maxInputs);
    return invalidArgument("op '" + std::string(op.name) + "' takes " + expected + " inputs, got " +
                           std::to_string(n));
  }
  KILN_TRY(checkAttributes(op, attrs));
  auto out = op.infer(inputs, AttrView(op, attrs));
  if (!out) return out.status().withContext(std::string(op.name));
  return out;
}

size_t nameDistance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      const bool same = std::tolower(static_cast<unsigned char>(a[i - 1])) ==
                        std::tolower(static_cast<unsigned char>(b[j - 1]));
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (same ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

}  // namespace kiln::ir
