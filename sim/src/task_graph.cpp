#include "moesim/sim/task_graph.hpp"

#include <algorithm>
#include <cassert>

namespace moesim::sim {

TaskGraphBuilder::TaskGraphBuilder(std::vector<std::string> category_names) {
  g_.category_names_ = std::move(category_names);
  g_.res_offset_.push_back(0);
}

void TaskGraphBuilder::reserve(std::size_t tasks, std::size_t edges) {
  g_.duration_.reserve(tasks);
  g_.category_.reserve(tasks);
  g_.label_.reserve(tasks);
  g_.ordinal_.reserve(tasks);
  g_.res_offset_.reserve(tasks + 1);
  g_.res_.reserve(tasks + tasks / 4);
  edges_.reserve(edges);
}

ResourceId TaskGraphBuilder::add_resource(std::string name, std::uint32_t rank, ResourceKind kind) {
  g_.resources_.push_back(ResourceInfo{std::move(name), rank, kind});
  return static_cast<ResourceId>(g_.resources_.size() - 1);
}

LabelId TaskGraphBuilder::label(std::string_view text) {
  auto it = label_index_.find(std::string(text));
  if (it != label_index_.end()) return it->second;
  const auto id = static_cast<LabelId>(g_.labels_.size());
  g_.labels_.emplace_back(text);
  label_index_.emplace(std::string(text), id);
  return id;
}

TaskId TaskGraphBuilder::add_task(Tick duration, Category category, LabelId label, std::int32_t ordinal,
                                  std::span<const ResourceId> resources) {
  if (g_.res_offset_.empty()) g_.res_offset_.push_back(0);
  assert(duration >= 0);
  assert(!resources.empty());
  const auto id = static_cast<TaskId>(g_.duration_.size());
  g_.duration_.push_back(duration);
  g_.category_.push_back(category);
  g_.label_.push_back(label);
  g_.ordinal_.push_back(ordinal);
  for (ResourceId r : resources) {
    assert(r < g_.resources_.size());
    g_.res_.push_back(r);
  }
  g_.res_offset_.push_back(static_cast<std::uint32_t>(g_.res_.size()));
  return id;
}

void TaskGraphBuilder::depend(TaskId before, TaskId after) {
  assert(before < g_.duration_.size() && after < g_.duration_.size());
  if (before == after) return;
  edges_.emplace_back(before, after);
}

TaskGraph TaskGraphBuilder::build() && {
  TaskGraph& g = g_;
  if (g.res_offset_.empty()) g.res_offset_.push_back(0);
  const std::size_t n = g.duration_.size();

  // Successor and predecessor CSR from the edge list by counting (no sort: the lists keep
  // insertion order, and a duplicate edge is harmless — it is counted and released twice).
  g.succ_offset_.assign(n + 1, 0);
  g.pred_offset_.assign(n + 1, 0);
  for (auto [a, b] : edges_) {
    ++g.succ_offset_[a + 1];
    ++g.pred_offset_[b + 1];
  }
  for (std::size_t i = 0; i < n; ++i) {
    g.succ_offset_[i + 1] += g.succ_offset_[i];
    g.pred_offset_[i + 1] += g.pred_offset_[i];
  }
  g.succ_.resize(edges_.size());
  g.pred_.resize(edges_.size());
  {
    std::vector<std::uint32_t> sfill(g.succ_offset_.begin(), g.succ_offset_.end() - 1);
    std::vector<std::uint32_t> pfill(g.pred_offset_.begin(), g.pred_offset_.end() - 1);
    for (auto [a, b] : edges_) {
      g.succ_[sfill[a]++] = b;
      g.pred_[pfill[b]++] = a;
    }
  }
  edges_.clear();
  edges_.shrink_to_fit();

  // Stream program order: tasks in id order per stream resource.
  const std::size_t nr = g.resources_.size();
  g.queue_offset_.assign(nr + 1, 0);
  for (std::size_t t = 0; t < n; ++t)
    for (std::uint32_t s = g.res_offset_[t]; s < g.res_offset_[t + 1]; ++s)
      if (g.resources_[g.res_[s]].kind == ResourceKind::Stream) ++g.queue_offset_[g.res_[s] + 1];
  for (std::size_t r = 0; r < nr; ++r) g.queue_offset_[r + 1] += g.queue_offset_[r];
  g.queue_.resize(g.queue_offset_[nr]);
  {
    std::vector<std::uint32_t> fill(g.queue_offset_.begin(), g.queue_offset_.end() - 1);
    for (std::size_t t = 0; t < n; ++t)
      for (std::uint32_t s = g.res_offset_[t]; s < g.res_offset_[t + 1]; ++s) {
        const ResourceId r = g.res_[s];
        if (g.resources_[r].kind == ResourceKind::Stream) g.queue_[fill[r]++] = static_cast<TaskId>(t);
      }
  }
  label_index_.clear();
  return std::move(g_);
}

}  // namespace moesim::sim
