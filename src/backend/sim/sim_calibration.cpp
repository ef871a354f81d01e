// Reading a calibration file (Note [Calibration file]) and the op costs (Note [Op costs]).
#include "backend/sim/sim_calibration.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include <nlohmann/json.hpp>

#include "fsdp/error.h"

namespace fsdp::sim {

namespace {

using nlohmann::json;

constexpr uintmax_t kMaxCalibrationBytes = uintmax_t{16} << 20;
constexpr size_t kMaxRows = 100000;

// Reads `j` as it is checked, so that every error names the file and the key.
class Reader {
 public:
  explicit Reader(std::string source) : source_(std::move(source)) {}

  [[noreturn]] void fail(const std::string& key, const std::string& what) const {
    FSDP_USER_FAIL("calibration file '", source_, "': ", key.empty() ? "" : "'" + key + "' ",
                   what);
  }
  const json& object(const json& j, const std::string& key) const {
    if (!j.is_object()) fail(key, "must be an object");
    return j;
  }
  const json& array(const json& j, const std::string& key) const {
    if (!j.is_array()) fail(key, "must be an array");
    if (j.size() > kMaxRows) fail(key, detail::concat("has ", j.size(), " rows (at most ", kMaxRows, ")"));
    return j;
  }
  double number(const json& j, const std::string& key, double lo, double hi,
                bool lo_open = false) const {
    if (!j.is_number()) fail(key, "must be a number");
    const double v = j.get<double>();
    if (!std::isfinite(v) || v < lo || v > hi || (lo_open && v == lo))
      fail(key, detail::concat("must be ", lo_open ? "> " : ">= ", lo, " and <= ", hi, ", got ", v));
    return v;
  }
  int64_t integer(const json& j, const std::string& key, int64_t lo, int64_t hi) const {
    if (!j.is_number_integer()) fail(key, "must be an integer");
    const int64_t v = j.get<int64_t>();
    if (v < lo || v > hi) fail(key, detail::concat("must be in [", lo, ", ", hi, "], got ", v));
    return v;
  }
  std::string text(const json& j, const std::string& key) const {
    if (!j.is_string()) fail(key, "must be a string");
    return j.get<std::string>();
  }
  // Optional member: null when absent.
  static const json& member(const json& j, const char* name) {
    static const json absent;
    auto it = j.find(name);
    return it == j.end() ? absent : *it;
  }

