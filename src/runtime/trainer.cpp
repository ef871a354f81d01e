#include "runtime/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>

#include "checkpoint/trainer_checkpoint.h"
#include "core/fsdp_state.h"
#include "fsdp/collective_check.h"
#include "models/model_family.h"
#include "runtime/captured_step.h"
#include "fsdp/error.h"
#include "runtime/step_reader.h"
#include "runtime/trace_metrics.h"

namespace fsdp::runtime {

namespace {

double now_ms() {
  using namespace std::chrono;
  return duration<double, std::milli>(steady_clock::now().time_since_epoch()).count();
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

// Note [Captured steps]: what cannot be recorded into a graph fails here, in one line.
void check_capturable(const TrainConfig& c) {
  const std::string why = models::family(c.model.kind).capture_refusal(c.model);
  FSDP_USER_CHECK(why.empty(), why);
}

// Scales the loss gradient of one of `n` micro-batches by 1/n (TrainConfig::micro_batches);
// `scale` holds 1/n per row, made on first use.
void scale_for_micro_batches(Device& d, Stream s, Tensor& dy, int n, Tensor& scale) {
  if (n <= 1) return;
  if (!scale.defined() || scale.rows != dy.rows) {
    scale = empty_tensor(d, s, DType::F32, dy.rows, 1, MemTag::Other);
    d.fill(s, scale.data, DType::F32, dy.rows, 1.0f / static_cast<float>(n));
  }
  d.set_label("micro-batch loss scale");
  d.scale_rows(s, dy.data, dy.data, dy.dtype, scale.as<float>(), 1, dy.rows, dy.cols, false);
}

int64_t count_units(nn::Model& model) {
  int64_t n = 0;
  model.visit([&](Module& m) { n += core::state_of(m) != nullptr; });
  return n;
}

std::unique_ptr<BatchSource> make_source(const TrainConfig& c, int rank, int world) {
  if (c.batch_source) return c.batch_source(rank, world);
  return models::family(c.model.kind).batch_kind() == models::BatchKind::Tokens
             ? make_synthetic_tokens(c.model, c.seed)
             : make_synthetic_features(c.model, c.seed);
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
                          "; training stopped (try a lower --lr)");
  for (size_t i = 0; i < v.grad_squares.size(); ++i)
    if (!std::isfinite(v.grad_squares[i]))
      return detail::concat("step ", v.step + 1, ": the gradient of ",
                            names[i].empty() ? "the root" : names[i], " is not finite (norm ",
                            std::sqrt(v.grad_squares[i]), "); training stopped (try a lower --lr)");
  return {};
}

// Note [Evaluation]
// The validation loss is a forward pass per fixed batch, with no backward: FSDP gathers each
// unit and reshards it after forward as in training, and the next training step's root
// pre-forward starts a new step as usual. Each batch's loss is averaged over the ranks, then
// over the batches, on the device; the host waits once, for the mean.
// Note [Unreadable steps]: the inputs of step `step`, or its error naming the step.
DeviceBatch make_step_batch(BatchSource& source, int step, Device& device, Stream s, int64_t index,
                            int64_t first_row, int64_t rows, DType act_dtype) {
  try {
    return source.make(device, s, index, first_row, rows, act_dtype);
  } catch (const StepError&) {
    throw;
  } catch (const UserError& e) {
    throw StepError(step, detail::concat("step ", step + 1, ": ", e.what()));
  }
}

float evaluate(Device& device, Comm& world, RunContext& ctx, nn::Model& model,
               BatchSource& source, int64_t batches, int64_t first_row, int64_t rows,
               float* scratch, int step) {
  float* loss = scratch;
  float* loss_avg = scratch + 1;
  float* mean = scratch + 2;
  device.fill(ctx.compute, mean, DType::F32, 1, 0.0f);
  for (int64_t k = 0; k < batches; ++k) {
    DeviceBatch batch =
        make_step_batch(source, step, device, ctx.compute, k, first_row, rows, ctx.act_dtype);
    Tensor y = model.forward(ctx, batch.x);
    loss_and_grad(device, ctx.compute, model, y, batch, loss);
    device.set_label("eval loss all-reduce");
    world.all_reduce(loss, loss_avg, 1, DType::F32, ReduceOp::Avg, ctx.compute);
    device.accumulate(ctx.compute, mean, loss_avg, DType::F32, 1, 1.0f / static_cast<float>(batches));
  }
  float value = 0;
  device.copy_to_host(ctx.compute, &value, mean, sizeof(float));
  device.synchronize_stream(ctx.compute);
  return value;
}

float global_norm(const std::vector<float>& squares) {
  if (squares.empty()) return -1;
  double sum = 0;
  for (float s : squares) sum += s;
  return static_cast<float>(std::sqrt(sum));
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

RankResult train_rank(Device& device, std::shared_ptr<Comm> world, const TrainConfig& config,
                      const std::function<void(const StepReport&)>& on_step) {
  FSDP_USER_CHECK(config.steps >= 1, "--steps must be >= 1, got ", config.steps);
  FSDP_USER_CHECK(config.tokens >= 1, "--tokens must be >= 1, got ", config.tokens);
  FSDP_USER_CHECK(config.micro_batches >= 1, "--micro-batches must be >= 1, got ",
                  config.micro_batches);
  if (config.cuda_graph) check_capturable(config);
  FSDP_USER_CHECK(!(config.optimizer_in_backward && config.optimizer.max_grad_norm > 0),
                  "the optimizer in backward cannot clip gradients (clipping needs every "
                  "gradient before any step): turn clipping off or the optimizer in backward off");
  FSDP_USER_CHECK(!(config.optimizer_in_backward && config.optimizer_in_forward),
                  "the optimizer runs in backward or in forward, not both");
  // Note [Collective fingerprints]: every collective below, on `world` and on the
  // communicators split from it, is compared across ranks before it runs.
  if (config.check_collectives) world = with_collective_checks(std::move(world), device);
  const int rank = world->rank();
  RankResult result;
  result.rank = rank;
  const Stream compute = device.create_stream("compute", StreamPriority::Normal);
  RunContext ctx{&device, compute, config.param_dtype};

  // Expert parallelism (docs/moe.md): ep groups of consecutive ranks; the experts shard over
  // the efsdp mesh, the ranks with the same ep rank.
  nn::ModelConfig model_config = models::resolved(config.model);
  const models::ModelFamily& family = models::family(model_config.kind);
  const int ep = family.expert_parallel_size(model_config);
  FSDP_CHECK(ep >= 1 && world->size() % ep == 0, "--ep (", ep,
             ") must divide the number of data-parallel ranks (", world->size(), ")");
  model_config.ep_rank = rank % ep;
  model_config.moe_group_tokens = config.tokens;
  std::unique_ptr<Comm> ep_comm;
  if (ep > 1) ep_comm = world->split(rank / ep, rank, "ep");
  std::unique_ptr<nn::Model> built = models::build_model(model_config);
  nn::Model& model = *built;
  model.set_expert_comm(ep_comm.get());
  result.param_count = model.active_param_count();
  // HSDP (docs/hsdp.md): every mesh is replicate x shard, the same ranks in each role.
  const int replicas = config.hsdp_replicas;
  FSDP_USER_CHECK(replicas >= 0, "--hsdp must be >= 1, got ", replicas);
  FSDP_USER_CHECK(replicas == 0 || world->size() % replicas == 0, "--hsdp ", replicas,
                  " must divide the world size ", world->size());
  FSDP_USER_CHECK(replicas <= 1 || ep == 1, "--hsdp with --ep ", ep,
                  " is not supported yet: use one of the two");
  auto make_mesh = [&](const std::string& name, std::shared_ptr<Comm> one_d) {
    if (replicas == 0) return std::make_unique<Mesh>(name, device, std::move(one_d));
    return std::make_unique<Mesh>(make_hsdp_mesh(name, device, *world, replicas, world->size() / replicas));
  };
  std::unique_ptr<Mesh> dp_mesh = make_mesh("dp", world);
  FullyShardOptions options;
  options.reshard_after_forward = config.reshard_after_forward;
  if (config.reshard_after_forward_size > 0) options.reshard_after_forward = config.reshard_after_forward_size;
  options.mp_policy = {config.param_dtype, config.reduce_dtype};
  models::ParallelizeContext placement{device, *world, *dp_mesh, make_mesh, replicas != 0, options,
                                       config.experts_on_own_mesh, nullptr};
  FsdpModule& root = family.parallelize(model, placement);
  std::unique_ptr<Mesh> expert_mesh = std::move(placement.expert_mesh);
  root.set_reduce_scatter_max_input_buffers(config.rs_max_input_buffers);
  root.set_separate_reduce_scatter_group(config.separate_rs_group);
  root.set_rs_reclaim_policy_for_testing(config.rs_policy);
  if (rank == 0 && config.event_log) root.set_event_log(config.event_log);
  if (config.customize) config.customize(model, root);

  std::vector<optim::ParamSpan> spans;
  for (const ShardedGroupView& g : sharded_groups(root, !config.optimizer_in_backward))
    spans.push_back({g.param, g.grad, g.numel, g.mesh ? &g.mesh->comm() : nullptr, g.name});
  optim::Optimizer optimizer(device, compute, spans, config.optimizer);
  if (config.optimizer_in_backward)
    root.set_optimizer_in_backward(
        [&optimizer](Stream s, int ordinal, float*, const void* grad, DType t, int64_t) {
          optimizer.step_one(s, ordinal, grad, t);
        });
  if (config.optimizer_in_forward)
    root.set_optimizer_in_forward([&optimizer](Stream s, int ordinal, void* copy, DType t) {
      optimizer.step_deferred(s, ordinal, copy, t);  // Note [Optimizer in forward]
    });
  // Note [Early grad norm]; an after_backward hook may change grads the early sums have read.
  if (!config.optimizer_in_backward && !config.after_backward)
    root.set_on_grad_shard_ready([&optimizer](Stream s, int ordinal, const float* grad, int64_t) {
      optimizer.add_grad_square(s, ordinal, grad);  // Note [Early grad norm]
    });
  result.sharded_state_bytes = device.memory_stats().tag_bytes[static_cast<int>(MemTag::ShardedState)];
  std::unique_ptr<BatchSource> source = make_source(config, rank, world->size());
  std::unique_ptr<BatchSource> eval_source;
  if (config.eval_source && config.eval_every > 0 && config.eval_batches > 0)
    eval_source = config.eval_source(rank, world->size());
  std::map<int, float> val_by_step;
  const std::vector<std::string>& grad_names = optimizer.grad_square_names();
  // The MoE layers' max loads are read with the step's loss (Model::copy_expert_loads).
  const int moe_layers = model.moe_layer_count();
  StepReader reader(device, compute, static_cast<int>(grad_names.size()), moe_layers);
  float* loss = static_cast<float*>(device.alloc(sizeof(float), compute, MemTag::Other));
  float* loss_avg = static_cast<float*>(device.alloc(sizeof(float), compute, MemTag::Other));
  TrainState state{device, model, root, optimizer, compute, 0};
  // Checkpoints (Note [Checkpoint hooks]): --resume or --init-from loads here and a resume
  // moves the first step; the user's on_start sees the loaded state.
  std::unique_ptr<checkpoint::TrainerCheckpoint> ckpt;
  if (config.checkpoint.enabled()) {
    checkpoint::RunDescription run{config.model,   config.param_dtype,    config.reduce_dtype,
                                   config.optimizer.kind, world->size(),  config.tokens,
                                   config.seed,    config.micro_batches,  config.schedule,
                                   config.optimizer.base_lr(), config.data_name,
                                   family.shape_fields(config.model)};
    const checkpoint::ExpertLayout experts{ep, family.expert_modules()};
    ckpt = std::make_unique<checkpoint::TrainerCheckpoint>(config.checkpoint, run, device,
                                                           compute, root, optimizer, experts);
    state.next_step = ckpt->start(config.steps);
  }
  if (config.on_start) config.on_start(state);
  device.synchronize();
  device.reset_peak_memory();
  const int64_t units = count_units(model);

  // Every communicator the run uses, for the first step's counts.
  auto comms = [&] {
    std::vector<const Comm*> out{world.get()};
    for (Mesh* m : {dp_mesh.get(), expert_mesh.get()}) {
      if (!m) continue;
      if (&m->comm() != world.get()) out.push_back(&m->comm());
      if (m->replicate_comm()) out.push_back(m->replicate_comm());
    }
    if (ep_comm) out.push_back(ep_comm.get());
    if (core::state_of(model)->ctx)
      for (const Comm* c : core::state_of(model)->ctx->own_comms()) out.push_back(c);
    return out;
  };
  auto issued = [&](CollectiveKind k) {
    int64_t n = 0;
    for (const Comm* c : comms()) n += c->issued(k);
    return n;
  };
  auto by_comm = [&] {
    std::map<std::string, std::vector<int64_t>> out;
    for (const Comm* c : comms()) {
      std::vector<int64_t>& v = out[c->name()];
      v.resize(kCollectiveKindCount);
      for (int k = 0; k < kCollectiveKindCount; ++k) v[k] += c->issued(static_cast<CollectiveKind>(k));
    }
    return out;
  };
  auto minus = [](std::map<std::string, std::vector<int64_t>> a,
                  const std::map<std::string, std::vector<int64_t>>& b) {
    for (auto& [name, v] : a)
      if (auto it = b.find(name); it != b.end())
        for (size_t k = 0; k < v.size(); ++k) v[k] -= it->second[k];
    return a;
  };

  double host_us_total = 0;
  int host_steps = 0;
  std::map<int, StepReport> issued_steps;  // issued, not yet read
  double last_done_ms = now_ms();
  // Reads the oldest unread step: reports it, or stops the run if it was not finite.
  auto read_one = [&]() -> bool {
    const StepValues v = reader.pop();
    StepReport report = issued_steps.at(v.step);
    issued_steps.erase(v.step);
    const std::string bad = nonfinite_message(v, grad_names);
    if (!bad.empty()) {
      result.error = bad;
      result.failed_step = v.step;
      return false;
    }
    report.loss = v.loss;
    if (auto it = val_by_step.find(v.step); it != val_by_step.end()) {
      report.val_loss = it->second;
      result.val_losses.push_back({v.step, it->second});
    }
    report.grad_norm = global_norm(v.grad_squares);
    if (!v.extras.empty()) report.max_expert_load = *std::max_element(v.extras.begin(), v.extras.end());
    report.step_ms = v.done_ms - last_done_ms;
    last_done_ms = v.done_ms;
    result.losses.push_back(report.loss);
    result.lrs.push_back(report.lr);
    result.grad_norms.push_back(report.grad_norm);
    result.max_expert_loads.push_back(report.max_expert_load);
    result.step_ms.push_back(report.step_ms);
    result.peak_bytes_by_step.push_back(device.memory_stats().peak_bytes);
    if (ckpt) ckpt->state_changes();  // after the first step: every rank has loaded
    if (on_step) on_step(report);
    return true;
  };

  bool stopped = false;
  const float inv_micro = 1.0f / static_cast<float>(config.micro_batches);
  Tensor micro_scale;  // 1/micro_batches per row
  // Note [Captured steps]: a prefetch crosses the step boundary, which a graph cannot.
  const bool prefetch = config.prefetch_next_step && !config.cuda_graph;
  std::unique_ptr<CapturedStep> graph;
  if (config.cuda_graph) graph = std::make_unique<CapturedStep>(device, compute, config.micro_batches);
  const int capture_at = state.next_step + std::max(1, config.warmup);
  int deferred_groups = 0;  // updates an eager step leaves pending (Note [Optimizer in forward])
  double host_step_us_total = 0;
  int host_step_count = 0;
  // One whole step's device work: every micro-batch, the grad norm and the optimizer. Under a
  // graph it is recorded once, reading the fixed batches and adding the loss up in place.
  auto issue_step = [&](int step, float* step_loss, double& host_us,
                        const std::function<const DeviceBatch&(int)>& batch_of) {
    for (int mb = 0; mb < config.micro_batches; ++mb) {
      root.set_requires_gradient_sync(mb == config.micro_batches - 1);
      const DeviceBatch& batch = batch_of(mb);
      const bool first = step == state.next_step && mb == 0;
      const int64_t ag0 = issued(CollectiveKind::AllGather);
      std::map<std::string, std::vector<int64_t>> c0, c1;
      if (first) c0 = by_comm();
      const double h0 = device.now_us();
      Tensor y = model.forward(ctx, batch.x);
      host_us += device.now_us() - h0;
      const int64_t ag1 = issued(CollectiveKind::AllGather);
      const int64_t rs1 = issued(CollectiveKind::ReduceScatter);
      if (first) c1 = by_comm();
      Tensor dy = loss_and_grad(device, compute, model, y, batch, loss);
      model.add_aux_loss(device, compute, loss);  // Note [MoE routing]
      scale_for_micro_batches(device, compute, dy, config.micro_batches, micro_scale);
      y = Tensor{};
      const double h1 = device.now_us();
      model.backward(ctx, dy, /*input_grad=*/false);  // the data needs no gradient
      host_us += device.now_us() - h1;
      if (first) {
        result.forward_by_comm_first_step = minus(c1, c0);  // the forward made new comms
        result.backward_by_comm_first_step = minus(by_comm(), c1);
        result.all_gathers_forward_first_step = ag1 - ag0;
        result.all_gathers_backward_first_step = issued(CollectiveKind::AllGather) - ag1;
        result.reduce_scatters_first_step = issued(CollectiveKind::ReduceScatter) - rs1;
      }
      device.set_label("loss all-reduce");
      world->all_reduce(loss, loss_avg, 1, DType::F32, ReduceOp::Avg, compute);
      device.accumulate(compute, step_loss, loss_avg, DType::F32, 1, inv_micro);
    }
    if (config.after_backward) config.after_backward(state);
    if (!config.optimizer_in_backward) {
      optimizer.compute_grad_squares(compute);
      if (config.optimizer_in_forward) {  // Note [Optimizer in forward]
        optimizer.defer_step(compute);
        root.defer_shard_updates(compute);
      } else {
        optimizer.step(compute);
      }
      zero_sharded_grads(root);
    }
    // Clears the loss for the next step; on a timeline it marks where this step ends.
    device.set_label(kStepEndLabel);
    device.fill(compute, loss, DType::F32, 1, 0.0f);
  };
  for (int step = state.next_step; step < config.steps && !stopped; ++step) {
    if (config.timeline && step == config.warmup) device.enable_timeline(true);
    double host_us = 0;
    const double host_step_start = device.now_us();
    const double waited_before = device.host_wait_us();
    StepReport report{};
    report.step = step;
    report.lr = config.schedule.at(step, config.optimizer.base_lr());
    optimizer.begin_step(compute, report.lr);
    float* step_loss = reader.begin(step);
    auto make_batch = [&](int mb) {
      const int64_t index = static_cast<int64_t>(step) * config.micro_batches + mb;
      DeviceBatch batch = make_step_batch(*source, step, device, compute, index,
                                          rank * config.tokens, config.tokens, config.param_dtype);
      report.tokens += batch.tokens;
      return batch;
    };
    // Note [Optimizer in forward]: a captured step starts with every group's update pending,
    // as the step before its capture left them; after anything ran them early (evaluation, a
    // checkpoint, the after_step hook) one eager step restores that.
    const bool graph_ready = !config.optimizer_in_forward || root.pending_shard_updates() == deferred_groups;
    if (graph && step >= capture_at && graph_ready) {
      for (int mb = 0; mb < config.micro_batches; ++mb) graph->stage(mb, make_batch(mb));
      if (!graph->captured()) {
        graph->capture([&] {
          device.fill(compute, graph->step_loss(), DType::F32, 1, 0.0f);
          issue_step(step, graph->step_loss(), host_us,
                     [&](int mb) -> const DeviceBatch& { return graph->batch(mb); });
        });
        result.captured_step = step;
        result.graph_streams = graph->streams();
        result.graph_op_times = graph->op_times();
      }
      graph->replay();
      device.set_label(kStepEndLabel);
      device.copy(compute, step_loss, graph->step_loss(), sizeof(float));
    } else {
      DeviceBatch current;
      issue_step(step, step_loss, host_us, [&](int mb) -> const DeviceBatch& {
        current = make_batch(mb);
        return current;
      });
      deferred_groups = root.pending_shard_updates();
    }
    if (prefetch && step + 1 < config.steps)
      fsdp_module_of(*model.blocks().front())->unshard(/*async_op=*/true);
    if (moe_layers > 0) model.copy_expert_loads(device, compute, reader.extras());
    reader.end(config.optimizer_in_backward ? nullptr : optimizer.grad_squares());
    if (step >= config.warmup && step != result.captured_step) {
      // The host's own work: waits for the device (a staging slot, say) are left out.
      host_step_us_total +=
          device.now_us() - host_step_start - (device.host_wait_us() - waited_before);
      ++host_step_count;
    }
    state.next_step = step + 1;
    if (config.after_step) {
      root.apply_pending_shard_updates(compute);  // the hook may read the shards
      config.after_step(state);
    }
    if (eval_source && ((step + 1) % config.eval_every == 0 || step + 1 == config.steps)) {
      float* scratch = static_cast<float*>(device.alloc(3 * sizeof(float), compute, MemTag::Other));
      const double eval_start_ms = now_ms();
      val_by_step[step] = evaluate(device, *world, ctx, model, *eval_source, config.eval_batches,
                                   rank * config.tokens, config.tokens, scratch, step);
      device.free(scratch, compute);
      // The evaluation's time is nobody's step time.
      last_done_ms += now_ms() - eval_start_ms;
    }
    if (step >= config.warmup) {
      host_us_total += host_us;
      ++host_steps;
    }
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
    issued_steps[step] = report;
    // Note [Asynchronous step read]: the previous step is read once this one is issued (a
    // traced step was synchronized already, so it is read at once).
    const int keep = config.timeline ? 0 : 1;
    while (reader.pending() > keep && !stopped) stopped = !read_one();
    // A save due after this step reads every step first (the copy to host waits for the step
    // anyway), so that a checkpoint never holds the state of a step that was not finite.
    if (ckpt && !stopped && ckpt->due(step + 1, config.steps)) {
      while (reader.pending() > 0 && !stopped) stopped = !read_one();
      if (!stopped) ckpt->after_step(step + 1, config.steps, nlohmann::json::object());
    }
  }
  root.apply_pending_shard_updates(compute);  // the last step's (Note [Optimizer in forward])
  while (reader.pending() > 0 && !stopped) stopped = !read_one();
  while (reader.pending() > 0) reader.pop();  // drain what ran after a stop
  if (ckpt) ckpt->finish();  // the last save is on disk
  device.synchronize();
  result.host_us_per_step = host_step_count ? host_step_us_total / host_step_count : 0;
  result.backend_peak_bytes = device.backend_peak_bytes();
  result.backend_reserved_peak_bytes = device.backend_reserved_peak_bytes();
  graph.reset();
  micro_scale = Tensor{};
  result.host_schedule_us_per_unit = host_steps ? host_us_total / host_steps / std::max<int64_t>(units, 1) : 0;
  if (config.timeline) device.enable_timeline(false);
  result.memory = device.memory_stats();
  if (config.collect_params) {
    result.params = gather_full_params(root, compute);
    if (ep_comm) gather_every_expert(device, *ep_comm, compute, model, result.params);
  }
  device.free(loss, compute);
  device.free(loss_avg, compute);
  device.synchronize();
  if (!result.error.empty() && !config.return_on_nonfinite) throw UserError(result.error);
  return result;
}

RankResult train_local_reference(Device& device, const TrainConfig& config, int world_size) {
  FSDP_CHECK(config.param_dtype == DType::F32, "the local reference runs in fp32 only");
  RankResult result;
  const Stream compute = device.create_stream("compute", StreamPriority::Normal);
  RunContext ctx{&device, compute, DType::F32};
  nn::ModelConfig model_config = config.model;
  model_config.ep = 1;  // every expert here
  model_config.moe_group_tokens = config.tokens;  // route each rank's tokens as its own group
  std::unique_ptr<nn::Model> built = models::build_model(model_config);
  nn::Model& model = *built;
  std::vector<optim::ParamSpan> spans;
  std::vector<Tensor> grads;
  std::vector<std::string> names;  // fqns, in all_params() order
  model.visit([&](Module& m) {
    for (const auto& p : m.params()) names.push_back(m.fqn().empty() ? p->name() : m.fqn() + "." + p->name());
  });
  for (Param* p : model.all_params()) {
    p->value = empty_tensor(device, compute, DType::F32, p->rows(), p->cols(), MemTag::ShardedState);
    device.copy_from_host(compute, p->value.data, p->init_values().data(), p->numel() * sizeof(float));
    grads.push_back(empty_tensor(device, compute, DType::F32, p->rows(), p->cols(), MemTag::ShardedState));
    device.fill(compute, grads.back().data, DType::F32, p->numel(), 0.0f);
    float* g = grads.back().as<float>();
    p->grad_sink = [g](RunContext& c, Param& param, Tensor t) {
      c.device->accumulate(c.compute, g, t.data, t.dtype, param.numel(), 1.0f);
    };
    spans.push_back({p->value.as<float>(), g, p->numel(), nullptr, names[spans.size()]});
  }
  optim::Optimizer optimizer(device, compute, spans, config.optimizer);
  std::unique_ptr<BatchSource> source = make_source(config, 0, 1);
  float* loss = static_cast<float*>(device.alloc(sizeof(float), compute, MemTag::Other));
  const int64_t rows = config.tokens * world_size;
  Tensor micro_scale;
  for (int step = 0; step < config.steps; ++step) {
    optimizer.begin_step(compute, config.schedule.at(step, config.optimizer.base_lr()));
    float loss_sum = 0;
    for (int mb = 0; mb < config.micro_batches; ++mb) {
      DeviceBatch batch = source->make(device, compute,
                                       static_cast<int64_t>(step) * config.micro_batches + mb, 0,
                                       rows, DType::F32);
      Tensor y = model.forward(ctx, batch.x);
      Tensor dy = loss_and_grad(device, compute, model, y, batch, loss);
      model.add_aux_loss(device, compute, loss);  // Note [MoE routing]
      scale_for_micro_batches(device, compute, dy, config.micro_batches, micro_scale);
      // Each rank's loss is a mean over its own rows, and FSDP averages the ranks: the same
      // as the mean over all rows.
      model.backward(ctx, dy, /*input_grad=*/false);  // the data needs no gradient
      float value = 0;
      device.copy_to_host(compute, &value, loss, sizeof(float));
      device.synchronize_stream(compute);
      loss_sum += value;
    }
    optimizer.compute_grad_squares(compute);
    optimizer.step(compute);
    optimizer.zero_grad(compute);
    std::vector<float> squares(optimizer.grad_square_names().size());
    device.copy_to_host(compute, squares.data(), optimizer.grad_squares(), squares.size() * sizeof(float));
    device.synchronize();
    result.losses.push_back(loss_sum / config.micro_batches);
    result.grad_norms.push_back(global_norm(squares));
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
