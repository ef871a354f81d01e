#include "fsdp/nn/model.h"

#include "fsdp/error.h"

namespace fsdp::nn {

Model::Model(const ModelConfig& c) : Module("Model"), config_(c), output_dim_(c.dim) {}

void Model::set_embedding(std::string name, std::unique_ptr<Module> embedding) {
  FSDP_CHECK(!embedding_ && blocks_.empty(), "the embedding comes first, once");
  embedding_ = &add_child(std::move(name), std::move(embedding));
}

Module& Model::add_block(std::unique_ptr<Module> block) {
  FSDP_CHECK(!final_norm_ && !head_, "blocks come before the final norm and the head");
  Module& b = add_child("layers." + std::to_string(blocks_.size()), std::move(block));
  blocks_.push_back(&b);
  return b;
}

void Model::set_final_norm(std::string name, std::unique_ptr<Module> norm) {
  FSDP_CHECK(!final_norm_ && !head_, "the final norm comes before the head, once");
  final_norm_ = &add_child(std::move(name), std::move(norm));
}

void Model::set_head(std::string name, std::unique_ptr<Module> head) {
  FSDP_CHECK(!head_, "a model has one head");
  head_ = &add_child(std::move(name), std::move(head));
}

void Model::set_output(int64_t dim, bool cross_entropy) {
  output_dim_ = dim;
  cross_entropy_ = cross_entropy;
}

int64_t Model::param_count() {
  int64_t n = 0;
  for (Param* p : all_params()) n += p->numel();
  return n;
}

ActivationCheckpoint ActivationCheckpointConfig::of_block(int layer) const {
  if (mode != ActivationCheckpoint::Full) return mode;
  return every >= 1 && layer % every == 0 ? ActivationCheckpoint::Full : ActivationCheckpoint::None;
}

std::string ActivationCheckpointConfig::to_string() const {
  if (mode == ActivationCheckpoint::Full && every > 1) return "every:" + std::to_string(every);
  return activation_checkpoint_name(mode);
}

namespace {

[[noreturn]] void bad_activation_checkpoint(const std::string& text) {
  throw OptionError("activation_checkpoint",
                    " must be none, full, every:N (N >= 1: every N-th block) or selective, got '" +
                        text + "'");
}

}  // namespace

ActivationCheckpointConfig parse_activation_checkpoint(const std::string& text) {
  ActivationCheckpointConfig c;
  if (text == "none") return c;
  if (text == "full" || text == "selective") {
    c.mode = text == "full" ? ActivationCheckpoint::Full : ActivationCheckpoint::Selective;
    return c;
  }
  const std::string prefix = "every:";
  if (text.rfind(prefix, 0) != 0) bad_activation_checkpoint(text);
  const std::string n = text.substr(prefix.size());
  // Digits only, at most 9 of them (no sign, no spaces, no overflow).
  if (n.empty() || n.size() > 9 || n.find_first_not_of("0123456789") != std::string::npos)
    bad_activation_checkpoint(text);
  c.mode = ActivationCheckpoint::Full;
  c.every = std::stoi(n);
  if (c.every < 1) bad_activation_checkpoint(text);
  return c;
}

void check_activation_checkpoint(const ActivationCheckpointConfig& c) {
  if (c.mode == ActivationCheckpoint::Full && c.every < 1)
    throw OptionError("activation_checkpoint",
                      detail::concat(" every:N needs N >= 1 (every N-th block), got ", c.every));
}

void apply_activation_checkpointing(Model& model, const ActivationCheckpointConfig& config) {
  check_activation_checkpoint(config);
  const std::vector<Module*>& blocks = model.blocks();
  for (size_t i = 0; i < blocks.size(); ++i)
    blocks[i]->set_activation_checkpoint(config.of_block(static_cast<int>(i)));
}

Tensor Model::forward_impl(RunContext& ctx, const Tensor& x) {
  Tensor h = x;
  if (embedding_) h = embedding_->forward(ctx, h);
  for (Module* b : blocks_) h = b->forward(ctx, h);
  if (final_norm_) h = final_norm_->forward(ctx, h);
  if (head_) h = head_->forward(ctx, h);
  return h;
}

Tensor Model::backward_impl(RunContext& ctx, const Tensor& dy, bool input_grad) {
  Tensor g = dy;
  if (head_) g = head_->backward(ctx, g);
  if (final_norm_) g = final_norm_->backward(ctx, g);
  // The first block computes d(loss)/d(input) only if the caller (or the embedding) wants it.
  const bool first_input_grad = input_grad || embedding_ != nullptr;
  for (auto it = blocks_.rbegin(); it != blocks_.rend(); ++it)
    g = (*it)->backward(ctx, g, first_input_grad || std::next(it) != blocks_.rend());
  if (embedding_) g = embedding_->backward(ctx, g, false);  // token ids: no gradient
  // Weight grads that blocks deferred (MoeGradOrder::ExpertsDeferred) are computed last.
  visit([&](Module& m) {
    if (auto* lin = dynamic_cast<Linear*>(&m)) lin->flush_deferred_grads(ctx);
  });
  release_deferred_expert_grads(ctx);
  return g;
}

}  // namespace fsdp::nn
