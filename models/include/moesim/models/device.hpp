#pragma once
// Accelerator models: the device description (from a preset JSON with a source for every
// number) and the compute model that turns an operator's shape into a duration.
//
//   DeviceSpec d = load_device_preset("ascend-910b2", diag);
//   ComputeModel cm{d};
//   Seconds t = cm.gemm(4096, 7680, 1536, Precision::BF16);   // M x K times K x N
//
// GEMMs follow a roofline with a shape-aware efficiency: tile quantisation (the output is cut
// into tiles of the shapes the kernel library uses), wave quantisation (tiles are spread over
// the compute cores in waves), a K-loop fill/drain term, and a sustained-peak fraction; where
// the preset carries published GEMM micro-benchmarks for the precision, their measured/modelled
// ratio, interpolated to the shape, corrects the shape model (gemm_benchmark_correction).
// Vector operators are memory-bound: bytes / (HBM bandwidth x efficiency). Every kernel pays a
// fixed launch overhead.

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "moesim/sim/config.hpp"
#include "moesim/sim/units.hpp"

namespace moesim::models {

enum class Precision : std::uint8_t { BF16, FP16, FP8 };
const char* precision_name(Precision p);

struct GemmTile {
  int m = 128;
  int n = 128;
};

/// A published GEMM micro-benchmark: the throughput a kernel library reached on one shape
/// ([m x k] x [k x n], `groups` equal problems of that shape for a grouped GEMM).
struct GemmBenchmark {
  Precision precision = Precision::BF16;
  double m = 0, n = 0, k = 0;
  int groups = 1;
  double tflops = 0;
  /// log(measured / (rated peak x the tile/wave/K model's shape efficiency)): what the shape
  /// model misses at this point. Filled in by parse_device.
  double log_ratio = 0;
  double log2_m = 0, log2_n = 0, log2_k = 0;  ///< the shape in the interpolation's coordinates
};

/// A published attention micro-benchmark series: the TFLOP/s one kernel reached in one direction,
/// with or without the causal mask, at one head dimension, over square sequence lengths (the
/// FlashAttention papers' setting: batch x sequence fixed, FLOPs 4 s^2 d h, halved when
/// causal, x2.5 backward).
struct AttentionSeries {
  bool flash2 = false;    ///< FlashAttention-2's kernels rather than the device's best ("flash")
  bool backward = false;
  bool causal = false;
  double head_dim = 128;
  std::vector<double> log2_seq;  ///< ascending
  std::vector<double> tflops;
};

struct DeviceSpec {
  std::string name;
  std::string description;
  FlopsPerSecond peak_bf16{0};
  FlopsPerSecond peak_fp16{0};
  FlopsPerSecond peak_fp8{0};  ///< 0 when the device has no FP8 tensor cores
  int compute_units = 1;
  std::vector<GemmTile> gemm_tiles;
  double gemm_peak_efficiency = 0.8;
  double gemm_fp8_efficiency = 0.0;  ///< sustained fraction of the FP8 peak; 0: as BF16
  double gemm_k_overhead = 128;  ///< K elements of a 16-bit main loop the per-tile fixed cost equals (FP8: twice)
  /// GEMM micro-benchmarks of the device's kernel library. Where the training precision has
  /// some, a GEMM runs at gemm_(fp8_)peak_efficiency x shape efficiency x the benchmarks'
  /// measured/modelled ratio interpolated to its shape (inverse squared distance in log m, n,
  /// k), so the efficiency is then the framework's fraction of the library kernel's speed.
  std::vector<GemmBenchmark> gemm_benchmarks;
  double attention_fwd_efficiency = 0.5;
  double attention_bwd_efficiency = 0.4;
  /// FlashAttention-2 (PyTorch SDPA) efficiencies; 0: not known for this device.
  double attention_fa2_fwd_efficiency = 0;
  double attention_fa2_bwd_efficiency = 0;
  /// Attention micro-benchmarks. Where the kernel in use has them, attention_*_efficiency is
  /// the efficiency of long non-causal attention at head dimension 128 and the series give the
  /// shape's fall-off from it (attention_shape_factor).
  std::vector<AttentionSeries> attention_benchmarks;
  bool attention_flash2 = false;  ///< the kernel in use is FlashAttention-2 (training.attention_kernel)
  Bytes hbm_capacity{0};
  BytesPerSecond hbm_bandwidth{0};
  double hbm_efficiency = 0.8;
  /// Speed of the vector (memory-bound) kernels relative to the HBM-bound model (operator_speed
  /// "vector"): below 1 for kernels that do not stream at the achievable bandwidth.
  double vector_speed = 1.0;
  Seconds kernel_overhead{0};
  Bytes memory_reserved{0};
  BytesPerSecond host_bandwidth{0};
  /// Host time to issue one operator from an eager framework (Python + PyTorch dispatch +
  /// library launch); 0 when not calibrated (the host is then never the bottleneck).
  Seconds host_op_time{0};
  /// Board power, watts: the rating the datasheet peaks hold at (`tdp`), the limit the device
  /// runs under (`limit`; 0: the rating) and the part that does not scale with the clock
  /// (`static_power`: leakage, HBM, board). 0 everywhere: no power model.
  double tdp_w = 0;
  double power_limit_w = 0;
  double static_power_w = 0;

