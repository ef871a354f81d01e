#include "tools/export_command.h"

#include <cctype>
#include <cstdio>
#include <map>

#include "checkpoint/full_weights.h"
#include "models/initial_weights.h"
#include "fsdp/checkpoint.h"
#include "fsdp/error.h"

namespace fsdp::tools {

CLI::App* add_export_command(CLI::App& app, ExportOptions& o) {
  CLI::App* cmd = app.add_subcommand(
      "export",
      "full weights of a checkpoint (or, with --init, a model's initial weights) in one "
      "safetensors file, or a Hugging Face model directory; the transformer gets "
      "Hugging Face names");
  cmd->add_option("--checkpoint", o.checkpoint, "a checkpoint, or a save dir (its latest)");
  cmd->add_flag("--init", o.init, "the initial weights of the model that the train flags describe");
  cmd->add_option("--out", o.out, "the safetensors file to write");
  cmd->add_option("--hf", o.hf,
                  "a Hugging Face model directory to write instead (config.json, "
                  "generation_config.json, shards and their index); it must not exist or be empty");
  cmd->add_option("--max-shard-size", o.max_shard_size,
                  "--hf: the largest shard, as Hugging Face writes it (5GB, 500MB, 2GiB, bytes)");
  cmd->add_option("--dtype", o.dtype, "fp32 | bf16 [default: fp32 for --out, bf16 for --hf]")
      ->check(CLI::IsMember({"fp32", "bf16"}));
  add_train_options(*cmd, o.train);
  return cmd;
}

uint64_t parse_shard_size(const std::string& text) {
  size_t digits = 0;
  while (digits < text.size() && std::isdigit(static_cast<unsigned char>(text[digits]))) ++digits;
  const std::string unit = text.substr(digits);
  static const std::map<std::string, uint64_t> units{{"", 1},
                                                     {"B", 1},
                                                     {"KB", 1000},
                                                     {"kB", 1000},
                                                     {"MB", 1000000},
                                                     {"GB", 1000000000},
                                                     {"KiB", uint64_t{1} << 10},
                                                     {"MiB", uint64_t{1} << 20},
                                                     {"GiB", uint64_t{1} << 30}};
  const auto it = units.find(unit);
  FSDP_USER_CHECK(digits > 0 && digits <= 12 && it != units.end(),
                  "--max-shard-size must be a size such as 5GB, 500MB or 2GiB, got '", text, "'");
  const uint64_t n = std::stoull(text.substr(0, digits));
  FSDP_USER_CHECK(n >= 1, "--max-shard-size must be at least 1 byte, got '", text, "'");
  return n * it->second;
}

int run_export(ExportOptions& o) {
  FSDP_USER_CHECK(o.checkpoint.empty() != !o.init, "export needs exactly one of --checkpoint DIR "
             "and --init");
  FSDP_USER_CHECK(o.out.empty() != o.hf.empty(),
                  "export needs exactly one of --out FILE and "
                  "--hf DIR");
  const std::string dtype_name = !o.dtype.empty() ? o.dtype : o.hf.empty() ? "fp32" : "bf16";
  const DType dtype = parse_dtype(dtype_name);
  if (!o.hf.empty()) {
    const uint64_t shard = parse_shard_size(o.max_shard_size);
    if (o.init)
      models::export_initial_weights_hf(model_config_of(o.train), o.hf, dtype, shard);
    else
      export_checkpoint_hf(o.checkpoint, o.hf, dtype, shard);
    std::printf("wrote %s (%s)\n", o.hf.c_str(), dtype_name.c_str());
    return 0;
  }
  if (o.init)
    models::export_initial_weights(model_config_of(o.train), o.out, dtype);
  else
    export_checkpoint(o.checkpoint, o.out, dtype);
  std::printf("wrote %s (%s)\n", o.out.c_str(), dtype_name.c_str());
  return 0;
}

}  // namespace fsdp::tools
