#include "moesim/models/device.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

namespace moesim::models {

const char* precision_name(Precision p) {
  switch (p) {
    case Precision::BF16: return "bf16";
    case Precision::FP16: return "fp16";
    case Precision::FP8: return "fp8";
  }
  return "?";
}

FlopsPerSecond DeviceSpec::peak(Precision p) const {
  switch (p) {
    case Precision::BF16: return peak_bf16;
    case Precision::FP16: return peak_fp16.value() > 0 ? peak_fp16 : peak_bf16;
    case Precision::FP8: return peak_fp8.value() > 0 ? peak_fp8 : peak_bf16;
  }
  return peak_bf16;
}

double DeviceSpec::clock_fraction() const {
  if (tdp_w <= 0 || power_limit_w <= 0 || power_limit_w >= tdp_w) return 1.0;
  return std::cbrt((power_limit_w - static_power_w) / (tdp_w - static_power_w));
}

namespace {

/// "gemm_benchmarks": [{"precision": "fp8", "m": 4096, "n": 7168, "k": 16384, "groups": 1,
/// "tflops": 1426}, ...]. The ratios need the peaks, tiles and K term: call after those.
void parse_gemm_benchmarks(const nlohmann::json& j, const std::string& ptr, DeviceSpec& d, Diagnostics& diag) {
  if (!j.is_array()) {
    diag.error(ptr, json_brief(j), "must be a list of {precision, m, n, k, groups, tflops} measurements");
    return;
  }
  for (std::size_t i = 0; i < j.size(); ++i) {
    ObjectReader e(j[i], ptr + "/" + std::to_string(i), diag);
    if (!e.valid()) continue;
    GemmBenchmark b;
    const std::string prec = e.string({"precision"}, "bf16", {"bf16", "fp16", "fp8"});
    b.precision = prec == "fp8" ? Precision::FP8 : prec == "fp16" ? Precision::FP16 : Precision::BF16;
    bool complete = true;
    for (const char* key : {"m", "n", "k", "tflops"})
      if (!e.has({key})) {
        diag.error(e.child_pointer(key), "", "is required (a positive number)");
        complete = false;
      }
    b.m = e.number({"m"}, 1, 1, 1e9);
    b.n = e.number({"n"}, 1, 1, 1e9);
    b.k = e.number({"k"}, 1, 1, 1e9);
    b.groups = static_cast<int>(e.integer({"groups"}, 1, 1, 1 << 20));
    b.tflops = e.number({"tflops"}, 1, 1e-3, 1e6);
    e.ignore({"source", "_source", "note"});
    e.finish();
    if (b.precision == Precision::FP8 && d.peak_fp8.value() <= 0) {
      diag.error(e.child_pointer("precision"), "\"fp8\"", "needs an FP8 peak (peak_flops/fp8)");
      complete = false;
    }
    if (b.tflops * 1e12 > d.peak(b.precision).value() && d.peak(b.precision).value() > 0) {
      diag.error(e.child_pointer("tflops"), fmt::format("{:g}", b.tflops),
                 fmt::format("is above the device's {} peak ({:g} TFLOP/s)", precision_name(b.precision),
                             d.peak(b.precision).value() / 1e12));
      complete = false;
    }
    if (!complete || d.gemm_tiles.empty()) continue;
    const double modelled = d.peak(b.precision).value() * gemm_shape_efficiency(d, b.m, b.n, b.k, b.groups, b.precision);
    b.log_ratio = std::log(b.tflops * 1e12 / modelled);
    b.log2_m = std::log2(b.m);
    b.log2_n = std::log2(b.n);
    b.log2_k = std::log2(b.k);
    d.gemm_benchmarks.push_back(b);
  }
}

/// operator_speed: {"gemm", "attention_forward", "attention_backward", "vector"}, each a factor
/// on the calibrated speed of that class of operators (a software stack's faster or slower
/// kernels: Huawei's 2025 operators run FlashAttention 1.5x / 1.3x, MatMul 1.1x and vector
/// operators 3x as fast as before, pangu.md D). A factor may not take a class past the hardware:
/// GEMM and attention efficiencies stay at most 1, vector kernels at most the HBM bandwidth.
void apply_operator_speed(const nlohmann::json& spec, const std::string& pointer, DeviceSpec& d, Diagnostics& diag) {
  ObjectReader o(spec, pointer, diag);
  if (!o.valid()) return;
  const double g = o.number({"gemm"}, 1.0, 0.01, 100.0);
  const double af = o.number({"attention_forward"}, 1.0, 0.01, 100.0);
  const double ab = o.number({"attention_backward"}, 1.0, 0.01, 100.0);
  const double v = o.number({"vector"}, 1.0, 0.01, 100.0);
  o.finish();
  auto scale = [&](double& eff, double f, const char* key, const char* what) {
    if (eff * f > 1.0)
      diag.error(pointer + "/" + key, fmt::format("{:g}", f),
                 fmt::format("would take {} from {:.3g} to {:.3g} of the peak; a speed-up must leave it at most 1", what,
                             eff, eff * f));
    else
      eff *= f;
  };
  scale(d.gemm_peak_efficiency, g, "gemm", "the GEMM efficiency");
  if (d.gemm_fp8_efficiency > 0) scale(d.gemm_fp8_efficiency, g, "gemm", "the FP8 GEMM efficiency");
  scale(d.attention_fwd_efficiency, af, "attention_forward", "the attention forward efficiency");
  scale(d.attention_bwd_efficiency, ab, "attention_backward", "the attention backward efficiency");
  if (d.attention_fa2_fwd_efficiency > 0) {
    scale(d.attention_fa2_fwd_efficiency, af, "attention_forward", "the FlashAttention-2 forward efficiency");
    scale(d.attention_fa2_bwd_efficiency, ab, "attention_backward", "the FlashAttention-2 backward efficiency");
  }
  if (d.hbm_efficiency * v > 1.0)
    diag.error(pointer + "/vector", fmt::format("{:g}", v),
               fmt::format("would stream vector kernels at {:.2f}x the HBM bandwidth (they run at hbm.efficiency "
                           "{:g} of it); to express kernels that were slower than memory-bound before a speed-up, give "
                           "the earlier state a vector speed below 1",
                           d.hbm_efficiency * v, d.hbm_efficiency));
  else
    d.vector_speed = v;
}

/// "attention_benchmarks": [{"kernel": "flash", "direction": "forward", "causal": true,
/// "head_dim": 128, "seq": [512, ...], "tflops": [315, ...]}, ...]. Needs the peaks.
void parse_attention_benchmarks(const nlohmann::json& j, const std::string& ptr, DeviceSpec& d, Diagnostics& diag) {
  if (!j.is_array()) {
    diag.error(ptr, json_brief(j), "must be a list of {kernel, direction, causal, head_dim, seq, tflops} series");
    return;
  }
  const double peak = d.peak(Precision::BF16).value() / 1e12;
  for (std::size_t i = 0; i < j.size(); ++i) {
    const std::string at = ptr + "/" + std::to_string(i);
    ObjectReader e(j[i], at, diag);
    if (!e.valid()) continue;
    AttentionSeries s;
    s.flash2 = e.string({"kernel"}, "flash", {"flash", "flash2"}) == "flash2";
    s.backward = e.string({"direction"}, "forward", {"forward", "backward"}) == "backward";
    s.causal = e.boolean({"causal"}, false);
    s.head_dim = e.number({"head_dim"}, 128, 1, 4096);
    e.ignore({"source", "_source", "note", "seq", "tflops"});
    e.finish();
    const auto* seq = j[i].is_object() && j[i].contains("seq") ? &j[i]["seq"] : nullptr;
    const auto* tf = j[i].is_object() && j[i].contains("tflops") ? &j[i]["tflops"] : nullptr;
    if (seq == nullptr || tf == nullptr || !seq->is_array() || !tf->is_array() || seq->empty() ||
        seq->size() != tf->size()) {
      diag.error(at, "", "needs \"seq\" and \"tflops\": lists of numbers of the same, non-zero length");
      continue;
    }
    bool ok = true;
    for (std::size_t k = 0; k < seq->size(); ++k) {
      const auto& sv = (*seq)[k];
      const auto& tv = (*tf)[k];
      if (!sv.is_number() || sv.get<double>() < 1 ||
          (k > 0 && sv.get<double>() <= (*seq)[k - 1].get<double>())) {
        diag.error(at + "/seq/" + std::to_string(k), json_brief(sv), "must be a sequence length >= 1, ascending");
        ok = false;
        continue;
      }
      if (!tv.is_number() || tv.get<double>() <= 0 || (peak > 0 && tv.get<double>() > peak)) {
        diag.error(at + "/tflops/" + std::to_string(k), json_brief(tv),
                   fmt::format("must be a throughput in TFLOP/s, > 0 and at most the BF16 peak ({:g})", peak));
        ok = false;
        continue;
      }
      s.log2_seq.push_back(std::log2(sv.get<double>()));
      s.tflops.push_back(tv.get<double>());
    }
    if (ok) d.attention_benchmarks.push_back(std::move(s));
  }
  // Every kernel and direction measured needs a non-causal series: the reference the device's
  // attention efficiency is given for.
  for (const AttentionSeries& s : d.attention_benchmarks) {
    const bool has_ref = std::any_of(d.attention_benchmarks.begin(), d.attention_benchmarks.end(), [&](const auto& o) {
      return o.flash2 == s.flash2 && o.backward == s.backward && !o.causal;
    });
    if (!has_ref) {
      diag.error(ptr, "", fmt::format("has {} {} series but no non-causal one, the reference attention_efficiency "
                                      "is given for",
                                      s.flash2 ? "flash2" : "flash", s.backward ? "backward" : "forward"));
      d.attention_benchmarks.clear();
      return;
    }
  }
}

/// TFLOP/s of a series at log2(seq): linear between points, clamped at the ends.
double series_at(const AttentionSeries& s, double l2) {
  const auto& x = s.log2_seq;
  if (l2 <= x.front()) return s.tflops.front();
  if (l2 >= x.back()) return s.tflops.back();
  const std::size_t i = static_cast<std::size_t>(std::upper_bound(x.begin(), x.end(), l2) - x.begin());
  const double w = (l2 - x[i - 1]) / (x[i] - x[i - 1]);
  return s.tflops[i - 1] + w * (s.tflops[i] - s.tflops[i - 1]);
}

/// Measured TFLOP/s for (kernel in use, direction, mask) at log2(seq) and head dimension:
/// linear in log2(head_dim) between the two nearest series, clamped. 0 with no such series.
double attention_measured(const DeviceSpec& d, bool backward, bool causal, double l2, double head_dim) {
  const double lh = std::log2(head_dim);
  const AttentionSeries* below = nullptr;  // largest head_dim <= the query
  const AttentionSeries* above = nullptr;  // smallest head_dim >= the query
  for (const AttentionSeries& s : d.attention_benchmarks) {
    if (s.flash2 != d.attention_flash2 || s.backward != backward || s.causal != causal) continue;
    if (s.head_dim <= head_dim && (below == nullptr || s.head_dim > below->head_dim)) below = &s;
    if (s.head_dim >= head_dim && (above == nullptr || s.head_dim < above->head_dim)) above = &s;
  }
  if (below == nullptr && above == nullptr) return 0;
  if (below == nullptr) return series_at(*above, l2);
  if (above == nullptr || above == below || above->head_dim == below->head_dim) return series_at(*below, l2);
  const double w = (lh - std::log2(below->head_dim)) / (std::log2(above->head_dim) - std::log2(below->head_dim));
  return (1 - w) * series_at(*below, l2) + w * series_at(*above, l2);
}

}  // namespace

double attention_shape_factor(const DeviceSpec& d, double seq, double head_dim, bool causal, bool backward) {
  if (d.attention_benchmarks.empty() || seq <= 0 || head_dim <= 0) return 1.0;
  // The reference: non-causal, head dim 128, the longest sequence measured.
  double ref = 0;
  for (const AttentionSeries& s : d.attention_benchmarks)
    if (s.flash2 == d.attention_flash2 && s.backward == backward && !s.causal)
      ref = std::max(ref, attention_measured(d, backward, false, s.log2_seq.back(), 128));
  if (ref <= 0) return 1.0;
  const double l2 = std::log2(seq);
  double v = attention_measured(d, backward, causal, l2, head_dim);
  if (v <= 0 && causal) {
    // No causal series in this direction: the non-causal one times the forward's mask penalty.
    const double nc = attention_measured(d, backward, false, l2, head_dim);
    const double fc = attention_measured(d, false, true, l2, head_dim);
    const double fn = attention_measured(d, false, false, l2, head_dim);
    v = fc > 0 && fn > 0 ? nc * fc / fn : nc;
  }
  return v > 0 ? v / ref : 1.0;
}

double gemm_k_overhead(const DeviceSpec& d, Precision p) {
  // The K-loop's fixed cost is time per output tile; an FP8 main loop covers twice the K
  // elements of a 16-bit one in that time.
  return p == Precision::FP8 ? 2.0 * d.gemm_k_overhead : d.gemm_k_overhead;
}

double gemm_shape_efficiency(const DeviceSpec& d, double m, double n, double k, double batch, Precision p) {
  if (m <= 0 || n <= 0 || k <= 0 || batch <= 0) return 1.0;
  const double units = d.compute_units;
  double best = 0.0;
  for (const GemmTile& t : d.gemm_tiles) {
    // Tile and wave quantisation together: useful output area over the area of every tile
    // slot in every wave.
    const double tiles = std::ceil(m / t.m) * std::ceil(n / t.n) * batch;
    const double waves = std::ceil(tiles / units);
    best = std::max(best, (m * n * batch) / (waves * units * t.m * t.n));
  }
  return best * (k / (k + gemm_k_overhead(d, p)));
}

double gemm_benchmark_correction(const DeviceSpec& d, double m, double n, double k, Precision p) {
  if (d.gemm_benchmarks.empty() || m <= 0 || n <= 0 || k <= 0) return 1.0;
  const Precision want = p == Precision::FP16 ? Precision::BF16 : p;
  double wsum = 0, lsum = 0;
  bool any = false;
  double lm = 0, ln = 0, lk = 0;
  for (const GemmBenchmark& b : d.gemm_benchmarks) {
    const Precision bp = b.precision == Precision::FP16 ? Precision::BF16 : b.precision;
    if (bp != want) continue;
    if (!any) {  // logs of the query once, only when some benchmark is in its precision
      lm = std::log2(m);
      ln = std::log2(n);
      lk = std::log2(k);
      any = true;
    }
    const double dm = lm - b.log2_m, dn = ln - b.log2_n, dk = lk - b.log2_k;
    const double d2 = dm * dm + dn * dn + dk * dk;
    if (d2 < 1e-12) return std::exp(b.log_ratio);
    const double w = 1.0 / (d2 * d2);  // inverse squared distance (d2 is already squared)
    wsum += w;
    lsum += w * b.log_ratio;
  }
  return wsum > 0 ? std::exp(lsum / wsum) : 1.0;
}

DeviceSpec parse_device(const nlohmann::json& input, const std::string& pointer, Diagnostics& diag) {
  nlohmann::json j = input;
  strip_sources(j, pointer, diag);
  DeviceSpec d;
  ObjectReader r(j, pointer, diag);
  if (!r.valid()) return d;
  d.name = r.string({"name"}, "custom-device");
  d.description = r.string({"description"}, "");
  if (const auto* pf = r.get({"peak_flops"})) {
    ObjectReader p(*pf, r.child_pointer("peak_flops"), diag);
    d.peak_bf16 = FlopsPerSecond{p.required_quantity({"bf16"}, Dimension::FlopsPerSecond, 1e9)};
    d.peak_fp16 = FlopsPerSecond{p.opt_quantity({"fp16"}, Dimension::FlopsPerSecond, 1e9).value_or(0.0)};
    d.peak_fp8 = FlopsPerSecond{p.opt_quantity({"fp8"}, Dimension::FlopsPerSecond, 1e9).value_or(0.0)};
    p.finish();
  } else {
    diag.error(r.child_pointer("peak_flops"), "", "is required ({\"bf16\": \"...TFLOPS\"})");
  }
  d.compute_units = static_cast<int>(r.required_integer({"compute_units"}, 1, 100000));
  if (const auto* tiles = r.get({"gemm_tiles"})) {
    const std::string tp = r.child_pointer("gemm_tiles");
    if (!tiles->is_array() || tiles->empty()) {
      diag.error(tp, json_brief(*tiles), "must be a non-empty list of [m, n] tile shapes");
    } else {
      for (std::size_t i = 0; i < tiles->size(); ++i) {
        const auto& t = (*tiles)[i];
        if (!t.is_array() || t.size() != 2 || !t[0].is_number_integer() || !t[1].is_number_integer() ||
            t[0].get<int>() < 1 || t[1].get<int>() < 1) {
          diag.error(tp + "/" + std::to_string(i), json_brief(t), "must be [m, n] with positive integers");
          continue;
        }
        d.gemm_tiles.push_back(GemmTile{t[0].get<int>(), t[1].get<int>()});
      }
    }
  } else {
    d.gemm_tiles = {GemmTile{128, 128}};
    diag.error(r.child_pointer("gemm_tiles"), "", "is required (list of [m, n] output tile shapes)");
  }
  d.gemm_peak_efficiency = r.number({"gemm_peak_efficiency"}, 0.8, 0.01, 1.0);
  if (!r.has({"gemm_peak_efficiency"}))
    diag.error(r.child_pointer("gemm_peak_efficiency"), "", "is required (fraction of peak, 0..1)");
  d.gemm_k_overhead = r.number({"gemm_k_overhead"}, 128, 0, 1e6);
  d.gemm_fp8_efficiency = r.number({"gemm_fp8_efficiency"}, 0.0, 0.0, 1.0);
  if (const auto* gb = r.get({"gemm_benchmarks"})) parse_gemm_benchmarks(*gb, r.child_pointer("gemm_benchmarks"), d, diag);
  if (d.gemm_fp8_efficiency > 0 && d.peak_fp8.value() <= 0)
    diag.error(r.child_pointer("gemm_fp8_efficiency"), std::to_string(d.gemm_fp8_efficiency),
               "needs an FP8 peak (peak_flops/fp8)");
  if (const auto* ae = r.get({"attention_efficiency"})) {
    ObjectReader a(*ae, r.child_pointer("attention_efficiency"), diag);
    d.attention_fwd_efficiency = a.number({"forward"}, 0.5, 0.01, 1.0);
    d.attention_bwd_efficiency = a.number({"backward"}, d.attention_fwd_efficiency * 0.75, 0.01, 1.0);
    a.finish();
  } else {
    diag.error(r.child_pointer("attention_efficiency"), "", "is required ({\"forward\": f, \"backward\": b})");
  }
  if (const auto* ab = r.get({"attention_benchmarks"}))
    parse_attention_benchmarks(*ab, r.child_pointer("attention_benchmarks"), d, diag);
  // FlashAttention-2's kernels (PyTorch SDPA's flash backend), where a framework uses them
  // instead of the device's best attention kernel (training.attention_kernel "flash2").
  if (const auto* ae = r.get({"attention_efficiency_fa2"})) {
    ObjectReader a(*ae, r.child_pointer("attention_efficiency_fa2"), diag);
    d.attention_fa2_fwd_efficiency = a.number({"forward"}, 0.5, 0.01, 1.0);
    d.attention_fa2_bwd_efficiency = a.number({"backward"}, d.attention_fa2_fwd_efficiency * 0.75, 0.01, 1.0);
    a.finish();
  }
  if (const auto* hbm = r.get({"hbm"})) {
    ObjectReader h(*hbm, r.child_pointer("hbm"), diag);
    d.hbm_capacity = Bytes{h.required_quantity({"capacity"}, Dimension::Bytes, 1.0)};
    d.hbm_bandwidth = BytesPerSecond{h.required_quantity({"bandwidth"}, Dimension::BytesPerSecond, 1.0)};
    d.hbm_efficiency = h.number({"efficiency"}, 0.8, 0.01, 1.0);
    h.finish();
  } else {
    diag.error(r.child_pointer("hbm"), "", "is required ({\"capacity\", \"bandwidth\", \"efficiency\"})");
  }
  d.kernel_overhead = Seconds{r.opt_quantity({"kernel_overhead"}, Dimension::Seconds).value_or(0.0)};
  d.memory_reserved = Bytes{r.opt_quantity({"memory_reserved"}, Dimension::Bytes).value_or(0.0)};
  d.host_bandwidth = BytesPerSecond{r.opt_quantity({"host_bandwidth"}, Dimension::BytesPerSecond).value_or(0.0)};
  d.host_op_time = Seconds{r.opt_quantity({"host_op_time"}, Dimension::Seconds).value_or(0.0)};
  if (d.host_op_time.value() > 0.1)  // negative values are refused by opt_quantity
    diag.error(r.child_pointer("host_op_time"), json_brief(*r.get({"host_op_time"})),
               "must be at most 100ms (host time per issued operator)");
  if (const auto* pw = r.get({"power"})) {
    ObjectReader w(*pw, r.child_pointer("power"), diag);
    d.tdp_w = w.number({"tdp_watts"}, 0.0, 1.0, 1e5);
    if (!w.has({"tdp_watts"})) diag.error(w.child_pointer("tdp_watts"), "", "is required (the rated board power, watts)");
    d.static_power_w = w.number({"static_watts"}, 0.0, 0.0, 1e5);
    d.power_limit_w = w.number({"limit_watts"}, d.tdp_w, 1.0, 1e5);
    if (d.static_power_w >= d.tdp_w && d.tdp_w > 0)
      diag.error(w.child_pointer("static_watts"), fmt::format("{:g}", d.static_power_w),
                 fmt::format("must be below tdp_watts ({:g})", d.tdp_w));
    if (d.power_limit_w <= d.static_power_w && w.has({"limit_watts"}))
      diag.error(w.child_pointer("limit_watts"), fmt::format("{:g}", d.power_limit_w),
                 fmt::format("must be above static_watts ({:g}): nothing would be left to run the clock", d.static_power_w));
    w.finish();
  }
  if (const auto* os = r.get({"operator_speed"})) apply_operator_speed(*os, r.child_pointer("operator_speed"), d, diag);
  r.ignore({"source", "_source"});
  r.finish();
  return d;
}

double ComputeModel::gemm_efficiency(double m, double n, double k, double batch, Precision p) const {
  const DeviceSpec& d = *d_;
  const double peak_eff =
      p == Precision::FP8 && d.gemm_fp8_efficiency > 0 ? d.gemm_fp8_efficiency : d.gemm_peak_efficiency;
  if (m <= 0 || n <= 0 || k <= 0 || batch <= 0) return peak_eff;
  // A benchmark correction can lift a shape above what the peak fraction alone allows, never above the peak.
  return std::min(1.0, peak_eff * gemm_shape_efficiency(d, m, n, k, batch, p) * gemm_benchmark_correction(d, m, n, k, p));
}

Seconds ComputeModel::gemm(double m, double n, double k, Precision p, double batch) const {
  if (m <= 0 || n <= 0 || k <= 0 || batch <= 0) return Seconds{0};
  const DeviceSpec& d = *d_;
  const Flops flops{2.0 * m * n * k * batch};
  const Seconds compute = flops / (d.sustained_peak(p) * gemm_efficiency(m, n, k, batch, p));
  const double elem = p == Precision::FP8 ? 1.0 : 2.0;
  // Inputs read once, output written once in 16-bit (FP8 GEMMs write BF16).
  const Bytes bytes{((m * k + k * n) * elem + m * n * 2.0) * batch};
  const Seconds memory = bytes / (d.hbm_bandwidth * d.hbm_efficiency);
  return std::max(compute, memory) + d.kernel_overhead;
}

Seconds ComputeModel::grouped_gemm(const std::vector<double>& m, const std::vector<double>& k, double n,
                                   Precision p) const {
  const DeviceSpec& d = *d_;
  const double peak_eff =
      p == Precision::FP8 && d.gemm_fp8_efficiency > 0 ? d.gemm_fp8_efficiency : d.gemm_peak_efficiency;
  double flops = 0, k_weighted = 0, bytes = 0, useful = 0, k_mean = 0;
  int groups = 0;
  const double elem = p == Precision::FP8 ? 1.0 : 2.0;
  for (std::size_t g = 0; g < m.size(); ++g) {
    if (m[g] <= 0 || k[g] <= 0 || n <= 0) continue;
    const double f = 2.0 * m[g] * n * k[g];
    flops += f;
    ++groups;
    k_mean += f * k[g];
    k_weighted += f * (k[g] / (k[g] + gemm_k_overhead(d, p)));  // FLOP-weighted K term
    bytes += (m[g] * k[g] + k[g] * n) * elem + m[g] * n * 2.0;
    useful += m[g] * n;
  }
  if (flops <= 0) return Seconds{0};
  double best = 0;
  for (const GemmTile& t : d.gemm_tiles) {
    double tiles = 0;
    for (std::size_t g = 0; g < m.size(); ++g)
      if (m[g] > 0 && k[g] > 0) tiles += std::ceil(m[g] / t.m) * std::ceil(n / t.n);
    const double waves = std::ceil(tiles / d.compute_units);
    best = std::max(best, useful / (waves * d.compute_units * t.m * t.n));
  }
  // The benchmarks' correction at the mean group: rows per group, FLOP-weighted K.
  const double corr = gemm_benchmark_correction(d, useful / n / groups, n, k_mean / flops, p);
  const double eff = std::min(1.0, peak_eff * best * (k_weighted / flops) * corr);
  const Seconds compute = Flops{flops} / (d.sustained_peak(p) * eff);
  const Seconds memory = Bytes{bytes} / (d.hbm_bandwidth * d.hbm_efficiency);
  return std::max(compute, memory) + d.kernel_overhead;
}

Seconds ComputeModel::attention(double bh, double sq, double skv, double d_qk, double d_v, bool causal,
                                double bwd_factor, Precision p) const {
  const bool backward = bwd_factor > 0;
  if (!backward) bwd_factor = 1.0;
  if (bh <= 0 || sq <= 0 || skv <= 0) return Seconds{0};
  const DeviceSpec& d = *d_;
  // Forward: QK^T and PV, 2 FLOPs per MAC; the causal mask halves the work. `bwd_factor`
  // scales a backward pass (2.5 for flash attention, from the workload).
  double flops = 2.0 * bh * sq * skv * (d_qk + d_v) * bwd_factor;
  if (causal) flops *= 0.5;
  // The measured fall-off from long non-causal attention: short sequences, the causal mask's
  // diagonal blocks, head dimension (the square of equal work stands for a rectangular shape).
  const double eff = (backward ? d.attention_bwd_efficiency : d.attention_fwd_efficiency) *
                     attention_shape_factor(d, std::sqrt(sq * skv), 0.5 * (d_qk + d_v), causal, backward);
  // Attention runs in 16-bit even in FP8 recipes (Transformer Engine keeps DPA in BF16).
  const Precision ap = p == Precision::FP8 ? Precision::BF16 : p;
  const Seconds compute = Flops{flops} / (d.sustained_peak(ap) * eff);
  const double io = bh * (sq * (d_qk + d_v) + skv * (d_qk + d_v)) * 2.0 * (backward ? 2.0 : 1.0);
  const Seconds memory = Bytes{io} / (d.hbm_bandwidth * d.hbm_efficiency);
  return std::max(compute, memory) + d.kernel_overhead;
}

Seconds ComputeModel::memory_bound(Bytes bytes) const {
  if (bytes.value() <= 0) return Seconds{0};
  return bytes / (d_->hbm_bandwidth * (d_->hbm_efficiency * d_->vector_speed)) + d_->kernel_overhead;
}

}  // namespace moesim::models
