#pragma once
// The parallel plan and the training settings, in Megatron-LM's vocabulary, and the scenario
// that ties model, cluster, training and plan together.
//
//   Scenario s = load_scenario_file("scenarios/pangu-ultra-moe-718b.json", {"parallelism.tp=4"});
//   s.plan.tp; s.plan.dp;              // dp derived from devices / (tp x pp x cp)
//   s.plan.ep_groups();                // expert-parallel size after TP-extend-EP
//
// Loading validates everything at once: unknown keys, bad units, and plans that do not divide
// (EP vs experts, TP vs heads, PP x VPP vs layers, devices vs TP x PP x CP x DP, batch vs
// micro-batches). Problems are thrown together as one ConfigError.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "moesim/models/device.hpp"
#include "moesim/models/model_spec.hpp"
#include "moesim/models/routing.hpp"
#include "moesim/models/workload.hpp"
#include "moesim/sim/config.hpp"
#include "moesim/strategies/plan/schedule.hpp"
#include "moesim/topologies/topology.hpp"

namespace moesim::strategies {

/// SelectiveOp: operator-level selective checkpointing (torchtitan's `selective_ac_option =
/// "op"`): each decoder layer keeps its input, the outputs of every other matmul and of the
/// attention kernel, and recomputes the rest in its backward.
enum class Recompute : std::uint8_t { None, Selective, Full, SelectiveOp };
enum class RecomputeMethod : std::uint8_t { Uniform, Block };
/// Pipeline schedules. ZeroBubbleH1 (Qi et al. 2023, "Zero Bubble Pipeline Parallelism"): the
/// backward is split into the data-gradient pass B and the weight-gradient pass W; stage s
/// runs 1F1B on F and B and defers each W by p - s - 1 micro-batches, so the Ws fill the
/// drain; same activation memory as 1F1B.
/// ZeroBubbleV: two chunks per stage placed as a V (stage s holds virtual stages s and
/// 2p - 1 - s, so the last virtual stage, with the loss, is back on stage 0), B/W split, list
/// scheduled like ZB-H1 with at most 2p chunk activations in flight (1F1B's memory).
/// DualPipeV (DeepSeek's DualPipe repository, after Sea AI Lab's "cut-in-half" DualPipe): the V
/// placement, DeepSeek's eight-phase order, whose steady state issues a forward of one chunk
/// and the full backward of the other as one overlapped F&B pair (one's expert all-to-all
/// under the other's compute), and zero-bubble weight-gradient deferral in warm-up and
/// cool-down; needs at least 2p micro-batches.
/// DualPipe (DeepSeek-V3): bidirectional; the model is cut into p stages and every device
/// holds two of them, stage s for micro-batches fed from device 0 and stage p - 1 - s for those
/// fed from device p - 1 (two parameter copies; internally two chunks, vpp = 2); DualPipeV's
/// phases on p/2 rank pairs with half the micro-batches per direction; needs p even and an
/// even number of micro-batches, at least 2p.
/// Expert all-to-all: flat pairwise, Pangu's hierarchical (aggregate across servers, then
/// exchange inside), or MindSpeed's all-gather across servers + all-to-all(v) inside.
enum class AllToAllAlgo : std::uint8_t { Flat, Hierarchical, AllGather };
const char* alltoall_name(AllToAllAlgo a);
enum class Fidelity : std::uint8_t { Fast, Balanced, Full };

const char* fidelity_name(Fidelity f);
std::optional<Fidelity> parse_fidelity(std::string_view s);

enum class DpSharding : std::uint8_t { None, Optimizer, OptimizerGradients, Full };
const char* dp_sharding_name(DpSharding s);  ///< Megatron-FSDP's names: no_shard, optim, optim_grads, optim_grads_params

struct Plan {
  int tp = 1;
  int pp = 1;
  int vpp = 1;
  int ep = 1;       ///< expert_model_parallel_size as given
  int etp = 0;      ///< expert_tensor_parallel_size; 0 = Megatron default (= tp)
  int cp = 1;
  int dp = 0;       ///< derived when 0
  int mbs = 1;
  bool sequence_parallel = false;
  /// Optimizer states sharded over the data-parallel ranks: dp_sharding >= Optimizer.
  bool distributed_optimizer = false;
  /// How data-parallel replicas shard the training state (ZeRO stages; Megatron-FSDP's
  /// data_parallel_sharding_strategy names): optimizer states (ZeRO-1, "optim", Megatron's
  /// distributed optimizer), also gradients (ZeRO-2, "optim_grads"), also parameters (ZeRO-3,
  /// FSDP, "optim_grads_params": each layer's weights are all-gathered before its forward and
  /// backward and its gradients reduce-scattered after its backward, every micro-batch).
  DpSharding dp_sharding = DpSharding::None;
  /// Full sharding: the gathered weights are freed after the forward and gathered again for the
  /// backward (FSDP's reshard_after_forward; ZeRO-3). Without it they stay until the backward.
  bool reshard_after_forward = true;
  /// Sharded gradients (OptimizerGradients, Full): reduce-scattered after every micro-batch's
  /// backward (Megatron-FSDP, DeepSpeed ZeRO, FSDP outside a pipeline), or accumulated unsharded
  /// in the reduce dtype and reduce-scattered once after the last micro-batch, with the gathered
  /// parameters kept from the first forward to the last backward — what
  /// torch.distributed.pipelining's stage does to an FSDP2 module (set_requires_gradient_sync
  /// and set_reshard_after_backward false for all but the last backward).
  bool grad_sync_every_microbatch = true;
  bool moe_tp_extend_ep = false;  ///< MindSpeed: TP ranks become extra EP ranks (experts not TP-split)
  bool allow_cross_node_tp = false;  ///< accept TP groups that cross servers (refused otherwise)
  Recompute recompute = Recompute::None;
  RecomputeMethod recompute_method = RecomputeMethod::Uniform;
  int recompute_num_layers = 0;  ///< full recompute: layers per virtual stage (0 = all)
  std::uint32_t recompute_modules = 0;  ///< selective: models::recompute bit set
  bool overlap_grad_reduce = false;
  bool overlap_param_gather = false;
  /// Tensor-parallel communication overlapped with the GEMM it feeds or drains (Megatron-core /
  /// Transformer Engine `--tp-comm-overlap` userbuffers, Ascend MC2): chunked, so the pair takes
  /// about the longer of the two.
  bool tp_comm_overlap = false;
  /// Context parallelism by all-gather (Megatron --cp-comm-type all_gather, the Llama 3 paper's
  /// CP, torchtitan's "allgather" rotation): each rank gathers every key/value block before its
  /// attention, which runs as one masked kernel, and reduce-scatters their gradients after the
  /// backward — nothing overlaps the transfers. false: the ring of point-to-point steps
  /// (--cp-comm-type p2p, Megatron's and MindSpeed's default).
  bool cp_all_gather = false;
  /// Megatron reduces BF16 gradients in FP32 unless --grad-reduce-in-bf16.
  bool grad_reduce_in_bf16 = false;
  /// Bytes per parameter of Adam's first and second moments (exp_avg, exp_avg_sq): 4 (FP32,
  /// the default) or 2 with Megatron's precision-aware optimizer (--use-precision-aware-optimizer
  /// --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16), 1 with fp8 moments.
  double exp_avg_bytes = 4;
  double exp_avg_sq_bytes = 4;
  /// Bytes per parameter of the optimizer's master weights (--main-params-dtype fp32 | fp16).
  double main_params_bytes = 4;
  /// FP8 recipes only: the model's weights are FP8 tensors (Megatron --fp8-param-gather, NeMo
  /// fp8_params): no BF16 copy beside the FP8 one, and the distributed optimizer all-gathers
  /// FP8 (1 byte per parameter).
  bool fp8_param_gather = false;
  AllToAllAlgo alltoall = AllToAllAlgo::Flat;
  ScheduleKind schedule = ScheduleKind::OneFOneB;
  /// MindSpeed --moe-fb-overlap: a forward and a backward of different micro-batches run as
  /// one interleaved pass, so each one's all-to-all hides behind the other's compute.
  bool fb_overlap = false;
  /// Megatron --moe-shared-expert-overlap / MindSpeed --moe-alltoall-overlap-comm: the shared
  /// expert computes while the routed tokens travel (forward and backward).
  bool shared_expert_overlap = false;
  /// Huawei's Adaptive Pipe Overlap (Pangu Ultra MoE): the hierarchical expert all-to-all in
  /// chunks whose cross-server and in-server phases run on separate streams, overlapping each
  /// other and, with forward-backward overlap (implied), the other micro-batch's compute.
  bool adaptive_pipe_overlap = false;
  /// Share of every chunk's saved activations swapped to host memory between its forward and
  /// backward (MindSpeed --swap-attention / Pangu's fine-grained swap), over the device-host link.
  double swap_activations = 0;
  /// MindSpeed --swap-optimizer: FP32 master weights and Adam moments kept in host memory,
  /// fetched over the device-host link for the optimizer step.
  bool swap_optimizer = false;
  /// Weights in host memory (ZeRO-Infinity's and Calculon's weight offload): each item's
  /// weights come over the host link before its forward and again before its backward, into
  /// a double buffer (two items resident); needs gradients sharded (optim_grads or more).
  bool offload_weights = false;
  // Pipeline layout: explicit decoder-layer counts per virtual stage, or a rule.
  std::string partition = "auto";       ///< "auto" (balance time), "even", or "explicit"
  std::vector<int> layers_per_stage;    ///< explicit: per virtual stage, pp*vpp entries
  int first_stage_layers = -1;          ///< decoder_first_pipeline_num_layers
  int last_stage_layers = -1;           ///< decoder_last_pipeline_num_layers
  int noop_layers = 0;                  ///< MindSpeed padding layers (count) at the end

