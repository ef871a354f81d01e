// A seeded generator of mutated checkpoints and full-weight files: shapes, dtypes, offsets,
// header sizes, chunk checksums, index entries, COMPLETE fields, nesting, truncation. Most
// cases get valid checksums again (CRC-32 is no secret), so that they reach the loader past
// the checksums. Each case is resumed (load_checkpoint into exactly sized shards of a world of
// 1 to 3 ranks), exported, or loaded as --init-from; it must load, or end in one UserError of
// one line. Never another exception, and under scripts/sanitize.sh (ASan + UBSan) never a
// memory error. A few cases also run the command, which must exit 0, or 1 with one line.
//
//   FSDP_FUZZ_ITERATIONS=20000 FSDP_FUZZ_SEED=7 build/fsdp_tests --gtest_filter='CheckpointFuzz.*'
//
// runs longer by hand (the default: 200 cases, about 4 s under ASan on a busy 2-core
// machine); a failure prints the seed and case that reproduce it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>
#include <random>

#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint_loader.h"
#include "checkpoint/full_weights.h"
#include "command_util.h"
#include "crafted_checkpoint.h"
#include "fsdp/checkpoint.h"
#include "fsdp/error.h"
#include "io/safetensors.h"
#include "models/model_family.h"
#include "test_checkpoint_util.h"

namespace fsdp::testing {
namespace {

namespace fs = std::filesystem;

int64_t env_or(const char* name, int64_t fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::strtoll(v, nullptr, 10) : fallback;
}

class Rng {
 public:
  explicit Rng(uint64_t seed) : gen_(seed) {}
  int64_t below(int64_t n) { return static_cast<int64_t>(gen_() % static_cast<uint64_t>(n)); }
  bool chance(double p) { return std::uniform_real_distribution<double>(0, 1)(gen_) < p; }
  template <typename T>
  T pick(const std::vector<T>& v) {
    return v[static_cast<size_t>(below(static_cast<int64_t>(v.size())))];
  }
  std::string bytes(size_t n) {
    std::string s(n, '\0');
    for (char& c : s) c = static_cast<char>(gen_());
    return s;
  }

