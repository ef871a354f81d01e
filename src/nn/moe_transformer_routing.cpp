// The MoE layer's routing (Note [MoE routing] in include/fsdp/nn/moe.h) and its dispatch of
// rows to the experts' ranks.
//
// Note [Expert dispatch]
// Experts are laid out in ep blocks of E / ep consecutive experts: ep rank p holds experts
// [p * E_local, (p + 1) * E_local). A rank sends its kept assignments sorted by expert
// (stable, so by assignment within an expert), which is also sorted by destination rank, so
// one all-to-all with per-peer row counts moves them. Dropless, the per-expert counts go
// first, in an all-to-all of E_local int32 per peer, and are read on the host (the row
// all-to-all's counts must be known there). With a capacity factor every expert gets exactly
// `slots` rows (its capacity times the groups, padded) from every rank: the counts and the
// permutations below follow from the shapes alone, so nothing is exchanged or read back and
// the layout is built once (plan_static; the send order itself is made on the device, Note
// [Device MoE routing]). A rank receives peer-major rows ([source][local expert][order]) and
// permutes them expert-major ([local expert][source][order]), so each local expert's rows are
// contiguous for its GEMMs. The return trip is the exact inverse: the inverse permutation,
// then the all-to-all with send and receive counts swapped. Each direction is the other's
// backward. With ep = 1 there is nothing to exchange and the send order is expert-major.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "fsdp/error.h"
#include "fsdp/moe_top_k.h"
#include "fsdp/nn/moe.h"
#include "nn/moe_transformer_rows.h"

