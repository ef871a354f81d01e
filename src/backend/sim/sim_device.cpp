// Note [Simulation backend]
// The simulation backend runs the engine as it is (src/core's scheduler, the models, the
// trainer) on a simulated GPU cluster, to predict a step at a scale no machine here has.
//  - Time is the CPU backend's virtual clock (Note [Virtual clock]) and its streams and
//    events are the CPU backend's (StreamDevice): each stream is a worker thread, each op a
//    task that lets its device time pass on the clock, so streams overlap, wait for events and
//    stall exactly as the schedule makes them, and the timeline is the real trace format.
//    Kernels of different streams that overlap share the device (Note [Shared channels], at
//    the calibration's kernel_sharing: 1 splits it equally, as a GPU's SMs and memory are
//    shared), so a memory-bound kernel beside a GEMM slows both; collectives' transfers run on
//    their links, beside the kernels. A memory-bound kernel shares by its stream's priority
//    too (the calibration's memory_kernel_yield and memory_kernel_lead), as the GPU hands free
//    SMs to the high-priority streams' kernels first.
//  - Ops do no arithmetic. Each costs device time from the calibration (Note [Op costs]):
//    GEMMs and attention by shape from measured tables, memory-bound kernels by their bytes
//    at measured bandwidths, plus, on the host, a launch cost per call (none for a captured
//    step). Collectives cost time from a model of the links (Note [Simulated collectives]).
//  - Memory is accounted, never touched: alloc hands out addresses from a range that holds
//    nothing (so a 70B model on 1024 GPUs needs no memory here) and the allocation ledger
//    counts them as the other backends do, exactly, at call time.
//  - Values are absent (Note [Simulated values]).
//
// Note [Symmetric ranks]
// FSDP's ranks all do the same work, so the backend runs one of them and it stands for the
// rest: the world's last rank, whose device and world communicator SimWorld makes. Its
// communicators know all their members (world ranks, and so their nodes), but no other rank
// runs: a collective takes the time the link model gives it once this rank issues it, as it
// would when every rank issues it at the same moment. What the model cannot see: a rank that
// is slower than the others (stragglers, an unbalanced MoE layer on another rank); the
// simulated rank is the one whose experts get the load model's hot expert, so an unbalanced
// MoE step is paced by the busiest rank, as a real one is.
//
// Note [Simulated values]
// Nothing is computed, so a loss, a grad norm or a routing read back on the host has no true
// value. Reads get zeros (the trainer's losses and norms: absent, and `fsdp simulate` says
// so), except where the schedule depends on the value:
//  - bytes the host wrote into a small buffer (copy_from_host, up to kShadowMaxBytes) are kept
//    as a shadow and read back as written, through device copies and collectives too: a
//    collective's peers are taken to send what this rank sends (symmetric ranks), so an
//    all-to-all of per-expert counts hands each peer's chunk for us our own chunk for us;
//  - the rows a softmax writes are probabilities: the dropless MoE routing reads them to
//    route on the host, and gets rows drawn from the load model (MoeLoad): Gumbel noise on
//    equal logits (balanced), with the last expert's logit raised (skewed) until that expert
//    gets max_load of the top-k assignments. The last expert lives on the simulated rank.
//
// Note [Simulated host routing]
// The host's own work takes no simulated time (each call costs its launch, nothing else),
// except where the host waits for values from the device and works on them before it launches
// more, leaving the device idle meanwhile. A dropless MoE layer (Note [MoE routing]) copies the
// router's probabilities to the host, synchronizes, routes them there (the top-k, the dispatch
// layout and the send order) and only then launches the dispatch; its backward copies the
// combine weights' gradients back, synchronizes and makes the router's gradient on the host.
// So a copy_to_host of a softmax's rows (Note [Simulated values]) makes the calibration's
// host.moe_route_us due, and one of a row_dot's output (the combine weights' gradients, the one
// row_dot output the engine reads on the host) host.moe_route_backward_us, and the host pays
// what is due when it next waits for the device, before its next launch. Both are per MoE
// layer, not per token: the traced step they are fitted from (bench/fit_calibration.py
// --moe-step) routes one token count, and one token count cannot tell a per-token rate from a
// fixed cost. The cost log lists them as host_moe_route and host_moe_route_backward, in host
// time.
#include "backend/sim/sim_device.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>
#include <tuple>

