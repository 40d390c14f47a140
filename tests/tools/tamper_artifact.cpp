// tamper_artifact IN OUT [--reseal-only]: writes IN with the first relocation of its first
// kernel object damaged and every checksum recomputed (tests/artifact_tamper.h), for the CLI
// tests: `kiln run OUT` must refuse it with exit 2, not crash inside LLVM's linker. With
// --reseal-only the bytes stay as they are and only the checksums are recomputed (to replay a
// fuzz input of the artifact target, which reseals every input, through `kiln run`).
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "artifact_tamper.h"
#include "runtime/artifact.h"

int main(int argc, char** argv) {
  const bool resealOnly = argc == 4 && std::string(argv[3]) == "--reseal-only";
  if (argc != 3 && !resealOnly) {
    std::fprintf(stderr, "usage: tamper_artifact IN OUT [--reseal-only]\n");
    return 2;
  }
  std::ifstream in(argv[1], std::ios::binary);
  std::vector<char> chars((std::istreambuf_iterator<char>(in)), {});
  std::vector<std::byte> image(chars.size());
  std::memcpy(image.data(), chars.data(), chars.size());
  if (!resealOnly && !kiln::test::corruptFirstRelocation(image)) {
    std::fprintf(stderr, "tamper_artifact: %s holds no kernel object with a relocation\n", argv[1]);
    return 1;
  }
  if (kiln::Status st = kiln::runtime::resealArtifact(image); !st.isOk()) {
    std::fprintf(stderr, "tamper_artifact: %s\n", st.message().c_str());
    return 1;
  }
  std::ofstream out(argv[2], std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(image.data()),
            static_cast<std::streamsize>(image.size()));
  return out ? 0 : 1;
}
