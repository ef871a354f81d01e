// A Llama-style decoder: token embedding, pre-norm blocks of causal grouped-query attention with
// rotary position embeddings and a SwiGLU feed-forward, a final RMSNorm and an LM head, with
// the options of Hugging Face's Llama, Qwen2 and Mistral (rope theta and "llama3" scaling, a
// head tied to the embedding, q/k/v biases, a head_dim of its own). docs/transformer.md
// describes the model, its parameter names and its FLOP count.
//
// Note [Transformer layout]
// Activations are [tokens, width] with token r = b * seq_len + i (sequence b, position i), so a
// rank's batch is tokens / seq_len whole sequences. The fused weights keep Hugging Face's
// layout: wqkv's rows are the q heads, then the k heads, then the v heads; w13's rows are the
// gate (w1) rows, then the up (w3) rows. RoPE uses the "rotate half" pairing, so the q and k
// rows load into Hugging Face's LlamaForCausalLM as they are.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "fsdp/module.h"
#include "fsdp/nn/kv_cache.h"

namespace fsdp::nn {

class Linear;

// RoPE's frequency scaling. "default": none. "llama3" (Llama 3.1's, as Hugging Face's
// _compute_llama3_parameters): with wavelength w = 2 pi / f of each frequency f, and
// L = original_max_positions, frequencies with w < L / high_freq_factor are kept, those with
// w > L / low_freq_factor divided by factor, and those between interpolated:
// s = (L / w - low_freq_factor) / (high_freq_factor - low_freq_factor),
// f' = (1 - s) f / factor + s f.
struct RopeScaling {
  std::string type = "default";
  double factor = 8, low_freq_factor = 1, high_freq_factor = 4;
  int64_t original_max_positions = 8192;
  bool operator==(const RopeScaling&) const = default;
};

struct TransformerConfig {
  int layers = 2;
  int64_t dim = 64;
  int64_t heads = 4;
  int64_t kv_heads = 4;  // grouped-query attention: each kv head serves heads / kv_heads q heads
  int64_t ffn_dim = 192;
  int64_t seq_len = 32;
  int64_t vocab = 256;
  int64_t head_size = 0;  // 0: dim / heads
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  float norm_eps = 1e-5f;
  bool tie_embeddings = false;  // Note [Tied embeddings]
  bool attention_bias = false;  // biases on q, k and v (Qwen2), none on the output projection
  uint64_t seed = 1;

  int64_t head_dim() const { return head_size > 0 ? head_size : dim / heads; }
  // One-line errors for sizes the model cannot take (dim not a multiple of heads, odd head_dim...).
  void validate() const;
};

// RoPE's inverse frequencies, head_dim / 2 of them, in fp32 as Hugging Face computes them:
// theta^(-2i / head_dim), then `scaling`'s.
std::vector<float> rope_inv_freq(int64_t head_dim, double theta, const RopeScaling& scaling);

// Every parameter, the embedding and the head included (one of them when tied, plus the q/k/v
// biases with attention_bias):
//   2 * vocab * dim + dim + layers * (dim * (heads + 2 * kv_heads) * head_dim
//                                     + heads * head_dim * dim + 3 * dim * ffn_dim + 2 * dim)
int64_t transformer_param_count(const TransformerConfig& c);
// Training FLOPs per token for MFU (docs/transformer.md): 6 * (params - vocab * dim) for the
// GEMMs (the embedding lookup is not a GEMM; the head is) plus 12 * layers * heads * head_dim *
// seq_len for attention's two score GEMMs, counted in full although the mask is causal.
double transformer_flops_per_token(const TransformerConfig& c);

// Normal(0, std), element j a pure function of (seed, j): the same values whatever the world
// size (see uniform_init in fsdp/nn/layers.h).
std::vector<float> normal_init(uint64_t seed, int64_t n, float std);
// The same values, made when the param first needs them (Note [Lazy initial values]).
ParamInit normal_init_fn(uint64_t seed, int64_t n, float std);
// Init: Normal(0, 0.02) for the embedding and every linear except the two that write into the
// residual stream, wo and w2, whose std shrinks with depth as torchtitan's depth init does
// (layer i, 0-based): 0.02 / sqrt(2 * (i + 1)). Norm weights start at 1.
constexpr float kTransformerInitStd = 0.02f;
float residual_projection_init_std(int layer);

// out[r,:] = weight[ids[r],:]. The input is int32 token ids ([tokens, 1], DType::I32); the
// backward returns no input gradient.
class Embedding : public Module {
 public:
  Embedding(int64_t vocab, int64_t dim, uint64_t seed);
  Param& weight() const { return *params()[0]; }

