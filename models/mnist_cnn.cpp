// mnist_cnn: the `Net` of pytorch/examples mnist/main.py, layer for layer and name for name.
#include "frontends/builder/builder.h"
#include "models/zoo.h"

namespace kiln::models {

namespace {

namespace nn = frontends::nn;

class Net : public nn::Module {
 public:
  explicit Net(nn::Scope s)
      : Module(std::move(s), "Net"),
        conv1(child("conv1"), 1, 32, 3, {.stride = 1}),
        conv2(child("conv2"), 32, 64, 3, {.stride = 1}),
        dropout1(child("dropout1"), 0.25),
        dropout2(child("dropout2"), 0.5),
        fc1(child("fc1"), 9216, 128),
        fc2(child("fc2"), 128, 10) {}

  nn::Tensor operator()(nn::Tensor x) const {
    auto scope = enter();
    x = conv1(x);
    x = nn::relu(x);
    x = conv2(x);
    x = nn::relu(x);
    x = nn::maxPool2d(x, 2);
    x = dropout1(x);
    x = x.flatten(1);
    x = fc1(x);
    x = nn::relu(x);
    x = dropout2(x);
    x = fc2(x);
    return nn::logSoftmax(x, 1);
  }

  nn::Conv2d conv1, conv2;
  nn::Dropout dropout1, dropout2;
  nn::Linear fc1, fc2;
};

}  // namespace

Expected<ir::Graph> buildMnistCnn(const ModelOptions& options) {
  KILN_TRY(checkOptions("mnist_cnn", options));
  nn::Builder b("mnist_cnn", options.seed);
  Net model(b.root());
  return b.finish(model(b.input("input", {options.batch, 1, 28, 28})));
}

}  // namespace kiln::models
