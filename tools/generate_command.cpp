#include "tools/generate_command.h"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <optional>

#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend.h"
#include "fsdp/error.h"
#include "generate/generator.h"
#include "io/file_io.h"
#include "models/hf_config.h"
#include "tokenizer/tokenizer.h"
#include "tools/train_command.h"

namespace fsdp::tools {

CLI::App* add_generate_command(CLI::App& app, GenerateCommandOptions& o) {
  CLI::App* cmd = app.add_subcommand(
      "generate",
      "text from a model, with a KV cache, through its tokenizer; one rank (the model whole on "
      "one device, unsharded)");
  cmd->add_option("--init-from", o.init_from,
                  "the model: a Hugging Face directory (config.json, model.safetensors or its "
                  "shards and index), or a safetensors file with --hf-config")
      ->required();
  cmd->add_option("--hf-config", o.hf_config,
                  "the config.json of the model, for --init-from FILE [default: --init-from "
                  "DIR's]");
  cmd->add_option("--tokenizer", o.tokenizer,
                  "the model's tokenizer: tokenizer.json, a SentencePiece .model, or a directory "
                  "holding one [default: the one in --init-from DIR]");
  auto* prompt = cmd->add_option("--prompt", o.prompt, "the text to continue");
  auto* ids =
      cmd->add_option("--input-ids", o.input_ids,
                      "the prompt as token ids, comma-separated (Hugging Face's input_ids), "
                      "instead of --prompt: no tokenizer is read unless --tokenizer is "
                      "given, and without one generation stops at --max-new-tokens only");
  prompt->excludes(ids);
  ids->excludes(prompt);

  cmd->add_option("--max-new-tokens", o.max_new_tokens, "tokens to generate (at most)");
  cmd->add_option("--temperature", o.temperature,
                  "0: greedy (the most likely token); else sample from softmax(logits / T)");
  cmd->add_option("--top-p", o.top_p,
                  "sample only from the most likely tokens whose probabilities reach P, in (0, 1]");
  cmd->add_option("--seed", o.seed, "the sampling's seed: the same seed, the same text");
  cmd->add_option("--backend", o.backend, "cpu | cuda | auto (cuda when a GPU is visible)")
      ->check(CLI::IsMember({"cpu", "cuda", "auto"}));
  cmd->add_option("--dtype", o.dtype, "the weights and activations: fp32 | bf16")
      ->check(CLI::IsMember({"fp32", "bf16"}));
  cmd->add_flag("--ignore-eos", o.ignore_eos,
                "make --max-new-tokens tokens even past the tokenizer's end-of-sequence token");
  cmd->add_flag("--no-special-tokens", o.no_special_tokens,
                "encode the prompt without the tokens the tokenizer puts around every text "
                "(Llama 3's <|begin_of_text|>, SentencePiece's <s>)");
  cmd->add_flag("--no-kv-cache", o.no_kv_cache,
                "recompute the whole sequence for every token (slow; to check the KV cache)");
  cmd->add_option("--json", o.json_path,
                  "also write the prompt's and the new tokens' ids and the text to this file");
  return cmd;
}

namespace {

nn::ModelConfig model_of(const GenerateCommandOptions& o) {
  FSDP_USER_CHECK(io::path_exists(o.init_from), "--init-from '", o.init_from, "' does not exist");
  const std::string in_dir = models::hf_config_in(o.init_from);
  FSDP_USER_CHECK(o.hf_config.empty() || in_dir.empty(), "--hf-config '", o.hf_config,
                  "' and --init-from '", o.init_from,
                  "' (whose config.json sets the model) both set the model: give one of them");
  const std::string file = o.hf_config.empty() ? in_dir : o.hf_config;
  FSDP_USER_CHECK(!file.empty(), "--init-from '", o.init_from,
                  "' has no config.json: give a Hugging Face directory (`fsdp export "
                  "--checkpoint CKPT --hf DIR --dtype fp32` makes one of a checkpoint), or the "
                  "model's config.json with --hf-config");
  nn::ModelConfig m;
  models::apply_hf_config(file, m);
  return m;
}

tokenizer::LoadedTokenizer tokenizer_of(const GenerateCommandOptions& o) {
  std::string path = o.tokenizer;
  if (path.empty() && io::is_directory(o.init_from))
    for (const char* name : {"tokenizer.json", "tokenizer.model"}) {
      const std::string in = o.init_from + "/" + name;
      if (io::path_exists(in)) {
        path = o.init_from;
        break;
      }
    }
  FSDP_USER_CHECK(!path.empty(),
                  "generate needs the model's tokenizer: --tokenizer FILE, or a "
                  "tokenizer.json or tokenizer.model in the --init-from directory");
  return tokenizer::load_tokenizer(path);
}

std::unique_ptr<Device> make_device(const std::string& backend,
                                    std::unique_ptr<cpu::CpuWorld>& world, std::string& chosen) {
  chosen = backend;
  if (backend == "auto")
    chosen = cuda::compiled_with_cuda() && cuda::device_count() > 0 ? "cuda" : "cpu";
  if (chosen == "cuda") {
    FSDP_USER_CHECK(
        cuda::compiled_with_cuda(),
        "--backend cuda: this build has no CUDA backend (nvcc or NCCL missing at build time)");
    FSDP_USER_CHECK(cuda::device_count() > 0, "--backend cuda: no GPU is visible");
    return cuda::make_device(0);
  }
  cpu::CpuOptions options;
  options.checked = false;  // one model's forward, nothing freed early to catch
  world = std::make_unique<cpu::CpuWorld>(1, options);
  return world->make_device(0);
}

// --input-ids "1,2,3": each a decimal id below the model's vocabulary, nothing else.
std::vector<uint32_t> parse_input_ids(const std::string& text, int64_t vocab) {
  std::vector<uint32_t> ids;
  size_t at = 0;
  while (at <= text.size()) {
    const size_t comma = std::min(text.find(',', at), text.size());
    const std::string item = text.substr(at, comma - at);
    int64_t id = -1;
    const auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), id);
    FSDP_OPTION_CHECK(!item.empty() && ec == std::errc() && end == item.data() + item.size() &&
                          id >= 0 && id < vocab,
                      OptionName{"input_ids"}, ": '", item, "' (item ", ids.size() + 1,
                      ") is not a token id in [0, ", vocab, ")");
    ids.push_back(static_cast<uint32_t>(id));
    at = comma + 1;
  }
  return ids;
}