 protected:
  Tensor forward_impl(RunContext& ctx, const Tensor& ids) override;
  Tensor backward_impl(RunContext& ctx, const Tensor& dy, bool input_grad) override;
  void drop_own_saved(ActivationCheckpoint what) override;

 private:
  int64_t vocab_, dim_;
  Tensor saved_ids_;
};

// y = x / sqrt(mean(x^2) + eps) * weight
class RMSNorm : public Module {
 public:
  RMSNorm(int64_t dim, float eps);
  Param& weight() const { return *params()[0]; }

  // The residual add before the norm fused into it: h = x + residual (returned through h), then
  // y = norm(h). Runs the module's hooks as forward() does.
  Tensor forward_add(RunContext& ctx, const Tensor& x, const Tensor& residual, Tensor& h);
  // backward() whose input gradient also takes the residual path's gradient: returns
  // dresidual + d(norm)/dh. Pairs with either forward.
  Tensor backward_add(RunContext& ctx, const Tensor& dy, const Tensor& dresidual);
  // A selective checkpoint (Note [Activation checkpointing]) dropped this norm's output, the
  // saved input of `consumer`: make it again from the norm's kept input and hand it back. The
  // same kernel, so the same values (the fused residual add stores h rounded before
  // normalizing it, as the plain norm reads it). Nothing when consumer still has it.
  void remake_output_for(RunContext& ctx, Linear& consumer);
  // Note [Fused amax]: the weights of the GEMMs that read this norm's output (as X) and its
  // input gradient (as dY). Where one is a tensorwise fp8 GEMM, the norm's kernel takes the
  // amax of what it writes, and the GEMM's cast reads it instead of passing over the tensor.
  void set_fp8_output_reader(const Param* w) { output_reader_ = w; }
  void set_fp8_input_grad_reader(const Param* w) { input_grad_reader_ = w; }

 protected:
  Tensor forward_impl(RunContext& ctx, const Tensor& x) override;
  Tensor backward_impl(RunContext& ctx, const Tensor& dy, bool input_grad) override;
  void drop_own_saved(ActivationCheckpoint what) override;

 private:
  Tensor backward_common(RunContext& ctx, const Tensor& dy, const Tensor* dresidual);

  int64_t dim_;
  float eps_;
  Tensor saved_x_, saved_rstd_;
  const Param* output_reader_ = nullptr;
  const Param* input_grad_reader_ = nullptr;
};

// Note [Tied embeddings]
// With tie_embeddings the head's weight is the embedding's: one Param, [vocab, dim], owned by
// the Embedding, which TiedHead uses as a Linear's weight. Both live in the root's FSDP unit,
// so one all-gather serves the embedding (first in forward) and the head (last), and the
// param is one sharded tensor like any other. Its gradient has two contributions in one
// backward: the head's (dy^T x, first) and the embedding's (the scatter-add of the token
// rows, last). TiedHead marks the param as used twice (Param::add_use), so its group counts
// two grads for it before it is complete, sums them, and only then reduce-scatters
// (ParamGroup::on_grad): never before the second contribution. With micro-batches each
// backward sums its two, and no-sync accumulation adds the sums as for any param. Without
// FSDP, Param::set_grad accumulates the two into Param::grad. A checkpoint holds the one
// param; Hugging Face files of tied models have no lm_head.weight.
class TiedHead : public Module {
 public:
  explicit TiedHead(Param& embedding_weight);

 protected:
  Tensor forward_impl(RunContext& ctx, const Tensor& x) override;
  Tensor backward_impl(RunContext& ctx, const Tensor& dy, bool input_grad) override;

 private:
  Param& weight_;
  int64_t vocab_, dim_;
  Tensor saved_x_;
};

// wo(attention(rope(q), rope(k), v)) with [q | k | v] = wqkv(x) (+ wqkv's bias with
// attention_bias), causal, grouped-query.
class Attention : public Module {
 public:
  Attention(const TransformerConfig& c, int layer);
  // Its input (wqkv's), which a selective checkpoint drops and hands back (Linear's).
  Linear& input_projection() const { return *wqkv_; }
  Linear& output_projection() const { return *wo_; }  // wo: its dY is the block's dh
  int64_t kv_width() const { return kv_heads_ * head_dim_; }
  // CachedBlock's: the new tokens' q, k and v from wqkv, RoPE at their positions
  // (Device::rope_at), the attention against the cache (Device::attention_kv_cache), wo.
  Tensor forward_cached(RunContext& ctx, const Tensor& x, LayerKvCache& cache, int64_t position);

 protected:
  Tensor forward_impl(RunContext& ctx, const Tensor& x) override;
  Tensor backward_impl(RunContext& ctx, const Tensor& dy, bool input_grad) override;
  void drop_own_saved(ActivationCheckpoint what) override;

