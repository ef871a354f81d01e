// Note [Optimizer offload] (fsdp/optim_offload.h).
#include "fsdp/optim_offload.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <fstream>
#include <functional>
#include <mutex>
#include <thread>

#include "backend/cpu/cpu_kernels.h"
#include "fsdp/error.h"

namespace fsdp::optim {

namespace {

std::string gib_text(int64_t bytes) {
  char text[64];
  std::snprintf(text, sizeof text, "%.2f GiB (%lld bytes)", static_cast<double>(bytes) / (1 << 30),
                static_cast<long long>(bytes));
  return text;
}

// Elements one thread steps at least: below this a chunk costs more to hand out than to run.
constexpr int64_t kMinChunk = int64_t{1} << 15;

}  // namespace

int64_t offload_host_bytes(const std::vector<ParamSpan>& params, const OptimizerConfig& config) {
  const int64_t states = config.kind == "adamw" ? 2 : 1;
  int64_t numel = 0, largest = 0;
  for (const ParamSpan& p : params) {
    numel += p.numel;
    largest = std::max(largest, p.numel);
  }
  return (numel * (1 + states) + kOffloadGradSlots * largest) * static_cast<int64_t>(sizeof(float)) +
         static_cast<int64_t>(std::max<size_t>(params.size(), 1) * sizeof(float));  // the sums
}

int64_t available_host_memory() {
  std::ifstream in("/proc/meminfo");
  std::string key, unit;
  int64_t kib = 0;
  while (in >> key >> kib >> unit)
    if (key == "MemAvailable:") return kib * 1024;
  return 0;
}

void check_offload_host_memory(const std::vector<ParamSpan>& params, const OptimizerConfig& config,
                               const OffloadOptions& options) {
  FSDP_USER_CHECK(options.host_memory_limit >= 0, "the optimizer offload's host memory limit must "
                  "be >= 0 bytes (0: MemAvailable), got ", options.host_memory_limit);
  FSDP_USER_CHECK(options.ranks_sharing_host >= 0, "the ranks sharing a host must be >= 1, got ",
                  options.ranks_sharing_host);
  const int sharing = std::max(options.ranks_sharing_host, 1);
  FSDP_USER_CHECK(options.threads >= 0 && options.threads <= 4096,
                  "the optimizer offload's host threads must be in [0, 4096], got ", options.threads);
  const int64_t per_rank = offload_host_bytes(params, config);
  const int64_t needed = per_rank * sharing;
  const bool limited = options.host_memory_limit > 0;
  const int64_t available = limited ? options.host_memory_limit
                            : options.simulated_host ? 0
                                                     : available_host_memory();
  FSDP_USER_CHECK(available <= 0 || needed <= available,
                  "the optimizer offload needs ", gib_text(needed), " of host memory (fp32 master "
                  "weights, ", config.kind, " state and grad buffers: ", gib_text(per_rank),
                  " per rank x ", sharing, sharing == 1 ? " rank) but " : " ranks) but ", gib_text(available),
                  limited ? " is the host memory limit" : " is available (MemAvailable)",
                  "; use more ranks or a smaller model");
}

// A fixed set of threads for the host step: run(count, f) calls f(0..count-1) across them and
// the caller, and returns when every call has; it rethrows the first exception.
class OptimizerOffload::Threads {
 public:
  explicit Threads(int n) {
    for (int i = 1; i < n; ++i) workers_.emplace_back([this] { serve(); });
  }
  ~Threads() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    for (std::thread& t : workers_) t.join();
  }
  int size() const { return static_cast<int>(workers_.size()) + 1; }

  void run(int count, const std::function<void(int)>& f) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      job_ = &f;
      next_ = 0;
      count_ = count;
      unfinished_ = count;
      error_ = nullptr;
      ++generation_;
    }
    wake_.notify_all();
    work();
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [&] { return unfinished_ == 0; });
    job_ = nullptr;
    if (error_) std::rethrow_exception(error_);
  }

 private:
  void serve() {
    uint64_t seen = 0;
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
      }
      work();
    }
  }
  // Takes items until none is left.
  void work() {
    for (;;) {
      int i = 0;
      const std::function<void(int)>* job = nullptr;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        if (!job_ || next_ >= count_) return;
        i = next_++;
        job = job_;
      }
      std::exception_ptr error;
      try {
        (*job)(i);
      } catch (...) {
        error = std::current_exception();
      }
      std::lock_guard<std::mutex> lock(mutex_);
      if (error && !error_) error_ = error;
      if (--unfinished_ == 0) done_.notify_all();
    }
  }

  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable wake_, done_;
  const std::function<void(int)>* job_ = nullptr;
  int next_ = 0, count_ = 0, unfinished_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
};

