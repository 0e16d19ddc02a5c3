// The memory detail of a simulated step (simulate --memory-detail): its JSON object and its
// text, every term of the largest stage's memory with its source.
#include <fmt/format.h>

#include "moesim/strategies/output/simulate.hpp"

namespace moesim::strategies {

nlohmann::json to_json(const MemoryDetail& d) {
  using nlohmann::json;
  json items = json::array();
  for (const MemoryItem& it : d.items) {
    json terms = json::array();
    for (const MemoryTerm& t : it.terms)
      terms.push_back({{"op", t.op},
                       {"full_bytes", t.full_bytes},
                       {"kept_bytes", t.kept_bytes},
                       {"dropped_by", *t.dropped_by ? json(t.dropped_by) : json(nullptr)},
                       {"note", t.note},
                       {"precision_factor", t.precision_factor}});
    items.push_back({{"kind", it.kind},
                     {"count", it.count},
                     {"full_bytes", it.full_bytes},
                     {"kept_bytes", it.kept_bytes},
                     {"terms", std::move(terms)}});
  }
  json statics = json::array();
  for (const MemoryStaticTerm& t : d.statics)
    statics.push_back({{"name", t.name},
                       {"bytes", t.bytes},
                       {"params", t.params},
                       {"bytes_per_param", t.bytes_per_param},
                       {"note", t.note}});
  return {{"stage", d.stage},
          {"chunks", d.chunks},
          {"inflight_chunks", d.inflight_chunks},
          {"chunk_bytes", d.chunk_bytes},
          {"per_microbatch_bytes", d.per_microbatch_bytes},
          {"reconciliation",
           {{"estimate_bytes", d.estimate_bytes},
            {"walked_peak_bytes", d.walked_peak_bytes},
            {"residual_bytes", d.walked_peak_bytes - d.estimate_bytes},
            {"swapped_bytes", d.swapped_activation_bytes},
            {"activations_bytes", d.activations_bytes}}},
          {"transient_source", d.transient_source},
          {"items", std::move(items)},
          {"static", std::move(statics)},
          {"total_bytes", d.total_bytes}};
}

namespace {

std::string bytes_text(double b) {
  const double a = std::abs(b);
  if (a >= 1024.0 * 1024.0 * 1024.0) return fmt::format("{:.2f} GiB", b / (1024.0 * 1024.0 * 1024.0));
  if (a >= 1024.0 * 1024.0) return fmt::format("{:.1f} MiB", b / (1024.0 * 1024.0));
  if (a >= 1024.0) return fmt::format("{:.1f} KiB", b / 1024.0);
  return fmt::format("{:.0f} B", b);
}

}  // namespace

std::string format_memory_detail(const MemoryDetail& d, double capacity_bytes) {
  std::string o;
  o += fmt::format("\nmemory detail: pipeline stage {} (the largest), one rank: {} of {}\n", d.stage,
                   bytes_text(d.total_bytes), bytes_text(capacity_bytes));
  o += fmt::format("  activations kept for backward, one micro-batch per item\n");
  o += fmt::format("    {:<34} {:>11} {:>11}  {:<34} {}\n", "item / operator", "no recomp.", "kept", "dropped by",
                   "what is kept and its source");
  for (const MemoryItem& it : d.items) {
    o += fmt::format("    {:<34} {:>11} {:>11}  x {} in the stage = {} kept\n", it.kind, bytes_text(it.full_bytes),
                     bytes_text(it.kept_bytes), it.count, bytes_text(it.kept_bytes * it.count));
    if (it.terms.empty()) o += "      (keeps nothing for backward)\n";
    for (const MemoryTerm& t : it.terms) {
      std::string note = t.note;
      if (t.precision_factor == 0.0) note += " [x0: counted with the operator that keeps it]";
      else if (t.precision_factor != 1.0) note += fmt::format(" [x{:g}: FP8 recipe]", t.precision_factor);
      o += fmt::format("      {:<32} {:>11} {:>11}  {:<34} {}\n", t.op, bytes_text(t.full_bytes),
                       bytes_text(t.kept_bytes), *t.dropped_by ? t.dropped_by : "-", note);
    }
  }
  std::string chunks;
  for (std::size_t c = 0; c < d.chunk_bytes.size(); ++c) chunks += (c ? " + " : "") + bytes_text(d.chunk_bytes[c]);
  o += fmt::format("  one micro-batch through the stage: sum of kept x items = {} ({} chunk{}: {})\n",
                   bytes_text(d.per_microbatch_bytes), d.chunks, d.chunks == 1 ? "" : "s", chunks);
  const double residual = d.walked_peak_bytes - d.estimate_bytes;
  o += fmt::format(
      "  check: {} / {} chunk{} x {} in flight = {}; walked peak {}; residual {} ({:.1e} relative{})\n",
      bytes_text(d.per_microbatch_bytes), d.chunks, d.chunks == 1 ? "" : "s", d.inflight_chunks,
      bytes_text(d.estimate_bytes), bytes_text(d.walked_peak_bytes), bytes_text(residual),
      d.walked_peak_bytes > 0 ? residual / d.walked_peak_bytes : 0.0,
      std::abs(residual) > 1e-9 * d.walked_peak_bytes ? "; the chunks differ, the peak is the walked one" : "");
  o += fmt::format("  activations = walked peak {} - swapped to host {} = {}\n", bytes_text(d.walked_peak_bytes),
                   bytes_text(d.swapped_activation_bytes), bytes_text(d.activations_bytes));
  o += "  the stage's memory\n";
  double sum = 0;
  for (const MemoryStaticTerm& t : d.statics) {
    sum += t.bytes;
    const std::string per =
        t.bytes_per_param > 0 ? fmt::format("{:.4g} params x {:g} B", t.params, t.bytes_per_param) : std::string();
    o += fmt::format("    {:<22} {:>11}  {:<26} {}\n", t.name, bytes_text(t.bytes), per, t.note);
  }
  o += fmt::format("    {:<22} {:>11}  {:<26} {}\n", "total", bytes_text(d.total_bytes), "",
                   fmt::format("the sum of the parts above ({}); capacity {}", bytes_text(sum), bytes_text(capacity_bytes)));
  return o;
}

}  // namespace moesim::strategies
