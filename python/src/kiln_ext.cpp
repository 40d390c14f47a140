// kiln._kiln: the Python extension (nanobind) over the compiler and the runtime. It trades in
// DLPack tensors (nb::ndarray): inputs are read where they lie when C-contiguous on the CPU (or,
// for a model on the CUDA backend, on its GPU), outputs are handed over without a copy, each
// owning its kiln tensor (or device buffer). The GIL is released
// while kiln compiles or runs. Errors become kiln.Error, or kiln.UserError (also a ValueError)
// where the user has something to fix. The Python side (python/kiln/) wraps these classes.
#include <Python.h>
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <mutex>
#include <span>
#include <sstream>
#include <stdexcept>
#include <string>
#include <variant>
#include <vector>

#include "compiler/artifact.h"
#include "compiler/compile.h"
#include "compiler/jit.h"
#include "compiler/staged.h"
#include "frontends/json/graph_json.h"
#include "frontends/onnx/onnx_import.h"
#include "frontends/sampling.h"
#include "frontends/window3d.h"
#include "ir/op_table.h"
#include "ir/printer.h"
#include "ir/verifier.h"
#include "models/zoo.h"
#include "runtime/artifact.h"
#include "runtime/backend.h"
#include "runtime/eager.h"
#include "runtime/gpu/gpu_backend.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace kiln::python {
namespace {

// ---- Errors ------------------------------------------------------------------------------

PyObject* gError = nullptr;      // kiln.Error(Exception)
PyObject* gUserError = nullptr;  // kiln.UserError(kiln.Error, ValueError)

struct KilnError : std::runtime_error {
  KilnError(const Status& s) : std::runtime_error(s.message()), user(s.isUserError()) {}
  bool user;
};

void check(const Status& s) {
  if (!s.isOk()) throw KilnError(s);
}
template <class T>
T take(Expected<T> e) {
  if (!e) throw KilnError(e.status());
  return std::move(*e);
}

// ---- Tensors -----------------------------------------------------------------------------

using InArray = nb::ndarray<nb::ro, nb::c_contig, nb::device::cpu>;
using CudaArray = nb::ndarray<nb::ro, nb::c_contig, nb::device::cuda>;

// DLPack's type code of every kiln dtype (its bits are the dtype's size): one table both ways.
using Code = nb::dlpack::dtype_code;
constexpr std::pair<ir::DType, Code> kDlpackCodes[] = {
    {ir::DType::kF32, Code::Float}, {ir::DType::kF64, Code::Float},
    {ir::DType::kF16, Code::Float}, {ir::DType::kBF16, Code::Bfloat},
    {ir::DType::kI64, Code::Int},   {ir::DType::kI32, Code::Int},
    {ir::DType::kI16, Code::Int},   {ir::DType::kI8, Code::Int},
    {ir::DType::kU8, Code::UInt},   {ir::DType::kU16, Code::UInt},
    {ir::DType::kU32, Code::UInt},  {ir::DType::kU64, Code::UInt},
    {ir::DType::kBool, Code::Bool},
};

ir::DType fromDlpack(nb::dlpack::dtype t, size_t index) {
  for (const auto& [dt, code] : kDlpackCodes)
    if (t.lanes == 1 && t.code == static_cast<uint8_t>(code) && t.bits == ir::dtypeSize(dt) * 8)
      return dt;
  throw KilnError(invalidArgument(
      "input " + std::to_string(index) + ": unsupported DLPack dtype (code " +
      std::to_string(t.code) + ", " + std::to_string(t.bits) + " bits, " + std::to_string(t.lanes) +
      " lanes); kiln takes float32/64/16, bfloat16, int8/16/32/64, uint8/16/32/64 and bool"));
}

nb::dlpack::dtype toDlpack(ir::DType t) {
  for (const auto& [dt, code] : kDlpackCodes)
    if (dt == t)
      return {static_cast<uint8_t>(code), static_cast<uint8_t>(ir::dtypeSize(dt) * 8), 1};
  // The narrow storage dtypes (ir/narrow.h: 8- and 4-bit floats, 4- and 2-bit integers).
  throw KilnError(unimplemented("an output of dtype " + std::string(ir::dtypeName(t)) +
                                " has no DLPack type kiln exchanges; cast it to a wider type in "
                                "the model (Cast, or DequantizeLinear)"));
}

// The array's dtype and shape as kiln's (any device); `index` names it in an error.
template <class Array>
ir::TensorType typeOf(const Array& a, size_t index) {
  ir::TensorType t;
  t.dtype = fromDlpack(a.dtype(), index);
  t.shape.resize(a.ndim());
  for (size_t d = 0; d < a.ndim(); ++d) t.shape[d] = static_cast<int64_t>(a.shape(d));
  return t;
}

// A kiln view of the array's bytes (no copy); the caller keeps the array alive.
runtime::Tensor viewOf(const InArray& a, size_t index) {
  ir::TensorType t = typeOf(a, index);
  auto* data = static_cast<std::byte*>(const_cast<void*>(a.data()));
  return runtime::Tensor::wrap(data, t.dtype, std::move(t.shape));
}

std::vector<runtime::Tensor> viewsOf(const std::vector<InArray>& arrays) {
  std::vector<runtime::Tensor> out;
  out.reserve(arrays.size());
  for (size_t i = 0; i < arrays.size(); ++i) out.push_back(viewOf(arrays[i], i));
  return out;
}

// An output handed to Python: the ndarray owns a copy of the kiln tensor (sharing its storage).
// An output that views an input's bytes (an identity) is copied, since the input may die first.
// `torch`: a torch.Tensor, else a NumPy array (both share the kiln tensor's bytes).
nb::object handOver(runtime::Tensor t, const std::vector<InArray>& inputs, bool torch,
                    uintptr_t* address) {
  if (!t.isContiguous()) t = take(t.contiguous());
  const std::byte* p = t.rawData();
  for (const InArray& a : inputs) {
    const auto* lo = static_cast<const std::byte*>(a.data());
    if (p >= lo && p < lo + a.nbytes()) {
      runtime::Tensor copy = take(runtime::Tensor::empty(t.dtype(), t.shape()));
      check(copy.copyFrom(t));
      t = std::move(copy);
      break;
    }
  }
  auto* owned = new runtime::Tensor(std::move(t));
  *address = reinterpret_cast<uintptr_t>(owned->rawData());
  nb::capsule owner(owned, [](void* q) noexcept { delete static_cast<runtime::Tensor*>(q); });
  std::vector<size_t> shape(owned->shape().begin(), owned->shape().end());
  const nb::dlpack::dtype dt = toDlpack(owned->dtype());
  if (torch)
    return nb::cast(nb::ndarray<nb::pytorch>(owned->rawData(), shape.size(), shape.data(), owner,
                                             nullptr, dt, nb::device::cpu::value));
  return nb::cast(nb::ndarray<nb::numpy>(owned->rawData(), shape.size(), shape.data(), owner,
                                         nullptr, dt, nb::device::cpu::value));
}

// `record`, when given, receives the address of each output's kiln tensor (zero-copy tests).
nb::list handOverAll(std::vector<runtime::Tensor> outs, const std::vector<InArray>& inputs,
                     bool torch, std::vector<uintptr_t>* record = nullptr) {
  nb::list l;
  for (runtime::Tensor& t : outs) {
    uintptr_t address = 0;
    l.append(handOver(std::move(t), inputs, torch, &address));
    if (record) record->push_back(address);
  }
  return l;
}

// Parameter bytes borrowed from a Python object (a torch tensor or NumPy array): the object is
// kept alive while any kiln copy of the data lives; released under the GIL.
ir::TensorData borrow(nb::object owner, const InArray& a) {
  ir::TensorType t = typeOf(a, 0);
  const ir::DType dt = t.dtype;
  ir::Shape shape = std::move(t.shape);
  auto* data = static_cast<std::byte*>(const_cast<void*>(a.data()));
  // Generated kernels and the libraries assume 64-byte aligned parameters (as kiln allocates
  // them); an unaligned view (a slice) is copied.
  if (reinterpret_cast<uintptr_t>(data) % 64 != 0 || a.nbytes() == 0) {
    ir::TensorData copy(dt, shape);
    if (a.nbytes() > 0) std::memcpy(copy.data(), data, a.nbytes());
    return copy;
  }
  PyObject* ref = owner.release().ptr();
  std::shared_ptr<void> keep(ref, [](void* o) {
    if (!Py_IsInitialized()) return;
    PyGILState_STATE s = PyGILState_Ensure();
    Py_DECREF(static_cast<PyObject*>(o));
    PyGILState_Release(s);
  });
  return ir::TensorData::wrap(dt, std::move(shape), data, std::move(keep));
}

// ---- Graphs ------------------------------------------------------------------------------

// A model graph and where it came from (an ONNX file is imported again for other input
// shapes by kiln.jit and kiln.compile(batch=...)).
struct PyGraph {
  std::shared_ptr<ir::Graph> graph;
  std::string source;  // File or zoo name; empty for built graphs.
};

nb::dict typeDict(const std::string& name, const ir::TensorType& t,
                  const std::vector<std::string>& dimNames = {}) {
  nb::dict d;
  d["name"] = name;
  d["dtype"] = std::string(ir::dtypeName(t.dtype));
  d["shape"] = std::vector<int64_t>(t.shape.begin(), t.shape.end());
  if (!dimNames.empty()) d["dim_names"] = dimNames;
  return d;
}

nb::list graphInputs(const ir::Graph& g) {
  nb::list l;
  for (const ir::Value* v : g.inputs()) l.append(typeDict(v->name(), v->type(), v->dimNames()));
  return l;
}
nb::list graphOutputs(const ir::Graph& g) {
  nb::list l;
  for (const ir::Value* v : g.outputs()) l.append(typeDict(v->name(), v->type()));
  return l;
}

bool isOnnx(const std::string& source) {
  return source.size() > 5 && source.compare(source.size() - 5, 5, ".onnx") == 0;
}

// An ONNX model whose output sizes depend on values (NonZero, Compress, NonMaxSuppression):
// imported in stages as each call's values make them (ir/staging.h), so it has no one graph.
struct PyStaged {
  std::shared_ptr<const ir::StagedModel> model;
  std::string source;
};

nb::list stagedInputs(const ir::StagedModel& m) {
  nb::list l;
  for (size_t i = 0; i < m.inputs.size(); ++i) l.append(typeDict(m.inputs[i], m.inputTypes[i]));
  return l;
}
// Names only: an output's shape is known when a call has computed it.
nb::list stagedOutputs(const ir::StagedModel& m) {
  nb::list l;
  for (const std::string& name : m.outputs) {
    nb::dict d;
    d["name"] = name;
    l.append(d);
  }
  return l;
}

// A PyGraph, or a PyStaged for an ONNX model that the plain import says needs stages.
nb::object loadGraph(const std::string& model, int64_t batch, uint64_t seed) {
  Expected<ir::Graph> g = [&] {
    nb::gil_scoped_release release;
    return models::loadModel(model, batch, seed);
  }();
  if (!g && isOnnx(model) && frontends::needsStages(g.status())) {
    Expected<ir::StagedModel> staged = [&] {
      nb::gil_scoped_release release;
      frontends::OnnxImportOptions o;
      o.defaultBatch = batch;
      return frontends::onnxStages(model, o);
    }();
    return nb::cast(
        PyStaged{std::make_shared<const ir::StagedModel>(take(std::move(staged))), model});
  }
  return nb::cast(PyGraph{std::make_shared<ir::Graph>(take(std::move(g))), model});
}

// ---- Options -----------------------------------------------------------------------------

// "cpu", "cuda" or "emu": the GPU backends are made (and registered) at their first use, as the
// CLI's --device does.
std::shared_ptr<runtime::Backend> backendNamed(const std::string& device) {
  if (device.empty()) return runtime::defaultBackend();
  return take(runtime::gpu::backendForDevice(device));
}

compiler::CompileOptions compileOptions(const std::string& device, bool autotune,
                                        const std::string& precision, int threads, bool inference,
                                        const std::string& targetCpu, int64_t maxMemory) {
  compiler::CompileOptions o;
  o.backend = backendNamed(device);
  o.autotune = autotune;
  o.precision = take(compiler::parsePrecision(precision));
  check(compiler::checkPrecision(o.precision, *o.backend));
  if (threads < 0) throw KilnError(invalidArgument("threads must be >= 0 (0: all cores)"));
  o.runThreads = threads;
  o.inference = inference;
  if (!targetCpu.empty()) check(compiler::checkTargetCpu(targetCpu));
  o.targetCpu = targetCpu;
  if (maxMemory < 0) throw KilnError(invalidArgument("max_memory must be >= 0 (0: no bound)"));
  o.maxMemoryBytes = maxMemory;
  return o;
}

// ---- Compiled and loaded models -----------------------------------------------------------

struct PyCompiled {
  std::shared_ptr<compiler::CompiledModel> compiled;  // One of the two is set.
  std::shared_ptr<runtime::LoadedModel> loaded;
  std::shared_ptr<runtime::Backend> backend;  // Where it runs (device outputs keep it alive).

