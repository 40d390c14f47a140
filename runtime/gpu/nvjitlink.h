// PTX to a cubin for one GPU architecture with nvJitLink (libnvJitLink.so.13, loaded with dlopen):
// the CUDA backend's fallback when an artifact's cubins are for another GPU. The toolkit's linker
// rather than the driver's JIT: it is the compiler that produced the PTX's release (the driver's
// JIT may be older than the PTX ISA), its errors come back as a log, and it runs without a GPU,
// so the fallback is tested on every machine.
#pragma once

#include <cstddef>
#include <span>
#include <string_view>
#include <vector>

#include "ir/status.h"

namespace kiln::runtime::gpu {

// Whether `image` is PTX text (else a binary: a cubin's ELF image, or a fatbin).
bool isPtx(std::span<const std::byte> image);

// Links `ptx` (text; a trailing NUL is allowed) into a cubin for sm_`smArch`. kNotFound when
// nvJitLink cannot be loaded or does not know the architecture, kInvalidArgument with its error log
// when the PTX does not link for that architecture (`name` labels the module in errors).
Expected<std::vector<std::byte>> linkPtxToCubin(std::span<const std::byte> ptx, int smArch,
                                                std::string_view name);

}  // namespace kiln::runtime::gpu
