#include "runtime/trainer.h"

#include <chrono>

#include "checkpoint/trainer_checkpoint.h"
#include "core/fsdp_state.h"
#include "fsdp/error.h"
#include "runtime/trace_metrics.h"

namespace fsdp::runtime {

namespace {

double now_ms() {
  using namespace std::chrono;
  return duration<double, std::milli>(steady_clock::now().time_since_epoch()).count();
}

// Inputs and labels of one micro-batch on the device.
struct DeviceBatch {
  Tensor x;
  Tensor labels;
};

DeviceBatch make_device_batch(Device& d, Stream s, const nn::ModelConfig& model, uint64_t seed,
                              int step, int64_t first_row, int64_t rows, DType t) {
  DeviceBatch out;
  out.x = empty_tensor(d, s, t, rows, model.dim, MemTag::Activation);
  d.set_label("data");
  d.synthetic_batch(s, out.x.data, t, rows, model.dim, seed, step, first_row, nn::kDataBound);
  const std::vector<int32_t> labels = nn::make_labels(model, seed, step, first_row, rows);
  if (!labels.empty()) {
    out.labels = empty_tensor(d, s, DType::F32, rows, 1, MemTag::Activation);  // int32 storage
    d.copy_from_host(s, out.labels.data, labels.data(), labels.size() * sizeof(int32_t));
  }
  return out;
}

// Loss of y and its gradient; the loss lands in `loss` (device fp32).
Tensor loss_and_grad(Device& d, Stream s, const nn::Model& model, const Tensor& y,
                     const DeviceBatch& batch, float* loss) {
  Tensor dy = empty_tensor(d, s, y.dtype, y.rows, y.cols, MemTag::Activation);
  d.set_label("loss");
  if (model.uses_cross_entropy())
    d.cross_entropy_loss(s, y.data, y.dtype, batch.labels.as<int32_t>(), y.rows, y.cols, loss,
                         dy.data);
  else
    d.mean_square_loss(s, y.data, y.dtype, y.numel(), loss, dy.data);
  return dy;
}

int64_t count_units(nn::Model& model) {
  int64_t n = 0;
  model.visit([&](Module& m) { n += core::state_of(m) != nullptr; });
  return n;
}

}  // namespace

RankResult train_rank(Device& device, std::shared_ptr<Comm> world, const TrainConfig& config,
                      const std::function<void(const StepReport&)>& on_step) {
  FSDP_CHECK(config.steps >= 1, "--steps must be >= 1, got ", config.steps);
  FSDP_CHECK(config.tokens >= 1, "--tokens must be >= 1, got ", config.tokens);
  FSDP_CHECK(config.micro_batches >= 1, "micro-batches must be >= 1");
  const int rank = world->rank();
  RankResult result;
  result.rank = rank;
  const Stream compute = device.create_stream("compute", StreamPriority::Normal);
  RunContext ctx{&device, compute, config.param_dtype};

  nn::Model model(config.model);
  result.param_count = model.param_count();
  Mesh mesh("dp", device, world);
  std::unique_ptr<Mesh> expert_mesh;
  FullyShardOptions options;
  options.reshard_after_forward = config.reshard_after_forward;
  options.mp_policy = {config.param_dtype, config.reduce_dtype};
  if (config.model.kind == "moe" && config.experts_on_own_mesh) {
    expert_mesh = std::make_unique<Mesh>("experts", device, world->split(0, rank, "experts"));
    Mesh* em = expert_mesh.get();
    options.shard_placement_fn = [em](const Module& owner, const Param&) -> Mesh* {
      return nn::MoeBlock::is_expert_param(owner) ? em : nullptr;
    };
  }
  for (Module* block : model.blocks()) fully_shard(*block, mesh, options);
  FullyShardOptions root_options = options;
  root_options.reshard_after_forward.reset();  // FSDP2's default: the root stays unsharded
  FsdpModule& root = fully_shard(model, mesh, root_options);
  root.set_reduce_scatter_max_input_buffers(config.rs_max_input_buffers);
  root.set_separate_reduce_scatter_group(config.separate_rs_group);
  root.set_rs_reclaim_policy_for_testing(config.rs_policy);
  if (rank == 0 && config.event_log) root.set_event_log(config.event_log);
  if (config.customize) config.customize(model, root);

  std::vector<optim::ParamSpan> spans;
  for (const ShardedGroupView& g : sharded_groups(root, !config.optimizer_in_backward))
    spans.push_back({g.param, g.grad, g.numel});
  optim::Optimizer optimizer(device, compute, spans, config.optimizer);
  if (config.optimizer_in_backward)
    root.set_optimizer_in_backward(
        [&optimizer](Stream s, int ordinal, float*, const float* grad, int64_t) {
          optimizer.step_one(s, ordinal, grad);
        });
  result.sharded_state_bytes = device.memory_stats().tag_bytes[static_cast<int>(MemTag::ShardedState)];
  float* loss = static_cast<float*>(device.alloc(sizeof(float), compute, MemTag::Other));
  float* loss_avg = static_cast<float*>(device.alloc(sizeof(float), compute, MemTag::Other));
  device.synchronize();
  device.reset_peak_memory();
  const int64_t units = count_units(model);

  auto issued = [&](CollectiveKind k) {
    int64_t n = world->issued(k);
    if (expert_mesh) n += expert_mesh->comm().issued(k);
    n += core::state_of(model)->ctx ? core::state_of(model)->ctx->separate_comm_issued(k) : 0;
    return n;
  };

  // ---- checkpoints: load before the first step (Note [Checkpoint hooks])
  checkpoint::TrainerCheckpoint ckpt(
      config.checkpoint,
      {config.model, config.param_dtype, config.reduce_dtype, config.optimizer.kind,
       world->size(), config.tokens, config.seed, config.micro_batches},
      device, compute, root, optimizer);
  const int first_step = ckpt.start(config.steps);

  double host_us_total = 0;
  int host_steps = 0;
  for (int step = first_step; step < config.steps; ++step) {
    if (config.timeline && step == config.warmup) device.enable_timeline(true);
    const double t0 = now_ms();
    double host_us = 0;
    float loss_sum = 0;
    for (int mb = 0; mb < config.micro_batches; ++mb) {
      root.set_requires_gradient_sync(mb == config.micro_batches - 1);
      const int data_step = step * config.micro_batches + mb;
      DeviceBatch batch = make_device_batch(device, compute, config.model, config.seed, data_step,
                                            rank * config.tokens, config.tokens, config.param_dtype);
      const int64_t ag0 = issued(CollectiveKind::AllGather);
      const double h0 = device.now_us();
      Tensor y = model.forward(ctx, batch.x);
      host_us += device.now_us() - h0;
      const int64_t ag1 = issued(CollectiveKind::AllGather);
      const int64_t rs1 = issued(CollectiveKind::ReduceScatter);
      Tensor dy = loss_and_grad(device, compute, model, y, batch, loss);
      y = Tensor{};
      const double h1 = device.now_us();
      model.backward(ctx, dy, /*input_grad=*/false);  // the data needs no gradient
      host_us += device.now_us() - h1;
      if (step == 0 && mb == 0) {
        result.all_gathers_forward_first_step = ag1 - ag0;
        result.all_gathers_backward_first_step = issued(CollectiveKind::AllGather) - ag1;
        result.reduce_scatters_first_step = issued(CollectiveKind::ReduceScatter) - rs1;
      }
      device.set_label("loss all-reduce");
      world->all_reduce(loss, loss_avg, 1, DType::F32, ReduceOp::Avg, compute);
      float value = 0;
      device.copy_to_host(compute, &value, loss_avg, sizeof(float));
      device.synchronize_stream(compute);
      loss_sum += value;
    }
    if (!config.optimizer_in_backward) {
      optimizer.step(compute);
      zero_sharded_grads(root);
    }
    // Clears the loss for the next step; on a timeline it marks where this step ends.
    device.set_label(kStepEndLabel);
    device.fill(compute, loss, DType::F32, 1, 0.0f);
    if (config.prefetch_next_step && step + 1 < config.steps) {
      fsdp_module_of(*model.blocks().front())->unshard(/*async_op=*/true);
      // Compute has joined the RS stream (finalize); the all-gather runs on past the step.
      device.synchronize_stream(compute);
    } else {
      device.synchronize();
    }
    const double ms = now_ms() - t0;
    if (step >= config.warmup) {
      host_us_total += host_us;
      ++host_steps;
    }
    StepReport report{step, loss_sum / config.micro_batches, ms};
    if (config.timeline && step >= config.warmup) {
      // Taken every step: the step's own metrics for the per-step line, and the CUDA
      // recorder's event pool stays small.
      Timeline part = device.take_timeline();
      const TimelineMetrics m = compute_metrics(part, compute.id, 1, 0);
      report.exposed_comm_ms = m.exposed_comm_ms;
      report.rs_recycle_stall_ms = m.rs_recycle_stall_ms;
      if (result.timeline.stream_names.empty()) result.timeline.stream_names = part.stream_names;
      for (auto& op : part.ops) result.timeline.ops.push_back(std::move(op));
      for (auto& sample : part.memory) result.timeline.memory.push_back(sample);
    }
    result.losses.push_back(report.loss);
    result.step_ms.push_back(ms);
    ckpt.after_step(step + 1, config.steps, nlohmann::json::object());  // saves when due
    if (on_step) on_step(report);
  }
  ckpt.finish();  // the last save is on disk
  result.host_schedule_us_per_unit = host_steps ? host_us_total / host_steps / std::max<int64_t>(units, 1) : 0;
  if (config.timeline) device.enable_timeline(false);
  result.memory = device.memory_stats();
  if (config.collect_params) result.params = gather_full_params(root, compute);
  device.free(loss, compute);
  device.free(loss_avg, compute);
  device.synchronize();
  return result;
}

RankResult train_local_reference(Device& device, const TrainConfig& config, int world_size) {
  FSDP_CHECK(config.param_dtype == DType::F32, "the local reference runs in fp32 only");
  RankResult result;
  const Stream compute = device.create_stream("compute", StreamPriority::Normal);
  RunContext ctx{&device, compute, DType::F32};
  nn::Model model(config.model);
  std::vector<optim::ParamSpan> spans;
  std::vector<Tensor> grads;
  for (Param* p : model.all_params()) {
    p->value = empty_tensor(device, compute, DType::F32, p->rows(), p->cols(), MemTag::ShardedState);
    device.copy_from_host(compute, p->value.data, p->init_values().data(), p->numel() * sizeof(float));
    grads.push_back(empty_tensor(device, compute, DType::F32, p->rows(), p->cols(), MemTag::ShardedState));
    device.fill(compute, grads.back().data, DType::F32, p->numel(), 0.0f);
    float* g = grads.back().as<float>();
    p->grad_sink = [g](RunContext& c, Param& param, Tensor t) {
      c.device->accumulate(c.compute, g, t.data, t.dtype, param.numel(), 1.0f);
    };
    spans.push_back({p->value.as<float>(), g, p->numel()});
  }
  optim::Optimizer optimizer(device, compute, spans, config.optimizer);
  float* loss = static_cast<float*>(device.alloc(sizeof(float), compute, MemTag::Other));
  const int64_t rows = config.tokens * world_size;
  for (int step = 0; step < config.steps; ++step) {
    float loss_sum = 0;
    for (int mb = 0; mb < config.micro_batches; ++mb) {
      DeviceBatch batch = make_device_batch(device, compute, config.model, config.seed,
                                            step * config.micro_batches + mb, 0, rows, DType::F32);
      Tensor y = model.forward(ctx, batch.x);
      Tensor dy = loss_and_grad(device, compute, model, y, batch, loss);
      // Each rank's loss is a mean over its own rows, and FSDP averages the ranks: the same
      // as the mean over all rows.
      model.backward(ctx, dy, /*input_grad=*/false);  // the data needs no gradient
      float value = 0;
      device.copy_to_host(compute, &value, loss, sizeof(float));
      device.synchronize_stream(compute);
      loss_sum += value;
    }
    optimizer.step(compute);
    optimizer.zero_grad(compute);
    device.synchronize();
    result.losses.push_back(loss_sum / config.micro_batches);
  }
  for (Param* p : model.all_params()) {
    std::vector<float> v(static_cast<size_t>(p->numel()));
    device.copy_to_host(compute, v.data(), p->value.data, v.size() * sizeof(float));
    result.params.push_back(std::move(v));
  }
  device.synchronize();
  for (Param* p : model.all_params()) p->value = Tensor{};
  grads.clear();
  device.free(loss, compute);
  result.memory = device.memory_stats();
  return result;
}

}  // namespace fsdp::runtime
