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
