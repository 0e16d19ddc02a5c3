#pragma once
// Inference cost model for RL rollouts and forward-only passes: prefill (compute-bound: the
// model's forward operators at the device's GEMM / attention efficiency) and decode (one
// step per generated token, or per `acceptance_length` tokens with MTP speculative decoding:
// every weight the step touches and the KV cache of every active sequence read from HBM,
// roofline against the step's FLOPs), on an inference layout (TP x PP x EP per instance,
// DP instances), with the TP all-reduces and EP all-to-alls of the collective models.
//
//   InferencePlan ip;  ip.tp = 8; ip.ep = 64;          // 64 dies per instance, 8-way attention TP
//   InferenceModel im(model, cluster, topo, ip, models::Precision::BF16);
//   StepCost c = im.decode_step(/*sequences=*/256, /*context tokens summed=*/256 * 4096.0);
//   c.seconds;  c.flops;  c.hbm_bytes_per_device;     // one decode step of the whole instance
//
// The model layer's operators (models::build_workload) are reused unchanged for the GEMMs and
// vector operators; the attention core is replaced in decode by a read of the KV cache (MLA:
// the compressed latent, kv_lora_rank + qk_rope_head_dim per token and layer, with absorbed
// up-projections; GQA: K and V of the rank's KV heads). Nothing here is a training step.

#include <cstdint>
#include <map>
#include <vector>

#include "moesim/models/device.hpp"
#include "moesim/models/model_spec.hpp"
#include "moesim/models/workload.hpp"
#include "moesim/topologies/collectives.hpp"
#include "moesim/topologies/topology.hpp"

namespace moesim::strategies {

/// How an inference instance is laid out. Each pipeline stage has max(tp, ep) devices:
/// attention and dense layers split tp-ways (max(tp, ep) / tp attention data-parallel groups,
/// each serving its share of the sequences), routed experts split ep-ways (whole experts).
struct InferencePlan {
  int tp = 1;
  int pp = 1;
  int ep = 1;
  int draft_tokens = 0;            ///< MTP speculative decoding: draft tokens per step (0: off)
  double acceptance_length = 1.0;  ///< tokens accepted per decode step, 1 .. 1 + draft_tokens
  [[nodiscard]] int stage_devices() const { return tp > ep ? tp : ep; }
  [[nodiscard]] int devices() const { return pp * stage_devices(); }
  [[nodiscard]] int attention_groups() const { return stage_devices() / tp; }
};

/// Cost of one decode step or one prefill of a whole instance.
struct StepCost {
  double seconds = 0;
  double flops = 0;                 ///< model FLOPs of the instance (all its devices)
  double hbm_bytes_per_device = 0;  ///< bytes read and written by the busiest device
};

/// Where one decode step's time goes on the slowest stage (seconds, multiplied by pp).
struct DecodeBreakdown {
  double gemm = 0;       ///< weight-reading GEMMs (dense and experts), roofline
  double attention = 0;  ///< KV-cache reads and attention arithmetic
  double vector = 0;     ///< norms, activations, sampling (memory-bound)
  double tp_comm = 0;
  double ep_comm = 0;
  double pp_comm = 0;
  [[nodiscard]] double total() const { return gemm + attention + vector + tp_comm + ep_comm + pp_comm; }
};

class InferenceModel {
 public:
  InferenceModel(const models::ModelSpec& m, const topologies::ClusterSpec& c, const topologies::Topology& topo,
                 const InferencePlan& plan, models::Precision precision);
  InferenceModel(const InferenceModel&) = delete;  // the compute model points at device_
  InferenceModel& operator=(const InferenceModel&) = delete;

  [[nodiscard]] const InferencePlan& plan() const { return plan_; }
  /// Weight bytes held by one device of the most loaded stage (16-bit weights).
  [[nodiscard]] double weight_bytes_per_device() const { return weight_bytes_; }
  /// KV-cache bytes one sequence's token costs on one device (most loaded stage).
  [[nodiscard]] double kv_bytes_per_token_per_device() const { return kv_bytes_per_token_; }
  /// KV-cache bytes per token for the whole model (all layers, one copy): MLA 2 x (kv_lora + rope) x layers.
  [[nodiscard]] double kv_bytes_per_token_model() const { return kv_bytes_per_token_model_; }
  /// HBM left for the KV cache on one device: capacity - runtime reserve - weights (may be < 0).
  [[nodiscard]] double kv_budget_per_device() const;
  /// Sequences one instance can hold at once when each reserves `context_tokens` of KV cache.
  [[nodiscard]] std::int64_t max_sequences(double context_tokens) const;

  /// One decode step of an instance with `sequences` active and `context_sum` tokens of KV
  /// cache over them; every sequence gains acceptance_length tokens.
  [[nodiscard]] StepCost decode_step(std::int64_t sequences, double context_sum) const;
  [[nodiscard]] DecodeBreakdown decode_breakdown(std::int64_t sequences, double context_sum) const;
  /// Forward pass over `sequences` new sequences of `tokens` tokens in total (sum of squared
  /// lengths `sum_sq`, for causal attention), on one instance: prefill or a reference / reward
  /// model's scoring pass.
  [[nodiscard]] StepCost prefill(double tokens, double sum_sq, double sequences) const;

 private:
  struct Linear {  // decode step of a stage = c0 + c1 x (context tokens of one attention group)
    double c0 = 0, c1 = 0, flops0 = 0, flops1 = 0, bytes0 = 0, bytes1 = 0;
    DecodeBreakdown parts;
  };
  struct StageOps {
    std::vector<const models::Op*> ops;      ///< main-model operators of the stage, in order
    std::vector<const models::Op*> mtp_ops;  ///< the MTP module (last stage; when drafting)
    int attention_layers = 0;                ///< layers with a KV cache (incl. MTP when used)
  };
  [[nodiscard]] Linear stage_decode(const StageOps& st, double seqs_per_group, double instance_seqs) const;
  [[nodiscard]] double op_seconds(const models::Op& op, double group_tokens, double instance_tokens, bool decode,
                                  double attn_seqs, double attn_len, double* flops, double* bytes,
                                  DecodeBreakdown* parts) const;
  [[nodiscard]] const std::vector<Linear>& decode_linear(std::int64_t sequences) const;

  const models::ModelSpec* m_;
  models::DeviceSpec device_;
  models::ComputeModel cm_;
  InferencePlan plan_;
  models::Precision precision_;
  models::Workload w_;
  std::vector<StageOps> stages_;
  topologies::GroupShape tp_shape_, ep_shape_;
  double ll_base_ = 0, ll_per_peer_ = 0, ll_bandwidth_ = 0;  ///< low-latency all-to-all (decode)
  double pp_hop_bandwidth_ = 0, pp_hop_latency_ = 0;
  double weight_bytes_ = 0;
  double kv_bytes_per_token_ = 0;
  double kv_bytes_per_token_model_ = 0;
  double kv_per_token_layer_device_ = 0;  ///< one layer, one device
  double attn_qk_ = 0, attn_v_ = 0;       ///< decode attention dims per head (MLA absorbed)
  double heads_local_ = 0;
  mutable std::map<std::int64_t, std::vector<Linear>> memo_;
};

}  // namespace moesim::strategies