 private:
  std::string source_;
};

DType dtype_of(const Reader& r, const json& j, const std::string& key) {
  const std::string s = r.text(j, key);
  if (s == "bf16") return DType::BF16;
  if (s == "fp32" || s == "f32") return DType::F32;
  r.fail(key, "must be \"bf16\" or \"fp32\", got \"" + s + "\"");
}

int layout_of(const Reader& r, const json& j, const std::string& key) {
  const std::string s = r.text(j, key);
  static const char* names[4] = {"nn", "nt", "tn", "tt"};
  for (int i = 0; i < 4; ++i)
    if (s == names[i]) return i;
  r.fail(key, "must be one of nn, nt, tn, tt, got \"" + s + "\"");
}

constexpr double kMaxUs = 1e9, kMaxGbps = 1e6, kMaxDim = 1e9;

LinkCurve read_link(const Reader& r, const json& j, const std::string& key) {
  r.object(j, key);
  LinkCurve l;
  if (j.contains("base_us")) l.base_us = r.number(j["base_us"], key + ".base_us", 0, 1e6);
  l.latency_us = r.number(Reader::member(j, "latency_us"), key + ".latency_us", 0, 1e6);
  const json& rows = r.array(Reader::member(j, "busbw_gbps"), key + ".busbw_gbps");
  if (rows.empty()) r.fail(key + ".busbw_gbps", "needs at least one [bytes, GB/s] row");
  for (size_t i = 0; i < rows.size(); ++i) {
    const std::string k = detail::concat(key, ".busbw_gbps[", i, "]");
    if (!rows[i].is_array() || rows[i].size() != 2) r.fail(k, "must be [bytes, GB/s]");
    l.busbw.emplace_back(r.number(rows[i][0], k + "[0]", 0, 1e15, true),
                         r.number(rows[i][1], k + "[1]", 0, kMaxGbps, true));
  }
  std::sort(l.busbw.begin(), l.busbw.end());
  return l;
}

std::vector<AttentionSample> read_attention(const Reader& r, const json& j, const std::string& key) {
  std::vector<AttentionSample> out;
  if (j.is_null()) return out;
  r.array(j, key);
  for (size_t i = 0; i < j.size(); ++i) {
    const std::string k = detail::concat(key, "[", i, "]");
    r.object(j[i], k);
    AttentionSample a;
    a.batch = r.integer(Reader::member(j[i], "batch"), k + ".batch", 1, kMaxDim);
    a.seq = r.integer(Reader::member(j[i], "seq"), k + ".seq", 1, kMaxDim);
    a.heads = r.integer(Reader::member(j[i], "heads"), k + ".heads", 1, 1 << 20);
    a.kv_heads = r.integer(Reader::member(j[i], "kv_heads"), k + ".kv_heads", 1, 1 << 20);
    a.head_dim = r.integer(Reader::member(j[i], "head_dim"), k + ".head_dim", 1, 1 << 20);
    a.us = r.number(Reader::member(j[i], "us"), k + ".us", 0, kMaxUs, true);
    out.push_back(a);
  }
  return out;
}

// Inverse-distance weighting of efficiencies over the nearest samples, in log-shape space;
// an exact match is its own sample. Returns 0 when there are none.
template <typename Sample, typename Dist, typename Eff>
double interpolated_efficiency(const std::vector<Sample>& samples, Dist dist, Eff eff) {
  std::vector<std::pair<double, double>> near;  // (distance, efficiency)
  for (const Sample& s : samples) {
    const double d = dist(s);
    if (d < 0) continue;  // not comparable (another dtype)
    if (d < 1e-9) return eff(s);
    near.emplace_back(d, eff(s));
  }
  if (near.empty()) return 0;
  const size_t k = std::min<size_t>(4, near.size());
  std::partial_sort(near.begin(), near.begin() + static_cast<std::ptrdiff_t>(k), near.end());
  double weights = 0, sum = 0;
  for (size_t i = 0; i < k; ++i) {
    const double w = 1.0 / (near[i].first * near[i].first);
    weights += w;
    sum += w * near[i].second;
  }
  return sum / weights;
}

double log_gap(double a, double b) { return std::fabs(std::log(a) - std::log(b)); }

}  // namespace

double LinkCurve::gbps(double bytes) const {
  if (busbw.empty()) return std::numeric_limits<double>::infinity();
  if (bytes <= busbw.front().first) return busbw.front().second;
  if (bytes >= busbw.back().first) return busbw.back().second;
  for (size_t i = 1; i < busbw.size(); ++i) {
    if (bytes > busbw[i].first) continue;
    const auto& [x0, y0] = busbw[i - 1];
    const auto& [x1, y1] = busbw[i];
    const double f = (std::log(bytes) - std::log(x0)) / (std::log(x1) - std::log(x0));
    return y0 + f * (y1 - y0);
  }
  return busbw.back().second;
}

double LinkCurve::peak_gbps() const {
  double peak = 0;
  for (const auto& [bytes, gbps] : busbw) peak = std::max(peak, gbps);
  return peak;
}

void LinkCurve::scale_to(double peak) {
  const double now = peak_gbps();
  if (busbw.empty()) {
    busbw.emplace_back(1.0, peak);
    return;
  }
  for (auto& [bytes, gbps] : busbw) gbps *= peak / now;
}

Calibration parse_calibration(const std::string& text, const std::string& source) {
  const Reader r(source);
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    r.fail("", std::string("is not valid JSON: ") + e.what());
  }
  r.object(j, "");
  if (Reader::member(j, "format") != "fsdp-sim-calibration")
    r.fail("format", "must be \"fsdp-sim-calibration\" (is this a calibration file?)");
  if (Reader::member(j, "version") != 1) r.fail("version", "must be 1");
  Calibration c;
  c.source = source;
  if (j.contains("device")) c.device = r.text(j["device"], "device");
  c.peak_tflops = r.number(Reader::member(j, "peak_tflops"), "peak_tflops", 0, 1e6, true);
  if (j.contains("device_memory_gib"))
    c.device_memory_gib = r.number(j["device_memory_gib"], "device_memory_gib", 0, 1e6);
  const json& host = r.object(Reader::member(j, "host"), "host");
  c.kernel_launch_us = r.number(Reader::member(host, "kernel_launch_us"), "host.kernel_launch_us", 0, 1e5);
  c.gemm_launch_us = r.number(Reader::member(host, "gemm_launch_us"), "host.gemm_launch_us", 0, 1e5);
  c.collective_launch_us = r.number(Reader::member(host, "collective_launch_us"),
                                    "host.collective_launch_us", 0, 1e5);
  if (host.contains("moe_route_us"))
    c.moe_route_us = r.number(host["moe_route_us"], "host.moe_route_us", 0, 1e6);
  if (host.contains("moe_route_backward_us"))
    c.moe_route_backward_us =
        r.number(host["moe_route_backward_us"], "host.moe_route_backward_us", 0, 1e6);
  c.kernel_min_us = r.number(Reader::member(j, "kernel_min_us"), "kernel_min_us", 0, 1e5);
  if (j.contains("kernel_sharing"))
    c.kernel_sharing = r.number(j["kernel_sharing"], "kernel_sharing", 0, 1);
  if (j.contains("memory_kernel_sharing"))
    c.memory_kernel_sharing = r.number(j["memory_kernel_sharing"], "memory_kernel_sharing", 0, 4);
  if (j.contains("memory_kernel_yield"))
    c.memory_kernel_yield = r.number(j["memory_kernel_yield"], "memory_kernel_yield", 0, 16);
  if (j.contains("memory_kernel_lead"))
    c.memory_kernel_lead = r.number(j["memory_kernel_lead"], "memory_kernel_lead", 0, 16);
  const json& mem = r.object(Reader::member(j, "memory"), "memory");
  c.memory_gbps = r.number(Reader::member(mem, "gbps"), "memory.gbps", 0, kMaxGbps, true);
  c.host_copy_gbps = r.number(Reader::member(mem, "host_copy_gbps"), "memory.host_copy_gbps", 0,
                              kMaxGbps, true);
  if (const json& by_op = Reader::member(mem, "by_op"); !by_op.is_null()) {
    r.object(by_op, "memory.by_op");
    for (const auto& [op, v] : by_op.items())
      c.op_gbps[op] = r.number(v, "memory.by_op." + op, 0, kMaxGbps, true);
  }
  const json& gemm = r.object(Reader::member(j, "gemm"), "gemm");
  const json& defaults = r.object(Reader::member(gemm, "default_tflops"), "gemm.default_tflops");
  for (const auto& [name, v] : defaults.items())
    c.gemm_default_tflops[dtype_of(r, json(name), "gemm.default_tflops." + name)] =
        r.number(v, "gemm.default_tflops." + name, 0, 1e6, true);
  if (const json& f = Reader::member(gemm, "in_step_factor"); !f.is_null()) {
    r.object(f, "gemm.in_step_factor");
    for (const auto& [name, v] : f.items())
      c.gemm_in_step_factor[static_cast<size_t>(layout_of(r, json(name), "gemm.in_step_factor." + name))] =
          r.number(v, "gemm.in_step_factor." + name, 0.1, 10);
  }
  if (const json& f = Reader::member(gemm, "grouped_factor"); !f.is_null()) {
    r.object(f, "gemm.grouped_factor");
    for (const auto& [name, v] : f.items())
      c.grouped_gemm_factor[static_cast<size_t>(layout_of(r, json(name), "gemm.grouped_factor." + name))] =
          r.number(v, "gemm.grouped_factor." + name, 0.1, 10);
  }
  if (const json& f = Reader::member(gemm, "fp8"); !f.is_null()) {
    r.object(f, "gemm.fp8");
    for (const auto& [name, v] : f.items()) {
      const std::string key = "gemm.fp8." + name;
      if (name == "tensorwise" || name == "rowwise")
        (name == "tensorwise" ? c.fp8.tensorwise : c.fp8.rowwise) = r.number(v, key, 0, 10, true);
      else if (name == "rowwise_outer_vector" && v.is_boolean())
        c.fp8.rowwise_outer_vector = v.get<bool>();
      else
        r.fail(key, name == "rowwise_outer_vector"
                        ? "must be true or false"
                        : "is not a key of gemm.fp8 (tensorwise, rowwise, rowwise_outer_vector)");
    }
  }
  if (const json& rows = Reader::member(gemm, "table"); !rows.is_null()) {
    r.array(rows, "gemm.table");
    for (size_t i = 0; i < rows.size(); ++i) {
      const std::string k = detail::concat("gemm.table[", i, "]");
      r.object(rows[i], k);
      GemmSample g;
      g.dtype = dtype_of(r, Reader::member(rows[i], "dtype"), k + ".dtype");
      g.m = r.integer(Reader::member(rows[i], "m"), k + ".m", 1, kMaxDim);
      g.n = r.integer(Reader::member(rows[i], "n"), k + ".n", 1, kMaxDim);
      g.k = r.integer(Reader::member(rows[i], "k"), k + ".k", 1, kMaxDim);
      g.layout = layout_of(r, Reader::member(rows[i], "layout"), k + ".layout");
      g.us = r.number(Reader::member(rows[i], "us"), k + ".us", 0, kMaxUs, true);
      c.gemms.push_back(g);
    }
  }
  const json& attn = r.object(Reader::member(j, "attention"), "attention");
  c.attention_forward = read_attention(r, Reader::member(attn, "forward"), "attention.forward");
  c.attention_backward = read_attention(r, Reader::member(attn, "backward"), "attention.backward");
  c.attention_forward_tflops = r.number(Reader::member(attn, "default_tflops_forward"),
                                        "attention.default_tflops_forward", 0, 1e6, true);
  c.attention_backward_tflops = r.number(Reader::member(attn, "default_tflops_backward"),
                                         "attention.default_tflops_backward", 0, 1e6, true);
  const json& links = r.object(Reader::member(j, "links"), "links");
  c.nvlink = read_link(r, Reader::member(links, "nvlink"), "links.nvlink");
  c.network = read_link(r, Reader::member(links, "network"), "links.network");
  return c;
}

