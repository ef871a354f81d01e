#include "core/param_group.h"

#include <algorithm>

#include "core/fsdp_state.h"
#include "fsdp/error.h"

namespace fsdp::core {

namespace {
std::vector<std::vector<int64_t>> shapes_of(const std::vector<Param*>& params) {
  std::vector<std::vector<int64_t>> shapes;
  for (const Param* p : params) shapes.push_back(p->shape());
  return shapes;
}
}  // namespace

ParamGroup::ParamGroup(FsdpState& state, Mesh& mesh, std::vector<Param*> params, int index,
                       Stream init_stream)
    : owner_(&state),
      mesh_(&mesh),
      device_(&mesh.device()),
      params_(std::move(params)),
      index_(index),
      layout_(make_group_layout(shapes_of(params_), mesh.size())) {
  for (const Param* p : params_) full_numel_ += p->numel();
  const size_t bytes = static_cast<size_t>(layout_.shard_numel) * sizeof(float);
  shard_param_ = static_cast<float*>(device_->alloc(bytes, init_stream, MemTag::ShardedState));
  if (device_->computes_values()) {
    std::vector<const std::vector<float>*> values;
    for (const Param* p : params_) {
      FSDP_CHECK(static_cast<int64_t>(p->init_values().size()) == p->numel(), "param '",
                 p->name(), "' of module '", state.module.fqn(), "' has ",
                 p->init_values().size(), " initial values but its shape holds ", p->numel(),
                 " (already sharded by another fully_shard call?)");
      values.push_back(&p->init_values());
    }
    const std::vector<float> shard = shard_of(layout_, mesh.rank(), values);
    device_->copy_from_host(init_stream, shard_param_, shard.data(), bytes);
  } else {
    // A simulated device (Device::computes_values): the shard's cost, none of its values.
    device_->fill(init_stream, shard_param_, DType::F32, layout_.shard_numel, 0.0f);
  }
  grads_.resize(params_.size());
  uses_seen_.assign(params_.size(), 0);
  setup_fp8();
  all_gather_done_ = device_->create_event();
  post_forward_ready_ = device_->create_event();
}

ParamGroup::~ParamGroup() {
  synchronize_in_destructor(*device_);
  // Frees go on the stream the context would use; any stream is fine after synchronize().
  const Stream s = ctx_ ? ctx_->all_gather_stream : Stream{0};
  if (gathered_) device_->free(gathered_, s);
  for (void* p : copied_out_) device_->free(p, s);
  if (unsharded_accum_) device_->free(unsharded_accum_, s);
  if (post_forward_) device_->free(post_forward_, s);
  if (fp8_scale_inv_) device_->free(fp8_scale_inv_, s);
  if (partial_reduce_) device_->free(partial_reduce_, s);
  grads_.clear();
  device_->free(shard_param_, s);
  if (shard_grad_) device_->free(shard_grad_, s);
  device_->destroy_event(all_gather_done_);
  device_->destroy_event(post_forward_ready_);
}

int ParamGroup::post_forward_size() const {
  return owner_->effective_reshard_after_forward() ? owner_->post_forward_size(*mesh_) : 0;
}

bool ParamGroup::update_pending() const {
  return ctx_->optimizer_in_forward && ctx_->optimizer_in_forward->pending(ordinal_);
}

float* ParamGroup::ensure_grad_shard(Stream s) {
  if (!shard_grad_) {
    shard_grad_ = static_cast<float*>(device_->alloc(
        static_cast<size_t>(layout_.shard_numel) * sizeof(float), s, MemTag::ShardedState));
    grad_shard_zero_ = true;
  }
  return shard_grad_;
}

void ParamGroup::release_grad_shard(Stream s) {
  if (shard_grad_) device_->free(shard_grad_, s);
  shard_grad_ = nullptr;
  grad_shard_zero_ = true;
}

void ParamGroup::lazy_init(std::shared_ptr<CommContext> context, const std::string& label,
                           int ordinal) {
  ctx_ = std::move(context);
  CommContext& ctx = *ctx_;
  label_ = label;
  ordinal_ = ordinal;
  label_optimizer_ = ctx.intern("optimizer " + label);
  label_ag_copy_in_ = ctx.intern("AG copy-in " + label);
  label_ag_ = ctx.intern("AG " + label);
  label_copy_out_ = ctx.intern("AG copy-out " + label);
  label_rs_copy_in_ = ctx.intern("RS copy-in " + label);
  label_rs_ = ctx.intern("RS " + label);
  label_rs_accumulate_ = ctx.intern("RS accumulate " + label);
  label_ar_ = ctx.intern("AR " + label);
  label_post_forward_ = ctx.intern("post-forward shard " + label);
}

void ParamGroup::unshard() {
  if (state_ == Gathering || state_ == Unsharded) return;
  const DType t = owner_->mp.param_dtype;
  const Stream s = ctx_->all_gather_stream;
  const int64_t n = fp8_count_ > 0 ? fp8_chunk_units_ : layout_.shard_numel;
  gathered_ = device_->alloc(static_cast<size_t>(n * layout_.world) * dtype_size(t), s,
                             MemTag::AllGather);
  if (fp8_count_ > 0) {
    // Note [Float8 all-gather]: refused with a post-forward mesh and the optimizer in forward.
    FSDP_CHECK(state_ == Sharded && !update_pending(), "group ", label_,
               ": a float8 all-gather gathers from the fp32 shards only");
    char* slot = static_cast<char*>(gathered_) + static_cast<size_t>(n * mesh_->rank()) * dtype_size(t);
    // Note [Optimizer offload hooks]: the shard is the host step's upload.
    if (ctx_->offload_hooks.before_all_gather) ctx_->offload_hooks.before_all_gather(s, ordinal_);
    if (fp8_amax_on_gather()) compute_fp8_amax(s);
    device_->set_label(label_ag_copy_in_);
    fp8_copy_in(s, slot);
    device_->set_label(label_ag_);
    mesh_->comm().all_gather(slot, gathered_, n, t, s);
  } else if (state_ == ShardedPostForward) {
    // Note [Post-forward mesh]: the N ranks of the small group hold the whole buffer.
    // (Its shard came from a forward all-gather, which ran any pending update first.)
    FSDP_CHECK(!update_pending(), "group ", label_, ": an update is pending over a post-forward shard");
    Comm& small = ctx_->post_forward_comm(*mesh_, post_forward_world_);
    const int64_t chunk = n * (layout_.world / post_forward_world_);
    device_->wait_event(s, post_forward_ready_);
    device_->set_label(label_ag_);
    small.all_gather(post_forward_, gathered_, chunk, t, s);
    device_->free(post_forward_, s);  // stream-ordered: after the all-gather read it
    post_forward_ = nullptr;
  } else {
    // The AG input is this rank's slot of the output: the copy-in casts straight into it, or
    // a pending update writes it (Note [Optimizer in forward]).
    void* slot = static_cast<char*>(gathered_) + static_cast<size_t>(n * mesh_->rank()) * dtype_size(t);
    if (update_pending()) {
      device_->set_label(label_optimizer_);
      ctx_->optimizer_in_forward->run(s, ordinal_, slot, t);
    } else {
      // Note [Optimizer offload hooks]: the shard is the host step's upload.
      if (ctx_->offload_hooks.before_all_gather) ctx_->offload_hooks.before_all_gather(s, ordinal_);
      device_->set_label(label_ag_copy_in_);
      device_->cast(s, slot, t, shard_param_, DType::F32, n);
    }
    device_->set_label(label_ag_);
    mesh_->comm().all_gather(slot, gathered_, n, t, s);
  }
  device_->record_event(all_gather_done_, s);
  state_ = Gathering;
}

void ParamGroup::wait_for_unshard(Stream compute) {
  if (state_ == Sharded || state_ == ShardedPostForward) unshard();
  if (state_ == Unsharded) return;
  device_->wait_event(compute, all_gather_done_);
  const DType t = owner_->mp.param_dtype;
  if (fp8_count_ > 0) {
    fp8_copy_out(compute);
  } else if (layout_.views_suffice) {
    for (size_t i = 0; i < params_.size(); ++i) {
      const ShardSlice& sl = layout_.slices[i];
      params_[i]->value = view_tensor(
          static_cast<char*>(gathered_) + static_cast<size_t>(sl.offset) * dtype_size(t), t,
          sl.rows, sl.cols);
    }
  } else {
    std::vector<void*> dsts;
    for (size_t i = 0; i < params_.size(); ++i) {
      const ShardSlice& sl = layout_.slices[i];
      void* dst = device_->alloc(static_cast<size_t>(sl.rows * sl.cols) * dtype_size(t), compute,
                                 MemTag::Unsharded);
      copied_out_.push_back(dst);
      dsts.push_back(dst);
      params_[i]->value = view_tensor(dst, t, sl.rows, sl.cols);
    }
    device_->set_label(label_copy_out_);
    device_->all_gather_copy_out(compute, gathered_, t, layout_.shard_numel, layout_.world,
                                 layout_.slices.data(), dsts.data(), static_cast<int>(dsts.size()));
    // The copy-out ran on compute, which already waited for the AG: free in stream order.
    // A forward that reshards to a smaller group cuts its post-forward shard from the AG
    // output, so that stays until the post-forward reshard.
    if (!(post_forward_size() > 0 && owner_->training_state == TrainingState::Forward)) {
      device_->free(gathered_, compute);
      gathered_ = nullptr;
    }
  }
  state_ = Unsharded;
}

void ParamGroup::reshard(Stream compute, bool post_forward) {
  if (state_ == Sharded) return;
  if (state_ == ShardedPostForward) {
    if (post_forward) return;
    device_->free(post_forward_, compute);  // a pending all-gather would have consumed it
    post_forward_ = nullptr;
    state_ = Sharded;
    return;
  }
  // A prefetched AG nobody waited for is still writing its buffer: wait before the free.
  if (state_ == Gathering) device_->wait_event(compute, all_gather_done_);
  const int small = post_forward && gathered_ ? post_forward_size() : 0;
  if (small > 0) {
    // Note [Post-forward mesh]: keep W / N rank slots of the AG output, the ones this rank
    // contributes to the small group's all-gather.
    const DType t = owner_->mp.param_dtype;
    const size_t chunk = static_cast<size_t>(layout_.shard_numel * (layout_.world / small)) * dtype_size(t);
    post_forward_ = device_->alloc(chunk, compute, MemTag::PostForward);
    device_->set_label(label_post_forward_);
    device_->copy(compute, post_forward_,
                  static_cast<char*>(gathered_) + chunk * static_cast<size_t>(mesh_->rank() % small),
                  chunk);
    device_->record_event(post_forward_ready_, compute);
    post_forward_world_ = small;
  }
  if (gathered_) device_->free(gathered_, compute);
  for (void* p : copied_out_) device_->free(p, compute);
  gathered_ = nullptr;
  copied_out_.clear();
  for (Param* p : params_) {
    p->value = Tensor{};
    p->fp8_value = nullptr;
    p->fp8_scale_inv = nullptr;
  }
  state_ = small > 0 ? ShardedPostForward : Sharded;
}

void ParamGroup::materialize_zero_grad(Stream compute) {
  // A micro-batch without gradient sync reduced nothing: the zeros wait for the last one,
  // whose reduce-scatter then writes the shard (and, freed, makes it: Note [Grads set to none]).
  if (!grad_shard_zero_ || ctx_->optimizer_in_backward || !owner_->requires_gradient_sync) return;
  ensure_grad_shard(compute);
  device_->fill(compute, shard_grad_, DType::F32, layout_.shard_numel, 0.0f);
  grad_shard_zero_ = false;
}

void ParamGroup::on_grad(RunContext& ctx, int param_index, Tensor grad) {
  Param& p = *params_[param_index];
  FSDP_CHECK(grad.numel() == p.numel(), "grad of '", p.name(), "' in ", label_, " has ",
             grad.numel(), " elements, the param has ", p.numel());
  FSDP_CHECK(!fired_, "a grad for '", p.name(), "' in ", label_,
             " arrived after its group was reduce-scattered in this backward");
  if (grads_[param_index].defined()) {
    // The param was used twice: sum the contributions.
    device_->add(ctx.compute, grads_[param_index].data, grads_[param_index].data, grad.data,
                 grad.dtype, grad.numel());
  } else {
    grads_[param_index] = std::move(grad);
    ++grads_received_;
  }
  // A param is complete once each of its uses has handed its grad (Note [Tied embeddings]);
  // the group reduce-scatters when every param is.
  if (++uses_seen_[param_index] == p.uses()) ++params_complete_;
  if (params_complete_ == static_cast<int>(params_.size())) post_backward(ctx);
}

void ParamGroup::accumulate_unsharded(RunContext& ctx) {
  if (!unsharded_accum_) {
    unsharded_accum_ = static_cast<float*>(device_->alloc(
        static_cast<size_t>(full_numel_) * sizeof(float), ctx.compute, MemTag::GradAccum));
    device_->fill(ctx.compute, unsharded_accum_, DType::F32, full_numel_, 0.0f);
  }
  int64_t offset = 0;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (grads_[i].defined())
      device_->accumulate(ctx.compute, unsharded_accum_ + offset, grads_[i].data, grads_[i].dtype,
                          params_[i]->numel(), 1.0f);
    offset += params_[i]->numel();
  }
}

