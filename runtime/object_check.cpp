#include "runtime/object_check.h"

#include <elf.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <optional>
#include <vector>

namespace kiln::runtime {

namespace {

// Section types glibc's elf.h may lack.
constexpr uint32_t kShtX86_64Unwind = 0x70000001;  // .eh_frame on x86-64.
constexpr uint32_t kShtLlvmAddrsig = 0x6fff4c03;   // .llvm_addrsig.
// Bounds on what a kernel module can need; a larger value is a malformed header, and the JIT
// would otherwise allocate it.
constexpr uint64_t kMaxNobits = uint64_t{1} << 30;
constexpr uint64_t kMaxAlign = 4096;
constexpr uint64_t kMaxSections = 4096;
// All loaded sections together (the linker allocates and zero-fills or copies each one).
constexpr uint64_t kMaxLoadedBytes = uint64_t{256} << 20;

template <class T>
std::optional<T> readAt(std::span<const std::byte> bytes, uint64_t offset) {
  if (offset > bytes.size() || bytes.size() - offset < sizeof(T)) return std::nullopt;
  T value;
  std::memcpy(&value, bytes.data() + offset, sizeof(T));
  return value;
}

// Bytes a relocation type writes, or 0 for a type kiln does not emit.
int relocationWidth(uint32_t type) {
  switch (type) {
    case R_X86_64_PC32:       // Constants in .rodata, .eh_frame.
    case R_X86_64_PLT32:      // Calls to libm/libc (expf, memset).
    case R_X86_64_GOTPCREL:   // -fPIC references to data outside the object,
    case R_X86_64_GOTPCRELX:  // and their linker-relaxable forms.
    case R_X86_64_REX_GOTPCRELX:
      return 4;
    case R_X86_64_64:  // Absolute addresses in data (tables of pointers).
      return 8;
    default:
      return 0;
  }
}

class Checker {
 public:
  Checker(std::span<const std::byte> bytes, const std::string& name) : b_(bytes), name_(name) {}

  Status run() {
    const auto eh = readAt<Elf64_Ehdr>(b_, 0);
    if (!eh || std::memcmp(eh->e_ident, ELFMAG, SELFMAG) != 0)
      return bad("not an ELF file (" + std::to_string(b_.size()) + " bytes)");
    if (eh->e_ident[EI_CLASS] != ELFCLASS64 || eh->e_ident[EI_DATA] != ELFDATA2LSB)
      return bad("not a little-endian 64-bit ELF file");
    if (eh->e_type != ET_REL)
      return bad("not a relocatable object (ELF type " + std::to_string(eh->e_type) + ")");
    if (eh->e_machine != EM_X86_64)
      return bad("not an x86-64 object (machine " + std::to_string(eh->e_machine) + ")");
    if (eh->e_phnum != 0) return bad("a relocatable object with program headers");
    if (eh->e_shentsize != sizeof(Elf64_Shdr))
      return bad("section header size " + std::to_string(eh->e_shentsize));
    if (eh->e_shnum == 0 || eh->e_shnum >= SHN_LORESERVE || eh->e_shnum > kMaxSections)
      return bad("section count " + std::to_string(eh->e_shnum));
    if (!within(eh->e_shoff, uint64_t{eh->e_shnum} * sizeof(Elf64_Shdr)))
      return bad("the section headers lie outside the file");
    for (uint16_t i = 0; i < eh->e_shnum; ++i)
      shdr_.push_back(*readAt<Elf64_Shdr>(b_, eh->e_shoff + uint64_t{i} * sizeof(Elf64_Shdr)));
    if (eh->e_shstrndx == SHN_UNDEF || eh->e_shstrndx >= shdr_.size())
      return bad("section name table index " + std::to_string(eh->e_shstrndx));

    for (size_t i = 0; i < shdr_.size(); ++i) KILN_TRY(checkSection(i));
    uint64_t loaded = 0;
    for (const Elf64_Shdr& sh : shdr_)
      if (sh.sh_flags & SHF_ALLOC) {
        loaded += sh.sh_size;  // Each at most 1 GiB (checked above), so no overflow.
        if (loaded > kMaxLoadedBytes)
          return bad("its sections would take more than " + std::to_string(kMaxLoadedBytes) +
                     " bytes of memory");
      }
    KILN_TRY(checkStringTable(eh->e_shstrndx));
    for (size_t i = 0; i < shdr_.size(); ++i)
      if (!nameAt(eh->e_shstrndx, shdr_[i].sh_name))
        return bad("section " + std::to_string(i) + ": its name lies outside the name table");
    for (size_t i = 0; i < shdr_.size(); ++i)
      if (shdr_[i].sh_type == SHT_SYMTAB) KILN_TRY(checkSymbols(i));
    for (size_t i = 0; i < shdr_.size(); ++i)
      if (shdr_[i].sh_type == SHT_RELA) KILN_TRY(checkRelocations(i));
    for (size_t i = 0; i < shdr_.size(); ++i)
      if (shdr_[i].sh_type == kShtX86_64Unwind) KILN_TRY(checkUnwindTable(i));
    return Status::ok();
  }

