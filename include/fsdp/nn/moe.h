// The MoE transformer's mixture-of-experts layer with expert parallelism (docs/moe.md):
// a softmax top-k router, token dispatch to the experts' ranks by all-to-all over the ep
// communicator, SwiGLU experts stored as one param per projection with a leading expert dim,
// and the combine back, forward and backward.
//
// Note [MoE routing]
// Rows are routed in groups of `group_tokens` (a rank's tokens; the unsharded reference sees
// world groups): softmax over the E router logits, the top K experts per token (ties to the
// lower index), their probabilities renormalized to sum to 1 (as Mixtral and torchtitan's
// default). Capacity factor cf > 0 caps each expert at ceil(cf * group_tokens * K / E)
// assignments per group, first come (token order) first served; the rest are dropped (their
// output is zero for that expert). The load-balancing loss of a group is
// E * sum_e f_e * P_e (Switch Transformer), f_e = the fraction of the group's T * K
// assignments routed to e (before drops), P_e = the mean router probability of e; the layer
// adds aux_loss_weight times the mean over groups to the loss (on the device: the layer keeps
// its aux loss and max load in device memory, Model::add_aux_loss).
// Where it runs depends on the shapes. With a capacity factor every shape is static (each
// expert gets exactly `capacity` rows per group, padded), so routing runs on the device
// (Device::moe_route, Note [Device MoE routing]) and nothing in the layer waits for the host:
// a step can be captured in a CUDA graph, and eager steps run the same ops. Dropless routing
// runs on the host: the layer copies the probabilities back (one synchronization per layer
// and direction) because its row counts, and so the all-to-all's counts, depend on the data.
// route_tokens below is that host routing, and the reference the device routing is tested
// against.
#pragma once

#include <cstdint>
#include <vector>

#include "fsdp/comm.h"
#include "fsdp/module.h"
#include "fsdp/nn/transformer.h"

namespace fsdp::nn {

class Linear;

struct MoeConfig {
  int experts = 4;
  int top_k = 2;
  int64_t expert_ffn_dim = 0;    // SwiGLU width of one expert
  double capacity_factor = 0;    // 0: dropless
  float aux_loss_weight = 0.01f;
  int ep = 1;                    // expert-parallel ranks; experts / ep are local
  int ep_rank = 0;               // which block of experts this rank holds
  int64_t group_tokens = 0;      // Note [MoE routing]; 0: all rows form one group
  int local_experts() const { return experts / ep; }
  // Assignments kept per expert per routing group of `group` tokens: ceil(cf * group * K / E);
  // 0 when dropless.
  int64_t capacity(int64_t group) const;
  void validate() const;  // one-line errors
};

// The host side of one routing: which expert each assignment a = t * K + k goes to.
struct RoutePlan {
  int64_t tokens = 0;
  int top_k = 0;
  std::vector<int32_t> expert;   // [tokens * K]; -1: dropped by capacity
  std::vector<int32_t> chosen;   // [tokens * K]; the top-k expert, kept or not
  std::vector<float> weight;     // [tokens * K]; renormalized top-k probability
  std::vector<float> aux_grad;   // [experts]; d(aux loss)/d(prob[t, e]) for a token of group g,
                                 // one row per group: [groups * experts]
  int64_t capacity = 0;          // per expert per group; 0: dropless
  float aux_loss = 0;            // aux_loss_weight * mean over groups
  float max_load = 0;            // max over experts of (assignments to e) / (tokens * K)
};
// Note [MoE routing] over probs [tokens, experts] (host, fp32).
RoutePlan route_tokens(const std::vector<float>& probs, int64_t tokens, const MoeConfig& c);

// Moves rows between token order and the experts' ranks (Note [Expert dispatch] in
// src/nn/moe_transformer_routing.cpp). plan() takes each assignment's expert (-1: not sent) and
// exchanges the counts; to_experts() takes rows in send order (sorted by expert, stable) and
// returns them on the experts' ranks, expert-major ([local expert][source rank][order]);
// from_experts() is its inverse (and so also its backward, and vice versa).
class ExpertDispatcher {
 public:
  // capacity > 0: static shapes: every expert gets exactly `capacity` rows from every rank,
  // padded with assignment -1 (the layer sends zero rows there), and no counts are exchanged.
  void plan(RunContext& ctx, Comm* ep, int experts, const std::vector<int32_t>& assignment_expert,
            int64_t capacity = 0);
  // The static layout alone (capacity > 0, routing on the device): every expert gets `slots`
  // rows from every rank. No host read, no counts exchange; the expert-major permutation
  // depends on the shapes only, so it is built once and kept. send_assignments() stays empty
  // (the send order is on the device, Note [Device MoE routing]).
  void plan_static(RunContext& ctx, Comm* ep, int experts, int64_t slots);
  // Rows of `cols` act-dtype elements (a tensor of 0 rows may have no data).
  Tensor to_experts(RunContext& ctx, const Tensor& send_rows, int64_t cols) const;
  Tensor from_experts(RunContext& ctx, const Tensor& expert_rows, int64_t cols) const;

