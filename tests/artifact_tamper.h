// Tampering with an artifact image the way someone with write access could: damage the first
// relocation of its first kernel object (a type no kiln kernel uses), for the tests that require
// the object check to catch it once the image is resealed (runtime::resealArtifact).
#pragma once

#include <elf.h>

#include <cstddef>
#include <cstring>
#include <vector>

namespace kiln::test {

// Gives the first relocation of the first ELF object found in `image` the type
// R_X86_64_TPOFF32. False when the image holds no object with a relocation.
inline bool corruptFirstRelocation(std::vector<std::byte>& image) {
  const std::byte magic[4] = {std::byte{0x7f}, std::byte{'E'}, std::byte{'L'}, std::byte{'F'}};
  for (size_t at = 0; at + sizeof(Elf64_Ehdr) <= image.size(); ++at) {
    if (std::memcmp(image.data() + at, magic, 4) != 0) continue;
    Elf64_Ehdr eh;
    std::memcpy(&eh, image.data() + at, sizeof(eh));
    if (eh.e_type != ET_REL || eh.e_shentsize != sizeof(Elf64_Shdr)) continue;
    for (size_t i = 0; i < eh.e_shnum; ++i) {
      const size_t sh = at + eh.e_shoff + i * sizeof(Elf64_Shdr);
      if (sh + sizeof(Elf64_Shdr) > image.size()) break;
      Elf64_Shdr s;
      std::memcpy(&s, image.data() + sh, sizeof(s));
      if (s.sh_type != SHT_RELA || s.sh_size < sizeof(Elf64_Rela)) continue;
      const size_t r = at + s.sh_offset;
      if (r + sizeof(Elf64_Rela) > image.size()) break;
      Elf64_Rela rela;
      std::memcpy(&rela, image.data() + r, sizeof(rela));
      rela.r_info = ELF64_R_INFO(ELF64_R_SYM(rela.r_info), R_X86_64_TPOFF32);
      std::memcpy(image.data() + r, &rela, sizeof(rela));
      return true;
    }
  }
  return false;
}

}  // namespace kiln::test
