// The table of ONNX op mappers, gathered from the families in onnx_map_*.cpp.
#include <string>
#include <unordered_map>

#include "frontends/onnx/onnx_importer.h"

namespace kiln::frontends::onnx_import {

OpMapper findMapper(std::string_view domain, std::string_view opType) {
  static const std::unordered_map<std::string, OpMapper> kTable = [] {
    std::unordered_map<std::string, OpMapper> t;
    for (auto family :
         {pointwiseMappers, nnMappers, movementMappers, constantMappers, padResizeMappers})
      for (const MapperEntry& e : family()) t.emplace(std::string(e.opType), e.map);
    return t;
  }();
  if (domain == "com.microsoft") return opType == "Gelu" ? mapGelu : nullptr;
  if (!domain.empty()) return nullptr;
  auto it = kTable.find(std::string(opType));
  return it == kTable.end() ? nullptr : it->second;
}

}  // namespace kiln::frontends::onnx_import