  // CUDA tensors (DLPack, zero-copy both ways): each input read where it lies after the work
  // `waitFor` (the stream the producer synchronized with, DLPack's `stream`) had enqueued; each
  // output a device buffer of kiln's, handed over (a torch.Tensor on that GPU, else a DLPack
  // array). The run has finished when this returns, so any consumer stream may read them.
  nb::list runCuda(const std::vector<CudaArray>& arrays, uintptr_t waitFor, bool torch) {
    if (backend->name() != "cuda")
      throw KilnError(invalidArgument(
          "CUDA tensors given to a model compiled for device '" + std::string(backend->name()) +
          "': compile it with device='cuda', or move the inputs with .cpu()"));
    const runtime::Plan& plan = compiled ? compiled->plan() : loaded->plan();
    std::vector<runtime::DeviceTensor> inputs;
    for (size_t i = 0; i < arrays.size(); ++i) {
      const CudaArray& a = arrays[i];
      if (a.device_id() != 0)
        throw KilnError(invalidArgument("input " + std::to_string(i) +
                                        ": a tensor on cuda:" + std::to_string(a.device_id()) +
                                        "; kiln runs on cuda:0 (the first GPU)"));
      inputs.push_back({runtime::DeviceAddress{const_cast<void*>(a.data()), 0}, typeOf(a, i)});
    }
    Expected<std::vector<runtime::DeviceBuffer>> outs = [&] {
      nb::gil_scoped_release release;
      return compiled ? compiled->runOnDevice(inputs, waitFor)
                      : loaded->runOnDevice(inputs, waitFor);
    }();
    std::vector<runtime::DeviceBuffer> buffers = take(std::move(outs));
    nb::list l;
    for (size_t i = 0; i < buffers.size(); ++i) {
      struct Owned {
        runtime::DeviceBuffer buffer;
        std::shared_ptr<runtime::Backend> backend;  // Frees the buffer: outlives it.
      };
      auto* owned = new Owned{std::move(buffers[i]), backend};
      nb::capsule owner(owned, [](void* q) noexcept { delete static_cast<Owned*>(q); });
      const auto& t = plan.outputs[i];
      std::vector<size_t> shape(t.shape.begin(), t.shape.end());
      void* data = owned->buffer.address().handle;
      const nb::dlpack::dtype dt = toDlpack(t.dtype);
      if (torch)
        l.append(nb::cast(nb::ndarray<nb::pytorch>(data, shape.size(), shape.data(), owner, nullptr,
                                                   dt, nb::device::cuda::value, 0)));
      else
        l.append(nb::cast(nb::ndarray<>(data, shape.size(), shape.data(), owner, nullptr, dt,
                                        nb::device::cuda::value, 0)));
    }
    return l;
  }

