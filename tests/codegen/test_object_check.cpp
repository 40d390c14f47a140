// checkKernelObject (runtime/object_check.h): real kernel objects pass; every kind of damage to
// their headers, sections, symbols and relocations is an error before LLVM's linker sees the
// bytes, and damaged objects that pass still load without crashing the loader.
#include <elf.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "codegen/cpu_compiler.h"
#include "runtime/object_check.h"
#include "runtime/object_loader.h"

using kiln::runtime::checkKernelObject;

namespace {

// A kernel like the generated ones: calls into libm (PLT32), constants (PC32), a table.
const char* kKernel = R"(
extern "C" float expf(float);
static const float kTable[4] = {1.f, 2.f, 3.f, 4.f};
extern "C" void k(void* const* args, long long begin, long long end) {
  const float* x = static_cast<const float*>(args[0]);
  float* y = static_cast<float*>(args[1]);
  for (long long i = begin; i < end; ++i) y[i] = expf(x[i]) * kTable[i & 3] + 0.5f;
}
)";

std::vector<std::byte> compiledObject() {
  auto o = kiln::codegen::compileCpp(kKernel, "object_check");
  INFO(o.status().message());
  REQUIRE(o.hasValue());
  return o->bytes;
}

template <class T>
T get(const std::vector<std::byte>& b, uint64_t at) {
  T v;
  std::memcpy(&v, b.data() + at, sizeof(T));
  return v;
}
template <class T>
void put(std::vector<std::byte>& b, uint64_t at, const T& v) {
  std::memcpy(b.data() + at, &v, sizeof(T));
}

Elf64_Shdr section(const std::vector<std::byte>& b, size_t i) {
  const auto eh = get<Elf64_Ehdr>(b, 0);
  return get<Elf64_Shdr>(b, eh.e_shoff + i * sizeof(Elf64_Shdr));
}
uint64_t sectionHeaderAt(const std::vector<std::byte>& b, size_t i) {
  return get<Elf64_Ehdr>(b, 0).e_shoff + i * sizeof(Elf64_Shdr);
}
// The first section of `type`, or 0.
size_t findSection(const std::vector<std::byte>& b, uint32_t type) {
  const auto eh = get<Elf64_Ehdr>(b, 0);
  for (size_t i = 1; i < eh.e_shnum; ++i)
    if (section(b, i).sh_type == type) return i;
  return 0;
}

std::string errorOf(const std::vector<std::byte>& b) {
  kiln::Status st = checkKernelObject(b, "test");
  return st.isOk() ? std::string() : st.message();
}

}  // namespace

TEST_CASE("object check: kiln's own objects pass and load") {
  const auto object = compiledObject();
  CHECK(errorOf(object).empty());
  kiln::runtime::LoadedObjects loaded;
  CHECK(loaded.add(object, "object_check").isOk());
  CHECK(loaded.lookup("k").hasValue());
}