  // Send order: the assignment index of each sent row (-1: padding).
  const std::vector<int32_t>& send_assignments() const { return send_assignment_; }
  // Rows each local expert receives (sum over source ranks).
  const std::vector<int64_t>& local_counts() const { return local_counts_; }
  int64_t sent_rows() const { return sent_; }
  int64_t received_rows() const { return received_; }

 private:
  Tensor exchange(RunContext& ctx, const Tensor& rows, int64_t cols, bool forward) const;
  // The counts and permutations from the rows sent to each expert and each (source rank,
  // local expert)'s rows received ([source][local expert]); the permutations' memory gets `tag`.
  void build_layout(RunContext& ctx, int experts, const std::vector<int32_t>& per_expert,
                    const std::vector<int32_t>& received, MemTag tag);

  Comm* ep_ = nullptr;
  std::vector<int32_t> send_assignment_;
  std::vector<int64_t> send_counts_, recv_counts_;  // rows per ep peer
  std::vector<int64_t> local_counts_;
  std::vector<int32_t> to_expert_major_, to_peer_major_;  // row permutations
  Tensor to_expert_major_dev_, to_peer_major_dev_;        // the same, int32 on the device
  int64_t sent_ = 0, received_ = 0;
  int64_t static_key_[3] = {0, 0, 0};  // plan_static's (ep size, experts, slots) when built
};

struct Fp8Operand;  // src/nn/fp8_linear.h

// The local experts: w13 [E_local, 2 * F, dim] (rows per expert: gate, then up) and
// w2 [E_local, dim, F], expert-major input rows with `counts` rows per local expert. Init by
// global expert index, so every ep layout starts from the same global weights. With fp8
// (Param::fp8 on both) each expert's GEMMs run in fp8 (Note [Fp8 experts]).
class GroupedExperts : public Module {
 public:
  GroupedExperts(const TransformerConfig& c, const MoeConfig& m, int layer);
  std::vector<int64_t> counts;  // set before forward; kept for backward
  // Tests fire the expert and dense groups in every order: with hold_grads the backward keeps
  // its weight grads until release_held_grads() (the block's end, or the root's).
  bool hold_grads = false;
  void release_held_grads(RunContext& ctx);

 protected:
  Tensor forward_impl(RunContext& ctx, const Tensor& x) override;
  Tensor backward_impl(RunContext& ctx, const Tensor& dy, bool input_grad) override;
  // Selective: SwiGLU's output, remade from w13's output in backward.
  void drop_own_saved(ActivationCheckpoint what) override;

 private:
  Tensor forward_fp8(RunContext& ctx, const Tensor& x);  // grouped_experts_fp8.cpp
  Tensor backward_fp8(RunContext& ctx, const Tensor& dy, Tensor& dw13, Tensor& dw2);
  bool fp8() const;

