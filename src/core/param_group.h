// One param group: the params of one FSDP module that shard over one mesh. The unit of one
// all-gather and one reduce-scatter (FSDP2's FSDPParamGroup).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/comm_context.h"
#include "core/shard_layout.h"
#include "fsdp/fsdp.h"

namespace fsdp::core {

class FsdpState;

class ParamGroup {
 public:
  ParamGroup(FsdpState& state, Mesh& mesh, std::vector<Param*> params, int index,
             Stream init_stream);
  ~ParamGroup();
  ParamGroup(const ParamGroup&) = delete;
  ParamGroup& operator=(const ParamGroup&) = delete;

  // Labels are made once the root's context exists (lazy init).
  void lazy_init(std::shared_ptr<CommContext> ctx, const std::string& label, int ordinal);

  // Issues the all-gather on the AG stream (copy-in cast + collective); no-op when the
  // params are unsharded or already being gathered.
  void unshard();
  // Makes the compute stream wait for the all-gather and points every Param::value at the
  // unsharded data (a view of the AG output, or a copy-out).
  void wait_for_unshard(Stream compute);
  // Frees the unsharded data, stream-ordered on the compute stream. With post_forward and
  // an int reshard_after_forward, keeps this rank's post-forward shard (Note [Post-forward
  // mesh]); the next unshard gathers from it on the smaller group.
  void reshard(Stream compute, bool post_forward = false);
  bool is_unsharded() const { return state_ == Unsharded; }
  bool is_gathering() const { return state_ == Gathering; }
  // Whether the all-gather's buffer is allocated (Note [All-gather ordering]).
  bool holds_all_gather_buffer() const { return gathered_ != nullptr; }
  bool is_sharded_post_forward() const { return state_ == ShardedPostForward; }
  bool is_sharded() const { return state_ == Sharded; }

  // Grad sink: counts grads; the last one of the group triggers post_backward().
  void on_grad(RunContext& ctx, int param_index, Tensor grad);
  // Reduce-scatters the group's grads (Note [RS ring]); with gradient sync off, accumulates
  // them unsharded instead. Missing grads count as zeros, even all of them: the other ranks
  // may have some (Note [Symmetric collectives]).
  void post_backward(RunContext& ctx);
  bool post_backward_pending() const { return grads_received_ > 0; }
  bool fired_this_backward() const { return fired_; }
  void reset_backward() { fired_ = false; }

  // zero_grad without touching memory: the next reduce-scatter writes the grad shard
  // directly instead of accumulating into it (Note [Lazy zero grad]).
  void mark_grad_shard_zero() { grad_shard_zero_ = true; }
  // For groups that got no reduce-scatter since the last mark: make the zeros real.
  void materialize_zero_grad(Stream compute);
  // zero_grad(set_to_none=True): frees the grad shard, stream-ordered on s; the next
  // reduce-scatter (or materialize_zero_grad) makes it again (Note [Grads set to none]).
  void release_grad_shard(Stream s);

  Mesh& mesh() const { return *mesh_; }
  int index() const { return index_; }
  int ordinal() const { return ordinal_; }  // among the root's groups (sharded_groups order)
  const GroupLayout& layout() const { return layout_; }
  const std::vector<Param*>& params() const { return params_; }
  const std::string& label() const { return label_; }
  float* shard_param() const { return shard_param_; }
  float* shard_grad() const { return shard_grad_; }
  // The persistent grad shard, made on first use (never under an optimizer in backward).
  float* ensure_grad_shard(Stream s);

  // Note [Float8 all-gather] (param_group_fp8.cpp). How many params gather as fp8 (0: none,
  // the group gathers as before); set_fp8_amax gives them their slots of the mesh's amax
  // buffer, which compute_fp8_amax fills from the fp32 shards (before the all-reduce).
  int fp8_count() const { return fp8_count_; }
  void set_fp8_amax(float* amax);
  void compute_fp8_amax(Stream s);
  // On a mesh of one rank the amaxes need no all-reduce: each group takes its own just before
  // its first copy-in of the step, on the all-gather stream, instead of in the precompute
  // that every all-gather waits for. Marks it taken.
  bool fp8_amax_on_gather();

