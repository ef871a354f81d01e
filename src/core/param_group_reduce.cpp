// The reduce-scatter side of a param group (ParamGroup in param_group.h): the copy-in, the
// collective on the RS stream, and what writes the grad shard after it, with HSDP's all-reduce
// and the optimizer in backward.
#include "core/fsdp_state.h"
#include "core/param_group.h"
#include "fsdp/error.h"

namespace fsdp::core {

void ParamGroup::reduce_scatter(RunContext& ctx, const std::vector<const void*>& srcs,
                                const std::vector<DType>& types) {
  const DType rt = owner_->mp.reduce_dtype;
  const int64_t n = layout_.shard_numel;
  const int world = layout_.world;
  const Stream rs_stream = ctx_->reduce_scatter_stream;

  // Note [One-rank reduce-scatter]: over one rank a lone grad that already is the copy-in's
  // output (no padding, a buffer of its own on compute) is the input itself. Its dtype may be
  // bf16 under an fp32 reduce: a one-rank reduction is the identity and bf16 widens to fp32
  // exactly, so what follows reads the same values without the copy-in's cast.
  const Tensor* lone = srcs.size() == 1 && grads_.size() == 1 ? &grads_[0] : nullptr;
  const bool one_rank = world == 1 && !mesh_->is_hsdp();
  const bool lone_is_input =
      one_rank && lone && lone->storage && lone->data == srcs[0] &&
      (lone->dtype == rt || (lone->dtype == DType::BF16 && rt == DType::F32)) &&
      lone->numel() == n && lone->storage->stream().id == ctx.compute.id;
  // Otherwise, where the reduce-scatter would only overwrite the fp32 grad shard with its
  // input, the copy-in writes the grad shard itself: no input buffer, no copy after it.
  if (one_rank && !lone_is_input && rt == DType::F32 && grad_shard_zero_ &&
      !ctx_->optimizer_in_backward && !custom_divide()) {
    copy_in_to_grad_shard(ctx, srcs, types);
    return;
  }
  ctx_->ring.reserve(*device_, ctx.compute, ctx_->events, index_,
                     static_cast<int>(owner_->groups.size()));
  void* rs_in = nullptr;
  DType in_type = rt;
  if (lone_is_input) {
    rs_in = lone->data;
    rs_in_owner_ = lone->storage;
    in_type = lone->dtype;
  } else {
    // Allocated on compute, where the copy-in writes it (FSDP2 #129721 does the same).
    rs_in = device_->alloc(static_cast<size_t>(n * world) * dtype_size(rt), ctx.compute,
                           MemTag::RsInput);
    device_->set_label(label_rs_copy_in_);
    device_->reduce_scatter_copy_in(ctx.compute, rs_in, rt, n, world, layout_.slices.data(),
                                    srcs.data(), types.data(), static_cast<int>(srcs.size()));
  }

  Event copied = ctx_->events.acquire();
  device_->record_event(copied, ctx.compute);
  device_->wait_event(rs_stream, copied);
  ctx_->events.release(copied);

  reduce_into_grad(rs_in, in_type, rs_stream);
  ctx_->log("reduce_scatter", label_, "post_backward");
}

void ParamGroup::copy_in_to_grad_shard(RunContext& ctx, const std::vector<const void*>& srcs,
                                       const std::vector<DType>& types) {
  const int64_t n = layout_.shard_numel;
  float* grad = ensure_grad_shard(ctx.compute);
  device_->set_label(label_rs_copy_in_);
  device_->reduce_scatter_copy_in(ctx.compute, grad, DType::F32, n, 1, layout_.slices.data(),
                                  srcs.data(), types.data(), static_cast<int>(srcs.size()));
  grad_shard_zero_ = false;
  const Stream rs_stream = ctx_->reduce_scatter_stream;
  Event copied = ctx_->events.acquire();
  device_->record_event(copied, ctx.compute);
  device_->wait_event(rs_stream, copied);
  ctx_->events.release(copied);
  // In place over one rank: counted like every reduce-scatter, and launches nothing.
  device_->set_label(label_rs_);
  ctx_->reduce_scatter_comm(*mesh_).reduce_scatter(grad, grad, n, DType::F32, ReduceOp::Avg,
                                                   rs_stream);
  if (ctx_->grad_shard_ready) {  // Note [Early grad norm]
    ctx_->grad_shard_ready(rs_stream, ordinal_, grad, n);
    ctx_->rs_work_after_ring = true;
  }
  ctx_->log("reduce_scatter", label_, "post_backward");
}

bool ParamGroup::custom_divide() const {
  // Note [Gradient divide factor]
  const std::optional<double> factor = owner_->gradient_divide_factor;
  return factor && *factor != static_cast<double>(mesh_->data_parallel_size());
}

void ParamGroup::reduce_into_grad(void* rs_in, DType rt, Stream rs_stream) {
  if (mesh_->is_hsdp()) {
    all_reduce_into_grad(rs_in, rs_stream);
    return;
  }
  const int64_t n = layout_.shard_numel;
  Comm& comm = ctx_->reduce_scatter_comm(*mesh_);
  // Note [Gradient divide factor]: the RS averages over the mesh unless the module asked for
  // another divisor; then it sums and the result is scaled by 1 / factor on the way out.
  const bool custom = custom_divide();
  const ReduceOp op = custom ? ReduceOp::Sum : ReduceOp::Avg;
  const float scale = custom ? static_cast<float>(1.0 / *owner_->gradient_divide_factor) : 1.0f;
  auto push_ring_entry = [&] {
    Event done = ctx_->events.acquire();
    device_->record_event(done, rs_stream);
    ctx_->ring.push({rs_in, done, index_, std::move(rs_in_owner_)});
    ctx_->rs_work_after_ring = false;
  };
  // Note [One-rank reduce-scatter]: over one rank the reduce-scatter is the identity, so it
  // runs in place and its output is rs_in itself: no output buffer and no copy. The ring then
  // takes rs_in back after the work that reads the output; otherwise right after the
  // collective, as reclaiming rs_in needs nothing more. And where the group's lone grad can be
  // rs_in itself there is no copy-in either (reduce_scatter): the ring then holds the grad.
  const bool in_place = comm.size() == 1;
  auto reduce = [&]() -> void* {
    device_->set_label(label_rs_);
    void* out = in_place ? rs_in
                         : device_->alloc(static_cast<size_t>(n) * dtype_size(rt), rs_stream,
                                          MemTag::RsOutput);
    comm.reduce_scatter(rs_in, out, n, rt, op, rs_stream);
    if (!in_place) push_ring_entry();
    return out;
  };
  auto release = [&](void* out) {  // after the last read of reduce()'s output
    if (in_place) {
      push_ring_entry();
      return;
    }
    device_->free(out, rs_stream);
    ctx_->rs_work_after_ring = true;
  };
  // dst (fp32) gets (overwrite) or adds (!overwrite) the reduced grad shard.
  auto reduce_to = [&](float* dst, bool overwrite) {
    if (overwrite && !custom && rt == DType::F32) {
      device_->set_label(label_rs_);
      comm.reduce_scatter(rs_in, dst, n, rt, op, rs_stream);
      push_ring_entry();
      return;
    }
    void* out = reduce();
    device_->set_label(label_rs_accumulate_);
    if (overwrite && !custom) {
      device_->cast(rs_stream, dst, DType::F32, out, rt, n);
    } else {
      if (overwrite) device_->fill(rs_stream, dst, DType::F32, n, 0.0f);
      device_->accumulate(rs_stream, dst, out, rt, n, scale);
    }
    release(out);
  };

  if (ctx_->optimizer_in_backward) {
    // Note [Optimizer in backward]: the grad is consumed at once on the same stream. An
    // average's output is the grad as is, read by the optimizer in the reduce dtype.
    if (!custom) {
      void* grad = reduce();
      device_->set_label(label_optimizer_);
      ctx_->optimizer_in_backward(rs_stream, ordinal_, shard_param_, grad, rt, n);
      release(grad);
      return;
    }
    float* grad = static_cast<float*>(
        device_->alloc(static_cast<size_t>(n) * sizeof(float), rs_stream, MemTag::RsOutput));
    reduce_to(grad, true);
    device_->set_label(label_optimizer_);
    ctx_->optimizer_in_backward(rs_stream, ordinal_, shard_param_, grad, DType::F32, n);
    device_->free(grad, rs_stream);
    ctx_->rs_work_after_ring = true;
    return;
  }
  ensure_grad_shard(rs_stream);
  // Note [Lazy zero grad]: the first reduce-scatter after zero_grad writes the grad shard
  // itself: no zero fill, no accumulation pass (and, in fp32, no RS output buffer).
  reduce_to(shard_grad_, grad_shard_zero_);
  grad_shard_zero_ = false;
  if (ctx_->grad_shard_ready) {  // Note [Early grad norm]
    ctx_->grad_shard_ready(rs_stream, ordinal_, shard_grad_, n);
    ctx_->rs_work_after_ring = true;  // the optimizer reads what it wrote after the drain
  }
}

// Note [HSDP schedule]
// On a 2-D mesh each group's grad takes two collectives. On the RS stream: the reduce-scatter
// within the shard group into an RS output (the ring's entry is recorded right after it, so
// the ring's bound k is the same as without replicas), plus the partial sum of earlier
// backwards that skipped the all-reduce. Then the all-reduce stream waits for an event
// recorded there, all-reduces the RS output across the replicate group in place, and writes
// it into the grad shard (or runs the optimizer in backward) on the same stream; the RS
// output is freed there. The root's finalize joins the all-reduce stream before the optimizer
// reads the grad shards. Both collectives average (Avg over S, then over R: the mean over all
// R x S ranks) unless a divide factor other than R x S is set; then both sum and the write
// scales by 1 / factor. With set_requires_all_reduce(false) the RS output is summed into
// partial_reduce_ on the RS stream instead and nothing else happens (FSDP2's semantics).
void ParamGroup::all_reduce_into_grad(void* rs_in, Stream rs_stream) {
  const DType rt = owner_->mp.reduce_dtype;
  const int64_t n = layout_.shard_numel;
  const size_t bytes = static_cast<size_t>(n) * dtype_size(rt);
  Comm& comm = ctx_->reduce_scatter_comm(*mesh_);
  const bool custom = custom_divide();
  const ReduceOp op = custom ? ReduceOp::Sum : ReduceOp::Avg;
  const float scale = custom ? static_cast<float>(1.0 / *owner_->gradient_divide_factor) : 1.0f;

  void* out = device_->alloc(bytes, rs_stream, MemTag::RsOutput);
  device_->set_label(label_rs_);
  comm.reduce_scatter(rs_in, out, n, rt, op, rs_stream);
  Event rs_done = ctx_->events.acquire();
  device_->record_event(rs_done, rs_stream);
  ctx_->ring.push({rs_in, rs_done, index_});
  ctx_->rs_work_after_ring = false;
  if (!owner_->requires_all_reduce) {
    if (!partial_reduce_) {
      partial_reduce_ = out;
      return;
    }
    device_->set_label(label_rs_accumulate_);
    device_->add(rs_stream, partial_reduce_, partial_reduce_, out, rt, n);
    device_->free(out, rs_stream);
    ctx_->rs_work_after_ring = true;
    return;
  }
  if (partial_reduce_) {
    device_->set_label(label_rs_accumulate_);
    device_->add(rs_stream, out, out, partial_reduce_, rt, n);
    device_->free(partial_reduce_, rs_stream);
    partial_reduce_ = nullptr;
    ctx_->rs_work_after_ring = true;
  }
  const Stream ar_stream = ctx_->all_reduce_stream;
  const Event reduced = ctx_->events.acquire();
  device_->record_event(reduced, rs_stream);
  device_->wait_event(ar_stream, reduced);
  ctx_->events.release(reduced);
  device_->set_label(label_ar_);
  mesh_->replicate_comm()->all_reduce(out, out, n, rt, op, ar_stream);
  ctx_->all_reduce_pending = true;
  // out (fp32) gets (overwrite) or adds (!overwrite) the all-reduced grad shard.
  auto write_to = [&](float* dst, bool overwrite) {
    device_->set_label(label_rs_accumulate_);
    if (overwrite && !custom) {
      device_->cast(ar_stream, dst, DType::F32, out, rt, n);
    } else {
      if (overwrite) device_->fill(ar_stream, dst, DType::F32, n, 0.0f);
      device_->accumulate(ar_stream, dst, out, rt, n, scale);
    }
  };
  if (ctx_->optimizer_in_backward) {
    // Note [Optimizer in backward], on the stream where the grad is final.
    float* grad = static_cast<float*>(
        device_->alloc(static_cast<size_t>(n) * sizeof(float), ar_stream, MemTag::RsOutput));
    write_to(grad, true);
    device_->set_label(label_optimizer_);
    ctx_->optimizer_in_backward(ar_stream, ordinal_, shard_param_, grad, DType::F32, n);
    device_->free(grad, ar_stream);
  } else {
    ensure_grad_shard(ar_stream);
    write_to(shard_grad_, grad_shard_zero_);  // Note [Lazy zero grad]
    grad_shard_zero_ = false;
    // Note [Early grad norm]; finalize waits for the all-reduce stream (all_reduce_pending).
    if (ctx_->grad_shard_ready) ctx_->grad_shard_ready(ar_stream, ordinal_, shard_grad_, n);
  }
  device_->free(out, ar_stream);
}

}  // namespace fsdp::core
