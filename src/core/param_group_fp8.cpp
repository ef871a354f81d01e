// Note [Float8 all-gather]
// A param group holding tensorwise fp8 weights (Param::fp8, MixedPrecisionPolicy::
// fp8_all_gather) gathers them as E4M3, as torchao's float8 all-gather with FSDP2 does:
// - Once per root forward, before any of its all-gathers (FsdpState::root_pre_forward, or an
//   explicit unshard that comes first), every group writes each fp8 weight's amax over its
//   fp32 shard into its slot of its mesh's amax buffer, and each mesh all-reduces (max) its
//   buffer: one small all-reduce per mesh (torchao's precompute_float8_dynamic_scale_for_fsdp).
//   The mesh is the one the weights shard over: the shard group under HSDP (the replicas hold
//   the same values), the expert mesh for experts. The amaxes are then those of the whole
//   weights, on every rank.
// - The copy-in casts each shard to E4M3 with the scale of that global amax (Note [Fp8
//   scale] in fsdp/fp8.h), after rounding to the param dtype, so the codes are exactly those
//   that casting the gathered param-dtype weight would give; the other params (norms,
//   biases) are cast to the param dtype as before. A rank's chunk holds the fp8 part first
//   (its byte count rounded up to even), then the rest: one all-gather of
//   fp8_chunk_units_ param-dtype elements per rank, so the fp8 weights move half the bytes.
// - The copy-out gives each fp8 weight its codes (Param::fp8_value) and inverse scale, which
//   the Linear's GEMMs read directly; Param::value stays empty for it. Codes whose rows are
//   whole param-dtype units move in the group's one fused copy-out, as those units. On one
//   rank the chunk is the gathered group itself: its params are views of it, no copy.
// On a mesh of one rank there is nothing to all-reduce: each group takes its amaxes just before
// its first copy-in of the step instead, so the first all-gather waits for its own group's
// amax pass only, not for every group's (3.4 ms a step at 3.0B parameters on one H200).
// Every rank computes the same scales, so none is sent. The inverse scales live in device
// memory: a step reads none on the host (graphs replay it). A forward's and the following
// backward's copy-ins write the same inverse scales (the amax changes only at the next
// root forward, after the optimizer). The reduce-scatter is unchanged.
#include <algorithm>

#include "core/fsdp_state.h"
#include "core/param_group.h"
#include "fsdp/error.h"

