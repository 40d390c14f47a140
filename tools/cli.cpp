#include "tools/cli.h"

#include <algorithm>

#include <filesystem>
#include <iostream>
#include <random>

#include "ir/narrow.h"
#include "models/zoo.h"
#include "runtime/reference/helpers.h"
#include "tools/checkpoint.h"

namespace kiln::cli {

std::optional<std::string> Args::value(const std::string& n) const {
  auto it = values.find(n);
  if (it == values.end() || it->second.empty()) return std::nullopt;
  return it->second.back();
}

const std::vector<std::string>& Args::all(const std::string& n) const {
  static const std::vector<std::string> kEmpty;
  auto it = values.find(n);
  return it == values.end() ? kEmpty : it->second;
}

Expected<int64_t> Args::intValue(const std::string& n, int64_t def, int64_t min,
                                 int64_t max) const {
  auto v = value(n);
  if (!v) return def;
  try {
    size_t used = 0;
    const long long x = std::stoll(*v, &used);
    if (used != v->size()) throw std::invalid_argument(*v);
    if (x < min || x > max)
      return invalidArgument("--" + n + " must be between " + std::to_string(min) + " and " +
                             std::to_string(max) + ", got " + *v);
    return static_cast<int64_t>(x);
  } catch (const std::exception&) {
    return invalidArgument("--" + n + " expects an integer, got '" + *v + "'");
  }
}

Expected<Args> parseArgs(const Command& cmd, const std::vector<std::string>& argv) {
  Args args;
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& a = argv[i];
    if (a.size() < 2 || a.rfind("--", 0) != 0) {
      if (a == "-o") {  // The one short option: -o is --output.
        if (i + 1 >= argv.size()) return invalidArgument("-o expects a file name");
        args.values["output"].push_back(argv[++i]);
        continue;
      }
      args.positional.push_back(a);
      continue;
    }
    std::string name = a.substr(2), val;
    bool hasInline = false;
    if (auto eq = name.find('='); eq != std::string::npos) {
      val = name.substr(eq + 1);
      name = name.substr(0, eq);
      hasInline = true;
    }
    const OptionSpec* spec = nullptr;
    for (const auto& o : cmd.options)
      if (o.name == name) spec = &o;
    if (!spec)
      return invalidArgument("unknown option --" + name + " for 'kiln " + cmd.name +
                             "' (see kiln " + cmd.name + " --help)");
    if (!spec->takesValue) {
      if (hasInline) return invalidArgument("--" + name + " takes no value");
      args.flags[name] = true;
      continue;
    }
    if (!hasInline) {
      if (i + 1 >= argv.size()) return invalidArgument("--" + name + " expects a value");
      val = argv[++i];
    }
    if (!spec->repeatable && args.values.count(name))
      return invalidArgument("--" + name + " given more than once");
    args.values[name].push_back(val);
  }
  return args;
}

std::string helpText(const Command& cmd) {
  std::string s = "usage: " + cmd.usage + "\n\n" + cmd.summary + "\n\noptions:\n";
  for (const auto& o : cmd.options) {
    std::string left = "  --" + o.name + (o.takesValue ? " VALUE" : "");
    if (left.size() < 26) left.resize(26, ' ');
    s += left + " " + o.help + "\n";
  }
  s += "  --help                   show this help\n";
  return s;
}

std::vector<OptionSpec> modelOptions() {
  return {{"batch", true,
           "batch size for zoo models and symbolic batch dims of ONNX models (default 1)"},
          {"seed", true, "seed for zoo model weights and random inputs (default 0)"},
          {"weights", true,
           "the model's weights from a checkpoint (kiln train --checkpoint DIR, or its "
           "ckpt-*.safetensors) or a safetensors file of state_dict names"},
          {"json", false, "machine-readable output"}};
}

Expected<ir::Graph> loadModelFromArgs(const Args& args) {
  if (args.positional.empty()) return invalidArgument("missing MODEL (a zoo name or a file)");
  if (args.positional.size() > 1)
    return invalidArgument("unexpected argument '" + args.positional[1] + "'");
  KILN_ASSIGN_OR_RETURN(int64_t batch, args.intValue("batch", 1, 1, 1 << 20));
  KILN_ASSIGN_OR_RETURN(int64_t seed, args.intValue("seed", 0, 0, INT64_MAX));
  KILN_ASSIGN_OR_RETURN(ir::Graph g,
                        models::loadModel(args.positional[0], batch, static_cast<uint64_t>(seed)));
  if (const auto weights = args.value("weights")) KILN_TRY(applyWeights(g, *weights));
  return g;
}

OptionSpec intRangeOption() {
  return {"int-range", true,
          "random integer inputs uniform in [LO, HI) (LO:HI, default 0:10; floats are uniform in "
          "[-1, 1), booleans even odds)"};
}

std::vector<ir::TensorType> inputTypes(const ir::Graph& g) {
  std::vector<ir::TensorType> types;
  for (const ir::Value* v : g.inputs()) types.push_back(v->type());
  return types;
}

namespace {

Expected<std::pair<int64_t, int64_t>> intRange(const Args& args) {
  const std::optional<std::string> v = args.value("int-range");
  if (!v) return std::pair<int64_t, int64_t>{0, 10};
  const size_t colon = v->find(':');
  int64_t lo = 0, hi = 0;
  size_t used = 0;
  bool ok = colon != std::string::npos;
  try {
    ok = ok && (lo = std::stoll(v->substr(0, colon), &used), used == colon);
    ok = ok && (hi = std::stoll(v->substr(colon + 1), &used), used == v->size() - colon - 1);
  } catch (const std::exception&) {
    ok = false;
  }
  if (!ok || lo >= hi)
    return invalidArgument(
        "--int-range expects LO:HI with integers LO < HI (values in [LO, HI)), "
        "got '" +
        *v + "'");
  return std::pair{lo, hi};
}

}  // namespace