// The continuation as the whole sequence decodes past the prompt: a SentencePiece piece's
// leading space is dropped when the piece is decoded alone.
// A model's vocabulary may be padded past its tokenizer's (Qwen2.5's 151,936 rows for
// 151,665 tokens): ids the tokenizer lacks have no text and are left out of it, as Hugging
// Face's decode leaves them (the --json file keeps every id).
std::string continuation(const tokenizer::Tokenizer& tok, const std::vector<uint32_t>& prompt,
                         const std::vector<int32_t>& generated) {
  std::vector<uint32_t> new_ids;
  for (int32_t id : generated)
    if (id < tok.vocab_size()) new_ids.push_back(static_cast<uint32_t>(id));
  std::vector<uint32_t> ids(prompt);
  ids.insert(ids.end(), new_ids.begin(), new_ids.end());
  const std::string whole = tok.decode(ids, /*skip_special_tokens=*/true);
  const std::string before = tok.decode(prompt, /*skip_special_tokens=*/true);
  return whole.starts_with(before) ? whole.substr(before.size())
                                   : tok.decode(new_ids, /*skip_special_tokens=*/true);
}

// Without a tokenizer the new tokens print as their ids.
std::string ids_text(const std::vector<int32_t>& ids) {
  std::string text;
  for (int32_t id : ids) text += (text.empty() ? "" : " ") + std::to_string(id);
  return text;
}

}  // namespace

