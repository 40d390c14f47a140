#include "frontends/data/images.h"

#include <png.h>
#include <turbojpeg.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>

#include "frontends/file_io.h"

namespace kiln::frontends {

namespace {

constexpr int64_t kMaxPixels = int64_t{1} << 28;

Expected<std::vector<unsigned char>> readAll(const std::string& path) {
  KILN_ASSIGN_OR_RETURN(InputFile f, openInputFile(path, "image"));
  if (f.size > (uint64_t{1} << 31))
    return invalidArgument("image '" + path + "': " + std::to_string(f.size) +
                           " bytes, more than kiln reads as one image (2 GiB)");
  std::vector<unsigned char> bytes(f.size);
  if (f.size > 0 &&
      !f.stream.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(f.size)))
    return ioError("image '" + path + "': read failed");
  return bytes;
}

Expected<Image> decodePng(const std::string& path, const std::vector<unsigned char>& bytes,
                          int channels) {
  png_image png;
  std::memset(&png, 0, sizeof png);
  png.version = PNG_IMAGE_VERSION;
  auto fail = [&](const char* what) {
    std::string msg = "image '" + path + "': " + what + " (" + png.message + ")";
    png_image_free(&png);
    return invalidArgument(msg);
  };
  if (!png_image_begin_read_from_memory(&png, bytes.data(), bytes.size()))
    return fail("not a readable PNG");
  if (static_cast<int64_t>(png.width) * png.height > kMaxPixels) return fail("too many pixels");
  png.format = channels == 1 ? PNG_FORMAT_GRAY : PNG_FORMAT_RGB;
  Image im{png.width, png.height, channels, {}};
  im.pixels.resize(PNG_IMAGE_SIZE(png));
  if (!png_image_finish_read(&png, nullptr, im.pixels.data(), 0, nullptr))
    return fail("a damaged PNG");
  return im;
}

Expected<Image> decodeJpeg(const std::string& path, const std::vector<unsigned char>& bytes,
                           int channels) {
  std::unique_ptr<void, int (*)(tjhandle)> tj(tjInitDecompress(), tjDestroy);
  if (!tj) return internalError("image '" + path + "': TurboJPEG did not initialize");
  int width = 0, height = 0, subsamp = 0, colorspace = 0;
  if (tjDecompressHeader3(tj.get(), bytes.data(), bytes.size(), &width, &height, &subsamp,
                          &colorspace) != 0)
    return invalidArgument("image '" + path + "': not a readable JPEG (" +
                           tjGetErrorStr2(tj.get()) + ")");
  if (width <= 0 || height <= 0 || static_cast<int64_t>(width) * height > kMaxPixels)
    return invalidArgument("image '" + path + "': a JPEG of " + std::to_string(width) + "x" +
                           std::to_string(height) + " pixels");
  Image im{width, height, channels, {}};
  im.pixels.resize(static_cast<size_t>(width) * height * channels);
  // A warning too (a truncated file decodes with grey fill): no silently wrong pixels.
  if (tjDecompress2(tj.get(), bytes.data(), bytes.size(), im.pixels.data(), width, 0, height,
                    channels == 1 ? TJPF_GRAY : TJPF_RGB, TJFLAG_ACCURATEDCT) != 0)
    return invalidArgument("image '" + path + "': a damaged JPEG (" + tjGetErrorStr2(tj.get()) +
                           ")");
  return im;
}

}  // namespace

Expected<Image> decodeImage(const std::string& path, int channels) {
  if (channels != 1 && channels != 3)
    return invalidArgument("image '" + path + "': the model takes " + std::to_string(channels) +
                           " channels; images decode to 1 (grey) or 3 (RGB)");
  KILN_ASSIGN_OR_RETURN(std::vector<unsigned char> bytes, readAll(path));
  static constexpr unsigned char kPng[] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  if (bytes.size() >= 8 && std::memcmp(bytes.data(), kPng, 8) == 0)
    return decodePng(path, bytes, channels);
  if (bytes.size() >= 3 && bytes[0] == 0xFF && bytes[1] == 0xD8 && bytes[2] == 0xFF)
    return decodeJpeg(path, bytes, channels);
  return invalidArgument("image '" + path + "': neither a PNG nor a JPEG (by its first bytes)");
}

void imageToTensor(const Image& im, int64_t height, int64_t width, float* dst) {
  // Scale so that the shorter side covers max(height, width), then take the centre.
  const double side = static_cast<double>(std::max(height, width));
  const double scale = side / static_cast<double>(std::min(im.width, im.height));
  const double rw = static_cast<double>(im.width) * scale,
               rh = static_cast<double>(im.height) * scale;
  const double offX = (rw - static_cast<double>(width)) / 2,
               offY = (rh - static_cast<double>(height)) / 2;
  const int64_t c = im.channels;
  auto at = [&](int64_t x, int64_t y, int64_t ch) {
    x = std::clamp<int64_t>(x, 0, im.width - 1);
    y = std::clamp<int64_t>(y, 0, im.height - 1);
    return static_cast<float>(im.pixels[static_cast<size_t>((y * im.width + x) * c + ch)]);
  };
  for (int64_t oy = 0; oy < height; ++oy) {
    // Half-pixel centres: output pixel (ox, oy) of the resized image samples the source at
    // ((ox + off + 0.5) / scale - 0.5).
    const double sy = (static_cast<double>(oy) + offY + 0.5) / scale - 0.5;
    const auto y0 = static_cast<int64_t>(std::floor(sy));
    const float fy = static_cast<float>(sy - static_cast<double>(y0));
    for (int64_t ox = 0; ox < width; ++ox) {
      const double sx = (static_cast<double>(ox) + offX + 0.5) / scale - 0.5;
      const auto x0 = static_cast<int64_t>(std::floor(sx));
      const float fx = static_cast<float>(sx - static_cast<double>(x0));
      for (int64_t ch = 0; ch < c; ++ch) {
        const float top = at(x0, y0, ch) * (1 - fx) + at(x0 + 1, y0, ch) * fx;
        const float bottom = at(x0, y0 + 1, ch) * (1 - fx) + at(x0 + 1, y0 + 1, ch) * fx;
        // Clamped: the blend of two 255s can round to a hair above 255.
        dst[(ch * height + oy) * width + ox] =
            std::clamp((top * (1 - fy) + bottom * fy) / 255.f, 0.f, 1.f);
      }
    }
  }
}

}  // namespace kiln::frontends
