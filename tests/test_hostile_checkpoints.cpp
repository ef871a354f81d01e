// Checkpoints crafted with valid checksums (CRC-32 is no secret): a rank file whose tensor
// is wider than the param it loads into, an index.json whose shapes its rank files do not
// cover, an index without its fields or with negative sizes. `--resume` and `fsdp export`
// end each in one plain line and exit 1, never a crash, a half-zero tensor or a library's
// words (Note [Checkpoint index checks], Note [Checked JSON]).
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <functional>

#include <nlohmann/json.hpp>

#include "command_util.h"
#include "crafted_checkpoint.h"
#include "test_checkpoint_util.h"

namespace fsdp::testing {
namespace {

const std::string kRun =
    "train --backend cpu --world-size 2 --model mlp --layers 2 --dim 32 --tokens 32 ";

// A 2-rank checkpoint of kRun after 3 steps, made once; each test changes a copy.
const std::string& base() {
  static const std::string dir = [] {
    const std::string d = fresh_dir("hostile_base");
    const CommandResult r = run_fsdp_command(kRun + "--steps 3 --quiet --save-dir " + d);
    EXPECT_EQ(r.code, 0) << r.output;
    return d;
  }();
  return dir;
}

std::string copy_of_base(const std::string& name) {
  const std::string dir = fresh_dir("hostile_" + name);
  std::filesystem::copy(base(), dir, std::filesystem::copy_options::recursive);
  return dir;
}

void expect_one_line_error(const CommandResult& r, const std::vector<std::string>& expect) {
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
  EXPECT_EQ(r.output.find("internal error"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("json.exception"), std::string::npos) << r.output;
  for (const std::string& e : expect)
    EXPECT_NE(r.output.find(e), std::string::npos) << e << ": " << r.output;
}

// --resume and export of `dir` both fail in one line holding each of `expect`.
void expect_refused(const std::string& dir, const std::vector<std::string>& expect) {
  SCOPED_TRACE(dir);
  expect_one_line_error(run_fsdp_command(kRun + "--steps 5 --resume " + dir), expect);
  const std::string out =
      dir + "/../" + std::filesystem::path(dir).filename().string() + ".safetensors";
  expect_one_line_error(run_fsdp_command("export --checkpoint " + dir + " --out " + out), expect);
  EXPECT_FALSE(std::filesystem::exists(out)) << "nothing is written";
}

// Rewrites step 3's index.json with `change`, and COMPLETE to match it.
void change_index(const std::string& dir, const std::function<void(nlohmann::json&)>& change) {
  const std::string step = dir + "/step-000003";
  nlohmann::json index = nlohmann::json::parse(slurp(step + "/index.json"));
  change(index);
  spill(step + "/index.json", index.dump(1) + "\n");
  reseal(step);
}

nlohmann::json& tensor_entry(nlohmann::json& index, const std::string& name) {
  for (nlohmann::json& t : index["tensors"])
    if (t["name"] == name) return t;
  throw std::runtime_error("no " + name);
}

TEST(HostileCheckpoint, ARowWiderThanTheParamIsRefusedByResumeAndExport) {
  const std::string dir = copy_of_base("wide_rows");
  const std::string file = dir + "/step-000003/rank-00000.safetensors";
  RawSafetensors f = RawSafetensors::read(file);
  std::vector<CraftedTensor> tensors = tensors_of(f);
  for (CraftedTensor& t : tensors)
    if (t.name == "layers.0.weight") {
      ASSERT_EQ(t.shape, (std::vector<int64_t>{16, 32}));
      t.shape = {16, 1024};  // the same 16 rows, each 32 times as wide: 65,536 bytes
      t.bytes = std::string(16 * 1024 * 4, '\x3f');
    }
  nlohmann::ordered_json meta = f.header["__metadata__"];
  meta.erase(checkpoint::kChunkCrcKey);
  craft_safetensors(tensors, meta).write(file);  // valid chunk CRCs
  reseal(dir + "/step-000003");                  // and a valid COMPLETE
  expect_refused(dir, {"rank-00000.safetensors", "layers.0.weight", "[16, 1024]", "16 rows of 32"});
}

TEST(HostileCheckpoint, ExportRefusesIndexShapesThatTheRankFilesDoNotHold) {
  // Wider than the rank files' rows: once a half-zero tensor, exit 0.
  std::string dir = copy_of_base("index_wider");
  change_index(dir, [](nlohmann::json& j) {
    tensor_entry(j, "layers.0.weight")["shape"] = {32, 64};
  });
  expect_one_line_error(
      run_fsdp_command("export --checkpoint " + dir + " --out " + dir + "/x.safetensors"),
      {"rank-00000.safetensors", "layers.0.weight", "16 rows of 64"});
  EXPECT_FALSE(std::filesystem::exists(dir + "/x.safetensors"));
  // Far more rows than the ranks hold: once 2 GiB written; now refused before any allocation.
  dir = copy_of_base("index_huge");
  change_index(dir, [](nlohmann::json& j) {
    tensor_entry(j, "layers.0.weight")["shape"] = {16384, 32768};
  });
  expect_one_line_error(
      run_fsdp_command("export --checkpoint " + dir + " --out " + dir + "/x.safetensors"),
      {"index.json", "tensors[2].ranks", "16384 rows"});
  // Ranges that leave a hole, or cover rows twice.
  for (const nlohmann::json& ranks :
       {nlohmann::json{{0, 16}, {20, 32}}, nlohmann::json{{0, 20}, {16, 32}},
        nlohmann::json{{0, 16}, {0, 16}}}) {
    dir = copy_of_base("index_ranges");
    change_index(dir,
                 [&](nlohmann::json& j) { tensor_entry(j, "layers.1.weight")["ranks"] = ranks; });
    expect_one_line_error(run_fsdp_command(kRun + "--steps 5 --resume " + dir),
                          {"index.json", "tensors[3].ranks", "layers.1.weight"});
  }
}

TEST(HostileCheckpoint, AnIndexWithMissingOrMistypedFieldsGetsAPlainLine) {
  struct Case {
    std::string name;
    std::function<void(nlohmann::json&)> change;
    std::vector<std::string> expect;
  };
  for (const Case& c : std::vector<Case>{
           {"no_tensors",
            [](nlohmann::json& j) { j.erase("tensors"); },
            {"index.json", "tensors is missing"}},
           {"negative_shape",
            [](nlohmann::json& j) {
              tensor_entry(j, "layers.0.weight")["shape"] = {-1, 32};
            },
            {"index.json", "tensors[2].shape[0] must be an integer in [0, "}},
           {"shape_of_strings",
            [](nlohmann::json& j) { tensor_entry(j, "head.bias")["shape"] = {"16"}; },
            {"tensors[1].shape[0] must be an integer", "not a string"}},
           {"ranks_not_pairs",
            [](nlohmann::json& j) {
              tensor_entry(j, "head.bias")["ranks"] = {0, 16};
            },
            {"tensors[1].ranks[0] must be an array"}},
           {"name_a_number",
            [](nlohmann::json& j) { j["tensors"][0]["name"] = 7; },
            {"tensors[0].name must be a string"}},
           {"tensors_an_object",
            [](nlohmann::json& j) { j["tensors"] = nlohmann::json::object(); },
            {"tensors must be an array"}},
           {"config_dtype_a_number",
            [](nlohmann::json& j) { j["config"]["param_dtype"] = 32; },
            {"config.param_dtype must be a string"}},
           {"step_a_string",
            [](nlohmann::json& j) { j["step"] = "3"; },
            {"step must be an integer"}},
       }) {
    SCOPED_TRACE(c.name);
    const std::string dir = copy_of_base("index_" + c.name);
    change_index(dir, c.change);
    // Both commands read the index through open_checkpoint; only a resume reads the run's
    // config. One command each keeps the test short.
    if (c.name == "config_dtype_a_number")
      expect_one_line_error(run_fsdp_command(kRun + "--steps 5 --resume " + dir), c.expect);
    else
      expect_one_line_error(
          run_fsdp_command("export --checkpoint " + dir + " --out " + dir + "/x.safetensors"),
          c.expect);
  }
}

TEST(HostileCheckpoint, AMarkerWithMistypedFieldsGetsAPlainLine) {
  for (const auto& [field, value] :
       std::vector<std::pair<std::string, nlohmann::json>>{{"world_size", -2},
                                                           {"world_size", "2"},
                                                           {"step", 1e300},
                                                           {"files", nlohmann::json::array()}}) {
    SCOPED_TRACE(field + " " + value.dump());
    const std::string dir = copy_of_base("marker_" + field);
    const std::string marker = dir + "/step-000003/COMPLETE";
    nlohmann::json body = nlohmann::json::parse(slurp(marker));
    body[field] = value;
    spill(marker, sealed_marker(body));
    expect_one_line_error(run_fsdp_command(kRun + "--steps 5 --resume " + dir), {"COMPLETE", field});
  }
}

}  // namespace
}  // namespace fsdp::testing