Calibration read_calibration(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  FSDP_USER_CHECK(!ec && fs::exists(st), "calibration file '", path, "' does not exist");
  FSDP_USER_CHECK(fs::is_regular_file(st), "calibration file '", path, "' is not a regular file");
  const uintmax_t size = fs::file_size(path, ec);
  FSDP_USER_CHECK(!ec && size <= kMaxCalibrationBytes, "calibration file '", path, "' is ",
                  size, " bytes (at most ", kMaxCalibrationBytes, ")");
  std::ifstream in(path, std::ios::binary);
  FSDP_USER_CHECK(in.good(), "calibration file '", path, "' cannot be read");
  std::ostringstream text;
  text << in.rdbuf();
  FSDP_USER_CHECK(!in.bad(), "calibration file '", path, "': reading failed");
  return parse_calibration(text.str(), path);
}

Calibration ideal_calibration(double memory_gbps, double tflops, double link_gbps) {
  Calibration c;
  c.device = "ideal";
  c.peak_tflops = tflops;
  c.memory_gbps = memory_gbps;
  c.host_copy_gbps = memory_gbps;
  for (DType t : {DType::BF16, DType::F32}) c.gemm_default_tflops[t] = tflops;
  c.fp8.tensorwise = c.fp8.rowwise = 0.5;  // fp8's dense peak is twice bf16's
  c.attention_forward_tflops = c.attention_backward_tflops = tflops;
  c.nvlink.busbw = {{1.0, link_gbps}};
  c.network.busbw = {{1.0, link_gbps}};
  return c;
}