  nb::list run(const std::vector<InArray>& arrays, bool torch,
               std::vector<uintptr_t>* record = nullptr) {
    std::vector<runtime::Tensor> inputs = viewsOf(arrays);
    Expected<std::vector<runtime::Tensor>> outs = [&] {
      nb::gil_scoped_release release;
      return compiled ? compiled->run(inputs) : loaded->run(inputs);
    }();
    return handOverAll(take(std::move(outs)), arrays, torch, record);
  }

  nb::dict report() const {
    nb::dict d;
    if (loaded) {
      const runtime::ArtifactInfo& i = loaded->info();
      d["kind"] = "artifact";
      d["path"] = i.path;
      d["load_ms"] = loaded->loadMs();
      d["prepare_ms"] = loaded->prepareMs();
      d["recompiled"] = loaded->recompiled();
      d["arena_bytes"] = i.arenaBytes;
      d["parameter_bytes"] = i.parameterBytes;
      d["steps"] = i.numSteps;
      d["precision"] = i.precision;
      return d;
    }
    const compiler::CompileReport& r = compiled->report();
    d["kind"] = "compiled";
    d["compile_ms"] = r.totalMs;
    d["passes_ms"] = r.passesMs;
    d["codegen_ms"] = r.codegenMs + r.compileMs;
    d["prepare_ms"] = r.prepareMs;
    d["nodes_in"] = r.nodesIn;
    d["nodes_optimized"] = r.nodesOptimized;
    d["generated_kernels"] = r.generatedKernels;
    d["compiled_kernels"] = r.compiledKernels;
    d["library_steps"] = r.referenceSteps;
    d["cache_hits"] = r.cacheHits;
    d["cache_misses"] = r.cacheMisses;
    d["arena_bytes"] = r.arenaBytes;
    d["parameter_bytes"] = r.parameterBytes;
    d["precision"] = r.precision;
    return d;
  }

