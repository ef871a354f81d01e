#include "checkpoint/trainer_checkpoint.h"

#include <mutex>
#include <vector>

#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>

#include "fsdp/error.h"
#include "io/file_io.h"

namespace fsdp::checkpoint {

namespace {
double now_ms() {
  using namespace std::chrono;
  return duration<double, std::milli>(steady_clock::now().time_since_epoch()).count();
}
}  // namespace

TrainerCheckpoint::TrainerCheckpoint(const CheckpointOptions& options, const RunDescription& run,
                                     Device& device, Stream stream, FsdpModule& root,
                                     optim::Optimizer& optimizer, const ExpertLayout& experts)
    : options_(options), run_(run), run_json_(run_config_json(run)), device_(device),
      stream_(stream), root_(root), state_(collect_sharded_state(root, &optimizer, experts)) {
  // The options were checked once, by check_train_config (check_checkpoint_options).
  // HSDP: one replica's shards are the whole state; the others save nothing.
  if (!options_.save_dir.empty() && state_.replica == 0)
    writer_ = std::make_unique<CheckpointWriter>(options_.save_dir, state_.rank, state_.world,
                                                 options_.keep_last,
                                                 options_.verbose && state_.rank == 0);
  lead_ = state_.rank == 0 && state_.replica == 0;
}

TrainerCheckpoint::~TrainerCheckpoint() {
  writer_.reset();  // joins the writer thread before host_, which it may be reading, goes
  // A copy to host_ that was queued when the stream's synchronize threw (another rank failed
  // and the world was aborted) may still run: host_ must outlive it, so it is left allocated.
  // It is kept, reachable, for the rest of the process (not dropped as a leak: the sanitizers
  // would report it, at a timing-dependent moment).
  if (copies_in_flight_) {
    static std::mutex kept_mutex;
    static std::vector<std::unique_ptr<float[]>> kept;
    const std::lock_guard<std::mutex> lock(kept_mutex);
    kept.push_back(std::move(host_));
  }
}

int TrainerCheckpoint::start(int total_steps) {
  // Note [Optimizer in forward]: no deferred update may land on the loaded shards later.
  root_.apply_pending_shard_updates(stream_);
  int64_t start_step = 0;
  std::shared_ptr<const CheckpointIndex> ckpt;
  std::vector<std::string> changes;  // Note [Resumed schedule and data]
  if (!options_.resume.empty()) {
    ckpt = open_checkpoint_shared(resolve_checkpoint_dir(options_.resume));
    changes = check_compatible(*ckpt, run_json_);
    start_step = ckpt->complete.step;
    FSDP_USER_CHECK(start_step < total_steps, "checkpoint '", ckpt->dir, "' is at step ", start_step,
               ": steps ", total_steps, " leaves nothing to train");
  }
  if (!options_.save_dir.empty()) check_save_dir(start_step);
  if (ckpt) resumed_state_ = load_checkpoint(*ckpt, state_, &device_, stream_);
  if (options_.verbose && lead_) changes_ = std::move(changes);
  if (!options_.init_from.empty())
    load_full_weights(options_.init_from, state_, &device_, stream_, run_.hf_names);
  if (writer_) {
    // The host copy of the shards, touched now: the first save's stall is then the copy alone,
    // not the page faults of a fresh buffer.
    host_floats_ = 0;
    for (const ShardView& v : state_.tensors)
      host_floats_ += static_cast<size_t>(v.rows.rows() * v.cols) * (1 + state_.state_names.size());
    host_.reset(new float[host_floats_]);
    std::memset(host_.get(), 0, host_floats_ * sizeof(float));
  }
  if (!options_.save_dir.empty() && lead_) {
    // Debris of crashed saves that this run will write again (Note [Checkpoint hooks]).
    for (const auto& [step, dir] : list_step_dirs(options_.save_dir, /*complete_only=*/false))
      if (step > start_step && step <= total_steps &&
          (step == total_steps || (options_.save_every > 0 && step % options_.save_every == 0)))
        std::filesystem::remove_all(dir);  // incomplete: complete ones after start are refused
  }
  return static_cast<int>(start_step);
}

void TrainerCheckpoint::check_save_dir(int64_t start_step) const {
  const std::string& dir = options_.save_dir;
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  FSDP_USER_CHECK(!ec, "cannot create save dir '", dir, "': ", ec.message());
  FSDP_USER_CHECK(io::is_directory(dir), "save dir '", dir, "' is not a directory");
  const std::string probe =
      join_path(dir, ".write-test-" + std::to_string(::getpid()) + "-" + std::to_string(state_.rank) +
                "-" + std::to_string(state_.replica));
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  FSDP_USER_CHECK(fd >= 0, "save dir '", dir, "' is not writable: ", std::strerror(errno));
  ::close(fd);
  ::unlink(probe.c_str());
  uint64_t need = 0;
  for (const ShardView& v : state_.tensors)
    need += static_cast<uint64_t>(v.rows.rows() * v.cols) * 4 * (1 + state_.state_names.size());
  need *= static_cast<uint64_t>(state_.world);
  struct statvfs st;
  if (::statvfs(dir.c_str(), &st) == 0) {
    const uint64_t free_bytes = static_cast<uint64_t>(st.f_bavail) * st.f_frsize;
    FSDP_USER_CHECK(free_bytes >= need, "save dir '", dir, "' has ", free_bytes / 1048576,
               " MiB free, a checkpoint needs about ", (need + 1048575) / 1048576,
               " MiB (disk full)");
  }
  const auto complete = list_step_dirs(dir, /*complete_only=*/true);
  FSDP_USER_CHECK(complete.empty() || complete.back().first <= start_step, "save dir '", dir,
             "' already holds a checkpoint after step ", start_step, " ('",
             complete.empty() ? "" : complete.back().second,
             "'); resume from it or save elsewhere");
}

void TrainerCheckpoint::state_changes() {
  for (const std::string& change : changes_) std::printf("checkpoint: %s\n", change.c_str());
  changes_.clear();
}

bool TrainerCheckpoint::due(int steps_done, int total_steps) const {
  return writer_ && (steps_done == total_steps ||
                     (options_.save_every > 0 && steps_done % options_.save_every == 0));
}

double TrainerCheckpoint::after_step(int steps_done, int total_steps,
                                     const nlohmann::json& train_state) {
  if (!due(steps_done, total_steps)) return 0;
  root_.apply_pending_shard_updates(stream_);  // Note [Optimizer in forward]: the step's shards
  const double t0 = now_ms();
  writer_->wait();  // the previous save; host_ is free again after it
  const double t1 = now_ms();
  const size_t copies = 1 + state_.state_names.size();
  size_t total = 0;
  for (const ShardView& v : state_.tensors) total += static_cast<size_t>(v.rows.rows() * v.cols) * copies;
  if (total > host_floats_) {  // not value-initialized: the copies write every element
    host_.reset(new float[total]);
    host_floats_ = total;
  }
  copies_in_flight_ = true;
  SaveJob job;
  job.step = steps_done;
  size_t at = 0;
  for (const ShardView& v : state_.tensors) {
    std::vector<int64_t> shape = v.shape.empty() ? std::vector<int64_t>{1} : v.shape;
    shape[0] = v.rows.rows();
    const size_t n = static_cast<size_t>(v.rows.rows() * v.cols);
    for (size_t k = 0; k < copies; ++k) {
      const float* src = k == 0 ? v.param : v.states[k - 1];
      if (n) device_.copy_to_host(stream_, host_.get() + at, src, n * sizeof(float));
      job.tensors.push_back({k == 0 ? v.fqn : v.fqn + "." + state_.state_names[k - 1], "F32",
                             shape, host_.get() + at});
      at += n;
    }
  }
  device_.synchronize_stream(stream_);
  copies_in_flight_ = false;
  if (state_.rank == 0) {
    nlohmann::json tensors = nlohmann::json::array();
    for (const ShardView& v : state_.tensors) {
      nlohmann::json ranks = nlohmann::json::array();
      for (const RowRange& rr : v.rank_rows) ranks.push_back({rr.begin, rr.end});
      tensors.push_back({{"name", v.fqn}, {"shape", v.shape}, {"dtype", "F32"},
                         {"optimizer_step", state_.optimizer->step_count()},
                         {"ranks", ranks}});
    }
    nlohmann::json files = nlohmann::json::array();
    for (int r = 0; r < state_.world; ++r) files.push_back(rank_file_name(r));
    nlohmann::json ts = train_state.is_object() ? train_state : nlohmann::json::object();
    ts["step"] = steps_done;
    // The data loader's position: the next micro-batch's index (Note [Batch sources]).
    ts["data_step"] = static_cast<int64_t>(steps_done) * run_.micro_batches;
    const nlohmann::json index = {{"format", kFormat},
                                  {"version", kFormatVersion},
                                  {"step", steps_done},
                                  {"world_size", state_.world},
                                  {"config", run_json_},
                                  {"train_state", ts},
                                  {"optimizer", state_.optimizer_kind},
                                  {"state_names", state_.state_names},
                                  {"tensors", tensors},
                                  {"files", files}};
    job.index_text = index.dump(1) + "\n";
  }
  last_stall_ms_ = now_ms() - t0;
  job.wait_ms = t1 - t0;
  job.copy_ms = now_ms() - t1;
  writer_->start(std::move(job));
  return last_stall_ms_;
}

void TrainerCheckpoint::finish() {
  if (writer_) writer_->wait();
}

}  // namespace fsdp::checkpoint