  // Derived by validate():
  int num_microbatches = 0;
  [[nodiscard]] int ep_size() const { return moe_tp_extend_ep ? ep * tp : ep; }
  [[nodiscard]] int etp_size() const { return moe_tp_extend_ep ? 1 : (etp > 0 ? etp : tp); }
  [[nodiscard]] int edp_size() const { return (tp * cp * dp) / (ep_size() * etp_size()); }
  [[nodiscard]] int virtual_stages() const { return pp * vpp; }
};

/// Sequences packed from documents with attention inside each document (varlen flash
/// attention): a sequence's attention work is sum(len^2) / seq^2 of one causal sequence.
struct DocumentSpec {
  bool packed = false;
  double mean_tokens = 0;  ///< mean document length (lognormal)
  double sigma = 1.0;      ///< lognormal shape: spread of document lengths
  bool reorder = false;    ///< balance attention work over data-parallel ranks and micro-batches
};

struct TrainingSpec {
  DocumentSpec documents;
  std::int64_t seq_length = 4096;
  std::int64_t global_batch_size = 1;
  models::Precision precision = models::Precision::BF16;
  models::WorkloadOptions workload;  ///< attention kernel, dropout
  bool flash2 = false;  ///< attention_kernel "flash2": the device's FlashAttention-2 efficiencies
  [[nodiscard]] double tokens_per_step() const {
    return static_cast<double>(seq_length) * static_cast<double>(global_batch_size);
  }
};

/// Where experts live: static contiguous blocks, or load-aware re-placement (MindSpeed-style
/// dynamic expert migration: EMA load prediction, greedy placement, migrate when the imbalance
/// gain is large enough, the weights' traffic charged), optionally with replicas of hot experts.
struct PlacementSpec {
  bool rebalance = false;
  double ema = 0.9;            ///< weight of the history in the load prediction (pangu.md G: 0.9)
  double threshold = 0.08;     ///< migrate when the coefficient of variation drops by this much
  int interval_steps = 50;     ///< steps between re-placements (traffic amortised over them)
  int redundant_experts = 0;   ///< extra replicas of the hottest experts, per EP group
  /// Static placement given by the user (`moe.expert_map`): per expert, the expert-parallel
  /// ranks holding it (its copies split evenly over them). Empty: expert e on rank e / (E / ep).
  std::vector<std::vector<int>> expert_map;
};

/// How collectives get their durations: the flow-level model (flows over the topology sharing
/// links max-min fairly; all-to-all(v) at balanced and full fidelity) or the analytical alpha-beta
/// model (always at fast fidelity and when screening plans in a search).
enum class NetworkModel : std::uint8_t { Flow, Analytical };

/// Devices and links that are not ideal (`simulation.stragglers`), all drawn deterministically
/// from the scenario's seed: slow devices (thermal throttling, a weak HBM) whose kernels take
/// `slowdown` times as long; slow NICs whose transfers leaving the server run at `nic_bandwidth`
/// of the link (each step slow with probability `nic_flapping`: 1 — always — unless given); and
/// host jitter, every device's compute slowed each step by a half-normal factor 1 + |N(0, s)|.
/// With randomness per step (jitter, flapping), `steps` steps are simulated for a distribution.
struct Stragglers {
  double device_fraction = 0;           ///< of the devices, drawn from the seed
  std::vector<long long> devices;       ///< listed device ids (global ranks: stage x block + local)
  double slowdown = 1.0;                ///< >= 1
  double nic_fraction = 0;
  std::vector<long long> nics;          ///< listed device ids whose NIC is slow
  double nic_bandwidth = 1.0;           ///< (0, 1]: share of the NIC's bandwidth left
  double nic_flapping = 1.0;            ///< probability per step that a slow NIC is slow
  double host_jitter = 0;               ///< relative standard deviation, per device and step
  int steps = 1;
  [[nodiscard]] bool any() const {
    return ((device_fraction > 0 || !devices.empty()) && slowdown > 1.0) ||
           ((nic_fraction > 0 || !nics.empty()) && nic_bandwidth < 1.0 && nic_flapping > 0) || host_jitter > 0;
  }
};

/// Which FLOP count the headline MFU uses (`simulation.mfu_definition`); every result carries all.
enum class MfuDefinition : std::uint8_t {
  Moesim,    ///< model FLOPs: 6 x active parameters' matmuls + causal attention (no recompute)
  Megatron,  ///< Megatron-LM's num_floating_point_operations (models::megatron_flops_per_token)
  Huawei,    ///< model FLOPs with causal attention counted over every key (the full score matrix)
};
const char* mfu_definition_name(MfuDefinition d);

struct SimulationOptions {
  Fidelity fidelity = Fidelity::Balanced;
  MfuDefinition mfu_definition = MfuDefinition::Moesim;
  NetworkModel network = NetworkModel::Flow;
  /// Host dispatch (the framework's per-kernel cost on the host thread; 0: not modelled):
  /// kernels shorter than their launch leave the device waiting (host-bound).
  double launch_overhead = 0;   ///< seconds per kernel launch
  bool fused_vector_ops = false;  ///< vector operators fused into their neighbours: no launch of their own
  /// Compute slowed by communication running at the same time on the device (shared cores,
  /// memory bandwidth): a kernel overlapped by communication for a share o of its time takes
  /// (1 + slowdown x o) as long. 0 (default): no interference.
  double comm_compute_slowdown = 0;
  /// Different collectives overlapping in time on one rank's port (scale-up or NIC) share it
  /// (balanced and full fidelity; fast fidelity times each collective alone).
  bool port_sharing = true;
  /// The most memory a simulation may take (bytes; `simulation.max_memory`, `--max-memory`);
  /// 0: three quarters of this machine's RAM. A run estimated above it is refused up front.
  double max_memory_bytes = 0;
  Stragglers stragglers;
  int step_index = 0;  ///< which step of a multi-step straggler run this is (set by simulate)
};

/// The software stack a scenario names (`software`: a models/presets/software preset or an
/// object): framework facts that become defaults of the plan and training sections.
struct SoftwareStack {
  std::string name;  ///< empty: none named
  std::string framework, version;
  int year = 0;
  bool host_graphs = false;          ///< kernels replayed from captured graphs (no host time per operator)
  std::vector<std::string> applied;  ///< the defaults it set, "key=value"
};

/// Failures and checkpoints (the scenario's `reliability` section; by default the
/// models/presets/reliability/llama3-405b-h100.json preset; "none" turns it off): what a
/// capacity plan's goodput comes from.
struct Reliability {
  bool enabled = true;
  std::string name;                  ///< the preset, or "custom"
  double device_mtbf_s = 0;          ///< one failure per this many device-seconds (0: none)
  double node_mtbf_s = 0;            ///< one failure per this many server-seconds (0: none)
  bool checkpoint_async = true;      ///< two-phase: to host memory (blocking), then to storage
  double storage_write_bandwidth = 0;  ///< B/s, aggregate
  double storage_read_bandwidth = 0;   ///< B/s, aggregate
  double restart_s = 0;              ///< detecting, replacing, restarting (before reading)
  double checkpoint_interval_s = 0;  ///< 0: the interval that maximises goodput
  /// Every value's source, by key (from the preset or "given in the scenario").
  std::vector<std::pair<std::string, std::string>> sources;
};

struct Scenario {
  std::string file = "<inline>";
  nlohmann::json document;  ///< the effective scenario (after --set overrides)
  std::string model_name;
  models::ModelSpec model;
  topologies::ClusterSpec cluster;
  TrainingSpec training;
  Plan plan;
  models::RoutingSpec routing;
  PlacementSpec placement;
  SimulationOptions simulation;
  SoftwareStack software;
  std::uint64_t seed = 1;
  Reliability reliability;
  /// Every file the scenario was read from (itself, a model config.json, a routing histogram):
  /// an output path may not be one of them.
  [[nodiscard]] std::vector<std::string> input_files() const {
    std::vector<std::string> v;
    for (const std::string* f : {&file, &model.source_file, &routing.histogram_file})
      if (!f->empty() && *f != "<stdin>" && *f != "<inline>") v.push_back(*f);
    return v;
  }
};

/// Changing a loaded scenario. Its typed fields and `document` (which outputs echo, error
/// messages quote and search fingerprints hash) must say the same thing: outside loading, a
/// scenario is changed only through these, which update both.
void set_plan(Scenario& s, const Plan& p, const nlohmann::json& parallelism);
void set_fidelity(Scenario& s, Fidelity f);
void set_devices(Scenario& s, int devices);
void set_global_batch_size(Scenario& s, std::int64_t global_batch_size);

/// Loads and validates a scenario document. Throws ConfigError listing every problem.
Scenario load_scenario(const nlohmann::json& doc, const std::string& file, const std::string& base_dir);
/// Reads SCENARIO ("-" for stdin), applies `--set` overrides, loads. Throws ConfigError.
/// Problems in a value an override set are reported as the override's (`override_label` and the
/// assignment, e.g. "--set parallelism.tp=3"), not the file's.
Scenario load_scenario_file(const std::string& path, const std::vector<std::string>& overrides,
                            std::string_view override_label = "--set");

/// `parallelism.ep=8` (or `search.ep=[8,16]`) on a scenario that spells the key out overrides
/// that key (and the other way round) instead of creating a second spelling of it: the
/// assignment rewritten to the document's spelling (load_scenario_file applies it to --set).
std::string canonical_override(const nlohmann::json& doc, const std::string& assignment);

/// Checks divisibility and consistency of a plan against the model and cluster, deriving dp
/// and the number of micro-batches. Problems go to `diag` (JSON paths under /parallelism).
void validate_plan(Plan& plan, const TrainingSpec& t, const models::ModelSpec& m, const topologies::ClusterSpec& c,
                   Diagnostics& diag);
/// The same checks without messages (fast; for searches). Derives dp and micro-batches too.
bool plan_is_valid(Plan& plan, const TrainingSpec& t, const models::ModelSpec& m, const topologies::ClusterSpec& c);

/// Short aliases of the parallelism keys (INTERFACE.md): {alias, Megatron name}.
inline constexpr std::pair<std::string_view, std::string_view> kParallelismAliases[] = {
    {"tp", "tensor_model_parallel_size"},    {"pp", "pipeline_model_parallel_size"},
    {"vpp", "virtual_pipeline_model_parallel_size"}, {"ep", "expert_model_parallel_size"},
    {"etp", "expert_tensor_parallel_size"},  {"cp", "context_parallel_size"},
    {"dp", "data_parallel_size"},            {"mbs", "micro_batch_size"},
};

/// A Megatron / MindSpeed command line read as scenario keys.
struct MegatronArgs {
  nlohmann::json parallelism = nlohmann::json::object();
  nlohmann::json training = nlohmann::json::object();
  /// Model shape flags (--num-layers, --hidden-size, ...) by their key: checked against the model.
  nlohmann::json model = nlohmann::json::object();
  /// For messages: each key set above and the flag that set it, as written ("--num-layers 30").
  std::map<std::string, std::string> flag;
};

/// Parses a Megatron / MindSpeed command line (reference/pangu.md G for MindSpeed's flags; a
/// flag moesim cannot honour is refused with the reason).
MegatronArgs parse_megatron_args(const std::string& args, const std::string& pointer, Diagnostics& diag);

/// The parallelism section's megatron_args merged into `par` and `training`. A key the command
/// line and the scenario both give must agree, and shape flags must match `model` (when read):
/// a contradiction is an error naming the flag and the scenario's value.
void merge_megatron_args(nlohmann::json& par, nlohmann::json& training, const models::ModelSpec* model,
                         Diagnostics& diag);

}  // namespace moesim::strategies
