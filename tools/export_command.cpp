#include "tools/export_command.h"

#include <cstdio>

#include "checkpoint/full_weights.h"
#include "models/initial_weights.h"
#include "fsdp/checkpoint.h"
#include "fsdp/error.h"

namespace fsdp::tools {

CLI::App* add_export_command(CLI::App& app, ExportOptions& o) {
  CLI::App* cmd = app.add_subcommand(
      "export", "full weights of a checkpoint (or, with --init, a model's initial weights) in one "
                "safetensors file; the transformer gets Hugging Face Llama names");
  cmd->add_option("--checkpoint", o.checkpoint, "a checkpoint, or a save dir (its latest)");
  cmd->add_flag("--init", o.init, "the initial weights of the model that the train flags describe");
  cmd->add_option("--out", o.out, "the safetensors file to write")->required();
  cmd->add_option("--dtype", o.dtype, "fp32 | bf16")->check(CLI::IsMember({"fp32", "bf16"}));
  add_train_options(*cmd, o.train);
  return cmd;
}

int run_export(ExportOptions& o) {
  FSDP_USER_CHECK(o.checkpoint.empty() != !o.init, "export needs exactly one of --checkpoint DIR "
             "and --init");
  const DType dtype = parse_dtype(o.dtype);
  if (o.init)
    models::export_initial_weights(model_config_of(o.train), o.out, dtype);
  else
    export_checkpoint(o.checkpoint, o.out, dtype);
  std::printf("wrote %s (%s)\n", o.out.c_str(), o.dtype.c_str());
  return 0;
}

}  // namespace fsdp::tools
