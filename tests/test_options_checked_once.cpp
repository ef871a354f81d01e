// Note [Options checked once]: an option's rule lives where the API takes it and speaks the
// API's names; the command maps the name to its flag. Followed here for one option, the RS
// ring's k, from the flag to the ring.
#include <gtest/gtest.h>

#include <algorithm>

#include "command_util.h"
#include "fsdp/error.h"
#include "models/model_family.h"
#include "test_util.h"

namespace fsdp::testing {
namespace {

TEST(OptionsCheckedOnce, TheApiNamesItsOwnOptionWithNoSourceLocation) {
  runtime::TrainConfig c;
  c.model = tiny_mlp_config(2, 8);
  c.tokens = 4;
  c.steps = 1;
  c.rs_max_input_buffers = 0;
  auto [option, what] = option_error_of([&] { runtime::check_train_config(c, 2); });
  EXPECT_EQ(option, "reduce_scatter_max_input_buffers") << what;
  EXPECT_EQ(what, "reduce_scatter_max_input_buffers must be a positive integer, got 0");
  // FSDP2's own setter raises the same error, from the same rule.
  std::tie(option, what) = option_error_of([&] {
    runtime::run_cpu_ranks(1, {}, [&](int, Device& device, std::shared_ptr<Comm> world) {
      auto model = models::build_model(tiny_mlp_config(1, 4));
      Mesh mesh("dp", device, world);
      fully_shard(*model, mesh).set_reduce_scatter_max_input_buffers(0);
    });
  });
  EXPECT_NE(what.find("reduce_scatter_max_input_buffers must be a positive integer, got 0"),
            std::string::npos)
      << what;
  EXPECT_EQ(what.find(".cpp:"), std::string::npos) << what;  // a user's value, not a bug
  // train_rank checks its config before anything else.
  std::tie(option, what) = option_error_of([&] { run_fsdp(2, c); });
  EXPECT_NE(what.find("reduce_scatter_max_input_buffers must be a positive integer"),
            std::string::npos)
      << what;
}

TEST(OptionsCheckedOnce, TheCommandPutsItsFlagInFront) {
  const CommandResult r = run_fsdp_command(
      "train --backend cpu --world-size 2 --model mlp --layers 2 --dim 8 --tokens 4 --steps 1 "
      "--rs-max-input-buffers 0 --quiet");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.output.find("--rs-max-input-buffers must be a positive integer, got 0"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find(".cpp:"), std::string::npos) << r.output;
  // A model option, raised by the family's resolve(), named as the flag.
  const CommandResult layers = run_fsdp_command(
      "train --backend cpu --world-size 2 --model mlp --layers 0 --dim 8 --tokens 4 --steps 1 --quiet");
  EXPECT_NE(layers.output.find("--layers must be >= 1, got 0"), std::string::npos) << layers.output;
}

// A rule that names several options (the model's validate()): the library's message names
// each as the API spells it and no flag; the command spells every one as its flag.
TEST(OptionsCheckedOnce, AMessageNamingSeveralOptionsIsSpelledByTheCommand) {
  nn::ModelConfig m;
  m.kind = "transformer";
  m.layers = 1;
  m.dim = 64;
  m.heads = 3;
  auto [option, what] = option_error_of([&] { models::resolved(m); });
  EXPECT_EQ(option, "dim") << what;
  EXPECT_EQ(what, "dim (64) must be a multiple of heads (3)");
  try {
    models::resolved(m);
  } catch (const OptionError& e) {
    EXPECT_EQ(e.spelled([](const std::string& name) { return "<" + name + ">"; }),
              "<dim> (64) must be a multiple of <heads> (3)");
  }
  const CommandResult r = run_fsdp_command(
      "train --backend cpu --world-size 1 --model transformer --layers 1 --dim 64 --heads 3 "
      "--steps 1 --quiet");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.output.find("--dim (64) must be a multiple of --heads (3)"), std::string::npos)
      << r.output;
  EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
}

}  // namespace
}  // namespace fsdp::testing