  std::string explain(const std::string& what) const {
    auto lines = [](const std::vector<std::string>& v) {
      std::string s;
      for (const std::string& l : v) s += l + "\n";
      return s;
    };
    if (loaded) {
      if (what == "algos") return lines(loaded->info().algorithmChoices);
      if (what == "graph") return loaded->info().optimizedGraph;
      throw KilnError(invalidArgument("explain('" + what +
                                      "'): a loaded artifact explains 'algos' and 'graph' "
                                      "(fusion and cache are decided when it is compiled)"));
    }
    const compiler::CompileReport& r = compiled->report();
    if (what == "fusion") return r.fusionExplanation;
    if (what == "algos") return lines(r.algorithmChoices);
    if (what == "cache") return lines(r.cacheExplanations);
    if (what == "graph") return ir::printGraph(compiled->optimizedGraph());
    if (what == "remarks") return lines(r.remarks);
    throw KilnError(invalidArgument("explain('" + what +
                                    "'): expected 'fusion', 'algos', 'cache', 'graph' or "
                                    "'remarks'"));
  }

  void save(const std::string& path, const std::string& name) const {
    if (!compiled)
      throw KilnError(
          invalidArgument("save(): this model was loaded from an "
                          "artifact already (" +
                          loaded->info().path + ")"));
    nb::gil_scoped_release release;
    check(compiler::saveArtifact(*compiled, path, name));
  }
};

PyCompiled wrapCompiled(std::unique_ptr<compiler::CompiledModel> m,
                        std::shared_ptr<runtime::Backend> backend) {
  PyCompiled c;
  c.compiled = std::move(m);
  c.backend = std::move(backend);
  return c;
}

PyCompiled compileGraph(const PyGraph& g, std::optional<int64_t> batch, const std::string& device,
                        bool autotune, const std::string& precision, int threads, bool inference,
                        const std::string& targetCpu, int64_t maxMemory) {
  compiler::CompileOptions o =
      compileOptions(device, autotune, precision, threads, inference, targetCpu, maxMemory);
  nb::gil_scoped_release release;
  std::shared_ptr<ir::Graph> graph = g.graph;
  if (batch) {
    if (*batch < 1) throw KilnError(invalidArgument("batch must be >= 1"));
    if (g.source.empty())
      throw KilnError(invalidArgument(
          "compile(batch=...): this graph was built in memory, not loaded from a file or the "
          "zoo; build it for the batch you want (or use kiln.jit, which specializes per call)"));
    graph = std::make_shared<ir::Graph>(take(models::loadModel(g.source, *batch, 0)));
  }
  return wrapCompiled(take(compiler::compile(*graph, o)), o.backend);
}

PyCompiled loadArtifact(const std::string& path, const std::string& device, int threads,
                        bool recompile, bool warmup) {
  runtime::LoadOptions o;
  o.backend = backendNamed(device);
  o.threads = threads;
  o.warmup = warmup;
  if (recompile) o.recompile = compiler::recompileForHost;
  nb::gil_scoped_release release;
  PyCompiled c;
  c.loaded = take(runtime::loadArtifact(path, o));
  c.backend = o.backend;
  return c;
}

// ---- Eager and JIT -----------------------------------------------------------------------

struct PyEager {
  std::shared_ptr<ir::Graph> graph;
  std::shared_ptr<runtime::Backend> backend;

  nb::list run(const std::vector<InArray>& arrays, bool torch) {
    std::vector<runtime::Tensor> inputs = viewsOf(arrays);
    Expected<std::vector<runtime::Tensor>> outs = [&] {
      nb::gil_scoped_release release;
      // An executor per call: EagerExecutor runs one call at a time, and Python threads may
      // call at once.
      runtime::EagerExecutor exec(*graph, backend);
      return exec.run(inputs);
    }();
    return handOverAll(take(std::move(outs)), arrays, torch);
  }
};

struct PyJit {
  std::shared_ptr<compiler::JitModule> jit;

