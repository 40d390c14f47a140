#include "compiler/conv_autotune.h"

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "codegen/cpu_compiler.h"
#include "ir/printer.h"
#include "ir/timing.h"
#include "runtime/library_info.h"
#include "runtime/reference/helpers.h"

namespace kiln::compiler {

Expected<passes::AlgorithmChoice> chooseConvAlgorithm(const ir::Node& n, const ConvTuning& t) {
  runtime::Backend& be = t.backend;
  const ir::Shape& xs = n.input(0)->type().shape;
  const ir::Shape& ws = n.input(1)->type().shape;
  const ir::TensorType& yt = n.output()->type();
  if (!be.hasLibraryKernel(n.op(), yt.dtype, yt.layout))
    return passes::AlgorithmChoice{
        "auto", "backend '" + std::string(be.name()) + "' has no library convolution"};
  std::vector<ir::TensorType> types;
  for (const ir::Value* v : n.inputs()) types.push_back(v->type());
  const auto candidates = be.libraryAlgorithms(n.op(), n.attr(), types);
  if (!t.autotune || candidates.size() < 2)
    return passes::AlgorithmChoice{"auto", "heuristic: the library's default"};
  const bool nhwc = n.input(0)->type().layout == ir::Layout::kNHWC;
  std::string attrs;
  for (const auto& [k, v] : n.attrs())
    if (k != "algo") attrs += k + "=" + ir::printAttrValue(v) + ";";
  const codegen::CacheKey key = codegen::CacheKeyBuilder()
                                    .add("conv-algo")
                                    .add(std::string(ir::opName(n.op())))
                                    .add(std::string(ir::dtypeName(n.input(0)->type().dtype)))
                                    .add(ir::shapeToString(xs))
                                    .add(ir::shapeToString(ws))
                                    .add(attrs)
                                    .add(nhwc ? "nhwc" : "nchw")
                                    .add(n.numInputs() > 2 ? "bias" : "nobias")
                                    .add(std::string(be.name()))
                                    .add(be.caps().device)
                                    .add(t.tf32 ? "tf32" : "fp32")
                                    .add(codegen::hostCpuName() + codegen::hostCpuFeatures())
                                    .add(runtime::libraryIdentity())
                                    .finish();
  if (auto hit = t.cache.lookup(key); hit.hit) {
    const std::string payload = hit.payloadString();
    const size_t bar = payload.find('|');
    return passes::AlgorithmChoice{payload.substr(0, bar), "cached: " + payload.substr(bar + 1)};
  }
  // Inputs of a fixed pattern on the backend, and the output.
  std::vector<runtime::DeviceBuffer> buffers;
  std::vector<runtime::DeviceTensor> ins;
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<runtime::Stream> stream, be.openStream(0));
  std::vector<runtime::Tensor> host;
  for (const ir::Value* v : n.inputs()) {
    KILN_ASSIGN_OR_RETURN(runtime::DeviceBuffer b, be.allocate(v->type().byteSize()));
    KILN_ASSIGN_OR_RETURN(runtime::Tensor h,
                          runtime::Tensor::empty(v->type().dtype, v->type().shape));
    for (int64_t i = 0; i < h.numElements(); ++i) {
      const double x = static_cast<double>((i * 7919) % 97) * 0.01 - 0.5;
      switch (v->type().dtype) {
        case ir::DType::kBF16:
          h.data<uint16_t>()[i] = runtime::ref::doubleToBf16Bits(x);
          break;
        case ir::DType::kF16:
          h.data<uint16_t>()[i] = runtime::ref::doubleToF16Bits(x);
          break;
        default:
          h.data<float>()[i] = static_cast<float>(x);
      }
    }
    KILN_TRY(stream->upload(b.address(), h.rawData(), static_cast<size_t>(v->type().byteSize())));
    host.push_back(std::move(h));
    ins.push_back({b.address(), v->type()});
    buffers.push_back(std::move(b));
  }
  KILN_ASSIGN_OR_RETURN(runtime::DeviceBuffer outBuf, be.allocate(yt.byteSize()));
  const runtime::DeviceTensor out{outBuf.address(), yt};
  KILN_TRY(stream->synchronize());

  std::string best = "auto", explanation;
  double bestMs = 1e300;
  for (runtime::ConvAlgo algo : candidates) {
    runtime::LibraryCache weights;
    runtime::OpCall call;
    call.name = "convolution algorithm timing";
    call.op = n.op();
    call.attrs = &n.attrs();
    call.library = true;
    call.options.algo = algo;
    call.options.channelsLast = nhwc;
    call.options.tf32 = t.tf32;
    call.options.cache = &weights;
    std::vector<double> ms;
    Status st;
    for (int rep = 0; rep < 4 && st.isOk(); ++rep) {
      const auto t0 = std::chrono::steady_clock::now();
      st = stream->run(call, ins, std::span<const runtime::DeviceTensor>(&out, 1));
      if (st.isOk()) st = stream->synchronize();
      if (rep > 0) ms.push_back(msSince(t0));  // The first run reorders weights.
    }
    if (!st.isOk()) {  // The algorithm cannot run this shape: said, not timed.
      explanation += (explanation.empty() ? "" : ", ") + std::string(runtime::convAlgoName(algo)) +
                     " failed (" + st.message() + ")";
      continue;
    }
    std::sort(ms.begin(), ms.end());
    const double median = ms[ms.size() / 2];
    char buf[64];
    std::snprintf(buf, sizeof buf, "%s%s %.3f ms", explanation.empty() ? "" : ", ",
                  std::string(runtime::convAlgoName(algo)).c_str(), median);
    explanation += buf;
    if (median < bestMs) {
      bestMs = median;
      best = std::string(runtime::convAlgoName(algo));
    }
  }
  t.stored(t.cache.store(key, best + "|" + explanation));
  return passes::AlgorithmChoice{best, "timed: " + explanation};
}

}  // namespace kiln::compiler
