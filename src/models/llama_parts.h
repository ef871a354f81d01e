// The parts the decoder families share (llama.cpp defines them): the embedding, the final
// norm and head, the attention's FLOPs and saved bytes, the shape fields, the Hugging Face
// names.
#pragma once

#include <nlohmann/json.hpp>

#include "fsdp/nn/model.h"
#include "fsdp/nn/transformer.h"
#include "models/model_family.h"

namespace fsdp::models {

void resolve_decoder(nn::ModelConfig& c);
void add_decoder_embedding(nn::Model& root, const nn::TransformerConfig& c);
void add_decoder_head(nn::Model& root, const nn::TransformerConfig& c);
double decoder_attention_flops_per_token(const nn::TransformerConfig& c);
double attention_saved_bytes_per_token(const nn::TransformerConfig& c, DType act);
// A dense decoder block's (attention, then the SwiGLU FFN).
double dense_block_saved_bytes_per_token(const nn::TransformerConfig& c, DType act);
// ModelFamily::block_fp8_saved_delta_per_token of a decoder block: wo's codes beside the
// attention output, which attention keeps too, and, for each Linear input only its Linear
// keeps (wqkv's and, with a dense FFN, w13's and w2's), one byte in place of an element,
// unless the mode dropped them. MoE layers' experts keep their inputs (Note [Fp8 experts]).
double decoder_fp8_saved_delta_per_token(const nn::TransformerConfig& c, bool dense_ffn,
                                         DType act, ActivationCheckpoint mode);
// What selective checkpointing drops from a decoder block, per token (Note [Activation
// checkpointing]): the two norms' outputs and SwiGLU's output, `swiglu_width` wide (ffn_dim,
// or top_k x an expert's for an MoE layer's routed copies).
double selective_dropped_bytes_per_token(const nn::TransformerConfig& c, double swiglu_width,
                                         DType act);
// What a decoder block's backward holds at once beyond its saved set, per token: SwiGLU's
// gradients, `swiglu_width` wide (ModelFamily::block_backward_bytes_per_token).
double swiglu_backward_bytes_per_token(double swiglu_width, DType act);
nlohmann::json decoder_shape_fields(const ModelFamily& f, const nn::ModelConfig& m);
void read_decoder_shape_fields(const nlohmann::json& j, nn::ModelConfig& m);
checkpoint::HfNames decoder_hf_names(const nn::TransformerConfig& c);
// llama_hf.cpp: the keys of a config.json of model_type llama, qwen2 or mistral.
void read_decoder_hf_config(const std::string& model_type, HfKeys& keys, nn::ModelConfig& m);
// ... and the config.json that reads back as `m`: model_type qwen2 with biases, mistral with a
// sliding window, else llama.
nlohmann::json decoder_hf_config(const nn::ModelConfig& m, DType dtype);

}  // namespace fsdp::models