 private:
  enum UnshardState { Sharded, ShardedPostForward, Gathering, Unsharded };
  // The post-forward group size the next forward reshard goes to (0: fully sharded).
  int post_forward_size() const;
  // Whether this group's optimizer step waits for its next all-gather (Note [Optimizer in
  // forward's owner]).
  bool update_pending() const;
  void reduce_scatter(RunContext& ctx, const std::vector<const void*>& srcs,
                      const std::vector<DType>& types);
  // Note [One-rank reduce-scatter]: the copy-in writes the fp32 grad shard directly, on
  // compute; the in-place collective and the early grad norm follow on the RS stream.
  void copy_in_to_grad_shard(RunContext& ctx, const std::vector<const void*>& srcs,
                             const std::vector<DType>& types);
  // Whether the grads are summed and scaled by 1 / gradient_divide_factor rather than
  // averaged over the mesh (Note [Gradient divide factor]).
  bool custom_divide() const;
  // The collective and what follows it on the RS stream: into the grad shard, or (optimizer
  // in backward) into a transient grad that the optimizer consumes.
  // rt: rs_in's dtype, the reduce dtype (or a one-rank grad's own: Note [One-rank
  // reduce-scatter]).
  void reduce_into_grad(void* rs_in, DType rt, Stream rs_stream);
  // HSDP: the reduce-scatter's output (partial_reduce_ added) all-reduced across replicas
  // on the all-reduce stream, then into the grad shard there (Note [HSDP schedule]).
  void all_reduce_into_grad(void* rs_in, Stream rs_stream);
  void accumulate_unsharded(RunContext& ctx);
  // Note [Float8 all-gather]: the copy-in of the mixed fp8 / param-dtype chunk, and the
  // copy-out that sets Param::fp8_value.
  void setup_fp8();
  void fp8_copy_in(Stream s, char* chunk);
  void fp8_copy_out(Stream compute);
  void release_grads();

  FsdpState* owner_;
  Mesh* mesh_;
  Device* device_;
  // Shared: a child's groups may outlive the root's state (Note [FSDP teardown]).
  std::shared_ptr<CommContext> ctx_;
  std::vector<Param*> params_;
  int index_;
  GroupLayout layout_;
  float* shard_param_ = nullptr;  // fp32 master shard, flat
  float* shard_grad_ = nullptr;   // fp32 grad shard, flat
  int64_t fp8_amax_generation_ = -1;  // CommContext::fp8_amax_generation it was taken in
  bool grad_shard_zero_ = true;  // logically zero; the memory may hold old values

  UnshardState state_ = Sharded;
  void* gathered_ = nullptr;  // [world][shard_numel] in the param dtype
  void* post_forward_ = nullptr;  // this rank's chunk of gathered_ (Note [Post-forward mesh])
  int post_forward_world_ = 0;    // the size of the group post_forward_ was cut for
  Event post_forward_ready_;      // on compute, after post_forward_ was written
  // HSDP with set_requires_all_reduce(false): reduce-scattered grads summed in the reduce
  // dtype, waiting for a backward with the all-reduce (FSDP2's partial_reduce_output).
  void* partial_reduce_ = nullptr;
  std::vector<void*> copied_out_;
  Event all_gather_done_;

  std::vector<Tensor> grads_;
  // The grad serving as this reduce-scatter's input, handed to the ring with it (Note
  // [One-rank reduce-scatter]); null when the input is a copy-in buffer.
  std::shared_ptr<Storage> rs_in_owner_;
  int grads_received_ = 0;      // params with a grad
  std::vector<int> uses_seen_;  // grads handed per param in this backward (Param::uses)
  int params_complete_ = 0;     // params whose every use has handed its grad
  bool fired_ = false;
  float* unsharded_accum_ = nullptr;  // fp32, sum of rows*cols, for no-sync micro-batches
  int64_t full_numel_ = 0;

  // Note [Float8 all-gather]: per param its index among the fp8 ones (-1: param dtype) and
  // its offset in its part of the chunk (bytes for fp8, elements for the rest); the chunk is
  // fp8_chunk_units_ param-dtype elements per rank, the fp8 part first (fp8_bytes_, even).
  int fp8_count_ = 0;
  std::vector<int> fp8_index_;
  std::vector<int64_t> fp8_offset_;
  std::vector<ShardSlice> rest_slices_;  // the others', offsets within the rest part
  std::vector<int> rest_params_;
  int64_t fp8_bytes_ = 0;
  int64_t fp8_chunk_units_ = 0;
  float* fp8_amax_ = nullptr;       // fp8_count_ entries of the mesh's buffer (not owned)
  float* fp8_scale_inv_ = nullptr;  // fp8_count_ inverse scales, 16 bytes apart, by the copy-in

  std::string label_;
  int ordinal_ = -1;  // index among the root's groups (sharded_groups order)
  const char* label_optimizer_ = "";
  const char* label_ag_copy_in_ = "";
  const char* label_ag_ = "";
  const char* label_copy_out_ = "";
  const char* label_rs_copy_in_ = "";
  const char* label_rs_ = "";
  const char* label_rs_accumulate_ = "";
  const char* label_ar_ = "";
  const char* label_post_forward_ = "";
};

}  // namespace fsdp::core
