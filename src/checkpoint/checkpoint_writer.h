// Writes one rank's part of a checkpoint on a background thread (docs/checkpoint.md).
//
// Note [Checkpoint save stages]
// Every rank writes DIR/step-N/rank-R.safetensors (Note [Atomic files]). Rank 0 also writes
// index.json, then waits until every rank's file is there (a rank file exists only once it
// is complete: it appears by rename), reads their headers and writes COMPLETE with the
// checksums, last. A checkpoint without COMPLETE is never loaded, so a crash at any stage
// leaves the previous checkpoint the latest loadable one. A rank whose write fails leaves an
// empty rank-R.failed so that rank 0 stops waiting. The fault-point stages, in order:
//   "begin"      before anything is written          (path: the step dir)
//   "write", "fsync", "rename"   of each file          (path: the file; Note [Atomic files])
//   "rank-file-written"  this rank's shard file is in place
//   "all-ranks-written"  rank 0: every rank's file is in place; COMPLETE not yet written
//   "complete-written"   rank 0: the checkpoint is complete
//   "prune"      rank 0, before removing each checkpoint that --keep-last drops
#pragma once

#include <atomic>
#include <cstdint>
#include <exception>
#include <string>
#include <thread>
#include <vector>

#include "io/safetensors.h"

namespace fsdp::checkpoint {

struct SaveJob {
  int64_t step = 0;
  std::vector<io::TensorToWrite> tensors;  // views of host memory that lives until wait()
  std::string index_text;                  // rank 0 only
  double wait_ms = 0, copy_ms = 0;  // the stall before it (wait for the previous, copy to host)
};

class CheckpointWriter {
 public:
  CheckpointWriter(std::string save_dir, int rank, int world, int keep_last, bool verbose);
  ~CheckpointWriter();  // stops waiting for other ranks and joins
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  // Starts writing in the background; the previous save must have been waited for.
  void start(SaveJob job);
  // Waits for the save in flight, if any, to be complete on every rank (rank 0's COMPLETE
  // marker), and rethrows its error: the next save starts after the previous is complete.
  void wait();
  bool busy() const { return thread_.joinable(); }

 private:
  void run(const SaveJob& job);
  void wait_for_ranks(const std::string& dir);
  void write_complete(const std::string& dir, int64_t step);
  void prune();

  std::string save_dir_;
  int rank_, world_, keep_last_;
  bool verbose_;
  std::thread thread_;
  std::exception_ptr error_;
  int64_t last_step_ = -1;  // the save started last and not yet waited for
  std::atomic<bool> stop_{false};
};

// Removes a complete checkpoint: COMPLETE first (so that no reader takes the rest for a
// checkpoint), then the files and the directory.
void remove_checkpoint(const std::string& dir);

}  // namespace fsdp::checkpoint