  nb::list run(const std::vector<InArray>& arrays, bool torch) {
    std::vector<runtime::Tensor> inputs = viewsOf(arrays);
    Expected<std::vector<runtime::Tensor>> outs = [&] {
      nb::gil_scoped_release release;
      return (*jit)(inputs);
    }();
    return handOverAll(take(std::move(outs)), arrays, torch);
  }
};

// A staged model's runner (compiler::StagedModule): each stage compiled (or run eagerly) for
// the call's input types and the sizes its values give, and cached.
struct PyStagedModule {
  std::shared_ptr<const ir::StagedModel> model;
  std::shared_ptr<compiler::StagedModule> module;

  nb::list run(const std::vector<InArray>& arrays, bool torch) {
    std::vector<runtime::Tensor> inputs = viewsOf(arrays);
    Expected<std::vector<runtime::Tensor>> outs = [&] {
      nb::gil_scoped_release release;
      return (*module)(inputs);
    }();
    return handOverAll(take(std::move(outs)), arrays, torch);
  }
};

PyStagedModule runStaged(const PyStaged& s, const std::string& device, bool autotune,
                         const std::string& precision, int threads, const std::string& targetCpu,
                         int64_t maxMemory, bool eager) {
  compiler::CompileOptions o =
      compileOptions(device, autotune, precision, threads, true, targetCpu, maxMemory);
  return {s.model, std::make_shared<compiler::StagedModule>(*s.model, std::move(o), eager)};
}

// ---- Building graphs (kiln.from_torch) ----------------------------------------------------

ir::AttrValue attrFrom(const ir::OpInfo& op, const std::string& name, nb::handle v,
                       const std::string& where) {
  const ir::AttrSpec* spec = op.findAttr(name);
  if (!spec)
    throw KilnError(invalidArgument(where + ": op '" + std::string(op.name) +
                                    "' has no attribute '" + name + "'"));
  try {
    switch (spec->kind) {
      case ir::AttrKind::kInt:
        return nb::cast<int64_t>(v);
      case ir::AttrKind::kFloat:
        return nb::cast<double>(v);
      case ir::AttrKind::kString:
        return nb::cast<std::string>(v);
      case ir::AttrKind::kInts:
        return nb::cast<std::vector<int64_t>>(v);
      case ir::AttrKind::kFloats:
        return nb::cast<std::vector<double>>(v);
      case ir::AttrKind::kTensor:
        break;
    }
  } catch (const nb::cast_error&) {
    throw KilnError(invalidArgument(where + ": attribute '" + name + "' of op '" +
                                    std::string(op.name) + "' has the wrong type (" +
                                    nb::cast<std::string>(nb::str(v.type())) + ")"));
  }
  throw KilnError(unimplemented(where + ": tensor attributes are not taken from Python"));
}

struct PyBuilder {
  std::shared_ptr<ir::Graph> graph;
  int64_t constants = 0;  // Names the constants window3d adds.

  ir::Value* value(const std::string& name, const std::string& where) const {
    ir::Value* v = graph->findValue(name);
    if (!v) throw KilnError(invalidArgument(where + ": no value named '" + name + "'"));
    return v;
  }

  std::string input(const std::string& name, const std::string& dtype,
                    const std::vector<int64_t>& shape, const std::vector<std::string>& dimNames) {
    std::optional<ir::DType> dt = ir::parseDType(dtype);
    if (!dt)
      throw KilnError(invalidArgument("input '" + name + "': unknown dtype '" + dtype + "'"));
    ir::Value* v = take(graph->addInput(name, {*dt, ir::Shape(shape), ir::Layout::kPlain}));
    if (!dimNames.empty()) check(graph->setDimNames(v, dimNames));
    return v->name();
  }

  std::string parameter(const std::string& name, nb::object owner, const InArray& a,
                        bool trainable) {
    return take(graph->addParameter(name, borrow(std::move(owner), a), trainable))->name();
  }

  std::vector<std::string> node(const std::string& op, const std::vector<std::string>& inputs,
                                nb::dict attrs, const std::vector<std::string>& outputNames,
                                const std::string& nodeName) {
    const ir::OpInfo* info = ir::findOp(op);
    const std::string where = nodeName.empty() ? op : nodeName;
    if (!info) throw KilnError(invalidArgument(where + ": kiln has no op '" + op + "'"));
    std::vector<ir::Value*> ins;
    for (const std::string& n : inputs) ins.push_back(value(n, where));
    ir::AttrMap am;
    for (auto [k, v] : attrs) {
      const std::string key = nb::cast<std::string>(k);
      am[key] = attrFrom(*info, key, v, where);
    }
    Expected<ir::Node*> n = graph->addNode(info->kind, std::move(ins), std::move(am), outputNames);
    if (!n) throw KilnError(n.status().withContext(where));
    if (!nodeName.empty()) (*n)->setName(nodeName);
    std::vector<std::string> outs;
    for (const ir::Value* v : (*n)->outputs()) outs.push_back(v->name());
    return outs;
  }

  // What a shared lowering (frontends/window3d.h, sampling.h) emits: nodes, and constants named
  // after `kind`.
  frontends::Emitter emitter(const std::string& kind) {
    return {
        [this](ir::OpKind op, std::vector<ir::Value*> in, ir::AttrMap a) -> Expected<ir::Value*> {
          KILN_ASSIGN_OR_RETURN(ir::Node * n, graph->addNode(op, std::move(in), std::move(a)));
          return n->output();
        },
        [this, kind](ir::TensorData d) {
          std::string name;
          do {
            name = kind + "/const" + std::to_string(constants++);
          } while (graph->findValue(name));
          return graph->addParameter(name, std::move(d), false);
        }};
  }