Expected<std::vector<runtime::Tensor>> randomInputs(const std::vector<ir::TensorType>& types,
                                                    const Args& args) {
  KILN_ASSIGN_OR_RETURN(int64_t seed, args.intValue("seed", 0, 0, INT64_MAX));
  KILN_ASSIGN_OR_RETURN(auto range, intRange(args));
  std::vector<runtime::Tensor> inputs;
  for (size_t k = 0; k < types.size(); ++k) {
    const ir::TensorType& type = types[k];
    const ir::DType dt = type.dtype;
    KILN_ASSIGN_OR_RETURN(runtime::Tensor t, runtime::Tensor::zeros(dt, type.shape));
    std::mt19937_64 rng(static_cast<uint64_t>(seed) + 1000003 * (k + 1));
    std::uniform_real_distribution<double> real(-1.0, 1.0);
    std::uniform_int_distribution<int64_t> integer(range.first, range.second - 1);
    auto fitsIn = [&](int64_t lo, int64_t hi) {
      return range.first >= lo && range.second - 1 <= hi;
    };
    const bool fits = dt == ir::DType::kI8    ? fitsIn(INT8_MIN, INT8_MAX)
                      : dt == ir::DType::kU8  ? fitsIn(0, UINT8_MAX)
                      : dt == ir::DType::kI16 ? fitsIn(INT16_MIN, INT16_MAX)
                      : dt == ir::DType::kU16 ? fitsIn(0, UINT16_MAX)
                      : dt == ir::DType::kI32 ? fitsIn(INT32_MIN, INT32_MAX)
                      : dt == ir::DType::kU32 ? fitsIn(0, UINT32_MAX)
                      : dt == ir::DType::kU64 ? fitsIn(0, INT64_MAX)
                      : dt == ir::DType::kI4  ? fitsIn(-8, 7)
                      : dt == ir::DType::kU4  ? fitsIn(0, 15)
                      : dt == ir::DType::kI2  ? fitsIn(-2, 1)
                      : dt == ir::DType::kU2  ? fitsIn(0, 3)
                                              : true;
    if (!fits)
      return invalidArgument("--int-range " + std::to_string(range.first) + ":" +
                             std::to_string(range.second) + " does not fit input " +
                             std::to_string(k) + "'s dtype " + std::string(ir::dtypeName(dt)));
    for (int64_t i = 0; i < t.numElements(); ++i) switch (dt) {
        case ir::DType::kF32:
          t.data<float>()[i] = static_cast<float>(real(rng));
          break;
        case ir::DType::kF64:
          t.data<double>()[i] = real(rng);
          break;
        case ir::DType::kF16:
          t.data<uint16_t>()[i] = runtime::ref::doubleToF16Bits(real(rng));
          break;
        case ir::DType::kBF16:
          t.data<uint16_t>()[i] = runtime::ref::doubleToBf16Bits(real(rng));
          break;
        case ir::DType::kI64:
          t.data<int64_t>()[i] = integer(rng);
          break;
        case ir::DType::kI32:
          t.data<int32_t>()[i] = static_cast<int32_t>(integer(rng));
          break;
        case ir::DType::kI8:
          t.data<int8_t>()[i] = static_cast<int8_t>(integer(rng));
          break;
        case ir::DType::kU8:
          t.data<uint8_t>()[i] = static_cast<uint8_t>(integer(rng));
          break;
        case ir::DType::kBool:
          t.data<uint8_t>()[i] = static_cast<uint8_t>(rng() & 1);
          break;
        case ir::DType::kI16:
          t.data<int16_t>()[i] = static_cast<int16_t>(integer(rng));
          break;
        case ir::DType::kU16:
          t.data<uint16_t>()[i] = static_cast<uint16_t>(integer(rng));
          break;
        case ir::DType::kU32:
          t.data<uint32_t>()[i] = static_cast<uint32_t>(integer(rng));
          break;
        case ir::DType::kU64:
          t.data<uint64_t>()[i] = static_cast<uint64_t>(integer(rng));
          break;
        default:  // The narrow storage dtypes (ir/narrow.h), a byte each.
          t.data<uint8_t>()[i] = ir::isNarrowFloat(dt) ? ir::narrowFromFloat(dt, real(rng))
                                                       : ir::narrowFromInteger(dt, integer(rng));
          break;
      }
    const bool integral = !ir::isFloat(dt) && !ir::isNarrowFloat(dt);
    if (integral && dt != ir::DType::kBool && !args.flag("json"))
      std::cerr << "note: random integer input " << k << " (" << type.toString() << ") drawn from ["
                << range.first << ", " << range.second
                << "); choose the range with --int-range LO:HI, or pass --input\n";
    inputs.push_back(std::move(t));
  }
  return inputs;
}

int reportError(const std::string& command, const Status& s) {
  std::cerr << "kiln " << command << ": error: " << s.message() << "\n";
  return s.isUserError() ? kExitUser : kExitInternal;
}

Timing summarize(std::vector<double> ms) {
  std::sort(ms.begin(), ms.end());
  Timing t;
  t.min = ms.front();
  t.max = ms.back();
  t.median = ms.size() % 2 ? ms[ms.size() / 2] : 0.5 * (ms[ms.size() / 2 - 1] + ms[ms.size() / 2]);
  return t;
}

bool isArtifactPath(const std::string& model) {
  return std::filesystem::path(model).extension() == ".kiln";
}

}  // namespace kiln::cli