#include "fsdp/error.h"

namespace fsdp::sim {

namespace {

// Where the simulated address range starts: far above any host address, and never read.
constexpr uintptr_t kAddressBase = uintptr_t{1} << 56;
constexpr uintptr_t kAlignment = 256;
constexpr size_t kShadowMaxBytes = size_t{1} << 20;
constexpr size_t kShadowTotalBytes = size_t{256} << 20;

cpu::CpuOptions world_options() {
  cpu::CpuOptions o;
  o.checked = false;
  o.virtual_clock = true;
  o.collective_timeout_s = 0;  // one host: nobody to wait for
  return o;
}

uint64_t mix(uint64_t x) {  // splitmix64
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

double gumbel(uint64_t seed, uint64_t draw, uint64_t row, uint64_t col) {
  const uint64_t h = mix(mix(mix(mix(seed) ^ draw) ^ row) ^ col);
  const double u = (static_cast<double>(h >> 11) + 0.5) / 9007199254740992.0;  // (0, 1)
  return -std::log(-std::log(u));
}

// The hot expert's share of top-k assignments with its logit raised by `bias` (Monte Carlo
// over a fixed sample, so the same every time).
double hot_share(int experts, int top_k, double bias) {
  constexpr int kRows = 4000;
  int64_t hot = 0;
  std::vector<double> z(static_cast<size_t>(experts));
  for (int r = 0; r < kRows; ++r) {
    for (int e = 0; e < experts; ++e) z[e] = gumbel(12345, 0, r, e) + (e == experts - 1 ? bias : 0);
    int above = 0;  // experts ahead of the hot one
    for (int e = 0; e + 1 < experts; ++e) above += z[e] > z[experts - 1];
    hot += above < top_k;
  }
  return static_cast<double>(hot) / (static_cast<double>(kRows) * top_k);
}

double hot_bias(int experts, int top_k, double max_load) {
  double lo = 0, hi = 40;
  for (int i = 0; i < 40; ++i) {
    const double mid = 0.5 * (lo + hi);
    (hot_share(experts, top_k, mid) < max_load ? lo : hi) = mid;
  }
  return 0.5 * (lo + hi);
}

}  // namespace

SimShared::SimShared(SimOptions o)
    : options(std::move(o)), world(std::make_shared<cpu::WorldState>(1, world_options())) {
  kernels.sharing = options.calibration.kernel_sharing;
}

SimDevice::SimDevice(std::shared_ptr<SimShared> shared, int rank)
    : StreamDevice(shared->world, rank, "sim"),
      shared_(std::move(shared)),
      next_address_(kAddressBase) {}

SimDevice::~SimDevice() { stop_streams(); }

void SimDevice::host_cost(double us) {
  if (!shared_->options.host_costs || !(us > 0) || !on_host_thread()) return;
  world()->clock->sleep_for(host_participant(), us, &cancellation());
}

void SimDevice::log_cost(const char* op, double bytes, double flops, double us) {
  if (!shared_->options.cost_log) return;
  std::lock_guard<std::mutex> lock(shared_->cost_mutex);
  CostEntry& e = shared_->costs[{std::string(current_label() ? current_label() : ""), op}];
  ++e.ops;
  e.bytes += bytes;
  e.flops += flops;
  e.us += us;
}

void SimDevice::timed(Stream s, OpKind kind, const char* op, double us, double launch_us,
                      double bytes, double flops, bool alone, bool memory_bound) {
  host_cost(launch_us);
  if (flops > 0) shared_->flops.fetch_add(flops, std::memory_order_relaxed);
  log_cost(op, bytes, flops, us);
  if (alone) {
    enqueue(s, kind, [this, us] { world()->pass_time(us, &cancellation()); });
    return;
  }
  cpu::ChannelShare share;  // a GEMM's or attention's: the channel's kernel_sharing
  share.priority = stream_priority(s) == StreamPriority::High ? 1 : 0;
  if (memory_bound) {
    share.sharing = calibration().memory_kernel_sharing;
    share.yield = calibration().memory_kernel_yield;
    share.lead = calibration().memory_kernel_lead;
  }
  enqueue(s, kind, [this, us, share] {
    cpu::ClockParticipant* self = cpu::this_thread_participant();
    FSDP_CHECK(self != nullptr, "a simulated kernel outside a stream");
    world()->clock->sleep_on_channel(*self, shared_->kernels, us, &cancellation(), share);
  });
}

// ---- Note [Simulated host routing]

void SimDevice::read_by_host(const void* src, bool probabilities) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (probabilities) route_due_us_ += calibration().moe_route_us;
  if (routing_grads_.count(reinterpret_cast<uintptr_t>(src)))
    route_backward_due_us_ += calibration().moe_route_backward_us;
}

void SimDevice::pay_host_work() {
  double route = 0, backward = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    std::swap(route, route_due_us_);
    std::swap(backward, route_backward_due_us_);
  }
  // A captured step never waits inside (dropless routing refuses capture), and host_costs off
  // prices no host work at all.
  if (!shared_->options.host_costs || !on_host_thread()) return;
  for (const auto& [op, us] : {std::pair{"host_moe_route", route},
                               std::pair{"host_moe_route_backward", backward}}) {
    if (!(us > 0)) continue;
    host_cost(us);
    log_cost(op, 0, 0, us);
  }
}