void ParamGroup::release_grads() {
  for (Tensor& g : grads_) g = Tensor{};  // stream-ordered frees on compute
  grads_received_ = 0;
  std::fill(uses_seen_.begin(), uses_seen_.end(), 0);
  params_complete_ = 0;
}

void ParamGroup::post_backward(RunContext& ctx) {
  if (fired_) return;
  fired_ = true;
  ctx_->log("post_backward", label_, "post_backward");
  const bool any_grad = grads_received_ > 0 || unsharded_accum_ != nullptr;
  if (!owner_->requires_gradient_sync) {
    if (any_grad) accumulate_unsharded(ctx);
    release_grads();
  } else {
    // With no grad at all this rank still reduce-scatters (zeros): the other ranks may have
    // grads for the group (Note [Symmetric collectives]).
    std::vector<const void*> srcs(params_.size());
    std::vector<DType> types(params_.size());
    if (unsharded_accum_) {
      accumulate_unsharded(ctx);
      int64_t offset = 0;
      for (size_t i = 0; i < params_.size(); ++i) {
        srcs[i] = unsharded_accum_ + offset;
        types[i] = DType::F32;
        offset += params_[i]->numel();
      }
    } else {
      for (size_t i = 0; i < params_.size(); ++i) {
        if (!grads_[i].defined()) {  // an unused param reduces zeros, so every rank matches
          grads_[i] = empty_tensor(*device_, ctx.compute, owner_->mp.param_dtype,
                                   params_[i]->rows(), params_[i]->cols(), MemTag::Grad);
          device_->fill(ctx.compute, grads_[i].data, grads_[i].dtype, params_[i]->numel(), 0);
        }
        srcs[i] = grads_[i].data;
        types[i] = grads_[i].dtype;
      }
    }
    reduce_scatter(ctx, srcs, types);
    if (unsharded_accum_) {
      device_->free(unsharded_accum_, ctx.compute);  // the copy-in read it on compute
      unsharded_accum_ = nullptr;
    }
  }
  release_grads();
  if (owner_->reshard_after_backward) reshard(ctx.compute);
}

}  // namespace fsdp::core
