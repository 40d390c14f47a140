// mlp: a 784-512-256-10 multilayer perceptron with ReLU, the classic MNIST MLP.
#include "frontends/builder/builder.h"
#include "models/zoo.h"

namespace kiln::models {

namespace {

namespace nn = frontends::nn;

class Mlp : public nn::Module {
 public:
  explicit Mlp(nn::Scope s)
      : Module(std::move(s), "Mlp"),
        fc1(child("fc1"), 784, 512),
        fc2(child("fc2"), 512, 256),
        fc3(child("fc3"), 256, 10) {}

  nn::Tensor operator()(nn::Tensor x) const {
    auto scope = enter();
    x = nn::relu(fc1(x));
    x = nn::relu(fc2(x));
    return fc3(x);
  }

  nn::Linear fc1, fc2, fc3;
};

}  // namespace

Expected<ir::Graph> buildMlp(const ModelOptions& options) {
  KILN_TRY(checkOptions("mlp", options));
  nn::Builder b("mlp", options.seed);
  Mlp model(b.root());
  return b.finish(model(b.input("input", {options.batch, 784})));
}

}  // namespace kiln::models