void SimDevice::synchronize_event(Event e) {
  StreamDevice::synchronize_event(e);
  pay_host_work();
}

void SimDevice::synchronize_stream(Stream s) {
  StreamDevice::synchronize_stream(s);
  pay_host_work();
}

void SimDevice::synchronize() {
  StreamDevice::synchronize();
  pay_host_work();
}

void SimDevice::memory_op(Stream s, const char* op, double bytes, OpKind kind) {
  timed(s, kind, op, memory_us(calibration(), op, bytes), calibration().kernel_launch_us, bytes, 0,
        false, /*memory_bound=*/true);
}

// ---- memory

void* SimDevice::alloc(size_t bytes, Stream s, MemTag tag) {
  worker(s);  // validates the stream
  void* p;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const uintptr_t size = (std::max<uintptr_t>(bytes, 1) + kAlignment - 1) / kAlignment * kAlignment;
    FSDP_CHECK(next_address_ + size > next_address_, "simulated address range exhausted");
    p = reinterpret_cast<void*>(next_address_);
    next_address_ += size;
  }
  const int64_t current = ledger_.add(p, bytes, tag);
  sample_memory(current);
  return p;
}

void SimDevice::free(void* ptr, Stream s) {
  if (ptr == nullptr) return;
  worker(s);
  const core::AllocationLedger::Entry entry = ledger_.remove(ptr, name());
  {
    std::lock_guard<std::mutex> lock(mutex_);
    drop_values(reinterpret_cast<uintptr_t>(ptr), entry.bytes);
  }
  sample_memory(ledger_.current_bytes());
}

MemStats SimDevice::memory_stats() const { return ledger_.stats(); }
void SimDevice::reset_peak_memory() { ledger_.reset_peak(); }

void* SimDevice::alloc_host(size_t bytes) {
  void* p = std::calloc(bytes ? bytes : 1, 1);
  if (!p) throw std::bad_alloc();
  return p;
}
void SimDevice::free_host(void* ptr) { std::free(ptr); }

// ---- values (Note [Simulated values])

void SimDevice::drop_values(uintptr_t first, size_t bytes) {
  const uintptr_t end = first + std::max<size_t>(bytes, 1);
  for (auto it = shadows_.lower_bound(first); it != shadows_.end() && it->first < end;) {
    shadow_bytes_ -= it->second.size();
    it = shadows_.erase(it);
  }
  for (auto it = probabilities_.lower_bound(first); it != probabilities_.end() && it->first < end;)
    it = probabilities_.erase(it);
  routing_grads_.erase(routing_grads_.lower_bound(first), routing_grads_.lower_bound(end));
}