 private:
  Status bad(const std::string& what) const {
    return invalidArgument("object '" + name_ + "' is malformed: " + what +
                           "; it was not made by kiln's kernel compiler (a damaged or edited "
                           "artifact or cache entry)");
  }

  bool within(uint64_t offset, uint64_t size) const {
    return offset <= b_.size() && size <= b_.size() - offset;
  }

  std::string where(size_t i) const { return "section " + std::to_string(i); }

  Status checkSection(size_t i) {
    const Elf64_Shdr& s = shdr_[i];
    if (i == 0) {
      if (s.sh_type != SHT_NULL) return bad("section 0 is not the null section");
      return Status::ok();
    }
    switch (s.sh_type) {
      case SHT_PROGBITS:
      case SHT_NOBITS:
      case SHT_SYMTAB:
      case SHT_STRTAB:
      case SHT_RELA:
      case SHT_NOTE:
      case SHT_GROUP:
      case kShtX86_64Unwind:
      case kShtLlvmAddrsig:
        break;
      default:
        return bad(where(i) + " has type " + std::to_string(s.sh_type) +
                   ", which kiln's kernels never contain");
    }
    if (s.sh_type == SHT_NOBITS) {
      if (s.sh_size > kMaxNobits)
        return bad(where(i) + " asks for " + std::to_string(s.sh_size) + " zeroed bytes");
    } else if (!within(s.sh_offset, s.sh_size)) {
      return bad(where(i) + " (" + std::to_string(s.sh_size) + " bytes at " +
                 std::to_string(s.sh_offset) + ") lies outside the file");
    }
    constexpr uint64_t kKnownFlags = SHF_WRITE | SHF_ALLOC | SHF_EXECINSTR | SHF_MERGE |
                                     SHF_STRINGS | SHF_INFO_LINK | SHF_GROUP | SHF_EXCLUDE;
    if ((s.sh_flags & ~kKnownFlags) != 0)
      return bad(where(i) + " has flags " + std::to_string(s.sh_flags) +
                 " that kiln's kernels never use");
    if ((s.sh_flags & SHF_MERGE) && s.sh_entsize == 0)
      return bad(where(i) + " is mergeable with entries of 0 bytes");
    if (s.sh_addralign > kMaxAlign || (s.sh_addralign & (s.sh_addralign - 1)) != 0)
      return bad(where(i) + " has alignment " + std::to_string(s.sh_addralign));
    if (s.sh_link >= shdr_.size())
      return bad(where(i) + " links to section " + std::to_string(s.sh_link));
    return Status::ok();
  }

  Status checkStringTable(size_t i) const {
    const Elf64_Shdr& s = shdr_[i];
    if (s.sh_type != SHT_STRTAB) return bad(where(i) + " should be a string table");
    if (s.sh_size == 0 || b_[s.sh_offset + s.sh_size - 1] != std::byte{0})
      return bad(where(i) + ": a string table that does not end in NUL");
    return Status::ok();
  }

  bool nameAt(size_t table, uint64_t offset) const { return offset < shdr_[table].sh_size; }