  // A lowering's attributes (window3d, deform_conv2d): `key` as out.size() ints into `out` (left
  // as it is when absent), or one int (`fill` when absent); errors name `kind`.
  static void intsAttr(const nb::dict& attrs, const std::string& kind, const char* key,
                       std::span<int64_t> out) {
    if (!attrs.contains(key)) return;
    const auto v = nb::cast<std::vector<int64_t>>(attrs[key]);
    if (v.size() != out.size())
      throw KilnError(invalidArgument(kind + ": " + key + " must have " +
                                      std::to_string(out.size()) + " values, got " +
                                      std::to_string(v.size())));
    std::copy(v.begin(), v.end(), out.begin());
  }
  static int64_t intAttr(const nb::dict& attrs, const char* key, int64_t fill) {
    return attrs.contains(key) ? nb::cast<int64_t>(attrs[key]) : fill;
  }

  // torchvision's deform_conv2d through frontends/sampling.h (ONNX DeformConv's lowering).
  // inputs: x, w, offset, mask and bias ("" for none); attrs: strides, pads (top, left, bottom,
  // right), dilations, group, offset_group. Returns the output's name.
  std::string deformConv2d(const std::vector<std::string>& inputs, nb::dict attrs) {
    const std::string kind = "deform_conv2d";
    if (inputs.size() != 5)
      throw KilnError(invalidArgument(kind + " takes x, w, offset, mask and bias"));
    std::vector<ir::Value*> ins;
    for (const std::string& n : inputs) ins.push_back(n.empty() ? nullptr : value(n, kind));
    frontends::DeformWindow w;
    intsAttr(attrs, kind, "strides", w.strides);
    intsAttr(attrs, kind, "pads", w.pads);
    intsAttr(attrs, kind, "dilations", w.dilations);
    Expected<ir::Value*> y =
        frontends::emitDeformConv2d(emitter(kind), ins[0], ins[1], ins[2], ins[3], ins[4], w,
                                    intAttr(attrs, "group", 1), intAttr(attrs, "offset_group", 1));
    if (!y) throw KilnError(y.status().withContext(kind));
    return (*y)->name();
  }

  // A 3-D convolution or pooling, or its gradient, lowered onto kiln's 2-D ops by
  // frontends/window3d.h (the ONNX importer's lowering). `kind` and its inputs: conv3d (x, w and
  // an optional bias), conv_transpose3d (x, w; attribute output_padding), conv3d_backward
  // (grad, x, w; attribute output_mask: the three gradients wanted), max_pool3d, avg_pool3d and
  // max_pool3d_indices (x), max_pool3d_backward and avg_pool3d_backward (grad, x). attrs: kernel
  // (pools), strides, pads (the three begins, then the three ends), dilations, group, ceil_mode,
  // count_include_pad. Returns the outputs' names
  // ("" for a gradient not wanted).
  std::vector<std::string> window3d(const std::string& kind, const std::vector<std::string>& inputs,
                                    nb::dict attrs) {
    std::vector<ir::Value*> ins;
    for (const std::string& n : inputs) ins.push_back(value(n, kind));
    auto ints = [&](const char* key, size_t n, int64_t fill) {
      std::vector<int64_t> v(n, fill);
      intsAttr(attrs, kind, key, v);
      return v;
    };
    auto integer = [&](const char* key, int64_t fill) { return intAttr(attrs, key, fill); };
    auto arity = [&](size_t lo, size_t hi, const char* what) {
      if (ins.size() < lo || ins.size() > hi)
        throw KilnError(invalidArgument(kind + " takes " + what));
    };
    frontends::Window3d w;
    const auto kernel = ints("kernel", 3, 1), strides = ints("strides", 3, 1),
               dilations = ints("dilations", 3, 1), pads = ints("pads", 6, 0);
    std::copy(kernel.begin(), kernel.end(), w.kernel.begin());
    std::copy(strides.begin(), strides.end(), w.strides.begin());
    std::copy(dilations.begin(), dilations.end(), w.dilations.begin());
    std::copy(pads.begin(), pads.end(), w.pads.begin());
    const frontends::Emitter e = emitter(kind);
    const bool isMax = kind.rfind("max_pool3d", 0) == 0;
    const ir::OpKind pool = isMax ? ir::OpKind::kMaxPool2d : ir::OpKind::kAvgPool2d;
    ir::AttrMap extra{{"ceil_mode", integer("ceil_mode", 0)}};
    if (!isMax) extra["count_include_pad"] = integer("count_include_pad", 0);
    std::vector<Expected<ir::Value*>> outs;
    if (kind == "conv3d") {
      arity(2, 3, "x, w and an optional bias");
      outs.push_back(frontends::emitConv3d(e, ins[0], ins[1], ins.size() == 3 ? ins[2] : nullptr, w,
                                           integer("group", 1)));
    } else if (kind == "conv_transpose3d") {
      arity(2, 2, "x and w");
      const auto pad = ints("output_padding", 3, 0);
      outs.push_back(frontends::emitConvTranspose3d(e, ins[0], ins[1], w, {pad[0], pad[1], pad[2]},
                                                    integer("group", 1)));
    } else if (kind == "conv3d_backward") {
      arity(3, 3, "grad, x and w");
      const auto mask = ints("output_mask", 3, 1);
      Expected<frontends::Conv3dGradients> g =
          frontends::emitConv3dBackward(e, ins[0], ins[1], ins[2], w, integer("group", 1),
                                        {mask[0] != 0, mask[1] != 0, mask[2] != 0});
      if (!g) throw KilnError(g.status().withContext(kind));
      outs = {g->input, g->weight, g->bias};
    } else if (kind == "max_pool3d" || kind == "avg_pool3d") {
      arity(1, 1, "x");
      outs.push_back(frontends::emitPool3d(e, pool, ins[0], w, extra));
    } else if (kind == "max_pool3d_indices") {
      arity(1, 1, "x");
      outs.push_back(frontends::emitMaxPool3dIndices(e, ins[0], w, extra));
    } else if (kind == "max_pool3d_backward" || kind == "avg_pool3d_backward") {
      arity(2, 2, "grad and x");
      outs.push_back(frontends::emitPool3dBackward(e, pool, ins[0], ins[1], w, extra));
    } else {
      throw KilnError(invalidArgument("unknown 3-D window op '" + kind + "'"));
    }
    std::vector<std::string> names;
    for (Expected<ir::Value*>& v : outs) {
      if (!v) throw KilnError(v.status().withContext(kind));
      names.push_back(*v ? (*v)->name() : "");
    }
    return names;
  }

