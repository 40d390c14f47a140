// Shared pieces of the `kiln` command-line tool: argument parsing, model loading (zoo name or
// file) and the command table. Each command lives in its own cmd_*.cpp.
#pragma once

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "compiler/compile.h"
#include "ir/graph.h"
#include "ir/timing.h"
#include "runtime/tensor.h"

namespace kiln::cli {

// Exit codes: 0 success, 1 internal error (a kiln bug), 2 user error.
inline constexpr int kExitOk = 0;
inline constexpr int kExitInternal = 1;
inline constexpr int kExitUser = 2;

// A declared option of a command: "--batch N" (takesValue) or "--json" (a flag). Repeatable
// options (--input) collect every value.
struct OptionSpec {
  std::string name;
  bool takesValue;
  std::string help;
  bool repeatable = false;
};

struct Args {
  std::vector<std::string> positional;
  std::map<std::string, std::vector<std::string>> values;  // Options with values.
  std::map<std::string, bool> flags;

  bool flag(const std::string& n) const { return flags.count(n) > 0; }
  std::optional<std::string> value(const std::string& n) const;
  const std::vector<std::string>& all(const std::string& n) const;
  Expected<int64_t> intValue(const std::string& n, int64_t def, int64_t min, int64_t max) const;
};

struct Command {
  std::string name;
  std::string usage;    // "kiln info MODEL [options]"
  std::string summary;  // One line.
  std::vector<OptionSpec> options;
  int (*run)(const Args&);
};

Expected<Args> parseArgs(const Command& cmd, const std::vector<std::string>& argv);
std::string helpText(const Command& cmd);

// The options every model-taking command accepts.
std::vector<OptionSpec> modelOptions();
// Reads --batch and --seed and loads MODEL (the first positional argument).
Expected<ir::Graph> loadModelFromArgs(const Args& args);

// Seeded random inputs of these types, for kiln run, bench and artifacts without --input: floats
// uniform in [-1, 1), integers uniform in [LO, HI) from --int-range LO:HI (default 0:10: token
// ids or class indices below 10), booleans false or true with equal odds; --seed (default 0)
// seeds them.
Expected<std::vector<runtime::Tensor>> randomInputs(const std::vector<ir::TensorType>& types,
                                                    const Args& args);
std::vector<ir::TensorType> inputTypes(const ir::Graph& g);
// The options randomInputs reads besides --seed.
OptionSpec intRangeOption();

// Medians of timed runs, and a stopwatch.
struct Timing {
  double median = 0, min = 0, max = 0;
};
Timing summarize(std::vector<double> ms);  // `ms` must not be empty.
using kiln::msSince;                       // ir/timing.h

// AOT artifacts (`kiln compile -o model.kiln`): run, bench and inspect take them as MODEL.
bool isArtifactPath(const std::string& model);
int runArtifact(const Args&);    // kiln run model.kiln
int benchArtifact(const Args&);  // kiln bench model.kiln
int runInspect(const Args&);     // kiln inspect model.kiln

// Prints an error as "kiln <cmd>: error: ..." and returns the exit code for its status.
int reportError(const std::string& command, const Status& s);

// Options shared by the commands that compile (compile, run, bench), and their reading.
std::vector<OptionSpec> compileOptionSpecs();
Expected<compiler::CompileOptions> compileOptionsFromArgs(const Args& args);
// The backend --device names (cpu by default): the one line of the error where it has none.
Expected<std::shared_ptr<runtime::Backend>> deviceFromArgs(const Args& args);
// --max-memory SIZE in bytes (0 when absent).
Expected<int64_t> memoryLimit(const Args& args);

int runInfo(const Args&);
int runCompile(const Args&);
int runBench(const Args&);
int runBenchKernels(const Args&);
int runProfile(const Args&);
int runDump(const Args&);
int runRun(const Args&);
int runExport(const Args&);
int runTrain(const Args&);

}  // namespace kiln::cli