  Status checkSymbols(size_t i) {
    const Elf64_Shdr& s = shdr_[i];
    if (s.sh_entsize != sizeof(Elf64_Sym) || s.sh_size % sizeof(Elf64_Sym) != 0)
      return bad(where(i) + ": symbol entries of " + std::to_string(s.sh_entsize) + " bytes");
    KILN_TRY(checkStringTable(s.sh_link));
    const uint64_t count = s.sh_size / sizeof(Elf64_Sym);
    if (s.sh_info > count) return bad(where(i) + ": first global symbol past the table");
    for (uint64_t k = 0; k < count; ++k) {
      const Elf64_Sym sym = *readAt<Elf64_Sym>(b_, s.sh_offset + k * sizeof(Elf64_Sym));
      const std::string what = "symbol " + std::to_string(k);
      if (!nameAt(s.sh_link, sym.st_name)) return bad(what + ": its name lies outside the table");
      const unsigned type = ELF64_ST_TYPE(sym.st_info);
      if (type != STT_NOTYPE && type != STT_OBJECT && type != STT_FUNC && type != STT_SECTION &&
          type != STT_FILE)
        return bad(what + " has type " + std::to_string(type) +
                   " (thread-local or indirect symbols are never in kiln's kernels)");
      const uint16_t sec = sym.st_shndx;
      if (type == STT_SECTION && (sec == SHN_UNDEF || sec >= shdr_.size()))
        return bad(what + " is a section symbol without a section");
      if (sec == SHN_UNDEF || sec == SHN_ABS) continue;
      if (sec >= shdr_.size())
        return bad(what + " is defined in section " + std::to_string(sec) +
                   ", which does not exist");
      const Elf64_Shdr& in = shdr_[sec];
      if (type == STT_FUNC && (in.sh_type != SHT_PROGBITS || (in.sh_flags & SHF_ALLOC) == 0 ||
                               (in.sh_flags & SHF_EXECINSTR) == 0))
        return bad(what + " is a function in section " + std::to_string(sec) +
                   ", which is not loaded code");
      if (type == STT_FUNC || type == STT_OBJECT) {
        if (sym.st_value > in.sh_size || sym.st_size > in.sh_size - sym.st_value)
          return bad(what + " (" + std::to_string(sym.st_size) + " bytes at " +
                     std::to_string(sym.st_value) + ") lies outside its section of " +
                     std::to_string(in.sh_size) + " bytes");
      } else if (sym.st_value > in.sh_size) {
        return bad(what + " lies past the end of its section");
      }
    }
    symbolCount_[i] = count;
    symbolTable_[i] = s.sh_offset;
    return Status::ok();
  }

  Status checkRelocations(size_t i) {
    const Elf64_Shdr& s = shdr_[i];
    if (s.sh_entsize != sizeof(Elf64_Rela) || s.sh_size % sizeof(Elf64_Rela) != 0)
      return bad(where(i) + ": relocation entries of " + std::to_string(s.sh_entsize) + " bytes");
    if (shdr_[s.sh_link].sh_type != SHT_SYMTAB)
      return bad(where(i) + ": its symbol table is section " + std::to_string(s.sh_link) +
                 ", not a symbol table");
    if (s.sh_info == 0 || s.sh_info >= shdr_.size())
      return bad(where(i) + " relocates section " + std::to_string(s.sh_info));
    const Elf64_Shdr& target = shdr_[s.sh_info];
    if (target.sh_type == SHT_NOBITS || target.sh_type == SHT_RELA ||
        target.sh_type == SHT_SYMTAB || target.sh_type == SHT_STRTAB ||
        (target.sh_flags & SHF_ALLOC) == 0)
      return bad(where(i) + " relocates section " + std::to_string(s.sh_info) + " of type " +
                 std::to_string(target.sh_type) + ", which is not loaded");
    const uint64_t symbols = symbolCount_.count(s.sh_link) ? symbolCount_.at(s.sh_link) : 0;
    const uint64_t count = s.sh_size / sizeof(Elf64_Rela);
    for (uint64_t k = 0; k < count; ++k) {
      const Elf64_Rela r = *readAt<Elf64_Rela>(b_, s.sh_offset + k * sizeof(Elf64_Rela));
      const std::string what = where(i) + ", relocation " + std::to_string(k);
      const uint32_t type = ELF64_R_TYPE(r.r_info);
      const int width = relocationWidth(type);
      if (width == 0)
        return bad(what + " has type " + std::to_string(type) +
                   ", not one of the types kiln's kernels use");
      const uint64_t symIndex = ELF64_R_SYM(r.r_info);
      if (symIndex == 0 || symIndex >= symbols)
        return bad(what + " names symbol " + std::to_string(symIndex) + " of " +
                   std::to_string(symbols));
      // LLVM's linker aborts on relocations against file symbols and section symbols without
      // a section (checkSymbols refuses the latter).
      const Elf64_Sym sym =
          *readAt<Elf64_Sym>(b_, symbolTable_.at(s.sh_link) + symIndex * sizeof(Elf64_Sym));
      const unsigned symType = ELF64_ST_TYPE(sym.st_info);
      if (symType != STT_NOTYPE && symType != STT_OBJECT && symType != STT_FUNC &&
          symType != STT_SECTION)
        return bad(what + " refers to symbol " + std::to_string(symIndex) + " of type " +
                   std::to_string(symType));
      if (r.r_offset > target.sh_size || static_cast<uint64_t>(width) > target.sh_size - r.r_offset)
        return bad(what + " writes " + std::to_string(width) + " bytes at " +
                   std::to_string(r.r_offset) + ", outside its section of " +
                   std::to_string(target.sh_size) + " bytes");
    }
    return Status::ok();
  }

