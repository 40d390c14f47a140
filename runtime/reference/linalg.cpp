// Reference kernels for matmul (NumPy rules: batched, broadcasting, 1-D promotion), gemm
// (ONNX: transA/transB, alpha, beta, broadcast C), linear (x W^T + b) and det.
#include <cmath>
#include <limits>
#include <vector>

#include "runtime/reference/helpers.h"

namespace kiln::runtime {

namespace {

using ref::Tag;

// C[M,N] = A[M,K] * B[K,N], all row-major and contiguous. The i-k-j order keeps the inner loop
// a contiguous axpy over a row of B and C, which the compiler vectorizes.
template <class T>
void matmul2d(const T* __restrict a, const T* __restrict b, T* __restrict c, int64_t m, int64_t k,
              int64_t n) {
  for (int64_t i = 0; i < m * n; ++i) c[i] = T(0);
  for (int64_t i = 0; i < m; ++i) {
    T* cRow = c + i * n;
    for (int64_t p = 0; p < k; ++p) {
      const T av = a[i * k + p];
      const T* bRow = b + p * n;
      for (int64_t j = 0; j < n; ++j) cRow[j] = ref::addWrap(cRow[j], ref::mulWrap(av, bRow[j]));
    }
  }
}

// The row-major transpose of a [rows, cols] matrix.
template <class T>
std::vector<T> transposed(const T* x, int64_t rows, int64_t cols) {
  std::vector<T> t(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) t[c * rows + r] = x[r * cols + c];
  return t;
}

// The determinant of each [M, M] matrix: Gaussian elimination with partial pivoting (the row of
// the largest magnitude; LAPACK's getrf, which NumPy's det calls) in f64, rounded once. A zero
// pivot multiplies the product by 0 and its column is skipped, as getrf does, so that a NaN
// elsewhere still propagates.
Status detKernel(const ir::AttrView& attrs, std::span<const Tensor> in, std::span<Tensor> out) {
  const ir::Shape& s = in[0].shape();
  const int64_t m = s.back();
  const int64_t count = out[0].numElements();
  return ref::dispatchFloat(ref::opNameOf(attrs), in[0].dtype(), [&]<class T>(Tag<T>) {
    const T* x = in[0].data<T>();
    T* y = out[0].data<T>();
    std::vector<double> a(static_cast<size_t>(m * m));
    for (int64_t b = 0; b < count; ++b) {
      for (int64_t i = 0; i < m * m; ++i) a[static_cast<size_t>(i)] = x[b * m * m + i];
      double det = 1;
      for (int64_t c = 0; c < m; ++c) {
        int64_t p = c;
        for (int64_t r = c + 1; r < m; ++r)
          if (std::fabs(a[static_cast<size_t>(r * m + c)]) >
              std::fabs(a[static_cast<size_t>(p * m + c)]))
            p = r;
        const double pivot = a[static_cast<size_t>(p * m + c)];
        if (pivot == 0) {
          det *= pivot;
          continue;
        }
        if (p != c) {
          for (int64_t k = 0; k < m; ++k)
            std::swap(a[static_cast<size_t>(p * m + k)], a[static_cast<size_t>(c * m + k)]);
          det = -det;
        }
        det *= pivot;
        for (int64_t r = c + 1; r < m; ++r) {
          const double f = a[static_cast<size_t>(r * m + c)] / pivot;
          for (int64_t k = c + 1; k < m; ++k)
            a[static_cast<size_t>(r * m + k)] -= f * a[static_cast<size_t>(c * m + k)];
        }
      }
      y[b] = static_cast<T>(det);
    }
    return Status::ok();
  });
}

Status matmulKernel(const ir::AttrView& attrs, std::span<const Tensor> in, std::span<Tensor> out) {
  // Promote 1-D operands ([K] -> [1,K] for A, [K] -> [K,1] for B). The output keeps the
  // [batch..., M, N] memory order whether or not a promoted dim was removed from its shape.
  ir::Shape a = in[0].shape(), b = in[1].shape();
  if (a.size() == 1) a.insert(a.begin(), 1);
  if (b.size() == 1) b.push_back(1);
  const int64_t m = a[a.size() - 2], k = a.back(), n = b.back();
  const ir::Shape aBatch(a.begin(), a.end() - 2), bBatch(b.begin(), b.end() - 2);
  KILN_ASSIGN_OR_RETURN(const ir::Shape batch, ir::broadcastShapes(aBatch, bBatch));
  // Batch strides in whole matrices.
  const std::array<std::vector<int64_t>, 2> strides = {ref::broadcastStrides(aBatch, batch),
                                                       ref::broadcastStrides(bBatch, batch)};
  return ref::dispatchNumeric(ref::opNameOf(attrs), in[0].dtype(), [&]<class T>(Tag<T>) {
    const T* x = in[0].data<T>();
    const T* y = in[1].data<T>();
    T* z = out[0].data<T>();
    ref::forEachStrided<2>(
        batch, strides, {0, 0}, [&](int64_t i, const std::array<int64_t, 2>& off) {
          matmul2d(x + off[0] * m * k, y + off[1] * k * n, z + i * m * n, m, k, n);
        });
    return Status::ok();
  });
}

Status gemmKernel(const ir::AttrView& attrs, std::span<const Tensor> in, std::span<Tensor> out) {
  const bool transA = attrs.getInt("transA") != 0, transB = attrs.getInt("transB") != 0;
  const double alpha = attrs.getFloat("alpha"), beta = attrs.getFloat("beta");
  const int64_t m = out[0].shape()[0], n = out[0].shape()[1];
  const int64_t k = transA ? in[0].shape()[0] : in[0].shape()[1];
  return ref::dispatchFloat(ref::opNameOf(attrs), in[0].dtype(), [&]<class T>(Tag<T>) {
    // Transposed operands are copied to row-major [M,K] / [K,N] so one matmul loop serves all.
    std::vector<T> aT, bT;
    const T* a = in[0].data<T>();
    const T* b = in[1].data<T>();
    if (transA) a = (aT = transposed(a, k, m)).data();
    if (transB) b = (bT = transposed(b, n, k)).data();
    T* y = out[0].data<T>();
    matmul2d(a, b, y, m, k, n);
    const T al = static_cast<T>(alpha), be = static_cast<T>(beta);
    if (in.size() < 3) {
      for (int64_t i = 0; i < m * n; ++i) y[i] = al * y[i];
      return Status::ok();
    }
    const T* c = in[2].data<T>();
    ref::forEachStrided<1>(
        out[0].shape(), {ref::broadcastStrides(in[2].shape(), out[0].shape())}, {0},
        [&](int64_t i, const std::array<int64_t, 1>& off) { y[i] = al * y[i] + be * c[off[0]]; });
    return Status::ok();
  });
}

Status linearKernel(const ir::AttrView& attrs, std::span<const Tensor> in, std::span<Tensor> out) {
  const int64_t inF = in[1].shape()[1], outF = in[1].shape()[0];
  const ir::Shape& xs = in[0].shape();
  const int64_t rows = ir::numElements(ir::Shape(xs.begin(), xs.end() - 1));
  return ref::dispatchFloat(ref::opNameOf(attrs), in[0].dtype(), [&]<class T>(Tag<T>) {
    const std::vector<T> wT = transposed(in[1].data<T>(), outF, inF);  // [in, out]
    T* y = out[0].data<T>();
    matmul2d(in[0].data<T>(), wT.data(), y, rows, inF, outF);
    if (in.size() == 3) {
      const T* bias = in[2].data<T>();
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t j = 0; j < outF; ++j) y[r * outF + j] += bias[j];
    }
    return Status::ok();
  });
}

// attention(q, kt, v[, mask]): per batch, scores = scale * (q @ kt) (+ mask), softmax over T
// with the softmax kernel's formula (maximum subtracted, NaN kept), then @ v.
Status attentionKernel(const ir::AttrView& attrs, std::span<const Tensor> in,
                       std::span<Tensor> out) {
  const ir::Shape& qs = in[0].shape();
  const int64_t s = qs[qs.size() - 2], d = qs.back(), t = in[1].shape().back();
  const int64_t dv = in[2].shape().back();
  const int64_t batches = ir::numElements(ir::Shape(qs.begin(), qs.end() - 2));
  ir::Shape scoresShape(qs.begin(), qs.end() - 2);
  scoresShape.push_back(s);
  scoresShape.push_back(t);
  const double scale = attrs.getFloat("scale");
  return ref::dispatchFloat(ref::opNameOf(attrs), in[0].dtype(), [&]<class T>(Tag<T>) {
    // The mask broadcast to the scores' shape.
    std::vector<T> mask;
    if (in.size() == 4) {
      mask.resize(static_cast<size_t>(batches * s * t));
      const T* m = in[3].data<T>();
      ref::forEachStrided<1>(scoresShape, {ref::broadcastStrides(in[3].shape(), scoresShape)}, {0},
                             [&](int64_t i, const std::array<int64_t, 1>& off) {
                               mask[static_cast<size_t>(i)] = m[off[0]];
                             });
    }
    std::vector<T> sc(static_cast<size_t>(s * t));
    for (int64_t b = 0; b < batches; ++b) {
      matmul2d(in[0].data<T>() + b * s * d, in[1].data<T>() + b * d * t, sc.data(), s, d, t);
      for (int64_t i = 0; i < s * t; ++i) {
        sc[i] = sc[i] * static_cast<T>(scale);
        if (!mask.empty()) sc[i] += mask[b * s * t + i];
      }
      for (int64_t r = 0; r < s; ++r) {
        T* x = sc.data() + r * t;
        T mx = -std::numeric_limits<T>::infinity();
        for (int64_t j = 0; j < t; ++j)
          if (x[j] > mx || ref::isNaN(x[j])) mx = x[j];
        T sum = T(0);
        for (int64_t j = 0; j < t; ++j) sum += std::exp(x[j] - mx);
        for (int64_t j = 0; j < t; ++j) x[j] = std::exp(x[j] - mx) / sum;
      }
      matmul2d(sc.data(), in[2].data<T>() + b * t * dv, out[0].data<T>() + b * s * dv, s, t, dv);
    }
    return Status::ok();
  });
}

}  // namespace

void registerLinalgKernels(RefKernelTable& t) {
  ref::setKernel(t, ir::OpKind::kAttention, attentionKernel);
  ref::setKernel(t, ir::OpKind::kMatMul, matmulKernel);
  ref::setKernel(t, ir::OpKind::kDet, detKernel);
  ref::setKernel(t, ir::OpKind::kGemm, gemmKernel);
  ref::setKernel(t, ir::OpKind::kLinear, linearKernel);
}

}  // namespace kiln::runtime