namespace fsdp::nn {

// Note [Options checked once]: the options by their ModelConfig names.
void MoeConfig::validate() const {
  const OptionName experts_{"experts"}, ep_{"ep"};
  FSDP_OPTION_CHECK(experts >= 1, experts_, " must be >= 1, got ", experts);
  FSDP_OPTION_CHECK(top_k >= 1 && top_k <= experts, OptionName{"top_k"}, " must be in [1, ",
                    experts_, " = ", experts, "], got ", top_k);
  FSDP_OPTION_CHECK(expert_ffn_dim >= 1, OptionName{"expert_ffn_dim"}, " must be >= 1, got ",
                    expert_ffn_dim);
  FSDP_OPTION_CHECK(capacity_factor >= 0, OptionName{"capacity_factor"},
                    " must be >= 0 (0: dropless), got ", capacity_factor);
  FSDP_OPTION_CHECK(aux_loss_weight >= 0, OptionName{"aux_loss_weight"}, " must be >= 0, got ",
                    aux_loss_weight);
  FSDP_OPTION_CHECK(ep >= 1, ep_, " must be >= 1, got ", ep);
  FSDP_OPTION_CHECK(experts % ep == 0, experts_, " (", experts, ") must be divisible by ", ep_,
                    " (", ep, ")");
  FSDP_CHECK(ep_rank >= 0 && ep_rank < ep, "ep rank ", ep_rank, " outside [0, ", ep, ")");
}

int64_t MoeConfig::capacity(int64_t group) const {
  if (capacity_factor <= 0) return 0;
  const int64_t c = static_cast<int64_t>(
      std::ceil(capacity_factor * static_cast<double>(group * top_k) / experts));
  return c > 0 ? c : 0;
}

RoutePlan route_tokens(const std::vector<float>& probs, int64_t tokens, const MoeConfig& c) {
  const int E = c.experts, K = c.top_k;
  const int64_t group = c.group_tokens > 0 ? c.group_tokens : tokens;
  FSDP_CHECK(group > 0 ? tokens % group == 0 : tokens == 0, "MoE routing: ", tokens,
             " rows do not split into groups of ", group, " tokens");
  FSDP_CHECK(static_cast<int64_t>(probs.size()) == tokens * E, "MoE routing: ", probs.size(),
             " probabilities for ", tokens, " tokens of ", E, " experts");
  const int64_t groups = group > 0 ? tokens / group : 0;
  RoutePlan plan;
  plan.tokens = tokens;
  plan.top_k = K;
  plan.expert.assign(static_cast<size_t>(tokens * K), -1);
  plan.chosen.assign(static_cast<size_t>(tokens * K), -1);
  plan.weight.assign(static_cast<size_t>(tokens * K), 0.0f);
  plan.aux_grad.assign(static_cast<size_t>(groups * E), 0.0f);
  plan.capacity = c.capacity(group);
  const int64_t capacity = c.capacity_factor > 0 ? plan.capacity : -1;
  std::vector<int64_t> total(static_cast<size_t>(E), 0);
  std::vector<int> order(static_cast<size_t>(E));
  double aux_sum = 0;
  for (int64_t g = 0; g < groups; ++g) {
    std::vector<int64_t> routed(static_cast<size_t>(E), 0), kept(static_cast<size_t>(E), 0);
    std::vector<double> mean_prob(static_cast<size_t>(E), 0.0);
    for (int64_t t = g * group; t < (g + 1) * group; ++t) {
      const float* p = probs.data() + t * E;
      for (int e = 0; e < E; ++e) mean_prob[e] += p[e];
      const float sum = moe_top_k(p, K, order);
      for (int k = 0; k < K; ++k) {
        const int e = order[k];
        const size_t a = static_cast<size_t>(t * K + k);
        plan.chosen[a] = e;
        plan.weight[a] = p[e] / sum;
        ++routed[e];
        if (capacity < 0 || kept[e] < capacity) {
          plan.expert[a] = e;
          ++kept[e];
        }
      }
    }
    double aux = 0;
    for (int e = 0; e < E; ++e) {
      const double f = static_cast<double>(routed[e]) / static_cast<double>(group * K);
      aux += f * mean_prob[e] / static_cast<double>(group);
      // d(weight * mean over groups of E * sum f P)/d(prob[t, e]) for t in this group.
      plan.aux_grad[static_cast<size_t>(g * E + e)] = static_cast<float>(
          c.aux_loss_weight * E * f / (static_cast<double>(group) * static_cast<double>(groups)));
      total[e] += routed[e];
    }
    aux_sum += E * aux;
  }
  plan.aux_loss = groups > 0 ? static_cast<float>(c.aux_loss_weight * aux_sum / groups) : 0.0f;
  if (tokens > 0)
    plan.max_load = static_cast<float>(*std::max_element(total.begin(), total.end())) /
                    static_cast<float>(tokens * K);
  return plan;
}

// ---- ExpertDispatcher

void ExpertDispatcher::plan(RunContext& ctx, Comm* ep, int experts,
                            const std::vector<int32_t>& assignment_expert, int64_t capacity) {
  ep_ = ep && ep->size() > 1 ? ep : nullptr;
  const int peers = ep_ ? ep_->size() : 1;
  FSDP_CHECK(experts % peers == 0, "MoE dispatch: ", experts, " experts over ", peers,
             " ep ranks");
  const int local = experts / peers;
  std::vector<std::vector<int32_t>> by_expert(static_cast<size_t>(experts));
  for (size_t a = 0; a < assignment_expert.size(); ++a) {
    const int32_t e = assignment_expert[a];
    if (e < 0) continue;
    FSDP_CHECK(e < experts, "MoE dispatch: expert ", e, " outside [0, ", experts, ")");
    by_expert[static_cast<size_t>(e)].push_back(static_cast<int32_t>(a));
  }
  send_assignment_.clear();
  std::vector<int32_t> per_expert(static_cast<size_t>(experts), 0);
  for (int e = 0; e < experts; ++e) {
    auto& rows = by_expert[static_cast<size_t>(e)];
    if (capacity > 0) {  // static shapes: every expert gets exactly `capacity` slots
      FSDP_CHECK(static_cast<int64_t>(rows.size()) <= capacity, "MoE dispatch: expert ", e,
                 " got ", rows.size(), " rows over its capacity ", capacity);
      rows.resize(static_cast<size_t>(capacity), -1);
    }
    per_expert[static_cast<size_t>(e)] = static_cast<int32_t>(rows.size());
    send_assignment_.insert(send_assignment_.end(), rows.begin(), rows.end());
  }
  sent_ = static_cast<int64_t>(send_assignment_.size());
  std::vector<int32_t> counts(static_cast<size_t>(experts), static_cast<int32_t>(capacity));
  if (ep_ && capacity <= 0) {
    // The counts: E_local int32 to each peer, in the order of our experts.
    Device& d = *ctx.device;
    Tensor send = empty_tensor(d, ctx.compute, DType::I32, experts, 1, MemTag::Activation);
    Tensor recv = empty_tensor(d, ctx.compute, DType::I32, experts, 1, MemTag::Activation);
    d.copy_from_host(ctx.compute, send.data, per_expert.data(), send.bytes());
    const std::vector<int64_t> even(static_cast<size_t>(peers), local);
    d.set_label("moe counts all-to-all");
    ep_->all_to_all(send.data, even, recv.data, even, DType::I32, ctx.compute);
    d.copy_to_host(ctx.compute, counts.data(), recv.data, recv.bytes());  // [source][local expert]
    d.synchronize_stream(ctx.compute);
  }
  static_key_[0] = static_key_[1] = static_key_[2] = 0;
  build_layout(ctx, experts, per_expert, counts, MemTag::Activation);
}

void ExpertDispatcher::plan_static(RunContext& ctx, Comm* ep, int experts, int64_t slots) {
  ep_ = ep && ep->size() > 1 ? ep : nullptr;
  const int peers = ep_ ? ep_->size() : 1;
  FSDP_CHECK(experts % peers == 0, "MoE dispatch: ", experts, " experts over ", peers,
             " ep ranks");
  FSDP_CHECK(slots >= 1 && experts * slots <= INT32_MAX, "MoE dispatch: ", slots,
             " slots per expert");
  send_assignment_.clear();
  sent_ = experts * slots;
  const int64_t key[3] = {peers, experts, slots};
  if (std::equal(key, key + 3, static_key_)) return;  // the same shapes: the same layout
  const std::vector<int32_t> counts(static_cast<size_t>(experts), static_cast<int32_t>(slots));
  build_layout(ctx, experts, counts, counts, MemTag::Other);  // kept across steps
  std::copy(key, key + 3, static_key_);
}

void ExpertDispatcher::build_layout(RunContext& ctx, int experts,
                                    const std::vector<int32_t>& per_expert,
                                    const std::vector<int32_t>& counts, MemTag tag) {
  const int peers = ep_ ? ep_->size() : 1;
  const int local = experts / peers;
  send_counts_.assign(static_cast<size_t>(peers), 0);
  for (int e = 0; e < experts; ++e) send_counts_[static_cast<size_t>(e / local)] += per_expert[e];
  to_expert_major_.clear();
  to_peer_major_.clear();
  to_expert_major_dev_ = to_peer_major_dev_ = Tensor{};
  if (!ep_) {
    recv_counts_ = send_counts_;
    local_counts_.assign(per_expert.begin(), per_expert.end());
    received_ = sent_;
    return;
  }
  recv_counts_.assign(static_cast<size_t>(peers), 0);
  local_counts_.assign(static_cast<size_t>(local), 0);
  std::vector<int64_t> start(static_cast<size_t>(experts));  // row of (peer, l) in recv layout
  int64_t row = 0;
  for (int p = 0; p < peers; ++p)
    for (int l = 0; l < local; ++l) {
      const int32_t n = counts[static_cast<size_t>(p * local + l)];
      start[static_cast<size_t>(p * local + l)] = row;
      row += n;
      recv_counts_[static_cast<size_t>(p)] += n;
      local_counts_[static_cast<size_t>(l)] += n;
    }
  received_ = row;
  to_expert_major_.reserve(static_cast<size_t>(received_));
  for (int l = 0; l < local; ++l)
    for (int p = 0; p < peers; ++p)
      for (int32_t i = 0; i < counts[static_cast<size_t>(p * local + l)]; ++i)
        to_expert_major_.push_back(static_cast<int32_t>(start[static_cast<size_t>(p * local + l)] + i));
  to_peer_major_.assign(to_expert_major_.size(), 0);
  for (size_t i = 0; i < to_expert_major_.size(); ++i)
    to_peer_major_[static_cast<size_t>(to_expert_major_[i])] = static_cast<int32_t>(i);
  to_expert_major_dev_ = device_ids(ctx, to_expert_major_, tag);
  to_peer_major_dev_ = device_ids(ctx, to_peer_major_, tag);
}

Tensor ExpertDispatcher::exchange(RunContext& ctx, const Tensor& rows, int64_t cols,
                                  bool forward) const {
  const std::vector<int64_t>& send_rows = forward ? send_counts_ : recv_counts_;
  const std::vector<int64_t>& recv_rows = forward ? recv_counts_ : send_counts_;
  std::vector<int64_t> send(send_rows.size()), recv(recv_rows.size());
  int64_t out_rows = 0;
  for (size_t p = 0; p < send.size(); ++p) {
    send[p] = send_rows[p] * cols;
    recv[p] = recv_rows[p] * cols;
    out_rows += recv_rows[p];
  }
  Tensor out = empty_tensor(*ctx.device, ctx.compute, ctx.act_dtype, out_rows, cols,
                            MemTag::Activation);
  ctx.device->set_label(forward ? "moe dispatch all-to-all" : "moe combine all-to-all");
  ep_->all_to_all(rows.data, send, out.data, recv, ctx.act_dtype, ctx.compute);
  return out;
}

Tensor ExpertDispatcher::to_experts(RunContext& ctx, const Tensor& send_rows, int64_t cols) const {
  if (!ep_) return send_rows;
  return gather_rows(ctx, exchange(ctx, send_rows, cols, true), to_expert_major_dev_, received_,
                     cols);
}

Tensor ExpertDispatcher::from_experts(RunContext& ctx, const Tensor& expert_rows,
                                      int64_t cols) const {
  if (!ep_) return expert_rows;
  return exchange(ctx, gather_rows(ctx, expert_rows, to_peer_major_dev_, received_, cols), cols,
                  false);
}

}  // namespace fsdp::nn
