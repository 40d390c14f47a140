#include "runtime/library_info.h"

#include <oneapi/dnnl/dnnl.h>

namespace kiln::runtime {

std::string libraryIdentity() {
  const dnnl_version_t* v = dnnl_version();
  std::string s = "onednn " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." +
                  std::to_string(v->patch) + " (" + v->hash + ")";
  s += " sgemm-blocks";  // lib::sgemm's one-thread block grid (its bits; was OpenBLAS's).
  return s;
}

}  // namespace kiln::runtime
