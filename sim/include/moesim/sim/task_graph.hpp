#pragma once
// A flat, immutable task graph for the discrete-event engine.
//
// Tasks run on one or more resources for a fixed duration (integer ticks) once every task they
// depend on has finished. Resources are *streams* (tasks run in the order they were added, one
// at a time, like a CUDA/ACL stream) or *links* (tasks are served first-come-first-served, one
// at a time, like a NIC port). A task that needs several resources (a collective occupying the
// communication streams of every simulated member of its group; a transfer holding a sender's
// and a receiver's port) starts only when it holds all of them.
//
//   TaskGraphBuilder b;
//   auto compute = b.add_resource("rank0/compute", 0, ResourceKind::Stream);
//   auto a = b.add_task(1000, /*category=*/0, b.label("gemm"), /*ordinal=*/0, {compute});
//   auto c = b.add_task(500, 0, b.label("add"), 0, {compute});
//   b.depend(a, c);
//   TaskGraph g = std::move(b).build();
//
// Everything lives in contiguous arrays; dependencies and resources are stored as CSR.
// The graph knows nothing of models or parallelism: categories and labels are plain names.

#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "moesim/sim/units.hpp"

namespace moesim::sim {

using TaskId = std::uint32_t;
using ResourceId = std::uint32_t;
using Category = std::uint16_t;
using LabelId = std::uint32_t;
inline constexpr TaskId kNoTask = 0xffffffffu;

enum class ResourceKind : std::uint8_t {
  Stream,  ///< tasks run in insertion (program) order
  Link,    ///< tasks run first-come-first-served in the order they become ready
};

struct ResourceInfo {
  std::string name;
  std::uint32_t rank = 0;  ///< owning rank (for traces); links between ranks name one end
  ResourceKind kind = ResourceKind::Stream;
};

class TaskGraph {
 public:
  [[nodiscard]] std::size_t num_tasks() const { return duration_.size(); }
  [[nodiscard]] std::size_t num_resources() const { return resources_.size(); }
  [[nodiscard]] std::size_t num_edges() const { return succ_.size(); }

  [[nodiscard]] Tick duration(TaskId t) const { return duration_[t]; }
  /// Changes one task's duration (the structure stays); for fixed-point passes that re-run the
  /// engine with durations derived from a previous run.
  void set_duration(TaskId t, Tick d) { duration_[t] = d; }
  [[nodiscard]] Category category(TaskId t) const { return category_[t]; }
  [[nodiscard]] LabelId label(TaskId t) const { return label_[t]; }
  [[nodiscard]] std::int32_t ordinal(TaskId t) const { return ordinal_[t]; }
  [[nodiscard]] std::span<const ResourceId> resources_of(TaskId t) const {
    return {res_.data() + res_offset_[t], res_offset_[t + 1] - res_offset_[t]};
  }
  [[nodiscard]] std::span<const TaskId> successors(TaskId t) const {
    return {succ_.data() + succ_offset_[t], succ_offset_[t + 1] - succ_offset_[t]};
  }
  [[nodiscard]] std::span<const TaskId> predecessors(TaskId t) const {
    return {pred_.data() + pred_offset_[t], pred_offset_[t + 1] - pred_offset_[t]};
  }
  /// Tasks of a stream in program order (empty for links).
  [[nodiscard]] std::span<const TaskId> stream_order(ResourceId r) const {
    return {queue_.data() + queue_offset_[r], queue_offset_[r + 1] - queue_offset_[r]};
  }
  [[nodiscard]] const ResourceInfo& resource(ResourceId r) const { return resources_[r]; }
  [[nodiscard]] const std::vector<std::string>& category_names() const { return category_names_; }
  [[nodiscard]] const std::string& label_text(LabelId l) const { return labels_[l]; }
  [[nodiscard]] const std::vector<std::string>& labels() const { return labels_; }
  /// Offset of task t's first resource slot (slots index (task, resource) pairs).
  [[nodiscard]] std::uint32_t slot_begin(TaskId t) const { return res_offset_[t]; }
  [[nodiscard]] std::size_t num_slots() const { return res_.size(); }

 private:
  friend class TaskGraphBuilder;
  std::vector<Tick> duration_;
  std::vector<Category> category_;
  std::vector<LabelId> label_;
  std::vector<std::int32_t> ordinal_;
  std::vector<std::uint32_t> res_offset_;
  std::vector<ResourceId> res_;
  std::vector<std::uint32_t> succ_offset_;
  std::vector<TaskId> succ_;
  std::vector<std::uint32_t> pred_offset_;
  std::vector<TaskId> pred_;
  std::vector<std::uint32_t> queue_offset_;
  std::vector<TaskId> queue_;
  std::vector<ResourceInfo> resources_;
  std::vector<std::string> category_names_;
  std::vector<std::string> labels_;
};

class TaskGraphBuilder {
 public:
  TaskGraphBuilder() = default;
  explicit TaskGraphBuilder(std::vector<std::string> category_names);

  void reserve(std::size_t tasks, std::size_t edges);
  ResourceId add_resource(std::string name, std::uint32_t rank, ResourceKind kind);
  LabelId label(std::string_view text);
  TaskId add_task(Tick duration, Category category, LabelId label, std::int32_t ordinal,
                  std::span<const ResourceId> resources);
  TaskId add_task(Tick duration, Category category, LabelId label, std::int32_t ordinal,
                  std::initializer_list<ResourceId> resources) {
    return add_task(duration, category, label, ordinal, std::span<const ResourceId>(resources.begin(), resources.size()));
  }
  /// `after` cannot start before `before` has finished. Self-edges and duplicates are harmless.
  void depend(TaskId before, TaskId after);
  [[nodiscard]] std::size_t num_tasks() const { return g_.duration_.size(); }
  [[nodiscard]] Tick duration(TaskId t) const { return g_.duration_[t]; }
  [[nodiscard]] const ResourceInfo& resource(ResourceId r) const { return g_.resources_[r]; }

  TaskGraph build() &&;

 private:
  TaskGraph g_;
  std::vector<std::pair<TaskId, TaskId>> edges_;
  std::unordered_map<std::string, LabelId> label_index_;
};

}  // namespace moesim::sim
