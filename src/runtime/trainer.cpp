// One rank's training loop (Note [Trainer observers]).
#include "runtime/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>

#include "checkpoint/trainer_checkpoint.h"
#include "core/fsdp_state.h"
#include "fsdp/collective_check.h"
#include "fsdp/error.h"
#include "fsdp/out_of_memory.h"
#include "models/model_family.h"
#include "runtime/captured_step.h"
#include "runtime/evaluation.h"
#include "runtime/memory_estimate.h"
#include "runtime/memory_planner.h"
#include "runtime/parallel_model.h"
#include "runtime/step_parts.h"
#include "runtime/step_reader.h"
#include "runtime/trace_metrics.h"
#include "runtime/train_observers.h"

namespace fsdp::runtime {

namespace {

double now_ms() {
  using namespace std::chrono;
  return duration<double, std::milli>(steady_clock::now().time_since_epoch()).count();
}

int64_t count_units(nn::Model& model) {
  int64_t n = 0;
  model.visit([&](Module& m) { n += core::state_of(m) != nullptr; });
  return n;
}

// Note [Non-finite steps]
// A step whose loss or global grad norm is not finite ends the run there: nothing after it
// can be trusted, and continuing would print -nan for every later step. The message names
// the step (1-based, as the step line counts) and, for a grad, the first unit whose grad
// norm is not finite. Every rank sees the same all-reduced values, so all ranks stop at the
// same step and their collectives stay matched.
std::string nonfinite_message(const StepValues& v, const std::vector<std::string>& names) {
  if (!std::isfinite(v.loss))
    return detail::concat("step ", v.step + 1, ": the loss is ", v.loss,
                          "; training stopped (try a lower learning rate)");
  for (size_t i = 0; i < v.grad_squares.size(); ++i)
    if (!std::isfinite(v.grad_squares[i]))
      return detail::concat("step ", v.step + 1, ": the gradient of ",
                            names[i].empty() ? "the root" : names[i], " is not finite (norm ",
                            std::sqrt(v.grad_squares[i]),
                            "); training stopped (try a lower learning rate)");
  return {};
}

// gather_full_params gives an expert param's E / ep local experts; this appends the other ep
// ranks' blocks (ep-rank order is global expert order, docs/moe.md), so every rank gets all of
// them. Collective over the ep communicator.
void gather_every_expert(Device& d, Comm& ep, Stream s, nn::Model& model,
                         std::vector<std::vector<float>>& params) {
  size_t index = 0;  // all_params() order: pre-order, each module's params in order
  model.visit([&](Module& m) {
    const bool experts = dynamic_cast<nn::GroupedExperts*>(&m) != nullptr;
    for (size_t k = 0; k < m.params().size(); ++k, ++index) {
      if (!experts) continue;
      std::vector<float>& v = params.at(index);
      const int64_t n = static_cast<int64_t>(v.size());
      auto* buf = static_cast<float*>(
          d.alloc(static_cast<size_t>(n * (1 + ep.size())) * sizeof(float), s, MemTag::Other));
      if (n) d.copy_from_host(s, buf, v.data(), static_cast<size_t>(n) * sizeof(float));
      ep.all_gather(buf, buf + n, n, DType::F32, s);
      v.resize(static_cast<size_t>(n * ep.size()));
      if (n) d.copy_to_host(s, v.data(), buf + n, v.size() * sizeof(float));
      d.synchronize_stream(s);
      d.free(buf, s);
    }
  });
}

}  // namespace

// One rank's run: built and placed once, then step() per step, then finish().
class Trainer {
 public:
  Trainer(Device& device, std::shared_ptr<Comm> world, const TrainConfig& config,
          std::function<void(const StepReport&)> on_step);
  ~Trainer();
  bool running() const { return next_step_ < config_.steps && !stopped_; }
  void step();
  RankResult finish();

 private:
  void issue_step(int step, float* step_loss, double& host_us,
                  const std::function<const DeviceBatch&(int)>& batch_of);
  bool read_one();  // the oldest unread step; false if it was not finite (the run stops)
  bool read_all();  // every issued step; false if the run stopped