struct OptimizerOffload::Group {
  OptimTensor host;             // the host step's tensor: master, grad slot, states (host memory)
  int slot = 0;                 // its grad slot
  float* device_param = nullptr;
  const float* device_grad = nullptr;
  Event grad_ready, down, stepped, uploaded;
  bool grad_hooked = false;  // grad_ready ran since the last step
};

OptimizerOffload::OptimizerOffload(Optimizer& optimizer, Stream stream, const OffloadOptions& options)
    : optimizer_(optimizer), device_(optimizer.device_),
      drop_upload_wait_(options.drop_upload_wait_for_testing) {
  FSDP_CHECK(optimizer.placement() == StatePlacement::Host,
             "the optimizer offload needs an optimizer whose state is on the host");
  down_ = device_.create_stream("offload D2H", StreamPriority::Normal);
  host_ = device_.create_stream("host optimizer", StreamPriority::Normal);
  up_ = device_.create_stream("offload H2D", StreamPriority::Normal);
  const int sharing = std::max(options.ranks_sharing_host, 1);
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  threads_ = std::make_unique<Threads>(options.threads > 0 ? options.threads
                                                           : std::max(1, cores / sharing));
  const int sums = static_cast<int>(optimizer.grad_square_names().size());
  sums_ = static_cast<float*>(device_.alloc_host(static_cast<size_t>(std::max(sums, 1)) * sizeof(float)));
  std::memset(sums_, 0, static_cast<size_t>(std::max(sums, 1)) * sizeof(float));
  host_bytes_ = static_cast<int64_t>(std::max(sums, 1) * sizeof(float));
  step_begun_ = device_.create_event();
  int64_t largest = 0;
  for (const OptimTensor& t : optimizer.tensors()) largest = std::max(largest, t.numel);
  const size_t slot_bytes = static_cast<size_t>(std::max<int64_t>(largest, 1)) * sizeof(float);
  for (int s = 0; s < kOffloadGradSlots; ++s) {
    grad_slots_.push_back(static_cast<float*>(device_.alloc_host(slot_bytes)));
    if (device_.computes_values()) std::memset(grad_slots_.back(), 0, slot_bytes);
    slot_free_.push_back(device_.create_event());
    host_bytes_ += static_cast<int64_t>(slot_bytes);
  }
  const int count = static_cast<int>(optimizer.tensors().size());
  for (const OptimTensor& t : optimizer.tensors()) {
    FSDP_CHECK(t.grad, "the optimizer offload needs every group's grad shard");
    Group g;
    const size_t bytes = static_cast<size_t>(t.numel) * sizeof(float);
    g.host = t;  // the states: the optimizer's, on the host already
    g.host.param = static_cast<float*>(device_.alloc_host(bytes));
    // step() issues the groups last first: group i is the (count - 1 - i)-th.
    g.slot = (count - 1 - static_cast<int>(groups_.size())) % kOffloadGradSlots;
    g.host.grad = grad_slots_[static_cast<size_t>(g.slot)];
    g.host.grad_dtype = DType::F32;
    g.host.param_copy = nullptr;
    g.device_param = t.param;
    g.device_grad = static_cast<const float*>(t.grad);
    g.grad_ready = device_.create_event();
    g.down = device_.create_event();
    g.stepped = device_.create_event();
    g.uploaded = device_.create_event();
    host_bytes_ += (t.state1 ? 3 : 2) * static_cast<int64_t>(bytes);
    groups_.push_back(g);
  }
  pull_masters(stream);
}

OptimizerOffload::~OptimizerOffload() {
  synchronize_in_destructor(device_);
  for (Group& g : groups_) {
    device_.free_host(g.host.param);
    for (Event e : {g.grad_ready, g.down, g.stepped, g.uploaded}) device_.destroy_event(e);
  }
  for (float* p : grad_slots_) device_.free_host(p);
  for (Event e : slot_free_) device_.destroy_event(e);
  device_.free_host(sums_);
  device_.destroy_event(step_begun_);
}

int OptimizerOffload::threads() const { return threads_->size(); }

ShardOffloadHooks OptimizerOffload::hooks() {
  ShardOffloadHooks h;
  h.before_all_gather = [this](Stream s, int group) {
    FSDP_CHECK(group >= 0 && group < static_cast<int>(groups_.size()), "group ordinal ", group,
               " out of range (", groups_.size(), " offloaded groups)");
    if (!drop_upload_wait_) device_.wait_event(s, groups_[static_cast<size_t>(group)].uploaded);
  };
  h.before_shard_read = [this](Stream s) { wait_all(s); };
  return h;
}