const std::vector<char>* SimDevice::shadow_at(const void* p, size_t n) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = shadows_.find(reinterpret_cast<uintptr_t>(p));
  if (it == shadows_.end() || it->second.size() < n) return nullptr;
  return &it->second;
}

void SimDevice::set_shadow(void* p, std::vector<char> bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  drop_values(a, bytes.size());
  if (bytes.size() > kShadowMaxBytes || shadow_bytes_ + bytes.size() > kShadowTotalBytes) return;
  shadow_bytes_ += bytes.size();
  shadows_[a] = std::move(bytes);
}

bool SimDevice::synthesize_probabilities(void* host_dst, const void* src, size_t bytes) const {
  Probabilities pr;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = probabilities_.find(reinterpret_cast<uintptr_t>(src));
    if (it == probabilities_.end()) return false;
    pr = it->second;
  }
  const int64_t rows = std::min<int64_t>(pr.rows, static_cast<int64_t>(bytes / sizeof(float)) /
                                                      std::max<int64_t>(pr.cols, 1));
  const int experts = static_cast<int>(pr.cols);
  const MoeLoad& load = shared_->options.moe_load;
  double bias = 0;
  if (load.skewed && experts > 1) {
    static std::mutex cache_mutex;
    static std::map<std::tuple<int, int, double>, double> cache;
    const int k = std::clamp(load.top_k, 1, experts);
    std::lock_guard<std::mutex> lock(cache_mutex);
    auto [it, fresh] = cache.try_emplace({experts, k, load.max_load}, 0.0);
    if (fresh) it->second = hot_bias(experts, k, load.max_load);
    bias = it->second;
  }
  auto* out = static_cast<float*>(host_dst);
  std::vector<double> z(static_cast<size_t>(experts));
  for (int64_t r = 0; r < rows; ++r) {
    double top = -1e300;
    for (int e = 0; e < experts; ++e) {
      z[e] = gumbel(shared_->options.seed, pr.draw, static_cast<uint64_t>(r), e) +
             (e == experts - 1 ? bias : 0.0);
      top = std::max(top, z[e]);
    }
    double sum = 0;
    for (int e = 0; e < experts; ++e) sum += (z[e] = std::exp(z[e] - top));
    for (int e = 0; e < experts; ++e) out[r * experts + e] = static_cast<float>(z[e] / sum);
  }
  return true;
}

// ---- SimWorld

SimWorld::SimWorld(SimOptions options) {
  FSDP_USER_CHECK(options.gpus >= 1, "the simulated cluster needs at least 1 GPU, got ",
                  options.gpus);
  FSDP_USER_CHECK(options.gpus_per_node >= 1, "a simulated node needs at least 1 GPU, got ",
                  options.gpus_per_node);
  FSDP_USER_CHECK(options.gpus % options.gpus_per_node == 0 || options.gpus < options.gpus_per_node,
                  "the simulated cluster's ", options.gpus, " GPUs do not fill nodes of ",
                  options.gpus_per_node);
  FSDP_USER_CHECK(!options.moe_load.skewed || (options.moe_load.max_load > 0 &&
                                               options.moe_load.max_load <= 1),
                  "a skewed MoE load needs the busiest expert's share in (0, 1], got ",
                  options.moe_load.max_load);
  shared_ = std::make_shared<SimShared>(std::move(options));
}

SimWorld::~SimWorld() = default;

int SimWorld::size() const { return shared_->options.gpus; }
const SimOptions& SimWorld::options() const { return shared_->options; }

std::unique_ptr<Device> SimWorld::make_device() {
  FSDP_CHECK(!shared_->device_made, "a simulated world runs one rank: its device exists already");
  shared_->device_made = true;
  return std::make_unique<SimDevice>(shared_, simulated_rank());
}

CostLog SimWorld::cost_log() const {
  std::lock_guard<std::mutex> lock(shared_->cost_mutex);
  return shared_->costs;
}

double SimWorld::flops_done() const { return shared_->flops.load(); }

}  // namespace fsdp::sim