 private:
  int64_t heads_, kv_heads_, head_dim_, seq_len_;
  std::vector<float> inv_freq_;  // RoPE's, head_dim / 2 (rope_inv_freq)
  Linear* wqkv_;
  Linear* wo_;
  Tensor saved_qkv_;  // after RoPE: what the attention op read
  Tensor saved_out_;
  Tensor saved_lse_;
};

// w2(silu(x w1^T) * (x w3^T)), with w1 and w3 fused into one GEMM (w13).
class FeedForward : public Module {
 public:
  FeedForward(int64_t dim, int64_t ffn_dim, uint64_t seed, float w2_std);
  // Its input (w13's), which a selective checkpoint drops and hands back (Linear's).
  Linear& input_projection() const { return *w13_; }
  Linear& output_projection() const { return *w2_; }  // w2: its dY is the block's output grad

 protected:
  Tensor forward_impl(RunContext& ctx, const Tensor& x) override;
  Tensor backward_impl(RunContext& ctx, const Tensor& dy, bool input_grad) override;
  // Selective: SwiGLU's output (w2's input), remade from w13's output in backward.
  void drop_own_saved(ActivationCheckpoint what) override;
  // Full: w13 and SwiGLU again; w2 keeps its input and skips its GEMM.
  void recompute_impl(RunContext& ctx, const Tensor& x) override;

 private:
  // silu(x w1^T) * (x w3^T): w2's input. Keeps w13's output for backward.
  Tensor swiglu(RunContext& ctx, const Tensor& x);
  int64_t ffn_dim_;
  Linear* w13_;
  Linear* w2_;
  Tensor saved_h13_;
};

// Note [Fused amax]: what a decoder's builder links between neighbouring blocks, so that a
// block's input gradient (made by its attention_norm's backward) carries the amax the block
// before it needs for its last GEMM's dY.
class DecoderBlock {
 public:
  virtual ~DecoderBlock() = default;
  // The weight of the GEMM that reads this block's input gradient as its dY.
  virtual void set_input_grad_reader(const Param* w) = 0;
  // The weight of the Linear whose dY is this block's output gradient; null where the block
  // ends in something else (an MoE layer's combine).
  virtual const Param* output_projection_weight() const = 0;
};

// h = x + attention(attention_norm(x)); out = h + feed_forward(ffn_norm(h)). The first residual
// add runs fused into ffn_norm, and both backward residual adds into the norms' backward.
// Selective checkpointing (Note [Activation checkpointing]) drops the two norms' outputs (the
// attention's and the FFN's inputs) and SwiGLU's output, and keeps the GEMMs' and attention's
// outputs, the residual sum and the block's input (docs/memory.md).
// Its forward_cached (Note [KV cache]) is the same block with the attention's cached forward.
class TransformerBlock : public Module, public CachedBlock, public DecoderBlock {
 public:
  TransformerBlock(const TransformerConfig& c, int layer);
  int64_t kv_width() const override { return attention_->kv_width(); }
  void set_input_grad_reader(const Param* w) override;
  const Param* output_projection_weight() const override;  // w2's
  Tensor forward_cached(RunContext& ctx, const Tensor& x, LayerKvCache& cache,
                        int64_t position) override;

 protected:
  Tensor forward_impl(RunContext& ctx, const Tensor& x) override;
  Tensor backward_impl(RunContext& ctx, const Tensor& dy, bool input_grad) override;
  void drop_own_saved(ActivationCheckpoint what) override;
  // Full: the block up to the FFN, whose recompute stops before its last GEMM; the
  // residual add after it is left out (the block's output is not needed).
  void recompute_impl(RunContext& ctx, const Tensor& x) override;

 private:
  // The block's math around its attention, attend(attention_norm(x)), for both forwards.
  template <typename Attend>
  Tensor forward_with(RunContext& ctx, const Tensor& x, Attend&& attend);
  // Its first half: ffn_norm(h), with h = x + attend(attention_norm(x)).
  template <typename Attend>
  Tensor ffn_input(RunContext& ctx, const Tensor& x, Attend&& attend, Tensor& h);

  RMSNorm* attention_norm_;
  Attention* attention_;
  RMSNorm* ffn_norm_;
  FeedForward* feed_forward_;
};

// The seed of one parameter's init: distinct streams for each (layer, role) from the model's
// seed. Layer -1 is the root (embedding, head).
enum class InitRole : int { Embedding, Output, Wqkv, Wo, FeedForward };
uint64_t transformer_param_seed(uint64_t seed, int layer, InitRole role);

}  // namespace fsdp::nn
