// safetensors files: an 8-byte little-endian header size N, N bytes of JSON, then the raw
// little-endian tensor bytes (the format Hugging Face's libraries read and write).
//
// Note [Safetensors validation]
// A header is trusted only after every check below passes; each failure is a one-line error
// that names the file (Note [Checked JSON] for the fields):
//   - the path names a regular file (Note [Reading files]) of at least 8 bytes, and N fits
//     in the rest of it and in kMaxHeaderBytes (16 MiB; the reference implementation allows
//     100 MB, but real headers are kilobytes: ours hold ~11 bytes of chunk checksum per MiB of
//     data, 3 MB for a 280 GB file, and a header is parsed whole into memory);
//   - the header is a JSON object; "__metadata__", if there, maps strings to strings;
//   - every tensor has a known dtype, a shape of at most 16 non-negative integers and
//     data_offsets [begin, end] with begin <= end;
//   - end - begin == product(shape) * dtype size, computed without overflow;
//   - sorted by begin, the tensors tile the data section exactly: the first begins at 0, each
//     begins where the previous ended (no overlap, no hole), and the last ends at the end of
//     the file (a truncated or padded file is refused).
// Reads are byte ranges (pread), so a rank reads only the rows it needs; what a caller reads
// into is checked against the tensor's shape by the one reader of rows (RowReader::read_rows,
// src/checkpoint/checkpoint_format.h).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "io/file_io.h"

namespace fsdp::io {

inline constexpr uint64_t kMaxHeaderBytes = 16 << 20;

// Bytes per element of a safetensors dtype name ("F32", "BF16", ...); 0 if unknown.
size_t safetensors_dtype_size(const std::string& dtype);

struct TensorEntry {
  std::string name, dtype;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // byte offsets within the data section

  int64_t numel() const;
  int64_t rows() const { return shape.empty() ? 1 : shape[0]; }
  int64_t cols() const;        // elements of one dim-0 row: the product of the other dims
  uint64_t row_bytes() const;  // bytes of one dim-0 row
};

class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);  // opens and validates
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return file_.path(); }
  const FileIdentity& identity() const { return file_.identity(); }
  const std::vector<TensorEntry>& tensors() const { return tensors_; }
  const TensorEntry* find(const std::string& name) const;
  const TensorEntry& at(const std::string& name) const;  // error naming the file if absent
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  uint64_t file_bytes() const { return file_bytes_; }
  uint64_t header_bytes() const { return data_start_; }  // 8 + N
  uint32_t header_crc() const { return header_crc_; }    // CRC-32 of those bytes

  // Reads `bytes` bytes at `offset` within tensor `t`'s data.
  void read(const TensorEntry& t, uint64_t offset, uint64_t bytes, void* dst) const;

 private:
  ReadFile file_;
  uint64_t file_bytes_ = 0, data_start_ = 0;
  uint32_t header_crc_ = 0;
  std::vector<TensorEntry> tensors_;  // in file order (by begin)
  std::map<std::string, size_t> by_name_;
  std::map<std::string, std::string> metadata_;
};

struct TensorToWrite {
  std::string name, dtype;
  std::vector<int64_t> shape;
  const void* data = nullptr;  // product(shape) * dtype size bytes
};

struct WrittenFile {
  uint64_t bytes = 0;
  uint32_t file_crc = 0;    // of the whole file
  uint32_t header_crc = 0;  // of its first 8 + N bytes
  uint64_t header_bytes = 0;
};

// The header bytes (size prefix included), padded with spaces to a multiple of 8 as the
// reference implementation does; tensors are laid out in the given order.
std::string safetensors_header(const std::vector<TensorToWrite>& tensors,
                               const std::map<std::string, std::string>& metadata);

// Writes the file atomically (Note [Atomic files]).
WrittenFile write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                              const std::map<std::string, std::string>& metadata);

// Bytes this thread has read from safetensors files (headers and data), for tests that check
// a rank reads only what it needs.
uint64_t thread_bytes_read();
// Safetensors headers this process has parsed, for tests that check rank threads share one.
uint64_t safetensors_headers_parsed();

}  // namespace fsdp::io