// ---- Note [Op costs]
// A GEMM takes its flops at the efficiency (flops per second) of the nearest measured shapes
// of its dtype (inverse-distance weighted in log m, log n, log k; another layout counts as a
// little farther), or at the dtype's default when none is measured, and at least its bytes
// at the copy bandwidth (a skinny GEMM is memory-bound); then the layout's in-step factor. A
// grouped GEMM is one kernel: its groups' times add up (less the kernel minimum each would pay
// alone), scaled by the layout's grouped factor (cuBLAS's grouped GEMM is measured slower than
// the same GEMMs one by one). An fp8 GEMM is the bf16 GEMM of its call at the calibrated
// ratio (Note [Simulated fp8]).
// Attention is the same over (batch * heads, seq, head_dim) with the causal flops. A
// memory-bound kernel takes its bytes at its op class's measured bandwidth (the copy
// bandwidth when the class has none). The classes are the Device methods' names
// (rms_norm_forward, cast, adamw_step, ...) plus "one_rank_collective".

double gemm_us(const Calibration& c, DType ab_t, int64_t m, int64_t n, int64_t k, int layout) {
  const double flops = 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
  if (flops <= 0) return c.kernel_min_us;
  double eff = interpolated_efficiency(
      c.gemms,
      [&](const GemmSample& s) {
        if (s.dtype != ab_t) return -1.0;
        return log_gap(m, s.m) + log_gap(n, s.n) + log_gap(k, s.k) + (s.layout == layout ? 0 : 0.05);
      },
      [](const GemmSample& s) { return 2.0 * s.m * s.n * s.k / s.us; });
  if (eff <= 0) {
    auto it = c.gemm_default_tflops.find(ab_t);
    eff = (it != c.gemm_default_tflops.end() ? it->second : 100.0) * 1e6;  // flops per us
  }
  const double esize = static_cast<double>(dtype_size(ab_t));
  const double bytes = (static_cast<double>(m) * k + static_cast<double>(k) * n +
                        static_cast<double>(m) * n) * esize;
  const double us = std::max(flops / eff, bytes / (c.memory_gbps * 1e3));
  return std::max(c.kernel_min_us, us) * c.gemm_in_step_factor[static_cast<size_t>(layout & 3)];
}

