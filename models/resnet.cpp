// resnet18 / resnet50: torchvision.models.resnet (v1.5, stride on the 3x3 conv of Bottleneck)
// with torchvision's state_dict names.
#include <array>

#include "frontends/builder/builder.h"
#include "models/zoo.h"

namespace kiln::models {

namespace {

namespace nn = frontends::nn;

template <class Block>
class ResNet : public nn::Module {
 public:
  ResNet(nn::Scope s, std::array<int64_t, 4> layers, int64_t numClasses = 1000)
      : Module(std::move(s), "ResNet"),
        conv1(child("conv1"), 3, 64, 7, {.stride = 2, .padding = 3, .bias = false}),
        bn1(child("bn1"), 64),
        maxpool(child("maxpool"), 3, {.stride = 2, .padding = 1}),
        layer1(makeLayer(child("layer1"), 64, layers[0], 1)),
        layer2(makeLayer(child("layer2"), 128, layers[1], 2)),
        layer3(makeLayer(child("layer3"), 256, layers[2], 2)),
        layer4(makeLayer(child("layer4"), 512, layers[3], 2)),
        avgpool(child("avgpool"), 1),
        fc(child("fc"), 512 * Block::kExpansion, numClasses) {}

  nn::Tensor operator()(nn::Tensor x) const {
    auto scope = enter();
    x = conv1(x);
    x = bn1(x);
    x = nn::relu(x);
    x = maxpool(x);

    x = layer1(x);
    x = layer2(x);
    x = layer3(x);
    x = layer4(x);

    x = avgpool(x);
    x = x.flatten(1);
    return fc(x);
  }

 private:
  // torchvision's _make_layer: the first block strides and widens, the rest keep the shape.
  nn::Sequential makeLayer(nn::Scope s, int64_t planes, int64_t blocks, int64_t stride) {
    nn::Sequential layer(std::move(s));
    layer.add<Block>(inplanes_, planes, stride);
    inplanes_ = planes * Block::kExpansion;
    for (int64_t i = 1; i < blocks; ++i) layer.add<Block>(inplanes_, planes);
    return layer;
  }

  // Declared first: makeLayer reads and advances it while the layers below are initialized.
  int64_t inplanes_ = 64;

 public:
  nn::Conv2d conv1;
  nn::BatchNorm2d bn1;
  nn::MaxPool2d maxpool;
  nn::Sequential layer1, layer2, layer3, layer4;
  nn::AdaptiveAvgPool2d avgpool;
  nn::Linear fc;
};

template <class Block>
Expected<ir::Graph> buildResNet(const char* name, std::array<int64_t, 4> layers,
                                const ModelOptions& options) {
  KILN_TRY(checkOptions(name, options, /*anyImageSize=*/true));
  const int64_t size = options.imageSize != 0 ? options.imageSize : 224;
  nn::Builder b(name, options.seed);
  ResNet<Block> model(b.root(), layers);
  return b.finish(model(b.input("input", {options.batch, 3, size, size})));
}

}  // namespace

Expected<ir::Graph> buildResNet18(const ModelOptions& options) {
  return buildResNet<nn::BasicBlock>("resnet18", {2, 2, 2, 2}, options);
}

Expected<ir::Graph> buildResNet50(const ModelOptions& options) {
  return buildResNet<nn::Bottleneck>("resnet50", {3, 4, 6, 3}, options);
}

}  // namespace kiln::models