int run_generate(const GenerateCommandOptions& o) {
  if (!o.json_path.empty()) check_writable("--json", o.json_path);
  generate::GenerateOptions g;
  g.max_new_tokens = o.max_new_tokens;
  g.sampling = {o.temperature, o.top_p, o.seed};
  g.kv_cache = !o.no_kv_cache;
  try {
    // The cheap checks first: bad numbers are refused before a model is read.
    generate::check_sampling(g.sampling);
    FSDP_OPTION_CHECK(g.max_new_tokens >= 1, OptionName{"max_new_tokens"}, " must be >= 1, got ",
                      g.max_new_tokens);
    FSDP_OPTION_CHECK(!o.prompt.empty() || !o.input_ids.empty(), "give the ", OptionName{"prompt"},
                      " (text) or the ", OptionName{"input_ids"},
                      ": generation continues a prompt of at least one token");
    const nn::ModelConfig model = model_of(o);
    // With --input-ids, the tokenizer is read only when named: a build without a tokenizer.json
    // reader still generates from ids.
    std::optional<tokenizer::LoadedTokenizer> tok;
    if (o.input_ids.empty() || !o.tokenizer.empty()) tok = tokenizer_of(o);
    if (tok)
      FSDP_USER_CHECK(tok->tokenizer->vocab_size() <= model.vocab, "the tokenizer (",
                      tok->tokenizer->description(), ") has ", tok->tokenizer->vocab_size(),
                      " ids, more than the model's vocabulary of ", model.vocab,
                      ": another model's tokenizer?");
    std::vector<uint32_t> encoded;
    if (!o.input_ids.empty())
      encoded = parse_input_ids(o.input_ids, model.vocab);
    else
      encoded = tok->tokenizer->encode(o.prompt, !o.no_special_tokens);
    const std::vector<int32_t> prompt(encoded.begin(), encoded.end());
    if (tok && !o.ignore_eos)
      if (const std::optional<uint32_t> eos = tok->tokenizer->eos_id())
        g.eos_id = static_cast<int32_t>(*eos);
    std::unique_ptr<cpu::CpuWorld> world;
    std::string backend;
    std::unique_ptr<Device> device = make_device(o.backend, world, backend);
    generate::DecoderModel decoder(*device, model, parse_dtype(o.dtype), o.init_from);
    generate::check_generation(decoder.config(), decoder.max_positions(), prompt, g);
    const auto start = std::chrono::steady_clock::now();
    const generate::Generation out = decoder.generate(prompt, g);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    // The continuation as the whole sequence decodes past the prompt: a SentencePiece piece's
    // leading space is dropped when the piece is decoded alone.
    // A model's vocabulary may be padded past its tokenizer's (Qwen2.5's 151,936 rows for
    // 151,665 tokens): ids the tokenizer lacks have no text and are left out of it, as Hugging
    // Face's decode leaves them (the --json file keeps every id).
    const std::string text =
        tok ? continuation(*tok->tokenizer, encoded, out.tokens) : ids_text(out.tokens);
    std::printf("%s%s\n", tok && !o.prompt.empty() ? o.prompt.c_str() : "", text.c_str());
    std::fflush(stdout);
    if (!o.json_path.empty()) {
      nlohmann::json j = {{"backend", backend},     {"dtype", o.dtype},
                          {"prompt_ids", prompt},   {"new_ids", out.tokens},
                          {"text", text},           {"stopped_at_eos", out.stopped_at_eos},
                          {"kv_cache", g.kv_cache}, {"seconds", seconds}};
      // A prefix of a character's tokens need not be whole UTF-8: such bytes become U+FFFD
      // in the file (the ids are exact).
      io::write_file_atomic(o.json_path,
                            j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
    }
    return 0;
  } catch (const OptionError& e) {  // Note [Options checked once]: the flags' names
    throw UserError(e.spelled(flag_of));
  }
}

}  // namespace fsdp::tools