 private:
  std::mt19937_64 gen_;
};

// Values a field may be given: wrong types, signs, sizes past every limit.
nlohmann::json odd_value(Rng& rng, int64_t near) {
  near = std::clamp<int64_t>(near, -(int64_t{1} << 40), int64_t{1} << 40);
  const std::vector<nlohmann::json> values = {-1,
                                              0,
                                              1,
                                              2,
                                              3,
                                              near - 1,
                                              near,
                                              near + 1,
                                              2 * near,
                                              near / 2,
                                              1023,
                                              65536,
                                              int64_t{1} << 31,
                                              int64_t{1} << 48,
                                              int64_t{1} << 62,
                                              uint64_t{18446744073709551615u},
                                              -(int64_t{1} << 62),
                                              1.5,
                                              1e300,
                                              "7",
                                              "",
                                              nullptr,
                                              true,
                                              nlohmann::json::array(),
                                              nlohmann::json::object(),
                                              {1, 2}};
  return rng.pick(values);
}

// Text nested deeper than any file of ours.
nlohmann::json deep(int levels) {
  nlohmann::json v = 0;
  for (int i = 0; i < levels; ++i) v = nlohmann::json::array({v});
  return v;
}

// ---- the cases' sources: a transformer checkpoint on 2 ranks, its export, made once

struct Base {
  std::string dir, step, weights;  // save dir, its checkpoint, the exported weights
  runtime::TrainConfig config;
  std::vector<std::pair<std::string, std::vector<int64_t>>> params;  // fqn and shape
};

const Base& base() {
  static const Base made = [] {
    Base b;
    b.config = small_config("transformer");
    b.config.steps = 1;
    b.dir = fresh_dir("fuzz_base");
    b.config.checkpoint.save_dir = b.dir;
    run_fsdp(2, b.config);
    b.step = b.dir + "/step-000001";
    b.weights = b.dir + "/weights.safetensors";
    export_checkpoint(b.step, b.weights, DType::BF16);
    std::unique_ptr<nn::Model> model = models::build_model(b.config.model);
    model->visit([&](Module& m) {
      for (const auto& p : m.params())
        b.params.emplace_back(checkpoint::param_fqn(m, *p), p->shape());
    });
    return b;
  }();
  return made;
}

// ---- mutations

void mutate_tensor_list(Rng& rng, std::vector<CraftedTensor>& tensors) {
  CraftedTensor& t = tensors[static_cast<size_t>(rng.below(static_cast<int64_t>(tensors.size())))];
  switch (rng.below(6)) {
    case 0: {  // another shape, its bytes to match (a wider or narrower row, more rows)
      if (t.shape.empty()) t.shape = {1};
      const size_t d = static_cast<size_t>(rng.below(static_cast<int64_t>(t.shape.size())));
      t.shape[d] = rng.pick<int64_t>(
          {0, 1, t.shape[d] - 1, t.shape[d] + 1, 2 * t.shape[d], 64 * t.shape[d]});
      if (rng.chance(0.2)) t.shape.push_back(rng.pick<int64_t>({1, 2, 3}));
      if (rng.chance(0.1) && t.shape.size() > 1) t.shape.erase(t.shape.begin());
      break;
    }
    case 1:
      t.dtype = rng.pick<std::string>({"F32", "BF16", "F16", "F64", "I8", "BOOL", "U16"});
      break;
    case 2:
      t.name = rng.pick(tensors).name;
      break;  // a duplicate name
    case 3:
      t.name += rng.pick<std::string>({".exp_avg", "x", "\n", ""});
      break;
    case 4:
      tensors.erase(tensors.begin() + rng.below(static_cast<int64_t>(tensors.size())));
      return;
    default:
      tensors.push_back(t);
      tensors.back().name += ".copy";
      return;
  }
  int64_t numel = 1;
  for (int64_t d : t.shape) numel *= std::max<int64_t>(d, 0);
  const size_t esize = io::safetensors_dtype_size(t.dtype);
  t.bytes = rng.bytes(static_cast<size_t>(std::min<int64_t>(numel, 1 << 20)) * esize);
}

void mutate_header(Rng& rng, nlohmann::ordered_json& h) {
  std::vector<std::string> names;
  for (auto& [k, v] : h.items()) names.push_back(k);
  if (names.empty() || rng.chance(0.05)) {
    h = rng.pick<nlohmann::ordered_json>({nlohmann::ordered_json::array(), "x", 7, nullptr});
    return;
  }
  const std::string name = rng.pick(names);
  nlohmann::ordered_json& e = h[name];
  if (name == "__metadata__") {
    if (!e.is_object() || rng.chance(0.2)) {
      e = odd_value(rng, 1);
      return;
    }
    const auto c = e.find(checkpoint::kChunkCrcKey);
    nlohmann::json crcs = nlohmann::json::parse(
        c != e.end() && c->is_string() ? c->get<std::string>() : std::string("{}"), nullptr, false);
    if (crcs.is_discarded() || !crcs.is_object() || crcs.empty() || rng.chance(0.2)) {
      e[checkpoint::kChunkCrcKey] =
          rng.pick<std::string>({"", "[", "{}", "[1,2]", "{\"a\":[1]}", deep(60).dump()});
      return;
    }
    auto it = crcs.begin();
    std::advance(it, rng.below(static_cast<int64_t>(crcs.size())));
    switch (rng.below(4)) {
      case 0:
        it.value() = odd_value(rng, 1);
        break;
      case 1:
        if (it.value().is_array() && !it.value().empty()) it.value().erase(it.value().size() - 1);
        break;
      case 2:
        if (it.value().is_array()) it.value().push_back(odd_value(rng, 1));
        break;
      default:
        crcs.erase(it);
        break;
    }
    e[checkpoint::kChunkCrcKey] = crcs.dump();
    return;
  }
  if (!e.is_object() || rng.chance(0.05)) {
    e = odd_value(rng, 1);
    return;
  }
  const std::string field = rng.pick<std::string>({"dtype", "shape", "data_offsets"});
  if (rng.chance(0.1)) {
    e.erase(field);
  } else if (field == "dtype") {
    e[field] =
        rng.chance(0.5)
            ? nlohmann::ordered_json(rng.pick<std::string>({"F32", "BF16", "Q7", "", "F8_E4M3"}))
            : nlohmann::ordered_json(odd_value(rng, 1));
  } else if (e[field].is_array() && !e[field].empty() && rng.chance(0.8)) {
    auto& a = e[field];
    const size_t i = static_cast<size_t>(rng.below(static_cast<int64_t>(a.size())));
    const int64_t near = a[i].is_number_integer() ? a[i].get<int64_t>() : 1;
    a[i] = odd_value(rng, near);
    if (rng.chance(0.1)) a.push_back(nlohmann::ordered_json(odd_value(rng, near)));
  } else {
    e[field] = rng.chance(0.5) ? nlohmann::ordered_json(deep(40))
                               : nlohmann::ordered_json(odd_value(rng, 16));
  }
}

// A mutated safetensors file from `bytes`: a structured change (offsets, chunk CRCs and all
// made consistent again), a raw header change, or a byte-level one.
std::string mutate_safetensors(Rng& rng, const std::string& path) {
  RawSafetensors f = RawSafetensors::read(path);
  const int64_t mode = rng.below(10);
  if (mode < 5) {
    std::vector<CraftedTensor> tensors = tensors_of(f);
    for (int k = 0, n = 1 + static_cast<int>(rng.below(2)); k < n && !tensors.empty(); ++k)
      mutate_tensor_list(rng, tensors);
    nlohmann::ordered_json meta = f.header.value("__metadata__", nlohmann::ordered_json::object());
    meta.erase(checkpoint::kChunkCrcKey);
    return craft_safetensors(tensors, meta, rng.chance(0.9)).bytes();
  }
  if (mode < 8) {
    mutate_header(rng, f.header);
    if (f.header.is_object() && f.header.contains("__metadata__") && rng.chance(0.5)) {
      try {
        recompute_chunk_crcs(f);
      } catch (const std::exception&) {  // offsets no longer inside the data: leave the CRCs
      }
    }
    return f.bytes();
  }
  std::string bytes = f.bytes();
  switch (rng.below(4)) {
    case 0: {  // the header size prefix
      uint64_t n = 0;
      for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[i]);
      const uint64_t v =
          rng.pick<uint64_t>({0, 1, n - 1, n + 1, n + 8, bytes.size(), bytes.size() - 8,
                              uint64_t{1} << 40, ~uint64_t{0}, (20u << 20)});
      for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((v >> (8 * i)) & 0xff);
      return bytes;
    }
    case 1:
      bytes.resize(static_cast<size_t>(rng.below(static_cast<int64_t>(bytes.size()))));
      return bytes;
    case 2:
      return bytes + rng.bytes(static_cast<size_t>(1 + rng.below(64)));
    default:
      for (int k = 0; k < 4; ++k)
        bytes[static_cast<size_t>(rng.below(static_cast<int64_t>(bytes.size())))] ^=
            static_cast<char>(1 + rng.below(255));
      return bytes;
  }
}

void mutate_index(Rng& rng, nlohmann::json& j) {
  if (rng.chance(0.1)) {
    const std::string key =
        rng.pick<std::string>({"tensors", "format", "version", "step", "world_size", "state_names",
                               "config", "train_state"});
    if (rng.chance(0.5))
      j.erase(key);
    else
      j[key] = rng.chance(0.2) ? deep(40) : odd_value(rng, 2);
    return;
  }
  if (rng.chance(0.1) && j.contains("config") && j["config"].is_object()) {
    nlohmann::json& c = j["config"];
    const std::string key = rng.pick<std::string>(
        {"model", "param_dtype", "reduce_dtype", "optimizer", "lr_schedule", "seed"});
    c[key] = odd_value(rng, 3);
    return;
  }
  nlohmann::json& list = j["tensors"];
  if (!list.is_array() || list.empty()) return;
  nlohmann::json& t = list[static_cast<size_t>(rng.below(static_cast<int64_t>(list.size())))];
  switch (rng.below(7)) {
    case 0:
    case 1: {  // a shape
      nlohmann::json& shape = t["shape"];
      if (shape.is_array() && !shape.empty() && rng.chance(0.8)) {
        const size_t d = static_cast<size_t>(rng.below(static_cast<int64_t>(shape.size())));
        shape[d] = odd_value(rng, shape[d].is_number_integer() ? shape[d].get<int64_t>() : 1);
      } else {
        shape = rng.pick<nlohmann::json>(
            {{16384, 32768}, {-1, 32}, nlohmann::json::array(), {1, 1, 1}, "3"});
      }
      break;
    }
    case 2:
    case 3: {  // a rank's rows
      nlohmann::json& ranks = t["ranks"];
      if (!ranks.is_array() || ranks.empty() || rng.chance(0.1)) {
        ranks = odd_value(rng, 2);
        break;
      }
      nlohmann::json& r = ranks[static_cast<size_t>(rng.below(static_cast<int64_t>(ranks.size())))];
      if (r.is_array() && r.size() == 2 && rng.chance(0.8))
        r[static_cast<size_t>(rng.below(2))] =
            odd_value(rng, r[0].is_number_integer() ? r[0].get<int64_t>() : 1);
      else if (rng.chance(0.5))
        ranks.push_back(ranks[0]);
      else
        std::swap(ranks[0], ranks[ranks.size() - 1]);
      break;
    }
    case 4:
      t["name"] = rng.chance(0.5) ? list[0]["name"] : odd_value(rng, 1);
      break;
    case 5:
      t["dtype"] = rng.chance(0.5) ? nlohmann::json("BF16") : odd_value(rng, 1);
      break;
    default:
      t[rng.pick<std::string>({"optimizer_step", "name", "shape", "ranks"})] = odd_value(rng, 1);
      break;
  }
}

void mutate_marker(Rng& rng, nlohmann::json& m) {
  const int64_t what = rng.below(4);
  if (what == 0) {
    m[rng.pick<std::string>({"step", "world_size", "format", "files", "crc32"})] =
        odd_value(rng, 2);
  } else if (what == 1 && m["files"].is_object() && !m["files"].empty()) {
    auto it = m["files"].begin();
    std::advance(it, rng.below(static_cast<int64_t>(m["files"].size())));
    if (rng.chance(0.3))
      m["files"].erase(it);
    else
      it.value()[rng.pick<std::string>({"bytes", "crc_bytes", "crc32"})] = odd_value(rng, 1496);
  } else if (what == 2) {
    m["world_size"] = rng.pick<int>({1, 3, 4, 1 << 20});
  } else {
    m["files"]["rank-00002.safetensors"] = m["files"]["rank-00000.safetensors"];
    m["world_size"] = 3;
  }
}

// ---- running a case

// An error's kind, to count them: the message without the case's paths and numbers.
std::string kind_of(std::string what, const std::string& scratch) {
  for (size_t at; (at = what.find(scratch)) != std::string::npos;) what.erase(at, scratch.size());
  std::string out;
  for (char c : what)
    if (!(c >= '0' && c <= '9') && out.size() < 60) out += c;
  return out;
}

struct Outcome {
  bool ok = true;  // loaded, or one UserError of one line
  std::string what;
};

Outcome run_case(const std::function<void()>& body) {
  try {
    body();
    return {true, "loaded"};
  } catch (const UserError& e) {
    const std::string m = e.what();
    return {!m.empty() && m.find('\n') == std::string::npos, m};
  } catch (const std::exception& e) {
    return {false, std::string("not a UserError: ") + e.what()};
  }
}

// This rank's shards of the base model, exactly sized (ASan sees a write past one).
struct HostShards {
  std::vector<std::vector<float>> buffers;
  checkpoint::ShardedState state;
  HostShards(int world, int rank) {
    state.rank = rank;
    state.world = world;
    for (const auto& [fqn, shape] : base().params) {
      checkpoint::ShardView v;
      v.fqn = fqn;
      v.shape = shape;
      for (size_t d = 1; d < shape.size(); ++d) v.cols *= shape[d];
      v.rows = checkpoint::rows_of_rank(shape.empty() ? 1 : shape[0], world, rank);
      buffers.emplace_back(static_cast<size_t>(v.rows.rows() * v.cols));
      state.tensors.push_back(v);
    }
    for (size_t i = 0; i < buffers.size(); ++i) state.tensors[i].param = buffers[i].data();
  }
};

nlohmann::json run_config() {
  const runtime::TrainConfig& c = base().config;
  return checkpoint::run_config_json({c.model, c.param_dtype, c.reduce_dtype, c.optimizer.kind, 2,
                                      c.tokens, c.seed, c.micro_batches, c.schedule,
                                      c.optimizer.base_lr(), c.data_name,
                                      models::family(c.model.kind).shape_fields(c.model)});
}

TEST(CheckpointFuzz, MutatedCheckpointsAndWeightsLoadOrEndInOneLine) {
  const Base& b = base();
  const uint64_t seed = static_cast<uint64_t>(env_or("FSDP_FUZZ_SEED", 1));
  const int64_t iterations = env_or("FSDP_FUZZ_ITERATIONS", 200);
  const std::string scratch = fresh_dir("fuzz_case");
  const std::string ck = scratch + "/step-000001", weights = scratch + "/weights.safetensors";
  std::map<std::string, int> outcomes;  // the first words of each error, to see what was reached
  int cli_runs = 0;
  for (int64_t i = 0; i < iterations; ++i) {
    Rng rng(seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(i));
    fs::remove_all(scratch);
    fs::create_directories(scratch);
    fs::copy(b.step, ck, fs::copy_options::recursive);
    fs::copy_file(b.weights, weights);
    const int64_t target = rng.below(4);
    const std::string rank_file =
        ck + "/" + checkpoint::rank_file_name(static_cast<int>(rng.below(2)));
    if (target == 0) {
      spill(rank_file, mutate_safetensors(rng, rank_file));
      if (rng.chance(0.85)) reseal(ck);
    } else if (target == 1) {
      nlohmann::json index = nlohmann::json::parse(slurp(ck + "/index.json"));
      for (int k = 0, n = 1 + static_cast<int>(rng.below(2)); k < n; ++k) mutate_index(rng, index);
      std::string text = index.dump(1);
      if (rng.chance(0.05))
        text.resize(static_cast<size_t>(rng.below(static_cast<int64_t>(text.size()))));
      spill(ck + "/index.json", text);
      if (rng.chance(0.85)) reseal(ck);
    } else if (target == 2) {
      nlohmann::json marker = nlohmann::json::parse(slurp(ck + "/COMPLETE"));
      mutate_marker(rng, marker);
      spill(ck + "/COMPLETE", rng.chance(0.85) ? sealed_marker(marker) : marker.dump(1));
    } else {
      spill(weights, mutate_safetensors(rng, weights));
    }
    const int world = 1 + static_cast<int>(rng.below(3));
    const int rank = static_cast<int>(rng.below(world));
    Outcome o;
    bool exported = false;
    if (target == 3) {
      o = run_case([&] {
        HostShards shards(world, rank);
        checkpoint::load_full_weights(weights, shards.state, nullptr, Stream{});
      });
    } else if (rng.chance(0.5)) {
      o = run_case([&] {
        const checkpoint::CheckpointIndex index = checkpoint::open_checkpoint(ck);
        checkpoint::check_compatible(index, run_config());
        HostShards shards(world, rank);
        checkpoint::load_checkpoint(index, shards.state, nullptr, Stream{});
      });
    } else {
      exported = true;
      o = run_case([&] { export_checkpoint(ck, scratch + "/out.safetensors", DType::F32); });
    }
    EXPECT_TRUE(o.ok) << "FSDP_FUZZ_SEED=" << seed << " case " << i << " (target " << target
                      << "): " << o.what;
    outcomes[kind_of(o.what, scratch)]++;
    // The command too, for a few of the exports that failed: the same error, in one line and
    // exit 1; never a crash.
    if (exported && cli_runs < 6 && o.what != "loaded") {
      ++cli_runs;
      const CommandResult r =
          run_fsdp_command("export --checkpoint " + ck + " --out " + scratch + "/cli.safetensors");
      EXPECT_EQ(r.code, 1) << "case " << i << ": " << r.output;
      EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1)
          << "case " << i << ": " << r.output;
      EXPECT_NE(r.output.find(o.what), std::string::npos) << "case " << i << ": " << r.output;
    }
  }
  // The cases reach past the checksums: most end in errors of many kinds, some load.
  EXPECT_GT(outcomes.size(), static_cast<size_t>(std::min<int64_t>(iterations / 8, 40)));
  if (env_or("FSDP_FUZZ_VERBOSE", 0))
    for (const auto& [what, n] : outcomes) std::printf("%5d  %s\n", n, what.c_str());
}

}  // namespace
}  // namespace fsdp::testing
