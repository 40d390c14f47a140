#include "runtime/library_info.h"

#include <cblas.h>

#include <oneapi/dnnl/dnnl.h>

namespace kiln::runtime {

std::string libraryIdentity() {
  const dnnl_version_t* v = dnnl_version();
  std::string s = "onednn " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." +
                  std::to_string(v->patch) + " (" + v->hash + ")";
  s += std::string(" openblas ") + openblas_get_config();
  return s;
}

}  // namespace kiln::runtime
