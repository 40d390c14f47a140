// `kiln info` and `kiln dump`: what a model is, in numbers and as text IR.
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "ir/flops.h"
#include "ir/printer.h"
#include "runtime/gpu/device_api.h"
#include "runtime/gpu/gpu_backend.h"
#include "tools/cli.h"

namespace kiln::cli {

namespace {
nlohmann::json valueJson(const ir::Value* v) {
  return {{"name", v->name()},
          {"dtype", std::string(ir::dtypeName(v->type().dtype))},
          {"shape", v->type().shape}};
}

std::string withCommas(int64_t n) {
  std::string s = std::to_string(n), out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (i && (s.size() - i) % 3 == 0) out += ',';
    out += s[i];
  }
  return out;
}
}  // namespace

// kiln info --device cuda|emu: what the CUDA backend found.
int deviceInfo(const Args& args, const std::string& name) {
  auto backend = runtime::gpu::backendForDevice(name);
  if (!backend) return reportError("info", backend.status());
  const runtime::gpu::DeviceApi* dev = runtime::gpu::gpuDevice(**backend);
  if (!dev) {
    std::cout << "device      cpu: this machine's CPU (kernels as host objects, oneDNN)\n";
    return kExitOk;
  }
  const runtime::gpu::DeviceProps& p = dev->props();
  if (args.flag("json")) {
    std::cout << nlohmann::json{{"device", name},
                                {"name", p.name},
                                {"arch", "sm_" + std::to_string(p.smArch)},
                                {"multiprocessors", p.multiProcessors},
                                {"memory_bytes", p.totalMemory},
                                {"libraries", p.libraries},
                                {"kernel_code", (*backend)->caps().kernelCode}}
                     .dump(2)
              << "\n";
    return kExitOk;
  }
  std::printf("device      %s: %s\n", name.c_str(), p.name.c_str());
  std::printf("arch        sm_%d, %d multiprocessors, %s of memory\n", p.smArch, p.multiProcessors,
              runtime::gpu::bytesText(p.totalMemory).c_str());
  std::printf("kernels     %s\n", (*backend)->caps().kernelCode.c_str());
  std::printf("libraries   %s\n", p.libraries.c_str());
  return kExitOk;
}

int runInfo(const Args& args) {
  if (args.positional.empty())
    if (auto d = args.value("device")) return deviceInfo(args, *d);
  auto g = loadModelFromArgs(args);
  if (!g) return reportError("info", g.status());
  std::map<std::string, int64_t> histogram;
  for (const ir::Node* n : g->nodes()) ++histogram[std::string(ir::opName(n->op()))];
  const ir::WorkCount work = ir::countWork(*g);
  const int64_t batch = g->inputs().empty() || g->inputs()[0]->type().shape.empty()
                            ? 1
                            : std::max<int64_t>(1, g->inputs()[0]->type().shape[0]);

  if (args.flag("json")) {
    nlohmann::json j;
    j["model"] = args.positional[0];
    j["graph"] = g->name();
    j["inputs"] = nlohmann::json::array();
    for (const ir::Value* v : g->inputs()) j["inputs"].push_back(valueJson(v));
    j["outputs"] = nlohmann::json::array();
    for (const ir::Value* v : g->outputs()) j["outputs"].push_back(valueJson(v));
    j["nodes"] = g->numNodes();
    j["op_histogram"] = histogram;
    j["parameters"] = g->numTrainableParameters();
    j["parameter_tensors"] = g->parameters().size();
    j["parameter_bytes"] = g->parameterBytes();
    j["macs"] = work.macs;
    j["flops"] = work.flops();
    j["batch"] = batch;
    j["gmacs_per_sample"] = static_cast<double>(work.macs) / 1e9 / static_cast<double>(batch);
    j["gflops_per_sample"] = static_cast<double>(work.flops()) / 1e9 / static_cast<double>(batch);
    std::cout << j.dump(2) << "\n";
    return kExitOk;
  }
  std::ostringstream os;
  os << "model       " << args.positional[0] << " (graph '" << g->name() << "')\n";
  for (const ir::Value* v : g->inputs())
    os << "input       %" << v->name() << " : " << v->type().toString() << "\n";
  for (const ir::Value* v : g->outputs())
    os << "output      %" << v->name() << " : " << v->type().toString() << "\n";
  os << "nodes       " << g->numNodes() << "\n";
  os << "parameters  " << withCommas(g->numTrainableParameters()) << " trainable in "
     << g->parameters().size() << " tensors, " << withCommas(g->parameterBytes())
     << " bytes with buffers\n";
  char buf[160];
  std::snprintf(buf, sizeof buf, "work        %.3f GMAC, %.3f GFLOP per forward (batch %lld)\n",
                static_cast<double>(work.macs) / 1e9, static_cast<double>(work.flops()) / 1e9,
                static_cast<long long>(batch));
  os << buf << "ops\n";
  for (const auto& [op, count] : histogram) {
    std::string name = "  " + op;
    name.resize(22, ' ');
    os << name << count << "\n";
  }
  std::cout << os.str();
  return kExitOk;
}

int runDump(const Args& args) {
  auto g = loadModelFromArgs(args);
  if (!g) return reportError("dump", g.status());
  const std::string text = ir::printGraph(*g);
  if (args.flag("json")) {
    std::cout << nlohmann::json{{"graph", g->name()}, {"ir", text}}.dump(2) << "\n";
  } else {
    std::cout << text;
  }
  return kExitOk;
}

}  // namespace kiln::cli