namespace fsdp::core {

void ParamGroup::setup_fp8() {
  fp8_index_.assign(params_.size(), -1);
  if (!owner_->mp.fp8_all_gather) return;
  for (size_t i = 0; i < params_.size(); ++i)
    if (params_[i]->fp8 == Fp8Recipe::Tensorwise) fp8_index_[i] = fp8_count_++;
  if (fp8_count_ == 0) return;
  FSDP_USER_CHECK(owner_->mp.param_dtype == DType::BF16,
                  "a float8 all-gather needs bf16 params (module '", owner_->module.fqn(), "')");
  FSDP_USER_CHECK(owner_->post_forward_size(*mesh_) == 0,
                  "a float8 all-gather cannot reshard after forward to a smaller group yet "
                  "(module '", owner_->module.fqn(), "'): set fp8_all_gather off or "
                  "reshard_after_forward to a bool");
  fp8_offset_.assign(params_.size(), 0);
  int64_t bytes = 0, rest = 0;
  for (size_t i = 0; i < params_.size(); ++i) {
    const ShardSlice& sl = layout_.slices[i];
    const int64_t n = sl.rows_per_rank * sl.cols;
    if (fp8_index_[i] >= 0) {
      fp8_offset_[i] = bytes;
      bytes += n;
    } else {
      ShardSlice r = sl;
      r.offset = rest;
      rest_slices_.push_back(r);
      rest_params_.push_back(static_cast<int>(i));
      fp8_offset_[i] = rest;
      rest += n;
    }
  }
  fp8_bytes_ = (bytes + 1) & ~int64_t{1};
  fp8_chunk_units_ = fp8_bytes_ / 2 + rest;
  fp8_scale_inv_ = static_cast<float*>(device_->alloc(
      static_cast<size_t>(fp8_count_ * kFp8ScaleSlot) * sizeof(float), mesh_->init_stream(),
      MemTag::Other));  // a 16-byte slot each (fsdp/fp8.h's kFp8ScaleSlot)
}

void ParamGroup::set_fp8_amax(float* amax) { fp8_amax_ = amax; }

void ParamGroup::compute_fp8_amax(Stream s) {
  FSDP_CHECK(fp8_amax_, "group ", label_, ": no amax slots");
  for (size_t i = 0; i < params_.size(); ++i) {
    if (fp8_index_[i] < 0) continue;
    const ShardSlice& sl = layout_.slices[i];
    device_->fp8_amax(s, shard_param_ + sl.offset, DType::F32, sl.rows_per_rank, sl.cols,
                      Device::Fp8Axis::Tensor, fp8_amax_ + fp8_index_[i]);
  }
}

bool ParamGroup::fp8_amax_on_gather() {
  if (mesh_->size() > 1 || fp8_amax_generation_ == ctx_->fp8_amax_generation) return false;
  fp8_amax_generation_ = ctx_->fp8_amax_generation;
  device_->set_label("fp8 amax");
  return true;
}

void ParamGroup::fp8_copy_in(Stream s, char* chunk) {
  const DType t = owner_->mp.param_dtype;
  for (size_t i = 0; i < params_.size(); ++i) {
    const ShardSlice& sl = layout_.slices[i];
    const float* src = shard_param_ + sl.offset;
    const int k = fp8_index_[i];
    if (k >= 0) {
      device_->fp8_cast(s, src, DType::F32, t, sl.rows_per_rank, sl.cols, Device::Fp8Axis::Tensor,
                        fp8_amax_ + k, Fp8Format::E4M3,
                        reinterpret_cast<uint8_t*>(chunk + fp8_offset_[i]), nullptr,
                        fp8_scale_inv_ + k * kFp8ScaleSlot);
    } else {
      device_->cast(s, chunk + fp8_bytes_ + fp8_offset_[i] * static_cast<int64_t>(dtype_size(t)), t,
                    src, DType::F32, sl.rows_per_rank * sl.cols);
    }
  }
}

void ParamGroup::fp8_copy_out(Stream compute) {
  const DType t = owner_->mp.param_dtype;
  const auto unit = static_cast<int64_t>(dtype_size(t));
  const size_t chunk_bytes = static_cast<size_t>(fp8_chunk_units_) * dtype_size(t);
  const char* gathered = static_cast<const char*>(gathered_);
  if (layout_.world == 1) {
    // One rank's chunk is the whole group, each param contiguous in it: views serve, as they
    // do for a param-dtype group on one rank, and the output stays until the reshard.
    for (size_t i = 0; i < params_.size(); ++i) {
      const ShardSlice& sl = layout_.slices[i];
      const int k = fp8_index_[i];
      if (k >= 0) {
        params_[i]->value = Tensor{};
        params_[i]->fp8_value = reinterpret_cast<const uint8_t*>(gathered + fp8_offset_[i]);
        params_[i]->fp8_scale_inv = fp8_scale_inv_ + k * kFp8ScaleSlot;
      } else {
        params_[i]->value =
            view_tensor(const_cast<char*>(gathered) + fp8_bytes_ + fp8_offset_[i] * unit, t,
                        sl.rows, sl.cols);
      }
    }
    return;
  }
  device_->set_label(label_copy_out_);
  // Note [Float8 all-gather]: the codes are bytes, but a row of whole param-dtype units moves
  // as those units unchanged (the copy-out copies bits), so where every fp8 weight's rows and
  // offset are whole units, its codes join the rest in one fused copy-out: one launch a group
  // instead of a copy per rank and weight (on 64 GPUs, 8192 copies a step of an 8B model).
  bool whole_units = fp8_bytes_ % unit == 0;
  for (size_t i = 0; i < params_.size(); ++i)
    if (fp8_index_[i] >= 0)
      whole_units = whole_units && layout_.slices[i].cols % unit == 0 && fp8_offset_[i] % unit == 0;
  std::vector<ShardSlice> slices;
  std::vector<void*> dsts;
  for (size_t i = 0; i < params_.size(); ++i) {
    const int k = fp8_index_[i];
    if (k < 0) continue;
    const ShardSlice& sl = layout_.slices[i];
    auto* dst = static_cast<uint8_t*>(
        device_->alloc(static_cast<size_t>(sl.rows * sl.cols), compute, MemTag::Unsharded));
    copied_out_.push_back(dst);
    if (whole_units) {
      slices.push_back({sl.rows, sl.cols / unit, sl.rows_per_rank, fp8_offset_[i] / unit});
      dsts.push_back(dst);
    } else {  // rank r holds rows [r * rows_per_rank, ...) of the weight, contiguous in its chunk
      for (int r = 0; r < layout_.world; ++r) {
        const int64_t rows =
            std::clamp<int64_t>(sl.rows - r * sl.rows_per_rank, 0, sl.rows_per_rank);
        if (rows == 0) break;
        device_->copy(compute, dst + r * sl.rows_per_rank * sl.cols,
                      gathered + r * chunk_bytes + fp8_offset_[i],
                      static_cast<size_t>(rows * sl.cols));
      }
    }
    params_[i]->value = Tensor{};
    params_[i]->fp8_value = dst;
    params_[i]->fp8_scale_inv = fp8_scale_inv_ + k * kFp8ScaleSlot;
  }
  // The rest (norms, biases, weights left in the param dtype) after the fp8 part of each chunk.
  const int64_t rest_at = whole_units ? fp8_bytes_ / unit : 0;
  const char* rest_base = whole_units ? gathered : gathered + fp8_bytes_;
  for (size_t j = 0; j < rest_params_.size(); ++j) {
    ShardSlice sl = rest_slices_[j];
    void* dst = device_->alloc(static_cast<size_t>(sl.rows * sl.cols) * dtype_size(t), compute,
                               MemTag::Unsharded);
    copied_out_.push_back(dst);
    params_[static_cast<size_t>(rest_params_[j])]->value = view_tensor(dst, t, sl.rows, sl.cols);
    sl.offset += rest_at;
    if (whole_units) {
      slices.push_back(sl);
      dsts.push_back(dst);
    }
  }
  if (!whole_units && !rest_params_.empty()) {
    std::vector<void*> rest_dsts(copied_out_.end() - static_cast<std::ptrdiff_t>(rest_params_.size()),
                                 copied_out_.end());
    device_->all_gather_copy_out(compute, rest_base, t, fp8_chunk_units_, layout_.world,
                                 rest_slices_.data(), rest_dsts.data(),
                                 static_cast<int>(rest_dsts.size()));
  }
  if (!slices.empty())
    device_->all_gather_copy_out(compute, gathered, t, fp8_chunk_units_, layout_.world,
                                 slices.data(), dsts.data(), static_cast<int>(dsts.size()));
  // The copies ran on compute, which waited for the all-gather: free in stream order.
  device_->free(gathered_, compute);
  gathered_ = nullptr;
}

}  // namespace fsdp::core