  std::span<const std::byte> b_;
  const std::string& name_;
  std::vector<Elf64_Shdr> shdr_;
  // The unwind table (.eh_frame), which the loader registers with the C++ runtime: libgcc
  // walks it at the next exception anywhere in the process, trusting every length and offset.
  // Its records must tile the section: 32-bit lengths, each CIE with a NUL-terminated
  // augmentation string of the letters compilers write and version 1 or 3, each FDE pointing
  // back at the start of a CIE before it, and nothing after a zero terminator.
  Status checkUnwindTable(size_t i) const {
    const Elf64_Shdr& s = shdr_[i];
    const std::string what = where(i) + " (unwind table)";
    std::vector<uint64_t> cies;
    uint64_t at = 0;
    while (at < s.sh_size) {
      if (s.sh_size - at < 4) return bad(what + ": a record header is cut short");
      const uint32_t length = *readAt<uint32_t>(b_, s.sh_offset + at);
      if (length == 0) break;  // The terminator.
      if (length == 0xffffffffu) return bad(what + ": 64-bit record lengths are never written");
      if (length < 4 || length > s.sh_size - at - 4)
        return bad(what + ": a record of " + std::to_string(length) + " bytes at " +
                   std::to_string(at) + " runs past the section");
      const uint64_t body = at + 4;
      const uint32_t id = *readAt<uint32_t>(b_, s.sh_offset + body);
      if (id == 0) {
        // A CIE: id, version, augmentation string, then code/data alignment and more.
        if (length < 6) return bad(what + ": a CIE of " + std::to_string(length) + " bytes");
        const auto version = static_cast<uint8_t>(b_[s.sh_offset + body + 4]);
        if (version != 1 && version != 3)
          return bad(what + ": CIE version " + std::to_string(version));
        uint64_t k = body + 5;
        const uint64_t end = body + length;
        for (; k < end && b_[s.sh_offset + k] != std::byte{0}; ++k) {
          const char c = static_cast<char>(b_[s.sh_offset + k]);
          if (c != 'z' && c != 'R' && c != 'P' && c != 'L' && c != 'S')
            return bad(what + ": CIE augmentation letter " + std::to_string(c));
        }
        if (k >= end) return bad(what + ": a CIE augmentation string without its NUL");
        cies.push_back(at);
      } else {
        // An FDE: its CIE pointer counts back from the pointer's own position.
        if (id > body || std::find(cies.begin(), cies.end(), body - id) == cies.end())
          return bad(what + ": an FDE at " + std::to_string(at) + " points at no CIE");
        // CIE pointer, and the start and size of the code (4 bytes each, pc-relative).
        if (length < 12) return bad(what + ": an FDE of " + std::to_string(length) + " bytes");
      }
      at = body + length;
    }
    return Status::ok();
  }

  std::map<size_t, uint64_t> symbolCount_;  // Per symbol table section.
  std::map<size_t, uint64_t> symbolTable_;  // Per symbol table section: its file offset.
};

}  // namespace

Status checkKernelObject(std::span<const std::byte> object, const std::string& name) {
  return Checker(object, name).run();
}

}  // namespace kiln::runtime
