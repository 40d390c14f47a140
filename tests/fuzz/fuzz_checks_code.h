// The fuzz targets for compiled code that kiln reads back: AOT artifacts and kernel cache
// entries. They link the runtime (object check, ORC loader) and codegen (kernel cache), which
// the readers of fuzz_checks.h do not, so they live apart: fuzz_main.cpp takes them when
// KILN_FUZZ_CODE is defined, and tests/compiler/test_fuzz_code.cpp replays their corpora.
#pragma once

#include <cstring>
#include <vector>

#include "codegen/kernel_cache.h"
#include "fuzz/fuzz_checks.h"
#include "runtime/artifact.h"
#include "runtime/object_loader.h"

namespace kiln::fuzz {

inline std::vector<std::byte> toBytes(std::string_view s) {
  std::vector<std::byte> b(s.size());
  if (!s.empty()) std::memcpy(b.data(), s.data(), s.size());
  return b;
}

// ---- artifact: the input is an artifact file. The harness reseals it first (every checksum
// and the size recomputed, as anyone who can write the file could), so that mutations reach
// the metadata, the plan and the object check instead of stopping at a checksum. Loading may
// accept or refuse it, never crash; the code is linked, never run (machine code is trusted:
// docs/artifact-format.md).
inline Outcome checkArtifact(std::string_view bytes) {
  std::vector<std::byte> image = toBytes(bytes);
  (void)runtime::resealArtifact(image);  // Not an artifact at all: loaded as it is.
  const std::string path = scratchFile("input.kiln");
  writeFile(path, std::string_view(reinterpret_cast<const char*>(image.data()), image.size()));
  auto info = runtime::inspectArtifact(path);
  runtime::LoadOptions options;
  options.warmup = false;  // Load's warm-up runs the plan, and this harness runs no code.
  auto loaded = runtime::loadArtifact(path, options);
  if (!loaded) return rejected(loaded.status());
  if (!info)
    return violated("loadArtifact accepted what inspectArtifact refused: " +
                    info.status().message());
  return {true, std::nullopt};
}

// ---- kernel_cache: the input's first byte picks how the rest reaches the cache. Even: the
// rest is a payload, stored through KernelCache::store (a valid entry), so that mutations
// reach the object check and the linker. Odd: the rest is written as the entry file itself, so
// that mutations reach the entry's header checks. A hit is loaded and its kernels kiln_k0..3
// looked up (which links them); nothing runs.
inline Outcome checkKernelCacheEntry(std::string_view bytes) {
  if (bytes.empty()) return {};
  const bool raw = (static_cast<uint8_t>(bytes[0]) & 1) != 0;
  const std::string_view rest = bytes.substr(1);
  const std::filesystem::path dir = scratchDir() / "cache";
  const RemoveOnExit remove{dir};
  codegen::KernelCache cache(dir, true);
  const codegen::CacheKey key = codegen::CacheKeyBuilder().add("fuzz").finish();
  if (raw) {
    std::filesystem::create_directories(cache.entryPath(key).parent_path());
    writeFile(cache.entryPath(key).string(), rest);
  } else if (Status st = cache.store(key, rest); !st) {
    return violated("storing a payload failed: " + st.message());
  }
  codegen::CacheLookup hit = cache.lookup(key);
  if (!hit.hit) {
    if (!raw) return violated("a stored payload missed: " + hit.explain());
    return {};
  }
  runtime::LoadedObjects objects;
  if (Status st = objects.add(hit.payload, "entry"); !st) return rejected(st);
  for (const char* symbol : {"kiln_k0", "kiln_k1", "kiln_k2", "kiln_k3"}) {
    auto fn = objects.lookup(symbol);
    if (!fn && fn.status().code() == ErrorCode::kInternal) return rejected(fn.status());
  }
  return {true, std::nullopt};
}

inline constexpr Target kCodeTargets[] = {
    {"artifact", checkArtifact},
    {"kernel_cache", checkKernelCacheEntry},
};

constexpr int findCodeTarget(std::string_view name) {
  for (int i = 0; i < static_cast<int>(std::size(kCodeTargets)); ++i)
    if (kCodeTargets[i].name == name) return i;
  return -1;
}

}  // namespace kiln::fuzz