double fp8_gemm_us(const Calibration& c, bool rowwise, int64_t m, int64_t n, int64_t k,
                   int layout) {
  const double ratio = rowwise ? c.fp8.rowwise : c.fp8.tensorwise;
  FSDP_CHECK(ratio > 0, "the calibration has no fp8 ", rowwise ? "rowwise" : "tensorwise",
             " GEMM rate (gemm.fp8)");
  return std::max(c.kernel_min_us, ratio * gemm_us(c, DType::BF16, m, n, k, layout));
}

double grouped_gemm_us(const Calibration& c, DType ab_t, const GemmShape* groups, int count,
                       int layout) {
  double us = 0;
  for (int i = 0; i < count; ++i) {
    const GemmShape& g = groups[i];
    if (g.m == 0 || g.n == 0) continue;
    us += std::max(0.0, gemm_us(c, ab_t, g.m, g.n, g.k, layout) - c.kernel_min_us);
  }
  return us * c.grouped_gemm_factor[static_cast<size_t>(layout & 3)] + c.kernel_min_us;
}

double attention_flops(bool backward, int64_t batch, int64_t seq, int64_t heads,
                       int64_t head_dim) {
  // Two [seq, seq] x head_dim products forward (scores, weighted values), half of them under
  // the causal mask; backward does five (the scores again, and four gradients).
  const double forward = 4.0 * batch * heads * static_cast<double>(seq) * seq * head_dim * 0.5;
  return backward ? 2.5 * forward : forward;
}

double attention_us(const Calibration& c, bool backward, int64_t batch, int64_t seq,
                    int64_t heads, int64_t kv_heads, int64_t head_dim) {
  (void)kv_heads;  // grouped-query attention reads fewer K/V heads but does the same flops
  const double flops = attention_flops(backward, batch, seq, heads, head_dim);
  if (flops <= 0) return c.kernel_min_us;
  const auto& samples = backward ? c.attention_backward : c.attention_forward;
  double eff = interpolated_efficiency(
      samples,
      [&](const AttentionSample& s) {
        return log_gap(static_cast<double>(batch * heads), static_cast<double>(s.batch * s.heads)) +
               log_gap(seq, s.seq) + log_gap(head_dim, s.head_dim);
      },
      [&](const AttentionSample& s) {
        return attention_flops(backward, s.batch, s.seq, s.heads, s.head_dim) / s.us;
      });
  if (eff <= 0) eff = (backward ? c.attention_backward_tflops : c.attention_forward_tflops) * 1e6;
  return std::max(c.kernel_min_us, flops / eff);
}

double memory_us(const Calibration& c, const std::string& op, double bytes) {
  auto it = c.op_gbps.find(op);
  const double gbps = it != c.op_gbps.end() ? it->second : c.memory_gbps;
  return std::max(c.kernel_min_us, bytes / (gbps * 1e3));
}

}  // namespace fsdp::sim
