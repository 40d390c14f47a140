// kiln: the command-line tool. `kiln COMMAND --help` describes each command.
#include <algorithm>
#include <iostream>

#include "tools/cli.h"
#include "tools/serve_bench.h"

namespace kiln::cli {
namespace {

std::vector<OptionSpec> concat(std::vector<OptionSpec> a, const std::vector<OptionSpec>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

std::vector<Command> commands() {
  auto withModel = [](std::vector<OptionSpec> extra) {
    auto o = modelOptions();
    o.insert(o.end(), extra.begin(), extra.end());
    return o;
  };
  return {
      {"info", "kiln info MODEL [--batch N] [--json] | kiln info --device cuda|emu [--json]",
       "Summarize a model: inputs, outputs, nodes, op histogram, parameters and work per "
       "forward; or, with --device and no model, the device: GPU, architecture, memory, and what "
       "runs its library calls (cuDNN's and cuBLASLt's fused-ReLU NaN check included).",
       withModel({{"device", true, "describe this device (cpu, cuda, emu) instead of a model"}}),
       &runInfo},
      {"dump", "kiln dump MODEL [--batch N] [--json]", "Print the model's text IR.", withModel({}),
       &runDump},
      {"compile",
       "kiln compile MODEL [-o model.kiln] [--shapes x=1x3x224x224,...] [--emit-kernels DIR] "
       "[--explain-fusion]",
       "Compile a model and report passes, fusion, kernels, memory plan and cache use; -o writes "
       "an ahead-of-time artifact that `kiln run|bench|inspect` and kiln::load() take.",
       withModel(concat(
           compileOptionSpecs(),
           {{"output", true, "write the compiled model as an AOT artifact FILE.kiln (-o)"},
            {"shapes", true, "compile for these input shapes: NAME=DxDx...,... (symbolic dims)"},
            {"emit-kernels", true, "write each generated kernel's C++ and CUDA source to DIR"},
            {"explain-fusion", false, "print every fusion group and every rejected fusion"},
            {"explain-cache", false, "say why each kernel module hit or missed the cache"},
            {"explain-algos", false, "print each convolution's algorithm and timings"},
            {"cuda-check", false, "also compile every kernel with NVRTC for sm_80 and sm_90"},
            {"verbose", false, "print the passes' and lowering's notes"}})),
       &runCompile},
      {"run", "kiln run MODEL [--eager] [--batch N] [--input x.npy ...] [--output y.npy ...]",
       "Run a model (compiled, or --eager op by op) on .npy inputs or seeded random inputs.",
       withModel(
           concat(compileOptionSpecs(),
                  {{"eager", false, "run eagerly, op by op, on the reference kernels"},
                   {"no-recompile", false,
                    "artifacts: refuse code this CPU cannot run instead of recompiling it"},
                   {"input", true, "an input .npy file, in graph input order, or NAME=FILE", true},
                   intRangeOption(),
                   {"output", true, "save an output as .npy, in graph output order", true}})),
       &runRun},
      {"bench",
       "kiln bench MODEL [--batch N] [--threads T] [--runs R] [--only eager|compiled] "
       "[--concurrency 1,2,4] [--json]",
       "Run eager and compiled side by side: latency, throughput, peak memory, compile time. "
       "With --concurrency: serve the compiled model (or artifact) from that many client "
       "threads and report throughput and p50/p90/p99 latency per request.",
       withModel(concat(concat(compileOptionSpecs(), serveOptionSpecs()),
                        {{"runs", true, "timed runs of each (default 10)"},
                         {"no-recompile", false, "artifacts: refuse code this CPU cannot run"},
                         {"no-warmup", false,
                          "artifacts: skip load's warm-up run on zero inputs (the first run then "
                          "pays for what only a run touches)"},
                         {"profile", false, "print per-step times of one more run of each"},
                         {"only", true,
                          "eager or compiled: time that one alone in its own loop, as other "
                          "engines are timed (the default interleaves the two, so that machine "
                          "noise hits both alike; each then runs with the other's data in the "
                          "caches)"},
                         {"warmup", true, "untimed runs first (default 2)"},
                         intRangeOption()})),
       &runBench},
      {"profile", "kiln profile MODEL [--runs R] [--trace FILE] [--top K] [--no-peak] [--json]",
       "Where the time goes, eager and compiled side by side: every step of profiled runs timed "
       "and grouped by ops and kind (generated kernel, library call, reference kernel, copy) "
       "with calls, total and mean ms, share, GFLOP/s and GB/s against this machine's FMA peak "
       "and copy bandwidth measured in the same run; --trace writes a Chrome trace of both.",
       withModel(concat(
           compileOptionSpecs(),
           {{"runs", true, "profiled runs of each (default 10)"},
            {"warmup", true, "unprofiled runs first (default 2)"},
            {"trace", true, "write a Chrome trace (JSON; ui.perfetto.dev) with one event per step"},
            {"top", true, "rows per table (default 20; 0: all)"},
            {"no-peak", false, "skip measuring the peaks (no %fma and %bw columns)"},
            {"json", false, "machine-readable output"},
            intRangeOption()})),
       &runProfile},
      {"bench-kernels", "kiln bench-kernels [--rows R] [--cols C] [--runs N] [--peak] [--json]",
       "Bandwidth of generated kernels (copy, fused pointwise chain, softmax, layernorm) against "
       "memcpy; with --peak, this machine's fp32 FMA peak and multi-threaded copy bandwidth, "
       "and each kernel as a share of that bandwidth.",
       concat(compileOptionSpecs(),
              {{"rows", true, "rows of the test tensor (default 4096)"},
               {"cols", true, "columns (default 4096)"},
               {"runs", true, "timed runs (default 20)"},
               {"peak", false,
                "measure the fp32 FMA peak (GFLOP/s) and copy bandwidth (GB/s) on --threads"},
               {"json", false, "machine-readable output"}}),
       &runBenchKernels},
      {"train",
       "kiln train MODEL [--steps N | --data SPEC --epochs N [--val-split F]] [--batch B] "
       "[--lr X] [--optimizer sgd|adam] [--checkpoint DIR [--save-every N] [--resume]] "
       "[--eager] [--no-dropout] [--profile] [--json] [--ddp [--bucket-mb N]]",
       "Train a classifier with a cross-entropy loss: forward, backward and the optimizer update "
       "compiled as one step (or --eager), BatchNorm with batch statistics and dropout active, "
       "on a built-in learnable synthetic dataset or --data (IDX files or .npy pairs, shuffled "
       "each epoch, batches prepared on a background thread); prints loss, accuracy, "
       "validation accuracy, samples/s, the time spent waiting for data and the ETA. Here "
       "--batch defaults to 64.",
       withModel(concat(
           compileOptionSpecs(),
           {{"steps", true, "training steps (default 100)"},
            {"lr", true, "learning rate (default 0.01 for sgd, 1e-3 for adam)"},
            {"optimizer", true, "sgd (momentum 0.9) or adam (default sgd)"},
            {"eager", false, "run each step op by op instead of compiled"},
            {"no-dropout", false, "dropout stays the identity while training"},
            {"recompute", false,
             "recompute pointwise values (a BatchNorm's ReLU) in the backward pass from values "
             "it keeps anyway instead of keeping them: less memory, a little more time"},
            {"allow-nonfinite", false,
             "go on when the loss is NaN or infinite (default: stop with an error)"},
            {"profile", false, "per-step times of one more step (to stderr)"},
            {"data", true,
             "idx:DIR (MNIST-format train-/t10k-images-idx3-ubyte and "
             "-labels-idx1-ubyte; t10k is the validation set), npy:X.npy,Y.npy, "
             "npz:FILE.npz (x_train, y_train [, x_test, y_test] or x, y), "
             "folder:DIR (DIR/<class>/*.png|jpg, or DIR/train and DIR/val; "
             "decoded, resized and center-cropped to the model's input on the "
             "loader's thread), or X.npy with --labels"},
            {"labels", true, "class indices, i64 or i32 [M] .npy (with --data X.npy)"},
            {"normalize", true,
             "MEAN,...:STD,... per channel for folder: images (after scaling to "
             "[0, 1]), as torchvision's Normalize"},
            {"epochs", true, "passes over the training data (instead of --steps)"},
            {"val-split", true,
             "hold out this fraction for validation (default with --epochs: 0.1 "
             "where the data has no validation set; 0: none)"},
            {"no-shuffle", false, "keep the data's order (default: a seeded shuffle per epoch)"},
            {"checkpoint", true,
             "save the step's whole state (weights, optimizer state, step; "
             "safetensors + JSON) into DIR at the end and every --save-every "
             "steps, atomically"},
            {"save-every", true, "steps between checkpoints"},
            {"resume", false,
             "continue from DIR's latest checkpoint (same settings; bitwise the "
             "same parameters as an uninterrupted run)"},
            {"ddp", false,
             "data-parallel over MPI (mpirun -np N kiln train ... --ddp): --batch per "
             "rank, parameters broadcast from rank 0, gradients all-reduced in buckets "
             "started during the backward"},
            {"bucket-mb", true, "--ddp: all-reduce bucket size in MB (default 25)"},
            {"collectives", true,
             "--ddp: what sums the gradients: nccl (on the GPU, in device memory; the default "
             "with --device cuda) or mpi (on the host: the gradients are copied to it)"},
            {"no-overlap", false,
             "--ddp: start every all-reduce after the backward (to measure the overlap)"}})),
       &runTrain},
      {"inspect",
       "kiln inspect model.kiln [--json]",
       "Show an AOT artifact: format version, target CPU, inputs and outputs, kernels, arena, "
       "sections and checksums (all verified).",
       {{"json", false, "machine-readable output"}},
       &runInspect},
      {"export", "kiln export MODEL -o model.json [--batch N] [--seed S]",
       "Write the model as kiln's JSON graph with its weights in a .safetensors file beside it.",
       withModel({{"output", true, "the .json file to write (-o)"}}), &runExport},
  };
}

void printUsage(std::ostream& os) {
  os << "usage: kiln COMMAND [options]\n\ncommands:\n";
  size_t width = 0;
  for (const auto& c : commands()) width = std::max(width, c.name.size());
  for (const auto& c : commands()) {
    std::string name = "  " + c.name;
    name.resize(width + 4, ' ');
    os << name << c.summary << "\n";
  }
  os << "\nMODEL is a zoo name (mlp, mnist_cnn, resnet18, resnet50, bert_layer), a .json kiln "
        "graph, an .onnx model or, for run and bench, a .kiln artifact.\nRun 'kiln COMMAND "
        "--help' for a command's options.\n";
}

int mainImpl(int argc, char** argv) {
  std::vector<std::string> rest(argv + 1, argv + argc);
  if (rest.empty() || rest[0] == "--help" || rest[0] == "-h" || rest[0] == "help") {
    printUsage(rest.empty() ? std::cerr : std::cout);
    return rest.empty() ? kExitUser : kExitOk;
  }
  for (const auto& cmd : commands()) {
    if (cmd.name != rest[0]) continue;
    std::vector<std::string> cmdArgs(rest.begin() + 1, rest.end());
    for (const auto& a : cmdArgs)
      if (a == "--help" || a == "-h") {
        std::cout << helpText(cmd);
        return kExitOk;
      }
    auto args = parseArgs(cmd, cmdArgs);
    if (!args) return reportError(cmd.name, args.status());
    return cmd.run(*args);
  }
  std::cerr << "kiln: error: unknown command '" << rest[0] << "'\n\n";
  printUsage(std::cerr);
  return kExitUser;
}

}  // namespace
}  // namespace kiln::cli

int main(int argc, char** argv) {
  try {
    return kiln::cli::mainImpl(argc, argv);
  } catch (const std::bad_alloc&) {
    std::cerr << "kiln: error: out of memory\n";
    return kiln::cli::kExitUser;
  } catch (const std::exception& e) {
    std::cerr << "kiln: internal error: " << e.what() << "\n";
    return kiln::cli::kExitInternal;
  }
}
