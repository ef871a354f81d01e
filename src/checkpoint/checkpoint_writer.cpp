#include "checkpoint/checkpoint_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>

#include "checkpoint/checkpoint_format.h"
#include "fsdp/error.h"
#include "io/file_io.h"

namespace fsdp::checkpoint {

namespace fs = std::filesystem;

namespace {
double now_ms() {
  using namespace std::chrono;
  return duration<double, std::milli>(steady_clock::now().time_since_epoch()).count();
}
std::string failed_marker(const std::string& dir, int rank) {
  return join_path(dir, rank_file_name(rank) + ".failed");
}
}  // namespace

CheckpointWriter::CheckpointWriter(std::string save_dir, int rank, int world, int keep_last,
                                   bool verbose)
    : save_dir_(std::move(save_dir)), rank_(rank), world_(world), keep_last_(keep_last),
      verbose_(verbose) {}

CheckpointWriter::~CheckpointWriter() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

void CheckpointWriter::start(SaveJob job) {
  FSDP_CHECK(!thread_.joinable(), "a checkpoint save is already in flight");
  error_ = nullptr;
  last_step_ = job.step;
  thread_ = std::thread([this, job = std::move(job)] {
    try {
      run(job);
    } catch (...) {
      error_ = std::current_exception();
      // Rank 0 waits for this rank's file; tell it not to (an empty file needs no free space).
      const int fd = ::open(failed_marker(join_path(save_dir_, step_dir_name(job.step)), rank_).c_str(),
                            O_WRONLY | O_CREAT | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC, 0644);
      if (fd >= 0) ::close(fd);
    }
  });
}

void CheckpointWriter::wait() {
  if (thread_.joinable()) thread_.join();
  if (error_) {
    std::exception_ptr e = error_;
    error_ = nullptr;
    last_step_ = -1;
    std::rethrow_exception(e);
  }
  if (last_step_ < 0 || rank_ == 0) return;
  // The whole checkpoint, not just this rank's file: rank 0 writes COMPLETE.
  const std::string dir = join_path(save_dir_, step_dir_name(last_step_));
  last_step_ = -1;
  int sleep_us = 200;
  while (!io::path_exists(join_path(dir, kCompleteFile))) {
    FSDP_USER_CHECK(!io::path_exists(failed_marker(dir, 0)), "checkpoint '", dir,
               "' failed on rank 0");
    std::this_thread::sleep_for(std::chrono::microseconds(sleep_us));
    sleep_us = std::min(sleep_us * 2, 20000);
  }
}

void CheckpointWriter::run(const SaveJob& job) {
  const double t0 = now_ms();
  const std::string dir = join_path(save_dir_, step_dir_name(job.step));
  io::fault_point("begin", dir);
  std::error_code ec;
  fs::create_directories(dir, ec);
  FSDP_USER_CHECK(!ec, "cannot create checkpoint directory '", dir, "': ", ec.message());
  io::fsync_directory(save_dir_);

  // Note [Checkpoint checksums]: a CRC per 1 MiB chunk of every tensor, in the header.
  nlohmann::json crcs = nlohmann::json::object();
  uint64_t bytes = 0;
  for (const io::TensorToWrite& t : job.tensors) {
    uint64_t n = io::safetensors_dtype_size(t.dtype);
    for (int64_t d : t.shape) n *= static_cast<uint64_t>(d);
    crcs[t.name] = chunk_crcs(t.data, n);
    bytes += n;
  }
  const std::string rank_path = join_path(dir, rank_file_name(rank_));
  io::write_safetensors(rank_path, job.tensors,
                        {{"format", "pt"}, {kChunkCrcKey, crcs.dump()},
                         {"fsdp.step", std::to_string(job.step)},
                         {"fsdp.rank", std::to_string(rank_)}});
  io::fault_point("rank-file-written", rank_path);
  if (rank_ != 0) return;

  io::write_file_atomic(join_path(dir, kIndexFile), job.index_text);
  wait_for_ranks(dir);
  io::fault_point("all-ranks-written", dir);
  write_complete(dir, job.step);
  io::fault_point("complete-written", dir);
  if (verbose_)
    std::printf("checkpoint: %s complete (rank 0 stalled %.1f ms waiting for the previous save "
                "and %.1f ms copying %.1f MiB to host; written in the background in %.0f ms)\n",
                dir.c_str(), job.wait_ms, job.copy_ms, bytes / 1048576.0, now_ms() - t0),
        std::fflush(stdout);
  prune();
}

void CheckpointWriter::wait_for_ranks(const std::string& dir) {
  for (int r = 0; r < world_; ++r) {
    const std::string path = join_path(dir, rank_file_name(r));
    int sleep_us = 200;
    while (!io::path_exists(path)) {
      FSDP_USER_CHECK(!io::path_exists(failed_marker(dir, r)), "rank ", r,
                 " failed to write its shard file '", path, "'");
      FSDP_USER_CHECK(!stop_, "checkpoint '", dir, "' abandoned: the run stopped before rank ", r,
                 " wrote its shard file");
      std::this_thread::sleep_for(std::chrono::microseconds(sleep_us));
      sleep_us = std::min(sleep_us * 2, 20000);
    }
  }
}

void CheckpointWriter::write_complete(const std::string& dir, int64_t step) {
  CompleteMarker m;
  m.step = step;
  m.world = world_;
  const std::string index_text =
      io::read_bounded_file(join_path(dir, kIndexFile), kMaxIndexBytes, "a checkpoint's index.json");
  m.files[kIndexFile] = {index_text.size(), index_text.size(),
                         io::crc32_of(index_text.data(), index_text.size())};
  for (int r = 0; r < world_; ++r) {
    const io::SafetensorsFile f(join_path(dir, rank_file_name(r)));
    m.files[rank_file_name(r)] = {f.file_bytes(), f.header_bytes(), f.header_crc()};
  }
  io::write_file_atomic(join_path(dir, kCompleteFile), complete_marker_text(m));
}

void CheckpointWriter::prune() {
  if (keep_last_ <= 0) return;
  const auto complete = list_step_dirs(save_dir_, /*complete_only=*/true);
  for (size_t i = 0; i + keep_last_ < complete.size(); ++i) {
    io::fault_point("prune", complete[i].second);
    remove_checkpoint(complete[i].second);
  }
}

void remove_checkpoint(const std::string& dir) {
  const std::string marker = join_path(dir, kCompleteFile);
  FSDP_USER_CHECK(::unlink(marker.c_str()) == 0, "cannot remove '", marker, "'");
  io::fsync_directory(dir);
  std::error_code ec;
  fs::remove_all(dir, ec);
  FSDP_USER_CHECK(!ec, "cannot remove '", dir, "': ", ec.message());
}

}  // namespace fsdp::checkpoint
