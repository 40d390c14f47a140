// Op kernels: CUDA C written for single ops that the kernel IR cannot express (its loads are
// affine in the iteration index) and that a device's library does not compute as the reference
// kernels do, so that they run on the device instead of on the host with a copy each way.
//
//   - max_pool2d_backward (plain layout, f32/f16/bf16): one thread per input element gathers the
//     gradients of the windows whose choice it is — each window's first maximum in scan order,
//     NaN first, as the reference — adding them in the reference's order, in f32 (f16/bf16
//     rounded once, as the reference computes them): the same bits. cuDNN's
//     pooling gradient needs the forward's output and breaks ties its own way; ties are common
//     after a ReLU.
//   - max_pool2d_indices (NCHW, f32/f64/f16/bf16): one thread an output element scanning its
//     window with the reference's rule (PyTorch's indices); cuDNN's pooling gives no indices.
//   - nll_loss, cross_entropy_loss and their gradients (f32 over i64/i32 targets): one thread a
//     row (a sample and spatial position), serially over the classes in the reference's order;
//     a mean's count and sum in one block. A target out of range gives NaN: the compiler uses
//     these kernels where the targets are graph inputs, which the plan checks on the host before
//     the run (runtime::Plan::indexChecks), with the reference's error; targets the graph
//     computes the kernel checks itself (runtime::Plan::deviceIndexChecks).
//   - dropout_train and dropout_backward (f32, f64): the mask of ir/dropout.h (the step read on the
//     device), the reference's bits.
//   - pointwise ops on integers and bools (every integer dtype, bool; operands broadcast), which
//     the kernel IR leaves alone: comparisons, logical and bitwise ops, bitshift, wrapping add,
//     sub, mul, neg and abs, minimum, maximum, where of integer or bool values, casts to
//     integers (saturating, NaN 0) or bool, div and mod (by a constant without zeros, or a
//     divisor checked as indices are: IndexArg::nonZero): a training step's dropout counter,
//     attention masks.
//   - argmax and argmin (f32, f64, integers): one thread an output element scanning the axis.
//   - concat (the generated kernels' dtypes moved as bits, at most 500 inputs): each input in a
//     grid-stride loop of its own into its slot of the output.
//   - gather and gather_elements (the generated kernels' dtypes moved as bits, i64/i32
//     indices): one thread an output element. Like a loss's targets, the indices are checked
//     (graph inputs by the plan before the run, constants by the compiler, computed ones by the
//     kernel); an index out of range writes all bits set (false for bool) and reads nothing.
//   - gather_backward (f32, f64; i64/i32 indices), scatter_elements and scatter_nd (f32, f64,
//     i64, i32, i8, u8; every reduction): an embedding's gradient, a scatter's updates, combined
//     into their rows in index order as the reference does (repeated indices: the same bits, the
//     last update wins without a reduction), from a stable counting sort of the sources by row:
//     four launches over a workspace (Kernel::then, workspaceBytes). A scatter's indices are
//     resolved per component as its reference reads them (IndexArg::limits).
//   - topk_indices (f32, f64, i64, i32, i8, u8): a block a row making k selections, each the
//     first element after the previous one in the reference's stable order (NaN the largest).
//
// The renderers print an op kernel's source as it is (render.h); the compiler schedules one
// where a backend runs CUDA kernels and has no library kernel for the op (compiler/schedule.cpp).
#pragma once

#include <string>

#include "codegen/kernel_ir.h"
#include "ir/graph.h"

namespace kiln::codegen {

// The op kernel named `name` for node `n` (its inputs, then its output, as arguments), or
// kUnimplemented where the op, its dtypes or its layout have none. With `indexWord`, a kernel
// reading indices (Kernel::indexArgs) checks them itself: it takes the word of their device check
// last and reports there the index out of range at the lowest flat position
// (runtime::IndexWord), for indices the graph computes.
Expected<Kernel> opKernel(const ir::Node& n, std::string name, bool indexWord = false);

}  // namespace kiln::codegen
