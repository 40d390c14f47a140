// The registry of ONNX op mappers with the operator versions each handles, gathered from the
// families in onnx_map_*.cpp, and the operator history of the ONNX specification
// (onnx_op_versions.inc) that tells which version of an op a model's opset means.
#include <algorithm>
#include <climits>
#include <cstdint>
#include <map>
#include <string>
#include <unordered_map>

#include "frontends/onnx/onnx_import.h"
#include "frontends/onnx/onnx_importer.h"

namespace kiln::frontends::onnx_import {

namespace {

struct OpHistory {
  std::vector<int> versions;  // since_version of each definition; negative: deprecated there.
};

const std::unordered_map<std::string_view, OpHistory>& history() {
  static const auto* table = [] {
    auto* t = new std::unordered_map<std::string_view, OpHistory>;
#define KILN_ONNX_OP(name, ...) t->emplace(name, OpHistory{{__VA_ARGS__}});
#include "frontends/onnx/onnx_op_versions.inc"
#undef KILN_ONNX_OP
#undef KILN_ONNX_SCHEMA
    return t;
  }();
  return *table;
}

// What one version of an op accepts.
struct SchemaFacts {
  int minInputs, maxInputs, minOutputs, maxOutputs;
  std::string_view attributes;  // Comma-separated names.
};

const std::map<std::pair<std::string_view, int>, SchemaFacts>& schemas() {
  static const auto* table = [] {
    auto* t = new std::map<std::pair<std::string_view, int>, SchemaFacts>;
#define KILN_ONNX_SCHEMA(name, version, minIn, maxIn, minOut, maxOut, attrs) \
  t->emplace(std::make_pair(std::string_view(name), version),                \
             SchemaFacts{minIn, maxIn, minOut, maxOut, attrs});
#include "frontends/onnx/onnx_op_versions.inc"
#undef KILN_ONNX_OP
#undef KILN_ONNX_SCHEMA
    return t;
  }();
  return *table;
}

static_assert(KILN_ONNX_NEWEST_OPSET == kMaxOnnxOpset,
              "onnx_op_versions.inc and kMaxOnnxOpset disagree on the newest opset");

std::string joinVersions(const std::vector<int>& vs) {
  std::string s;
  for (int v : vs) s += (s.empty() ? "" : ", ") + std::to_string(v);
  return s;
}

const std::unordered_map<std::string, MapperEntry>& registry() {
  static const auto* table = [] {
    auto* t = new std::unordered_map<std::string, MapperEntry>;
    for (auto family :
         {pointwiseMappers, nnMappers, movementMappers, constantMappers, padResizeMappers,
          compositeMappers, attentionMappers, derivedMappers, recurrentMappers, signalMappers,
          samplingMappers, indexingMappers, controlFlowMappers, valueSizedMappers})
      for (MapperEntry& e : family()) t->emplace(std::string(e.opType), std::move(e));
    return t;
  }();
  return *table;
}

}  // namespace

int onnxOpVersion(std::string_view opType, int opset) {
  const auto it = history().find(opType);
  if (it == history().end()) return 0;
  int version = 0;
  for (int v : it->second.versions)
    if (std::abs(v) <= opset) version = v;
  return std::max(version, 0);  // A deprecated definition: not defined at this opset.
}

std::vector<int> onnxOpHistory(std::string_view opType) {
  const auto it = history().find(opType);
  return it == history().end() ? std::vector<int>{} : it->second.versions;
}

MapperLookup findMapper(std::string_view domain, std::string_view opType, int opset) {
  MapperLookup r;
  if (domain == "com.microsoft") {
    if (opType == "Gelu")
      r.map = mapGelu;
    else
      r.problem = "kiln maps only the default ONNX domain (and com.microsoft.Gelu)";
    return r;
  }
  if (!domain.empty()) {
    r.problem = "kiln maps only the default ONNX domain (and com.microsoft.Gelu)";
    return r;
  }
  const std::vector<int> hist = onnxOpHistory(opType);
  r.version = onnxOpVersion(opType, opset);
  if (r.version == 0) {
    if (hist.empty()) {
      r.problem = "'" + std::string(opType) + "' is not an operator of the ONNX specification " +
                  "(as of opset " + std::to_string(kMaxOnnxOpset) + ")";
    } else if (std::abs(hist.front()) > opset) {
      r.problem = std::string(opType) + " is not defined at opset " + std::to_string(opset) +
                  "; ONNX introduced it in opset " + std::to_string(std::abs(hist.front())) +
                  " (raise the model's opset_import)";
    } else {
      r.problem = std::string(opType) + " is deprecated at opset " + std::to_string(opset) +
                  " (the ONNX specification removed it; convert the model with " +
                  "onnx.version_converter)";
    }
    r.invalid = true;
    return r;
  }
  const auto it = registry().find(std::string(opType));
  if (it == registry().end()) {
    r.problem = "kiln has no mapping for this op";
    return r;
  }
  const std::vector<int>& handled = it->second.versions;
  if (std::find(handled.begin(), handled.end(), r.version) == handled.end()) {
    r.problem = "kiln does not map version " + std::to_string(r.version) + " of " +
                std::string(opType) + " (the definition in effect at opset " +
                std::to_string(opset) + "); it maps versions " + joinVersions(handled);
    return r;
  }
  r.map = it->second.map;
  return r;
}

Status checkNodeSchema(const ::onnx::NodeProto& node, int version) {
  const auto it = schemas().find({node.op_type(), version});
  if (it == schemas().end()) return Status::ok();  // Not a default-domain op version.
  const SchemaFacts& f = it->second;
  const std::string what = node.op_type() + " version " + std::to_string(version);
  const int in = node.input_size(), out = node.output_size();
  // "1", "1 to 3" or "1 or more" (a variadic maximum is INT32_MAX).
  auto range = [](int lo, int hi) {
    return std::to_string(lo) + (hi == lo          ? ""
                                 : hi == INT32_MAX ? " or more"
                                                   : " to " + std::to_string(hi));
  };
  if (in < f.minInputs || in > f.maxInputs)
    return invalidArgument(what + " takes " + range(f.minInputs, f.maxInputs) +
                           " inputs, the node has " + std::to_string(in));
  if (out < f.minOutputs || out > f.maxOutputs)
    return invalidArgument(what + " has " + range(f.minOutputs, f.maxOutputs) +
                           " outputs, the node has " + std::to_string(out));
  for (const auto& a : node.attribute()) {
    bool known = false;
    for (size_t b = 0; b <= f.attributes.size() && !known;) {
      const size_t e = std::min(f.attributes.find(',', b), f.attributes.size());
      known = f.attributes.substr(b, e - b) == a.name();
      b = e + 1;
    }
    if (!known)
      return invalidArgument(what + " has no attribute '" + a.name() + "'" +
                             (f.attributes.empty()
                                  ? std::string(" (it has none)")
                                  : " (it has " + std::string(f.attributes) + ")") +
                             "; the node may be written for another opset");
  }
  return Status::ok();
}

std::vector<MappedOp> mappedOps() {
  std::vector<MappedOp> ops;
  for (const auto& [name, e] : registry()) ops.push_back({name, e.versions});
  std::sort(ops.begin(), ops.end(),
            [](const MappedOp& a, const MappedOp& b) { return a.opType < b.opType; });
  return ops;
}

}  // namespace kiln::frontends::onnx_import
