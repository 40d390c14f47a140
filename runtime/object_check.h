// kiln's own check of a relocatable ELF object before LLVM's JIT linker sees it. The linker
// trusts its input: a malformed object read from an artifact or a kernel cache entry made it
// crash (SIGSEGV, SIGILL) or abort ("LLVM ERROR: Relocation type not implemented yet!"). This
// check turns such an object into an error; the machine code itself is not (cannot be)
// checked, which is why artifacts are trusted code (docs/artifact-format.md).
#pragma once

#include <cstddef>
#include <span>
#include <string>

#include "ir/status.h"

namespace kiln::runtime {

// Checks that `object` is what kiln's kernel compiler makes: a little-endian ELF64 x86-64
// relocatable object whose headers, sections, string tables, symbols and relocations all lie
// within the file and refer to existing sections and symbols; whose section types are those of
// compiled code (progbits, nobits, symbol and string tables, RELA relocations, notes, unwind
// tables, groups, LLVM's address-significance table); and whose relocations are of the types
// kiln's kernels use (PC32, PLT32, GOTPCREL and its relaxable forms, 64), each applied inside
// its section. `name` labels errors; kInvalidArgument names the offending part.
Status checkKernelObject(std::span<const std::byte> object, const std::string& name);

}  // namespace kiln::runtime
