// Reading tensors by rows from safetensors files: the one place that checks what is read
// against what it is read into, and the readers that rank threads share.
//
// Note [Shared readers]
// A safetensors header is parsed whole (up to 16 MiB of JSON, with its chunk checksums), so is
// a checkpoint's index.json (up to 256 MiB), and every rank thread of a process reads the same
// --init-from file, or the same checkpoint. So RowReader::open() and open_checkpoint_shared()
// keep one parsed copy per file (its path and identity: device, inode, size, mtime) while any
// thread holds it (io::shared_by_identity): the first thread to open a file parses it, the
// others wait for that parse and share it, and there is at most one parsed copy of a file in
// memory at a time. preads on the reader's one descriptor need no lock.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "checkpoint/checkpoint_format.h"
#include "io/safetensors.h"

namespace fsdp::checkpoint {

// "[a, b, c]", for messages about shapes.
std::string shape_text(const std::vector<int64_t>& shape);

// A safetensors file read by rows, into fp32, with every chunk read verified where the file
// carries chunk CRCs (Note [Checkpoint checksums]).
class RowReader {
 public:
  // The process's reader of `path` (Note [Shared readers]); opens and validates it when no
  // thread holds one.
  static std::shared_ptr<const RowReader> open(const std::string& path);
  explicit RowReader(const std::string& path);

  const io::SafetensorsFile& file() const { return *file_; }
  bool has_crcs() const { return has_crcs_; }
  // Tensor `name`, which must be F32 or BF16 of `rows` rows of `cols` elements; otherwise a
  // one-line error naming the file, the tensor, its shape and the one expected.
  const io::TensorEntry& expect(const std::string& name, int64_t rows, int64_t cols) const;
  // Rows [begin, end) of tensor `name` into `dst`, which holds exactly (end - begin) * cols
  // floats. Every dimension of the file's tensor is checked against the destination here,
  // for every caller (expect(), and 0 <= begin <= end <= rows).
  void read_rows(const std::string& name, int64_t rows, int64_t cols, int64_t begin, int64_t end,
                 std::span<float> dst) const;

 private:
  std::unique_ptr<io::SafetensorsFile> file_;
  bool has_crcs_ = false;
  std::map<std::string, std::vector<uint32_t>> crcs_;
};

// Each saved rank's file of a checkpoint, opened on first use and verified against COMPLETE
// (its size and header checksum).
class RankFiles {
 public:
  explicit RankFiles(const CheckpointIndex& ckpt) : ckpt_(ckpt) {}
  const RowReader& at(int rank);

 private:
  const CheckpointIndex& ckpt_;
  std::map<int, std::shared_ptr<const RowReader>> open_;
};

}  // namespace fsdp::checkpoint