  Device& device_;
  const TrainConfig& config_;
  std::function<void(const StepReport&)> on_step_;
  RankResult result_;
  Stream compute_;
  RunContext ctx_;
  ParallelModel pm_;
  std::unique_ptr<optim::Optimizer> optimizer_;
  // Note [Optimizer in forward's owner]: with the optimizer in forward; destroyed first.
  std::unique_ptr<optim::OptimizerInForward> in_forward_;
  // Note [Optimizer offload]: with the optimizer on the host; destroyed before the optimizer.
  std::unique_ptr<optim::OptimizerOffload> offload_;
  std::unique_ptr<BatchSource> source_, eval_source_;
  std::unique_ptr<StepReader> reader_;
  std::unique_ptr<TrainState> state_;
  std::unique_ptr<CapturedStep> graph_;
  std::vector<std::unique_ptr<TrainObserver>> observers_;
  float* loss_ = nullptr;
  float* loss_avg_ = nullptr;
  Tensor micro_scale_;  // 1/micro_batches per row
  std::map<int, StepReport> issued_steps_;  // issued, not yet read
  std::map<int, float> val_by_step_;
  int next_step_ = 0;
  int first_step_ = 0;
  int capture_at_ = 0;
  int moe_layers_ = 0;
  bool stopped_ = false;
  bool prefetch_ = false;
  int64_t units_ = 0;
  double last_done_ms_ = 0;
  double host_us_total_ = 0, host_step_us_total_ = 0;
  int host_steps_ = 0, host_step_count_ = 0;
};

Trainer::Trainer(Device& device, std::shared_ptr<Comm> world, const TrainConfig& config,
                 std::function<void(const StepReport&)> on_step)
    : device_(device), config_(config), on_step_(std::move(on_step)) {
  check_train_config(config, world->size());
  // Note [Collective fingerprints]: every collective below, on `world` and on the
  // communicators split from it, is compared across ranks before it runs.
  if (config.check_collectives) world = with_collective_checks(std::move(world), device);
  const int rank = world->rank();
  result_.rank = rank;
  result_.memory_plan = config.memory_plan;
  result_.predicted_peak_bytes =
      config.predicted_peak_bytes > 0
          ? config.predicted_peak_bytes
          : estimate_rank_memory(config, world->size() / std::max(config.hsdp_replicas, 1))
                .device_bytes;
  compute_ = device.create_stream("compute", StreamPriority::Normal);
  ctx_ = RunContext{&device, compute_, config.param_dtype};
  pm_ = parallelize_model(device, world, config);
  nn::Model& model = *pm_.model;
  FsdpModule& root = *pm_.root;
  result_.param_count = model.active_param_count();
  PlacedOptimizer placed = place_optimizer(device, compute_, root, config);
  optimizer_ = std::move(placed.optimizer);
  in_forward_ = std::move(placed.in_forward);
  offload_ = std::move(placed.offload);
  if (offload_) result_.offload_host_bytes = offload_->host_bytes();
  result_.sharded_state_bytes = device.memory_stats().tag_bytes[static_cast<int>(MemTag::ShardedState)];
  // Note [Grads set to none]: the optimizer was made over grad shards; none lives into step 0.
  if (config.zero_grad_set_to_none) release_sharded_grads(root, compute_);
  source_ = make_source(config, rank, world->size());
  // The MoE layers' max loads are read with the step's loss (Model::copy_expert_loads).
  moe_layers_ = model.moe_layer_count();
  reader_ = std::make_unique<StepReader>(
      device, compute_, static_cast<int>(optimizer_->grad_square_names().size()), moe_layers_);
  loss_ = static_cast<float*>(device.alloc(sizeof(float), compute_, MemTag::Other));
  loss_avg_ = static_cast<float*>(device.alloc(sizeof(float), compute_, MemTag::Other));
  state_ = std::make_unique<TrainState>(TrainState{device, model, root, *optimizer_, compute_, 0});

  observers_.push_back(first_step_counts(pm_, result_));
  if (config.eval_source && config.eval_every > 0 && config.eval_batches > 0)
    observers_.push_back(
        evaluator(config, *pm_.world, ctx_, val_by_step_, last_done_ms_));
  if (config.timeline) observers_.push_back(timeline_recorder(config, compute_, result_));
  if (config.checkpoint.enabled()) {
    const models::ModelFamily& family = models::family(config.model.kind);
    checkpoint::RunDescription run{config.model,   config.param_dtype,    config.reduce_dtype,
                                   config.optimizer.kind, pm_.world->size(), config.tokens,
                                   config.seed,    config.micro_batches,  config.schedule,
                                   config.optimizer.base_lr(), config.data_name,
                                   family.shape_fields(config.model),
                                   family.hf_names(config.model)};
    const checkpoint::ExpertLayout experts{pm_.ep, family.expert_modules()};
    observers_.push_back(checkpointer(
        std::make_unique<checkpoint::TrainerCheckpoint>(config.checkpoint, run, device, compute_,
                                                        root, *optimizer_, experts),
        config, [this] { return read_all(); }));
  }
  for (auto& o : observers_) o->on_start(*state_);
  if (config.on_start) config.on_start(*state_);  // sees the loaded state
  device.synchronize();
  // A loaded checkpoint wrote the device shards: the host masters follow them.
  if (offload_ && (config.checkpoint.enabled() || config.on_start)) offload_->pull_masters(compute_);
  device.reset_peak_memory();
  units_ = count_units(model);
  next_step_ = first_step_ = state_->next_step;
  last_done_ms_ = now_ms();
  // Note [Captured steps]: a prefetch crosses the step boundary, which a graph cannot.
  prefetch_ = config.prefetch_next_step && !config.cuda_graph;
  if (config.cuda_graph) graph_ = std::make_unique<CapturedStep>(device, compute_, config.micro_batches);
  capture_at_ = first_step_ + std::max(1, config.warmup);
}

Trainer::~Trainer() {
  graph_.reset();
  micro_scale_ = Tensor{};
  if (loss_) device_.free(loss_, compute_);
  if (loss_avg_) device_.free(loss_avg_, compute_);
}

// One whole step's device work: every micro-batch, the grad norm and the optimizer. Under a
// graph it is recorded once, reading the fixed batches and adding the loss up in place.
void Trainer::issue_step(int step, float* step_loss, double& host_us,
                         const std::function<const DeviceBatch&(int)>& batch_of) {
  nn::Model& model = *pm_.model;
  FsdpModule& root = *pm_.root;
  const float inv_micro = 1.0f / static_cast<float>(config_.micro_batches);
  for (int mb = 0; mb < config_.micro_batches; ++mb) {
    root.set_requires_gradient_sync(mb == config_.micro_batches - 1);
    const DeviceBatch& batch = batch_of(mb);
    const bool first = step == first_step_ && mb == 0;
    if (first)
      for (auto& o : observers_) o->before_first_forward();
    const double h0 = device_.now_us();
    Tensor y = model.forward(ctx_, batch.x);
    host_us += device_.now_us() - h0;
    if (first)
      for (auto& o : observers_) o->after_first_forward();
    Tensor dy = loss_and_grad(device_, compute_, model, y, batch, loss_);
    model.add_aux_loss(device_, compute_, loss_);  // Note [MoE routing]
    scale_for_micro_batches(device_, compute_, dy, config_.micro_batches, micro_scale_);
    y = Tensor{};
    const double h1 = device_.now_us();
    // Note [Optimizer offload]: the reduce-scatters overwrite grads still going down.
    if (offload_) offload_->before_backward(compute_);
    model.backward(ctx_, dy, /*input_grad=*/false);  // the data needs no gradient
    host_us += device_.now_us() - h1;
    if (first)
      for (auto& o : observers_) o->after_first_backward();
    device_.set_label("loss all-reduce");
    pm_.world->all_reduce(loss_, loss_avg_, 1, DType::F32, ReduceOp::Avg, compute_);
    device_.accumulate(compute_, step_loss, loss_avg_, DType::F32, 1, inv_micro);
  }
  if (config_.after_backward) config_.after_backward(*state_);
  if (!config_.optimizer_in_backward) {
    if (config_.zero_grad_set_to_none) optimizer_->rebind_grads(grad_shards(root));
    optimizer_->compute_grad_squares(compute_);
    if (in_forward_)  // Note [Optimizer in forward]
      root.defer_shard_updates(compute_);
    else if (offload_)  // Note [Optimizer offload]
      offload_->step(compute_);
    else
      optimizer_->step(compute_);
    if (config_.zero_grad_set_to_none)
      release_sharded_grads(root, compute_);
    else
      zero_sharded_grads(root);
  }
  // Clears the loss for the next step; on a timeline it marks where this step ends.
  device_.set_label(kStepEndLabel);
  device_.fill(compute_, loss_, DType::F32, 1, 0.0f);
}

bool Trainer::read_one() {
  const StepValues v = reader_->pop();
  StepReport report = issued_steps_.at(v.step);
  issued_steps_.erase(v.step);
  const std::string bad = nonfinite_message(v, optimizer_->grad_square_names());
  if (!bad.empty()) {
    result_.error = bad;
    result_.failed_step = v.step;
    return false;
  }
  report.loss = v.loss;
  if (auto it = val_by_step_.find(v.step); it != val_by_step_.end()) {
    report.val_loss = it->second;
    result_.val_losses.push_back({v.step, it->second});
  }
  report.grad_norm = global_norm(v.grad_squares);
  if (!v.extras.empty()) report.max_expert_load = *std::max_element(v.extras.begin(), v.extras.end());
  report.step_ms = v.done_ms - last_done_ms_;
  last_done_ms_ = v.done_ms;
  append_step(result_, report);  // the per-step lists (Note [Result fields])
  result_.peak_bytes_by_step.push_back(device_.memory_stats().peak_bytes);
  for (auto& o : observers_) o->after_read(v.step);
  if (on_step_) on_step_(report);
  return true;
}

bool Trainer::read_all() {
  while (reader_->pending() > 0 && !stopped_) stopped_ = !read_one();
  return !stopped_;
}

void Trainer::step() {
  const int step = next_step_;
  FsdpModule& root = *pm_.root;
  const int rank = pm_.world->rank();
  if (config_.timeline && step == config_.warmup) device_.enable_timeline(true);
  double host_us = 0;
  const double host_step_start = device_.now_us();
  const double waited_before = device_.host_wait_us();
  StepReport report{};
  report.step = step;
  report.lr = config_.schedule.at(step, config_.optimizer.base_lr());
  optimizer_->begin_step(compute_, report.lr);
  float* step_loss = reader_->begin(step);
  auto make_batch = [&](int mb) {
    const int64_t index = static_cast<int64_t>(step) * config_.micro_batches + mb;
    DeviceBatch batch = make_step_batch(*source_, step, device_, compute_, index,
                                        rank * config_.tokens, config_.tokens, config_.param_dtype);
    report.tokens += batch.tokens;
    return batch;
  };
  // Note [Optimizer in forward]: a captured step starts with every group's update pending,
  // as the step before its capture left them; after anything ran them early (evaluation, a
  // checkpoint, the after_step hook) one eager step restores that.
  const bool graph_ready = !in_forward_ || in_forward_->pending_as_deferred();
  if (graph_ && step >= capture_at_ && graph_ready) {
    for (int mb = 0; mb < config_.micro_batches; ++mb) graph_->stage(mb, make_batch(mb));
    if (!graph_->captured()) {
      graph_->capture([&] {
        device_.fill(compute_, graph_->step_loss(), DType::F32, 1, 0.0f);
        issue_step(step, graph_->step_loss(), host_us,
                   [&](int mb) -> const DeviceBatch& { return graph_->batch(mb); });
      });
      result_.captured_step = step;
      result_.graph_streams = graph_->streams();
      result_.graph_op_times = graph_->op_times();
    }
    graph_->replay();
    device_.set_label(kStepEndLabel);
    device_.copy(compute_, step_loss, graph_->step_loss(), sizeof(float));
  } else {
    DeviceBatch current;
    issue_step(step, step_loss, host_us, [&](int mb) -> const DeviceBatch& {
      current = make_batch(mb);
      return current;
    });
  }
  if (prefetch_ && step + 1 < config_.steps)
    fsdp_module_of(*pm_.model->blocks().front())->unshard(/*async_op=*/true);
  if (moe_layers_ > 0) pm_.model->copy_expert_loads(device_, compute_, reader_->extras());
  reader_->end(config_.optimizer_in_backward ? nullptr : optimizer_->grad_squares());
  if (step >= config_.warmup && step != result_.captured_step) {
    // The host's own work: waits for the device (a staging slot, say) are left out.
    host_step_us_total_ +=
        device_.now_us() - host_step_start - (device_.host_wait_us() - waited_before);
    ++host_step_count_;
  }
  state_->next_step = next_step_ = step + 1;
  if (config_.after_step) {
    root.apply_pending_shard_updates(compute_);  // the hook may read the shards
    config_.after_step(*state_);
  }
  if (step >= config_.warmup) {
    host_us_total_ += host_us;
    ++host_steps_;
  }
  for (auto& o : observers_) o->after_issue(*state_, step, report);
  issued_steps_[step] = report;
  // Note [Asynchronous step read]: the previous step is read once this one is issued (a
  // traced step was synchronized already, so it is read at once).
  const int keep = config_.timeline ? 0 : 1;
  while (reader_->pending() > keep && !stopped_) stopped_ = !read_one();
  if (!stopped_)
    for (auto& o : observers_) o->after_step(*state_, step);
}

RankResult Trainer::finish() {
  FsdpModule& root = *pm_.root;
  root.apply_pending_shard_updates(compute_);  // the last step's (Note [Optimizer in forward])
  read_all();
  while (reader_->pending() > 0) reader_->pop();  // drain what ran after a stop
  for (auto& o : observers_) o->on_finish(*state_);  // the last save is on disk
  device_.synchronize();
  result_.host_us_per_step = host_step_count_ ? host_step_us_total_ / host_step_count_ : 0;
  result_.backend_peak_bytes = device_.backend_peak_bytes();
  result_.backend_reserved_peak_bytes = device_.backend_reserved_peak_bytes();
  graph_.reset();
  micro_scale_ = Tensor{};
  result_.host_schedule_us_per_unit =
      host_steps_ ? host_us_total_ / host_steps_ / std::max<int64_t>(units_, 1) : 0;
  result_.memory = device_.memory_stats();
  if (config_.collect_params) {
    result_.params = gather_full_params(root, compute_);
    if (pm_.ep_comm) gather_every_expert(device_, *pm_.ep_comm, compute_, *pm_.model, result_.params);
  }
  device_.free(loss_, compute_);
  device_.free(loss_avg_, compute_);
  loss_ = loss_avg_ = nullptr;
  device_.synchronize();
  if (!result_.error.empty() && !config_.return_on_nonfinite) throw UserError(result_.error);
  return std::move(result_);
}

RankResult train_rank(Device& device, std::shared_ptr<Comm> world, const TrainConfig& config,
                      const std::function<void(const StepReport&)>& on_step) {
  const int shard_ranks = world->size() / std::max(config.hsdp_replicas, 1);
  try {
    Trainer trainer(device, std::move(world), config, on_step);
    while (trainer.running()) trainer.step();
    return trainer.finish();
  } catch (const OutOfMemoryError& e) {
    // Note [Out of memory]: the run's peak so far (the device's, since the set-up; at least
    // what this allocation would have made it), the budget, and what would fit in it.
    const int64_t peak = std::max<int64_t>(device.memory_stats().peak_bytes,
                                           e.live() + static_cast<int64_t>(e.requested()));
    throw e.followed_by(
        out_of_memory_advice(config, shard_ranks, peak, e.capacity(), e.live(), e.requested()));
  }
}

}  // namespace fsdp::runtime