  nb::dict type(const std::string& name) const {
    const ir::Value* v = value(name, "type");
    return typeDict(v->name(), v->type());
  }

  PyGraph finish(const std::vector<std::string>& outputs) {
    std::vector<ir::Value*> outs;
    for (const std::string& n : outputs) outs.push_back(value(n, "outputs"));
    graph->setOutputs(std::move(outs));
    graph->removeUnusedNodes();
    graph->removeUnusedParameters();
    check(ir::verify(*graph));
    PyGraph g{graph, ""};
    graph = std::make_shared<ir::Graph>(graph->name());  // The builder is spent.
    return g;
  }
};

}  // namespace
}  // namespace kiln::python

NB_MODULE(_kiln, m) {
  using namespace kiln::python;
  namespace ir = kiln::ir;
  m.doc() = "kiln's compiler and runtime (use the `kiln` package, not this module)";

  gError = PyErr_NewException("kiln.Error", PyExc_Exception, nullptr);
  PyObject* bases = PyTuple_Pack(2, gError, PyExc_ValueError);
  gUserError = PyErr_NewException("kiln.UserError", bases, nullptr);
  Py_DECREF(bases);
  m.attr("Error") = nb::handle(gError);
  m.attr("UserError") = nb::handle(gUserError);
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const KilnError& e) {
      PyErr_SetString(e.user ? gUserError : gError, e.what());
    }
  });

  m.def("version", [] { return std::string("0.1.0"); });
  m.def(
      "data_pointer", [](const InArray& a) { return reinterpret_cast<uintptr_t>(a.data()); },
      "a"_a.noconvert(),
      "The address kiln reads an array at (no copy was made if it equals "
      "the producer's own pointer).");
  m.def(
      "data_pointer", [](const CudaArray& a) { return reinterpret_cast<uintptr_t>(a.data()); },
      "a"_a.noconvert(), "The device address kiln reads a CUDA array at.");
  m.def("ops", [] {
    std::vector<std::string> names;
    for (int k = 0; k < ir::kNumOps; ++k)
      names.emplace_back(ir::opName(static_cast<ir::OpKind>(k)));
    return names;
  });
  m.def("zoo", [] {
    std::vector<std::pair<std::string, std::string>> out;
    for (const kiln::models::ModelInfo& i : kiln::models::listModels())
      out.emplace_back(i.name, i.description);
    return out;
  });

  nb::class_<PyGraph>(m, "Graph")
      .def_prop_ro("name", [](const PyGraph& g) { return g.graph->name(); })
      .def_prop_ro("source", [](const PyGraph& g) { return g.source; })
      .def_prop_ro("inputs", [](const PyGraph& g) { return graphInputs(*g.graph); })
      .def_prop_ro("outputs", [](const PyGraph& g) { return graphOutputs(*g.graph); })
      .def_prop_ro("num_nodes", [](const PyGraph& g) { return g.graph->numNodes(); })
      .def_prop_ro("parameter_bytes", [](const PyGraph& g) { return g.graph->parameterBytes(); })
      .def("text", [](const PyGraph& g) { return ir::printGraph(*g.graph); })
      .def("save_json", [](const PyGraph& g, const std::string& path) {
        nb::gil_scoped_release release;
        check(kiln::frontends::saveGraphJson(*g.graph, path));
      });
  m.def("load_graph", &loadGraph, "model"_a, "batch"_a = 1, "seed"_a = 0,
        "A Graph, or a Staged model where output sizes depend on values (ONNX NonZero)");

  nb::class_<PyStaged>(m, "Staged")
      .def_prop_ro("source", [](const PyStaged& s) { return s.source; })
      .def_prop_ro("inputs", [](const PyStaged& s) { return stagedInputs(*s.model); })
      .def_prop_ro("outputs", [](const PyStaged& s) { return stagedOutputs(*s.model); });
  nb::class_<PyStagedModule>(m, "StagedModule")
      .def("run", &PyStagedModule::run, "inputs"_a, "torch"_a = false)
      .def_prop_ro("inputs", [](const PyStagedModule& s) { return stagedInputs(*s.model); })
      .def_prop_ro("outputs", [](const PyStagedModule& s) { return stagedOutputs(*s.model); })
      .def_prop_ro("stages_made", [](const PyStagedModule& s) { return s.module->stagesMade(); })
      .def_prop_ro("log", [](const PyStagedModule& s) { return s.module->log(); });
  m.def("run_staged", &runStaged, "staged"_a, "device"_a = "cpu", "autotune"_a = false,
        "precision"_a = "fp32", "threads"_a = 0, "target_cpu"_a = "", "max_memory"_a = 0,
        "eager"_a = false);

  nb::class_<PyCompiled>(m, "Compiled")
      .def(
          "run",
          [](PyCompiled& c, const std::vector<InArray>& arrays, bool torch) {
            return c.run(arrays, torch);
          },
          "inputs"_a, "torch"_a = false)
      .def(
          "run_with_pointers",
          [](PyCompiled& c, const std::vector<InArray>& arrays, bool torch) {
            // The outputs and the address of each one's kiln tensor, for zero-copy tests.
            std::vector<uintptr_t> kilnPointers;
            nb::list outs = c.run(arrays, torch, &kilnPointers), pairs;
            for (size_t i = 0; i < outs.size(); ++i)
              pairs.append(nb::make_tuple(outs[i], kilnPointers[i]));
            return pairs;
          },
          "inputs"_a, "torch"_a = false)
      .def("run_cuda", &PyCompiled::runCuda, "inputs"_a, "wait_for"_a, "torch"_a = false)
      .def_prop_ro("device", [](const PyCompiled& c) { return std::string(c.backend->name()); })
      .def("report", &PyCompiled::report)
      .def("explain", &PyCompiled::explain)
      .def("save", &PyCompiled::save, "path"_a, "name"_a = "model")
      .def_prop_ro("inputs",
                   [](const PyCompiled& c) {
                     if (c.compiled) return graphInputs(c.compiled->optimizedGraph());
                     nb::list l;
                     const kiln::runtime::ArtifactInfo& i = c.loaded->info();
                     for (size_t k = 0; k < i.inputs.size(); ++k)
                       l.append(typeDict(i.inputNames[k], i.inputs[k]));
                     return l;
                   })
      .def_prop_ro("outputs", [](const PyCompiled& c) {
        if (c.compiled) return graphOutputs(c.compiled->optimizedGraph());
        nb::list l;
        const kiln::runtime::ArtifactInfo& i = c.loaded->info();
        for (size_t k = 0; k < i.outputs.size(); ++k)
          l.append(typeDict(i.outputNames[k], i.outputs[k]));
        return l;
      });
  m.def("compile", &compileGraph, "graph"_a, "batch"_a = nb::none(), "device"_a = "cpu",
        "autotune"_a = false, "precision"_a = "fp32", "threads"_a = 0, "inference"_a = true,
        "target_cpu"_a = "", "max_memory"_a = 0);
  m.def("load_artifact", &loadArtifact, "path"_a, "device"_a = "cpu", "threads"_a = 0,
        "recompile"_a = true, "warmup"_a = true);

  nb::class_<PyEager>(m, "Eager").def("run", &PyEager::run, "inputs"_a, "torch"_a = false);
  m.def(
      "eager",
      [](const PyGraph& g, const std::string& device) {
        return PyEager{g.graph, backendNamed(device)};
      },
      "graph"_a, "device"_a = "cpu");

  nb::class_<PyJit>(m, "Jit")
      .def("run", &PyJit::run, "inputs"_a, "torch"_a = false)
      .def_prop_ro("compiles", [](const PyJit& j) { return j.jit->compiles(); })
      .def_prop_ro("log", [](const PyJit& j) { return j.jit->log(); });
  m.def(
      "jit",
      [](const PyGraph& g, const std::string& device, bool autotune, const std::string& precision,
         int threads, int recompileLimit) {
        kiln::compiler::CompileOptions o =
            compileOptions(device, autotune, precision, threads, true, "", 0);
        ir::GraphSpecializer spec;
        if (isOnnx(g.source)) spec = take(kiln::frontends::onnxSpecializer(g.source));
        return PyJit{std::make_shared<kiln::compiler::JitModule>(*g.graph, std::move(o),
                                                                 recompileLimit, std::move(spec))};
      },
      "graph"_a, "device"_a = "cpu", "autotune"_a = false, "precision"_a = "fp32", "threads"_a = 0,
      "recompile_limit"_a = 8);

  nb::class_<PyBuilder>(m, "GraphBuilder")
      .def("__init__",
           [](PyBuilder* b, const std::string& name) {
             new (b) PyBuilder{std::make_shared<ir::Graph>(name), 0};
           })
      .def("input", &PyBuilder::input, "name"_a, "dtype"_a, "shape"_a,
           "dim_names"_a = std::vector<std::string>{})
      .def("parameter", &PyBuilder::parameter, "name"_a, "owner"_a, "array"_a,
           "trainable"_a = false)
      .def("node", &PyBuilder::node, "op"_a, "inputs"_a, "attrs"_a = nb::dict(),
           "output_names"_a = std::vector<std::string>{}, "node_name"_a = "")
      .def("window3d", &PyBuilder::window3d, "kind"_a, "inputs"_a, "attrs"_a = nb::dict())
      .def("deform_conv2d", &PyBuilder::deformConv2d, "inputs"_a, "attrs"_a = nb::dict())
      .def("type", &PyBuilder::type)
      .def("finish", &PyBuilder::finish);
}