  int64_t dim_, ffn_;
  int local_;
  Tensor saved_x_, saved_h_, saved_act_;  // fp8: each expert's rows padded (saved_padded_)
  std::vector<int64_t> saved_counts_, saved_padded_;
  // fp8, tensorwise: each expert's X amaxes of the forward, for its weight grads (w13's, w2's).
  std::vector<std::shared_ptr<Fp8Operand>> fp8_x13_, fp8_x2_;
  std::vector<Tensor> held_;  // dw2, dw13
};

// y = sum_k w_k * expert_k(x) over the token's kept top-k assignments (Note [MoE routing]).
class MoeFeedForward : public Module {
 public:
  MoeFeedForward(const TransformerConfig& c, const MoeConfig& m, int layer);
  void set_expert_comm(Comm* ep) { ep_ = ep; }
  // Device fp32 [2]: the aux loss (weight included) and the max load of the last forward;
  // null before the first. Written by the forward's own ops, so reading it needs no host wait
  // inside a step.
  const float* stats() const { return stats_.as<float>(); }
  GroupedExperts& experts() const { return *experts_; }
  // Its input (the router's), which a selective checkpoint drops and hands back (Linear's).
  Linear& router() const { return *router_; }

 protected:
  Tensor forward_impl(RunContext& ctx, const Tensor& x) override;
  Tensor backward_impl(RunContext& ctx, const Tensor& dy, bool input_grad) override;
  void drop_own_saved(ActivationCheckpoint what) override;

 private:
  void route_on_device(RunContext& ctx, int64_t tokens);  // capacity factor > 0
  void route_on_host(RunContext& ctx, int64_t tokens);    // dropless
  Tensor router_grad_on_host(RunContext& ctx, const Tensor& dweight, int64_t tokens);

  MoeConfig config_;
  Comm* ep_ = nullptr;
  Linear* router_;
  GroupedExperts* experts_;
  ExpertDispatcher dispatcher_;
  RoutePlan plan_;                  // dropless
  std::vector<float> probs_host_;   // dropless
  Device::MoeRouting routing_;      // capacity: its buffers are the tensors below
  Tensor chosen_, weights_, slots_, aux_grad_;
  Tensor stats_;        // [2] fp32, kept across steps (stats())
  Tensor probs_;        // [T, E] fp32
  Tensor combined_;     // [sent, dim]: expert outputs back in send order, unweighted
  Tensor send_tokens_;  // [sent] int32: the token of each sent row
  Tensor send_weights_; // [sent] fp32
  bool padded_ = false;  // static shapes (capacity factor > 0)
};

// h = x + attention(attention_norm(x)); out = h + moe(ffn_norm(h)). Selective checkpointing
// (Note [Activation checkpointing]) drops the two norms' outputs and the experts' SwiGLU
// output; the dispatched rows stay, so its recompute exchanges nothing over ep.
class MoeTransformerBlock : public Module, public DecoderBlock {
 public:
  MoeTransformerBlock(const TransformerConfig& c, const MoeConfig& m, int layer);
  void set_input_grad_reader(const Param* w) override;
  const Param* output_projection_weight() const override { return nullptr; }  // the combine
  MoeFeedForward& moe() const { return *moe_; }
  // With the experts holding their grads: hand them over from the root (Model::backward)
  // instead of at the end of this block's backward.
  bool defer_expert_grads_to_root = false;

 protected:
  Tensor forward_impl(RunContext& ctx, const Tensor& x) override;
  Tensor backward_impl(RunContext& ctx, const Tensor& dy, bool input_grad) override;
  void drop_own_saved(ActivationCheckpoint what) override;

 private:
  RMSNorm* attention_norm_;
  Attention* attention_;
  RMSNorm* ffn_norm_;
  MoeFeedForward* moe_;
};

// Block `layer` holds the MoE layer when (layer + 1) % every == 0: with every = 2 (the
// default), blocks 1, 3, 5, ...; with every = 1, all of them (torchtitan's interleave step).
inline bool is_moe_layer(int layer, int every) { return (layer + 1) % every == 0; }

// Seed of global expert `expert`'s weights in block `layer` (w13 and w2 from it).
uint64_t expert_param_seed(uint64_t seed, int layer, int expert);

}  // namespace fsdp::nn