  /// Dense peak for the precision GEMMs run in (FP8 falls back to BF16 when absent).
  [[nodiscard]] FlopsPerSecond peak(Precision p) const;
  /// The peak MFU divides by: the dense peak of the training precision.
  [[nodiscard]] FlopsPerSecond mfu_peak(Precision p) const { return peak(p); }
  /// Sustained clock under the power limit as a fraction of the rated one: dynamic power goes
  /// as f V^2 with V roughly proportional to f in the DVFS range, so as f^3, and the clock
  /// settles where static + dynamic power meets the limit. 1 without a limit below the rating.
  [[nodiscard]] double clock_fraction() const;
  /// What tensor-core work (GEMMs, attention) runs against: the peak at the sustained clock.
  [[nodiscard]] FlopsPerSecond sustained_peak(Precision p) const { return peak(p) * clock_fraction(); }
};

/// Parses a device description (a preset file or an inline object). Numbers may be given as
/// plain values or as {"value": ..., "source": "..."}. Problems go to `diag` under `pointer`.
DeviceSpec parse_device(const nlohmann::json& j, const std::string& pointer, Diagnostics& diag);

/// Tile x wave quantisation x K fill/drain of a GEMM shape on the device, without the peak
/// fraction: what the shape alone costs (1 for a shape that fills every tile slot, infinite K).
[[nodiscard]] double gemm_shape_efficiency(const DeviceSpec& d, double m, double n, double k, double batch = 1,
                                           Precision p = Precision::BF16);
/// The K-loop fill/drain cost in K elements for GEMMs in precision `p` (gemm_k_overhead is the
/// 16-bit figure; FP8 doubles it).
[[nodiscard]] double gemm_k_overhead(const DeviceSpec& d, Precision p);
/// The benchmarks' measured/modelled ratio at a shape, for GEMMs in precision `p`: the nearest
/// benchmarks' ratios weighted by inverse squared distance in (log2 m, log2 n, log2 k), m per
/// group; the ratio itself at a benchmarked shape; 1 with no benchmark in that precision.
[[nodiscard]] double gemm_benchmark_correction(const DeviceSpec& d, double m, double n, double k, Precision p);

/// Attention's speed at a shape relative to the kernel's long non-causal head-dim-128 speed, from
/// the device's attention_benchmarks for the kernel in use (log-linear in sequence length and
/// head dimension between measured points, clamped at the ends). A backward pass with a causal
/// mask and no causal backward series takes the forward's causal/non-causal ratio. `seq` is the
/// square length of equal work (sqrt(queries x keys)). 1 without benchmarks for the kernel.
[[nodiscard]] double attention_shape_factor(const DeviceSpec& d, double seq, double head_dim, bool causal,
                                            bool backward);

/// Operator durations on one device. Pure functions of the DeviceSpec; cheap to copy.
class ComputeModel {
 public:
  explicit ComputeModel(const DeviceSpec& d) : d_(&d) {}

  /// [m x k] x [k x n], `batch` independent problems of that shape (a grouped GEMM of equal
  /// groups). Includes one kernel overhead.
  [[nodiscard]] Seconds gemm(double m, double n, double k, Precision p, double batch = 1) const;
  /// A grouped GEMM (MoE experts): group g is [m_g x k_g] x [k_g x n]. Tiles of all groups share
  /// the waves; one kernel. With equal groups this equals gemm(m, n, k, p, groups).
  [[nodiscard]] Seconds grouped_gemm(const std::vector<double>& m, const std::vector<double>& k, double n,
                                     Precision p) const;
  /// Fraction of peak the GEMM shape reaches (tile x wave x K term x peak fraction).
  [[nodiscard]] double gemm_efficiency(double m, double n, double k, double batch = 1,
                                       Precision p = Precision::BF16) const;
  /// Fused (flash) attention: `bh` = batch x heads, sq queries against skv keys. A backward
  /// pass gives `bwd_factor` > 0, its FLOPs relative to the forward; 0 means forward.
  [[nodiscard]] Seconds attention(double bh, double sq, double skv, double d_qk, double d_v, bool causal,
                                  double bwd_factor, Precision p) const;
  /// A memory-bound kernel moving `bytes` through HBM.
  [[nodiscard]] Seconds memory_bound(Bytes bytes) const;
  [[nodiscard]] Seconds kernel_overhead() const { return d_->kernel_overhead; }
  [[nodiscard]] const DeviceSpec& device() const { return *d_; }

 private:
  const DeviceSpec* d_;
};

}  // namespace moesim::models
