// Image files for training data: PNG (libpng's simplified API) and JPEG (libjpeg-turbo's
// TurboJPEG), told apart by their signatures, decoded to 8-bit grey or RGB, then resized and
// cropped to a model's input as torchvision's Resize + CenterCrop do it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ir/status.h"

namespace kiln::frontends {

struct Image {
  int64_t width = 0, height = 0, channels = 0;  // channels 1 (grey) or 3 (RGB).
  std::vector<uint8_t> pixels;                  // Row-major, channels interleaved.
};

// Decodes `path` into `channels` (1 or 3) 8-bit channels: colour is converted to grey (or
// grey to RGB) by the decoder, alpha dropped. Errors name the file: not a PNG or JPEG, a
// damaged or truncated file, an image over 2^28 pixels (refused before anything is allocated).
Expected<Image> decodeImage(const std::string& path, int channels);

// The image resized so that its shorter side is max(height, width) (bilinear, half-pixel
// centres, no antialiasing), center-cropped to height x width, as f32 CHW in [0, 1]: `dst`
// holds channels * height * width values.
void imageToTensor(const Image& image, int64_t height, int64_t width, float* dst);

}  // namespace kiln::frontends