TEST_CASE("object check: each kind of damage is a named error") {
  const auto good = compiledObject();
  const size_t rela = findSection(good, SHT_RELA);
  const size_t symtab = findSection(good, SHT_SYMTAB);
  REQUIRE(rela != 0);
  REQUIRE(symtab != 0);
  const Elf64_Shdr relaHdr = section(good, rela);
  const Elf64_Shdr symHdr = section(good, symtab);

  struct Case {
    const char* what;
    const char* expect;
    std::function<void(std::vector<std::byte>&)> damage;
  };
  const std::vector<Case> cases = {
      {"truncated to 40 bytes", "not an ELF file", [](auto& b) { b.resize(40); }},
      {"another machine", "not an x86-64 object",
       [](auto& b) { put<uint16_t>(b, offsetof(Elf64_Ehdr, e_machine), EM_AARCH64); }},
      {"an executable", "not a relocatable object",
       [](auto& b) { put<uint16_t>(b, offsetof(Elf64_Ehdr, e_type), ET_EXEC); }},
      {"section headers past the end", "section headers lie outside",
       [](auto& b) { put<uint64_t>(b, offsetof(Elf64_Ehdr, e_shoff), b.size() - 8); }},
      {"a section past the end", "lies outside the file",
       [&](auto& b) {
         put<uint64_t>(b, sectionHeaderAt(b, rela) + offsetof(Elf64_Shdr, sh_offset), b.size());
       }},
      {"a huge .bss", "zeroed bytes",
       [&](auto& b) {
         put<uint32_t>(b, sectionHeaderAt(b, symtab - 1) + offsetof(Elf64_Shdr, sh_type),
                       SHT_NOBITS);
         put<uint64_t>(b, sectionHeaderAt(b, symtab - 1) + offsetof(Elf64_Shdr, sh_size),
                       uint64_t{1} << 40);
       }},
      {"an unknown section type", "which kiln's kernels never contain",
       [&](auto& b) {
         put<uint32_t>(b, sectionHeaderAt(b, rela) + offsetof(Elf64_Shdr, sh_type), SHT_DYNAMIC);
       }},
      {"a relocation type kiln never emits", "not one of the types kiln's kernels use",
       [&](auto& b) {
         auto r = get<Elf64_Rela>(b, relaHdr.sh_offset);
         r.r_info = ELF64_R_INFO(ELF64_R_SYM(r.r_info), R_X86_64_TPOFF32);
         put(b, relaHdr.sh_offset, r);
       }},
      {"a relocation outside its section", "outside its section",
       [&](auto& b) {
         auto r = get<Elf64_Rela>(b, relaHdr.sh_offset);
         r.r_offset = uint64_t{1} << 40;
         put(b, relaHdr.sh_offset, r);
       }},
      {"a relocation naming a missing symbol", "names symbol",
       [&](auto& b) {
         auto r = get<Elf64_Rela>(b, relaHdr.sh_offset);
         r.r_info = ELF64_R_INFO(100000, ELF64_R_TYPE(r.r_info));
         put(b, relaHdr.sh_offset, r);
       }},
      {"a symbol in a missing section", "which does not exist",
       [&](auto& b) {
         const uint64_t at =
             symHdr.sh_offset + sizeof(Elf64_Sym) * (symHdr.sh_size / sizeof(Elf64_Sym) - 1);
         auto sym = get<Elf64_Sym>(b, at);
         sym.st_shndx = 900;
         put(b, at, sym);
       }},
      {"a function past its section", "lies outside its section",
       [&](auto& b) {
         for (uint64_t at = symHdr.sh_offset; at < symHdr.sh_offset + symHdr.sh_size;
              at += sizeof(Elf64_Sym)) {
           auto sym = get<Elf64_Sym>(b, at);
           if (ELF64_ST_TYPE(sym.st_info) != STT_FUNC) continue;
           sym.st_size = uint64_t{1} << 32;
           put(b, at, sym);
           return;
         }
       }},
      {"a thread-local symbol", "thread-local",
       [&](auto& b) {
         const uint64_t at = symHdr.sh_offset + sizeof(Elf64_Sym);
         auto sym = get<Elf64_Sym>(b, at);
         sym.st_info = ELF64_ST_INFO(ELF64_ST_BIND(sym.st_info), STT_TLS);
         put(b, at, sym);
       }},
      {"a relocation against the file symbol", "refers to symbol",
       [&](auto& b) {
         // Symbol 1 is the STT_FILE symbol Clang writes first.
         REQUIRE(ELF64_ST_TYPE(get<Elf64_Sym>(b, symHdr.sh_offset + sizeof(Elf64_Sym)).st_info) ==
                 STT_FILE);
         auto r = get<Elf64_Rela>(b, relaHdr.sh_offset);
         r.r_info = ELF64_R_INFO(1, ELF64_R_TYPE(r.r_info));
         put(b, relaHdr.sh_offset, r);
       }},
      {"a section symbol without a section", "section symbol without a section",
       [&](auto& b) {
         for (uint64_t at = symHdr.sh_offset; at < symHdr.sh_offset + symHdr.sh_size;
              at += sizeof(Elf64_Sym)) {
           auto sym = get<Elf64_Sym>(b, at);
           if (ELF64_ST_TYPE(sym.st_info) != STT_SECTION) continue;
           sym.st_shndx = SHN_UNDEF;
           put(b, at, sym);
           return;
         }
       }},
      {"sections that would take gigabytes", "bytes of memory",
       [&](auto& b) {
         // Every section loaded and as large as the rules for one section allow.
         const auto eh = get<Elf64_Ehdr>(b, 0);
         for (size_t i = 1; i < eh.e_shnum; ++i) {
           auto sh = get<Elf64_Shdr>(b, sectionHeaderAt(b, i));
           if (sh.sh_type != SHT_PROGBITS) continue;
           sh.sh_type = SHT_NOBITS;
           sh.sh_flags |= SHF_ALLOC;
           sh.sh_size = uint64_t{1} << 30;
           put(b, sectionHeaderAt(b, i), sh);
         }
       }},
      {"an unwind record longer than its table", "runs past the section",
       [&](auto& b) {
         const size_t eh = findSection(b, 0x70000001);
         REQUIRE(eh != 0);
         put<uint32_t>(b, section(b, eh).sh_offset, 0x7ffffff0u);
       }},
      {"an unwind FDE that points at no CIE", "points at no CIE",
       [&](auto& b) {
         const auto sh = section(b, findSection(b, 0x70000001));
         const uint32_t cieLength = get<uint32_t>(b, sh.sh_offset);
         put<uint32_t>(b, sh.sh_offset + 4 + cieLength + 4, 3);  // The FDE's CIE pointer.
       }},
      {"a symbol name past its string table", "name lies outside",
       [&](auto& b) {
         const uint64_t at = symHdr.sh_offset + sizeof(Elf64_Sym);
         auto sym = get<Elf64_Sym>(b, at);
         sym.st_name = 0x7fffffff;
         put(b, at, sym);
       }},
  };
  for (const Case& c : cases) {
    INFO(c.what);
    auto bytes = good;
    c.damage(bytes);
    const std::string error = errorOf(bytes);
    CHECK_THAT(error, Catch::Contains(c.expect));
    // The loader refuses it with the same message instead of crashing inside LLVM.
    kiln::runtime::LoadedObjects loaded;
    const kiln::Status st = loaded.add(bytes, "test");
    CHECK_FALSE(st.isOk());
  }
}