namespace fsdp {

// What a checkpoint option asks for must happen: a save setting with nowhere to save would
// run and save nothing.
void check_checkpoint_options(const CheckpointOptions& o) {
  const OptionName save_every{"save_every"}, keep_last{"keep_last"};
  FSDP_OPTION_CHECK(o.save_every >= 0, save_every,
                    " must be >= 0 (0: after the last step only), got ", o.save_every);
  FSDP_OPTION_CHECK(o.keep_last >= 0, keep_last, " must be >= 0 (0: every checkpoint), got ",
                    o.keep_last);
  FSDP_OPTION_CHECK(!o.save_dir.empty() || o.save_every == 0, save_every, " ", o.save_every,
                    " needs a directory to save to (", OptionName{"save_dir"},
                    "); without one nothing would be saved");
  FSDP_OPTION_CHECK(!o.save_dir.empty() || o.keep_last == 0, keep_last, " ", o.keep_last,
                    " needs a directory to save to (", OptionName{"save_dir"},
                    "); without one nothing would be saved or kept");
  FSDP_OPTION_CHECK(o.resume.empty() || o.init_from.empty(), OptionName{"resume"}, " and ",
                    OptionName{"init_from"}, " exclude each other: a resume loads its own weights");
}

}  // namespace fsdp