namespace fsdp::core {

void FsdpState::setup_fp8_amax() {
  // Every rank runs the same states in the same order: the buffers and slots match up.
  std::vector<CommContext::Fp8Amax>& meshes = ctx->fp8_amax;
  auto entry = [&](Mesh* m) -> CommContext::Fp8Amax& {
    for (auto& e : meshes)
      if (e.mesh == m) return e;
    meshes.push_back({m, nullptr, 0, ctx->intern("AR fp8 amax " + m->name())});
    return meshes.back();
  };
  for (FsdpState* s : all_states)
    for (auto& g : s->groups)
      if (g->fp8_count() > 0) entry(&g->mesh()).count += g->fp8_count();
  for (auto& e : meshes) {
    e.amax = static_cast<float*>(mesh.device().alloc(static_cast<size_t>(e.count) * sizeof(float),
                                                     ctx->all_gather_stream, MemTag::Other));
    e.count = 0;  // counted again below as the slots are handed out
  }
  for (FsdpState* s : all_states)
    for (auto& g : s->groups)
      if (g->fp8_count() > 0) {
        CommContext::Fp8Amax& e = entry(&g->mesh());
        g->set_fp8_amax(e.amax + e.count);
        e.count += g->fp8_count();
      }
}

void FsdpState::precompute_fp8_amax() {
  if (ctx->fp8_amax.empty() || ctx->fp8_amax_precomputed == ctx->fp8_amax_generation) return;
  Device& d = mesh.device();
  const Stream s = ctx->all_gather_stream;
  // Meshes of one rank take their amaxes at each group's copy-in (fp8_amax_on_gather).
  for (FsdpState* st : all_states)
    for (auto& g : st->groups)
      if (g->fp8_count() > 0 && g->mesh().size() > 1) {
        // Note [Optimizer offload hooks]: the shard is the host step's upload.
        if (ctx->offload_hooks.before_all_gather) ctx->offload_hooks.before_all_gather(s, g->ordinal());
        d.set_label("fp8 amax");
        g->compute_fp8_amax(s);
      }
  for (const CommContext::Fp8Amax& e : ctx->fp8_amax) {
    if (e.mesh->size() == 1) continue;
    d.set_label(e.label);
    e.mesh->comm().all_reduce(e.amax, e.amax, e.count, DType::F32, ReduceOp::Max, s);
  }
  ctx->fp8_amax_precomputed = ctx->fp8_amax_generation;
}

}  // namespace fsdp::core