void OptimizerOffload::grad_ready(Stream s, int group) {
  FSDP_CHECK(group >= 0 && group < static_cast<int>(groups_.size()), "group ordinal ", group,
             " out of range (", groups_.size(), " offloaded groups)");
  Group& g = groups_[static_cast<size_t>(group)];
  device_.record_event(g.grad_ready, s);
  g.grad_hooked = true;
}

void OptimizerOffload::before_backward(Stream compute) {
  for (const Group& g : groups_) device_.wait_event(compute, g.down);
}

void OptimizerOffload::wait_all(Stream s) {
  for (const Group& g : groups_) {
    device_.wait_event(s, g.stepped);
    device_.wait_event(s, g.uploaded);
  }
}

void OptimizerOffload::pull_masters(Stream s) {
  wait_all(s);
  device_.set_label("offload master");
  for (const Group& g : groups_)
    device_.copy_to_host(s, g.host.param, g.device_param, static_cast<size_t>(g.host.numel) * sizeof(float));
  device_.synchronize_stream(s);
}

// One group's step on the host, split into chunks across the threads: each element's math is
// the CPU backend's kernel, so the chunking changes no bit.
void OptimizerOffload::host_step(int group, const StepScalars& scalars, int sum_count) {
  const OptimTensor& t = groups_[static_cast<size_t>(group)].host;
  const OptimizerConfig& c = optimizer_.config();
  const int64_t chunks = std::clamp<int64_t>(t.numel / kMinChunk, 1, threads_->size());
  const int64_t per = (t.numel + chunks - 1) / chunks;
  const GradSquares sq{sums_, sum_count};
  threads_->run(static_cast<int>(chunks), [&](int i) {
    const int64_t begin = i * per, n = std::min(t.numel, begin + per) - begin;
    if (n <= 0) return;
    OptimTensor part = t;
    part.param += begin;
    part.grad = static_cast<const float*>(t.grad) + begin;
    part.state0 += begin;
    if (part.state1) part.state1 += begin;
    part.numel = n;
    if (c.kind == "adamw")
      cpu::kernels::adamw_step_scalars(&part, 1, c.adamw, scalars, sq);
    else
      cpu::kernels::sgd_step_scalars(&part, 1, c.sgd_momentum, c.sgd_weight_decay, scalars, sq);
  });
}

void OptimizerOffload::step(Stream compute) {
  if (!optimizer_.begun_) optimizer_.begin_step(compute, optimizer_.config().base_lr());
  optimizer_.end_step();  // checks that clipping has its sums
  const StepScalars scalars = optimizer_.host_scalars();
  const int sum_count = optimizer_.config().max_grad_norm > 0
                            ? static_cast<int>(optimizer_.grad_square_names().size())
                            : 0;
  ++steps_issued_;
  device_.record_event(step_begun_, compute);
  const bool computes = device_.computes_values();
  // Clipping: the host steps read the global grad sums, which compute made last.
  if (sum_count > 0) {
    device_.wait_event(host_, step_begun_);
    device_.set_label("grad norm to host");
    device_.copy_to_host(host_, sums_, optimizer_.grad_squares(),
                         static_cast<size_t>(sum_count) * sizeof(float));
  }
  const int64_t state_count = optimizer_.config().kind == "adamw" ? 2 : 1;
  for (int i = static_cast<int>(groups_.size()) - 1; i >= 0; --i) {
    Group& g = groups_[static_cast<size_t>(i)];
    const size_t bytes = static_cast<size_t>(g.host.numel) * sizeof(float);
    // Down: after the grad is final and the last host step that read the slot is done.
    const Event slot_free = slot_free_[static_cast<size_t>(g.slot)];
    device_.wait_event(down_, g.grad_hooked ? g.grad_ready : step_begun_);
    device_.wait_event(down_, slot_free);
    device_.set_label("offload grad D2H");
    device_.copy_to_host(down_, const_cast<void*>(g.host.grad), g.device_grad, bytes);
    device_.record_event(g.down, down_);
    g.grad_hooked = false;
    // The step: after the grad is down and the last upload read the master.
    device_.wait_event(host_, g.down);
    device_.wait_event(host_, g.uploaded);
    device_.set_label("host optimizer");
    const int64_t traffic = g.host.numel * 4 * (3 + 2 * state_count);
    device_.run_host_task(host_, traffic, [this, i, scalars, sum_count, computes] {
      if (computes) host_step(i, scalars, sum_count);
    });
    device_.record_event(g.stepped, host_);
    device_.record_event(slot_free, host_);
    // Up: the new master into the device shard, for the group's next all-gather.
    device_.wait_event(up_, g.stepped);
    device_.set_label("offload param H2D");
    device_.copy_from_host_async(up_, g.device_param, g.host.param, bytes);
    device_.record_event(g.uploaded, up_);
  }
}

}  // namespace fsdp::optim