TEST_CASE("object check: random damage to headers, symbols and relocations never crashes") {
  const auto good = compiledObject();
  const size_t rela = findSection(good, SHT_RELA);
  const size_t symtab = findSection(good, SHT_SYMTAB);
  // The metadata regions: ELF header, section headers, the symbol table, the relocations.
  const auto eh = get<Elf64_Ehdr>(good, 0);
  const std::vector<std::pair<uint64_t, uint64_t>> regions = {
      {0, sizeof(Elf64_Ehdr)},
      {eh.e_shoff, uint64_t{eh.e_shnum} * sizeof(Elf64_Shdr)},
      {section(good, symtab).sh_offset, section(good, symtab).sh_size},
      {section(good, rela).sh_offset, section(good, rela).sh_size}};
  std::mt19937 rng(11);
  int refused = 0, passed = 0;
  // KILN_TEST_OBJECT_TRIALS runs more (a quick local fuzzer; libFuzzer's kernel_cache and
  // artifact targets do it properly).
  const char* env = std::getenv("KILN_TEST_OBJECT_TRIALS");
  const int trials = env ? std::atoi(env) : 400;
  for (int trial = 0; trial < trials; ++trial) {
    auto bytes = good;
    for (int flips = 0; flips < 3; ++flips) {
      const auto& [begin, size] = regions[rng() % regions.size()];
      const uint64_t at = begin + rng() % size;
      bytes[at] = static_cast<std::byte>(rng());
    }
    if (!errorOf(bytes).empty()) {
      ++refused;
      continue;
    }
    // Passed the check: linking it must not crash (it may still fail with an error).
    ++passed;
    kiln::runtime::LoadedObjects loaded;
    if (loaded.add(bytes, "trial").isOk()) (void)loaded.lookup("k");
  }
  INFO("passed the check and linked: " << passed);
  CHECK(refused > trials / 4);
}
