// NumPy .npy files (format versions 1.0, 2.0 and 3.0): one little-endian, C-ordered array per
// file, read into and written from ir::TensorData.
#pragma once

#include <istream>
#include <map>
#include <string>

#include "ir/status.h"
#include "ir/tensor_data.h"

namespace kiln::frontends {

// Reads f32 '<f4', f64 '<f8', f16 '<f2', i64 '<i8', i32 '<i4', i8 '|i1', u8 '|u1' and bool
// '|b1' arrays, 0-d and empty ones included. Big-endian data, fortran_order=True, structured
// and other dtypes are reported as unsupported; a malformed header, impossible dims, or data
// that does not match dtype x shape exactly (truncated or trailing bytes) as invalid. Storage
// is allocated only once the data length is validated against the file size. Errors name the
// file.
Expected<ir::TensorData> readNpy(const std::string& path);
// The same from `size` bytes of `in`; `where` ("npy file 'x.npy'") starts every error.
Expected<ir::TensorData> readNpy(std::istream& in, uint64_t size, const std::string& where);

// A NumPy .npz archive (np.savez, stored, or np.savez_compressed, deflated; read with libzip):
// every member "NAME.npy" as NAME, each read as readNpy reads a file. Members that are not .npy
// files are ignored. Errors name the archive and the member.
Expected<std::map<std::string, ir::TensorData>> readNpz(const std::string& path);

// Writes `t` as NumPy writes it (format 1.0, or 2.0 when the header needs it; the header padded
// so that the data starts at a multiple of 64 bytes), atomically: a failed write leaves no
// file behind. bf16 has no NumPy dtype and is reported as unsupported.
Status writeNpy(const std::string& path, const ir::TensorData& t);

}  // namespace kiln::frontends
