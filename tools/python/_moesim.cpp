// moesim._moesim — the C++ half of the `moesim` Python package (the Python half,
// tools/python/moesim/__init__.py, adds signatures, argument checks and documentation).
//
//   import moesim
//   r = moesim.simulate("scenarios/pangu-ultra-moe-718b.json", {"parallelism.tp": 4}, trace=True)
//   r["step_time_s"], r["breakdown_s"]["bubble"], r["trace"]["tasks"]["end"].max()
//
// A thin façade over the strategies API (STYLE.md item 12): the same loader, overrides,
// simulation and JSON as the CLI, converted to plain Python objects (dicts, lists, NumPy arrays
// for the trace). The GIL is released while C++ loads, simulates or searches. Bad input of any
// kind — a wrong Python type, an unknown key, a plan that does not divide — is a
// moesim.ConfigError whose message holds the CLI's lines ("file:/json/path: value constraint").

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>
#include <optional>
#include <thread>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "moesim/models/presets.hpp"
#include "moesim/sim/cancel.hpp"
#include "moesim/sim/progress.hpp"
#include "moesim/sim/config.hpp"
#include "moesim/sim/output_file.hpp"
#include "moesim/strategies/plan/plan.hpp"
#include "moesim/strategies/plan/preset_info.hpp"
#include "moesim/strategies/search/model_search.hpp"
#include "moesim/strategies/search/search.hpp"
#include "moesim/strategies/output/simulate.hpp"
#include "moesim/topologies/topology.hpp"

namespace py = pybind11;
namespace st = moesim::strategies;
using nlohmann::json;

namespace {

/// Where problems with the call's own arguments are reported ("<python>:/overrides: ...").
constexpr const char* kArgumentsFile = "<python>";
/// The file name of a scenario given as a dict.
constexpr const char* kDictFile = "<dict>";

// The exception classes, created once at import (module state lives as long as the module).
PyObject* g_error = nullptr;
PyObject* g_config_error = nullptr;
PyObject* g_infeasible = nullptr;

[[noreturn]] void throw_argument_error(const std::string& pointer, const std::string& value,
                                       const std::string& constraint) {
  throw moesim::ConfigError({moesim::Diagnostic{kArgumentsFile, pointer, value, constraint}});
}

std::string brief_repr(py::handle h) {
  std::string r = py::repr(h).cast<std::string>();
  if (r.size() > 60) r = r.substr(0, 57) + "...";
  return r;
}

std::string type_name(py::handle h) { return Py_TYPE(h.ptr())->tp_name; }

// ---------------------------------------------------------------------------------------------
// Python -> JSON. Every problem is collected with its JSON pointer, then thrown together.

class ToJson {
 public:
  explicit ToJson(std::string file) : file_(std::move(file)) {}

  json convert(py::handle h, const std::string& pointer) {
    json out = value(h, pointer);
    if (!errors_.empty()) throw moesim::ConfigError(std::move(errors_));
    return out;
  }

 private:
  void error(const std::string& pointer, py::handle h, const std::string& constraint) {
    errors_.push_back(moesim::Diagnostic{file_, pointer, brief_repr(h), constraint});
  }

  json value(py::handle h, const std::string& pointer) {
    PyObject* o = h.ptr();
    if (o == Py_None) return nullptr;
    if (PyBool_Check(o)) return o == Py_True;
    if (PyLong_Check(o)) return integer(h, pointer);
    if (PyFloat_Check(o)) return number(h, pointer);
    if (PyUnicode_Check(o)) return h.cast<std::string>();
    if (PyDict_Check(o)) {
      json obj = json::object();
      for (auto item : py::reinterpret_borrow<py::dict>(h)) {
        if (!PyUnicode_Check(item.first.ptr())) {
          error(pointer, item.first, "is a key of Python type " + type_name(item.first) + "; keys must be strings");
          continue;
        }
        const std::string key = item.first.cast<std::string>();
        obj[key] = value(item.second, pointer + "/" + moesim::escape_pointer_token(key));
      }
      return obj;
    }
    if (PyList_Check(o) || PyTuple_Check(o)) {
      json arr = json::array();
      std::size_t i = 0;
      for (auto item : py::reinterpret_borrow<py::iterable>(h)) arr.push_back(value(item, pointer + "/" + std::to_string(i++)));
      return arr;
    }
    // NumPy scalars and arrays: their tolist() gives Python numbers and (nested) lists.
    if (PyObject_HasAttrString(o, "tolist") == 1) {
      py::object plain = py::reinterpret_steal<py::object>(PyObject_CallMethod(o, "tolist", nullptr));
      if (plain && Py_TYPE(plain.ptr()) != Py_TYPE(o)) return value(plain, pointer);
      PyErr_Clear();
    } else if (PyIndex_Check(o)) {
      return integer(h, pointer);
    } else if (Py_TYPE(o)->tp_as_number != nullptr && Py_TYPE(o)->tp_as_number->nb_float != nullptr) {
      return number(h, pointer);
    }
    error(pointer, h,
          "(Python " + type_name(h) + ") is not a JSON value; use dict, list, tuple, str, int, float, bool or None");
    return nullptr;
  }

  json number(py::handle h, const std::string& pointer) {
    const double d = PyFloat_AsDouble(h.ptr());
    if (d == -1.0 && PyErr_Occurred()) {
      PyErr_Clear();
      error(pointer, h, "(Python " + type_name(h) + ") cannot be converted to a number");
      return nullptr;
    }
    if (!std::isfinite(d)) {
      error(pointer, h, "must be a finite number (JSON has no NaN or infinity)");
      return nullptr;
    }
    return d;
  }

  json integer(py::handle h, const std::string& pointer) {
    py::object idx = py::reinterpret_steal<py::object>(PyNumber_Index(h.ptr()));
    if (!idx) {
      PyErr_Clear();
      error(pointer, h, "(Python " + type_name(h) + ") cannot be converted to an integer");
      return nullptr;
    }
    int overflow = 0;
    const long long v = PyLong_AsLongLongAndOverflow(idx.ptr(), &overflow);
    if (overflow == 0) return static_cast<std::int64_t>(v);
    if (overflow > 0) {
      const unsigned long long u = PyLong_AsUnsignedLongLong(idx.ptr());
      if (!PyErr_Occurred()) return static_cast<std::uint64_t>(u);
      PyErr_Clear();
    }
    error(pointer, h, "is outside the 64-bit integer range");
    return nullptr;
  }


  std::string file_;
  std::vector<moesim::Diagnostic> errors_;
};

// JSON -> Python (dicts keep the JSON object's key order).
py::object to_python(const json& j) {
  switch (j.type()) {
    case json::value_t::null: return py::none();
    case json::value_t::boolean: return py::bool_(j.get<bool>());
    case json::value_t::number_integer: return py::int_(j.get<std::int64_t>());
    case json::value_t::number_unsigned: return py::int_(j.get<std::uint64_t>());
    case json::value_t::number_float: return py::float_(j.get<double>());
    case json::value_t::string: return py::str(j.get_ref<const std::string&>());
    case json::value_t::array: {
      py::list l(j.size());
      for (std::size_t i = 0; i < j.size(); ++i) l[i] = to_python(j[i]);
      return l;
    }
    case json::value_t::object: {
      py::dict d;
      for (auto it = j.begin(); it != j.end(); ++it) d[py::str(it.key())] = to_python(it.value());
      return d;
    }
    case json::value_t::binary:
    case json::value_t::discarded: break;
  }
  return py::none();
}

// ---------------------------------------------------------------------------------------------
// Scenario and overrides.

/// A scenario as given: a path (loaded like the CLI's SCENARIO) or a document (from a dict).
struct ScenarioInput {
  std::optional<std::string> path;
  json document;
  std::vector<std::string> overrides;  ///< "--set" assignments: KEY.PATH=JSON
};

std::vector<std::string> parse_overrides(py::handle overrides) {
  std::vector<std::string> sets;
  if (overrides.is_none()) return sets;
  if (PyDict_Check(overrides.ptr())) {
    ToJson conv(kArgumentsFile);
    for (auto item : py::reinterpret_borrow<py::dict>(overrides)) {
      if (!PyUnicode_Check(item.first.ptr()))
        throw_argument_error("/overrides", brief_repr(item.first), "is not a string; override keys are dotted paths like \"parallelism.tp\"");
      const std::string key = item.first.cast<std::string>();
      if (key.empty() || key.find('=') != std::string::npos)
        throw_argument_error("/overrides", brief_repr(item.first), "must be a dotted path like \"parallelism.tp\"");
      sets.push_back(key + "=" + conv.convert(item.second, "/overrides/" + key).dump());
    }
    return sets;
  }
  if (PyList_Check(overrides.ptr()) || PyTuple_Check(overrides.ptr())) {
    for (auto item : py::reinterpret_borrow<py::iterable>(overrides)) {
      if (!PyUnicode_Check(item.ptr()))
        throw_argument_error("/overrides", brief_repr(item), "must be a \"KEY.PATH=VALUE\" string like the CLI's --set");
      sets.push_back(item.cast<std::string>());
    }
    return sets;
  }
  throw_argument_error("/overrides", brief_repr(overrides),
                       "must be a dict {\"parallelism.tp\": 4, ...}, a list of \"KEY=VALUE\" strings, or None");
}

ScenarioInput scenario_input(py::handle scenario, py::handle overrides, py::handle fidelity) {
  ScenarioInput in;
  if (PyUnicode_Check(scenario.ptr())) {
    in.path = scenario.cast<std::string>();
  } else if (PyDict_Check(scenario.ptr())) {
    in.document = ToJson(kDictFile).convert(scenario, "");
  } else {
    throw_argument_error("/scenario", brief_repr(scenario), "must be a dict (the scenario) or a path to a scenario JSON file");
  }
  in.overrides = parse_overrides(overrides);
  if (!fidelity.is_none()) {
    if (!PyUnicode_Check(fidelity.ptr()) || !st::parse_fidelity(fidelity.cast<std::string>()))
      throw_argument_error("/fidelity", brief_repr(fidelity), "must be one of \"fast\", \"balanced\", \"full\" or None");
    in.overrides.push_back("simulation.fidelity=" + json(fidelity.cast<std::string>()).dump());  // as the CLI does
  }
  return in;
}

/// Loads like the CLI (call without the GIL). Throws moesim::ConfigError.
st::Scenario load(const ScenarioInput& in) {
  if (in.path) return st::load_scenario_file(*in.path, in.overrides, "override");
  json doc = in.document;
  moesim::Diagnostics set_diag(kDictFile);
  std::vector<std::string> applied;
  for (const auto& o : in.overrides) {
    applied.push_back(st::canonical_override(doc, o));
    moesim::apply_override(doc, applied.back(), set_diag);
  }
  set_diag.throw_if_any();
  try {
    return st::load_scenario(doc, kDictFile, "");
  } catch (const moesim::ConfigError& e) {
    if (applied.empty()) throw;
    throw moesim::blame_overrides(e, kDictFile, applied, "override");
  }
}

// ---------------------------------------------------------------------------------------------
// Trace: one row per (task, stream) interval of the run, as write_chrome_trace draws them.

struct TraceColumns {
  std::vector<std::int32_t> rank, sim_rank, stage, stream, category, label, microbatch;
  std::vector<double> start, end;
  std::vector<std::string> streams, categories, labels;
  json ranks = json::array();
};

TraceColumns trace_columns(const st::Simulation& sim) {
  TraceColumns t;
  const auto& g = sim.lowered.graph;
  const auto& run = sim.run;
  const auto& ranks = sim.lowered.ranks;
  for (int s = 0; s < st::kNumStreams; ++s) t.streams.emplace_back(st::stream_name(static_cast<st::Stream>(s)));
  t.categories = g.category_names();
  t.labels = g.labels();
  for (const auto& r : ranks) t.ranks.push_back({{"rank", r.global_rank}, {"stage", r.stage}, {"weight", r.weight}});
  if (run.start.size() != g.num_tasks() || run.end.size() != g.num_tasks()) return t;  // not run (infeasible)
  std::vector<std::pair<int, int>> where(g.num_resources(), {-1, -1});
  for (std::size_t i = 0; i < ranks.size(); ++i)
    for (int s = 0; s < st::kNumStreams; ++s) where[ranks[i].streams[s]] = {static_cast<int>(i), s};
  const double per_tick = 1.0 / static_cast<double>(moesim::kTicksPerSecond);
  for (moesim::sim::TaskId task = 0; task < g.num_tasks(); ++task) {
    if (run.end[task] - run.start[task] <= 0) continue;
    for (moesim::sim::ResourceId res : g.resources_of(task)) {
      const auto [r, s] = where[res];
      if (r < 0) continue;  // links are not streams
      t.rank.push_back(ranks[r].global_rank);
      t.sim_rank.push_back(r);
      t.stage.push_back(ranks[r].stage);
      t.stream.push_back(s);
      t.category.push_back(static_cast<std::int32_t>(g.category(task)));
      t.label.push_back(static_cast<std::int32_t>(g.label(task)));
      t.microbatch.push_back(g.ordinal(task));
      t.start.push_back(static_cast<double>(run.start[task]) * per_tick);
      t.end.push_back(static_cast<double>(run.end[task]) * per_tick);
    }
  }
  return t;
}

py::list to_list(const std::vector<std::string>& v) {
  py::list l;
  for (const auto& x : v) l.append(py::str(x));
  return l;
}

template <typename T>
py::array_t<T> to_array(const std::vector<T>& v) {
  py::array_t<T> a(static_cast<py::ssize_t>(v.size()));
  if (!v.empty()) std::copy(v.begin(), v.end(), a.mutable_data());
  return a;
}

py::dict trace_to_python(const TraceColumns& t) {
  py::dict tasks;
  tasks["rank"] = to_array(t.rank);
  tasks["sim_rank"] = to_array(t.sim_rank);
  tasks["stage"] = to_array(t.stage);
  tasks["stream"] = to_array(t.stream);
  tasks["category"] = to_array(t.category);
  tasks["label"] = to_array(t.label);
  tasks["microbatch"] = to_array(t.microbatch);
  tasks["start"] = to_array(t.start);
  tasks["end"] = to_array(t.end);
  py::dict out;
  out["tasks"] = tasks;
  out["streams"] = to_list(t.streams);
  out["categories"] = to_list(t.categories);
  out["labels"] = to_list(t.labels);
  out["ranks"] = to_python(t.ranks);
  return out;
}

// ---------------------------------------------------------------------------------------------
// Long calls run on a worker thread while the calling (Python) thread waits without the GIL and,
// every 50 ms, takes it to check for signals (Ctrl-C: KeyboardInterrupt) and to report progress.
// A raised exception — KeyboardInterrupt, or one from the progress callback — raises the
// CancelFlag, the worker stops (the engine, the lowering and the search poll it) and the
// exception propagates once the worker has ended: within a fraction of a second, and no Python
// object is ever touched off the calling thread.

/// Progress of a search, written by the worker and read by the calling thread: events of one
/// phase are coalesced into the latest, so a phase's last event (done == total) always arrives.
struct ProgressSlot {
  struct Event {
    std::string phase;
    std::size_t done = 0, total = 0;
  };
  std::mutex mu;
  std::vector<Event> pending;
  void set(const char* p, std::size_t d, std::size_t t) {
    std::lock_guard<std::mutex> lock(mu);
    if (!pending.empty() && pending.back().phase == p) pending.back() = Event{p, d, t};
    else pending.push_back(Event{p, d, t});
  }
  std::vector<Event> take() {
    std::lock_guard<std::mutex> lock(mu);
    return std::exchange(pending, {});
  }
};

template <class Work>
auto run_interruptible(Work&& work, ProgressSlot* progress = nullptr, py::handle callback = py::none())
    -> decltype(work(static_cast<const moesim::CancelFlag*>(nullptr))) {
  using Result = decltype(work(static_cast<const moesim::CancelFlag*>(nullptr)));
  moesim::CancelFlag cancel;
  // Without a slot, the phases the library reports through the flag (lowering, engine runs)
  // reach the callback: each change of phase or count, and the last state when it ends.
  moesim::sim::Progress phases;
  const bool report_phases = progress == nullptr && !callback.is_none();
  if (report_phases) cancel.attach(&phases);
  std::uint64_t seen_generation = 0, seen_done = 0;
  auto report = [&] {
    const auto snap = phases.snapshot();
    if (snap.phase.empty() || (snap.generation == seen_generation && snap.done == seen_done)) return;
    seen_generation = snap.generation;
    seen_done = snap.done;
    callback(snap.phase, snap.done, snap.total);
  };
  std::optional<Result> result;
  std::exception_ptr error;
  std::mutex mu;
  std::condition_variable cv;
  bool finished = false;
  std::optional<py::error_already_set> py_error;
  std::thread worker([&] {
    try {
      result.emplace(work(&cancel));
    } catch (...) {
      error = std::current_exception();
    }
    std::lock_guard<std::mutex> lock(mu);
    finished = true;
    cv.notify_all();
  });
  for (bool done = false; !done;) {
    {
      py::gil_scoped_release nogil;
      std::unique_lock<std::mutex> lock(mu);
      cv.wait_for(lock, std::chrono::milliseconds(50), [&] { return finished; });
      done = finished;
    }
    if (py_error) continue;  // cancelled: wait for the worker to stop
    try {
      if (progress != nullptr && !callback.is_none())
        for (const auto& e : progress->take()) callback(e.phase, e.done, e.total);
      if (report_phases) report();
      if (PyErr_CheckSignals() != 0) throw py::error_already_set();
    } catch (py::error_already_set& e) {
      py_error.emplace(std::move(e));
      cancel.request();
    }
  }
  worker.join();
  if (py_error) throw std::move(*py_error);
  if (error) std::rethrow_exception(error);
  return std::move(*result);
}

// ---------------------------------------------------------------------------------------------
// The functions.

py::object py_load_scenario(const std::string& path) {
  moesim::Diagnostics diag(path == "-" ? "<stdin>" : path);
  std::optional<json> doc;
  {
    py::gil_scoped_release nogil;
    doc = moesim::read_json_file(path, diag);
  }
  diag.throw_if_any();
  return to_python(*doc);
}

void py_save_scenario(py::handle scenario, const std::string& path) {
  if (!PyDict_Check(scenario.ptr()))
    throw_argument_error("/scenario", brief_repr(scenario), "must be a dict (the scenario)");
  const json doc = ToJson(kDictFile).convert(scenario, "");
  py::gil_scoped_release nogil;
  moesim::write_file_atomically(path, doc.dump(2) + "\n");
}

py::object py_check(py::handle scenario, py::handle overrides) {
  const ScenarioInput in = scenario_input(scenario, overrides, py::none());
  json out;
  {
    py::gil_scoped_release nogil;
    const st::Scenario s = load(in);
    json par = st::plan_to_json(s.plan, s.model);
    par["data_parallel_size"] = s.plan.dp;
    out = {{"file", s.file},
           {"model", s.model_name},
           {"cluster", s.cluster.name},
           {"device", s.cluster.device.name},
           {"devices", s.cluster.devices},
           {"num_microbatches", s.plan.num_microbatches},
           {"parallelism", std::move(par)},
           {"scenario", s.document}};
  }
  return to_python(out);
}

py::object py_simulate(py::handle scenario, py::handle overrides, py::handle fidelity, bool trace, bool raise_infeasible,
                       bool wall_time, bool memory_detail, py::handle progress) {
  const ScenarioInput in = scenario_input(scenario, overrides, fidelity);
  struct Out {
    json result;
    std::optional<TraceColumns> columns;
    bool feasible = true;
    std::string reason;
  };
  Out o = run_interruptible([&](const moesim::CancelFlag* cancel) {
    Out r;
    const st::Scenario s = load(in);
    const st::Simulation sim = st::simulate(s, cancel, memory_detail);
    r.result = st::to_json(sim.result, s, wall_time);
    r.result["critical_path"] = st::to_json(st::summarize_critical_path(sim));
    r.feasible = sim.result.feasible;
    r.reason = sim.result.infeasible_reason;
    if (trace) r.columns = trace_columns(sim);
    return r;
  }, nullptr, progress);
  json& result = o.result;
  std::optional<TraceColumns>& columns = o.columns;
  const bool feasible = o.feasible;
  const std::string& reason = o.reason;
  py::object out = to_python(result);
  if (columns) out["trace"] = trace_to_python(*columns);
  if (!feasible && raise_infeasible) {
    py::object err = py::reinterpret_borrow<py::object>(g_infeasible)(py::str("infeasible: " + reason));
    err.attr("reason") = py::str(reason);
    err.attr("result") = out;
    PyErr_SetObject(g_infeasible, err.ptr());
    throw py::error_already_set();
  }
  return out;
}

py::object py_search(py::handle scenario, py::handle overrides, int top, int threads, py::handle progress) {
  const ScenarioInput in = scenario_input(scenario, overrides, py::none());
  st::SearchOptions opt;
  opt.threads = threads;
  // The search reports progress from its own thread into a slot; the calling thread hands it
  // to the Python callback (run_interruptible). An exception in the callback cancels the search.
  ProgressSlot slot;
  if (!progress.is_none()) opt.progress = [&slot](const char* phase, std::size_t done, std::size_t total) { slot.set(phase, done, total); };
  const json report = run_interruptible(
      [&](const moesim::CancelFlag* cancel) {
        opt.cancel = cancel;
        const st::Scenario s = load(in);
        const st::SearchSpace space = st::parse_search_space(s);
        if (top > space.top_k) opt.top_k = top;  // simulate at least as many as are shown (as the CLI)
        return st::to_json(st::search(s, space, opt), top);
      },
      &slot, progress);
  return to_python(report);
}

/// One of `size` processes sharing a search (moesim.search with a Dask client): `allgather`
/// is a Python callable bytes -> list of bytes (every process's, in rank order).
py::object py_search_share(py::handle scenario, py::handle overrides, int top, int threads, int rank, int size,
                           py::handle allgather) {
  const ScenarioInput in = scenario_input(scenario, overrides, py::none());
  st::SearchOptions opt;
  opt.threads = threads;
  opt.peers.rank = rank;
  opt.peers.size = size;
  // The callable is called from the search's thread: with the GIL, and released with it.
  auto fn = std::shared_ptr<py::object>(new py::object(py::reinterpret_borrow<py::object>(allgather)), [](py::object* o) {
    py::gil_scoped_acquire gil;
    delete o;
  });
  opt.peers.allgather = [fn, size](const std::string& mine) {
    py::gil_scoped_acquire gil;
    const py::object got = (*fn)(py::bytes(mine));
    std::vector<std::string> out;
    for (const py::handle x : got) out.push_back(x.cast<std::string>());
    if (static_cast<int>(out.size()) != size)
      throw std::runtime_error("allgather returned " + std::to_string(out.size()) + " shares for " +
                               std::to_string(size) + " processes");
    return out;
  };
  const json report = run_interruptible([&](const moesim::CancelFlag* cancel) {
    opt.cancel = cancel;
    const st::Scenario s = load(in);
    const st::SearchSpace space = st::parse_search_space(s);
    if (top > space.top_k) opt.top_k = top;
    return st::to_json(st::search(s, space, opt), top);
  });
  return to_python(report);
}

/// The scenario's "model_search": every candidate model with its best plan.
py::object py_model_search(py::handle scenario, py::handle overrides, int threads) {
  const ScenarioInput in = scenario_input(scenario, overrides, py::none());
  const json report = run_interruptible([&](const moesim::CancelFlag* cancel) {
    const st::Scenario s = load(in);
    const auto spec = st::parse_model_search(s);
    if (!spec)
      throw moesim::ConfigError({moesim::Diagnostic{s.file, "/model_search", "",
                                                    "is required: {\"axes\": {config key: [values]}, ...}"}});
    st::SearchOptions opt;
    opt.threads = threads;
    opt.cancel = cancel;
    return st::to_json(st::model_search(s, *spec, opt));
  });
  return to_python(report);
}

py::object py_presets(const std::string& kind, const std::string& name) {
  if (!name.empty()) return to_python(st::describe_preset(kind, name));  // ConfigError: the translator
  py::dict d;
  d["models"] = to_list(moesim::models::preset_names("model"));
  d["devices"] = to_list(moesim::models::preset_names("device"));
  d["clusters"] = to_list(moesim::topologies::cluster_preset_names());
  return d;
}

/// moesim::ConfigError -> moesim.ConfigError: the message is the CLI's lines (one per problem);
/// `diagnostics` holds them as dicts {file, pointer, value, constraint}.
void raise_config_error(const moesim::ConfigError& e) {
  py::list diags;
  for (const auto& d : e.diagnostics()) {
    py::dict x;
    x["file"] = d.file;
    x["pointer"] = d.pointer;
    x["value"] = d.value;
    x["constraint"] = d.constraint;
    x["message"] = d.to_string();
    diags.append(std::move(x));
  }
  py::object err = py::reinterpret_borrow<py::object>(g_config_error)(py::str(e.what()));
  err.attr("diagnostics") = diags;
  PyErr_SetObject(g_config_error, err.ptr());
}

PyObject* new_exception(py::module_& m, const char* name, const char* doc, PyObject* base) {
  const std::string qualified = std::string("moesim.") + name;
  PyObject* cls = PyErr_NewExceptionWithDoc(qualified.c_str(), doc, base, nullptr);
  if (cls == nullptr) throw py::error_already_set();
  m.add_object(name, py::reinterpret_borrow<py::object>(cls));
  return cls;
}

}  // namespace

PYBIND11_MODULE(_moesim, m) {
  m.doc() = "C++ core of the moesim package; import `moesim` instead.";
  m.attr("__version__") = st::kVersion;

  g_error = new_exception(m, "Error", "Base class of moesim's exceptions.", PyExc_Exception);
  g_config_error = new_exception(
      m, "ConfigError",
      "Bad input: the message has one line per problem, 'file:/json/pointer: value constraint', the text the\n"
      "CLI prints before exiting with status 2; `diagnostics` holds them as dicts.",
      g_error);
  g_infeasible = new_exception(
      m, "Infeasible",
      "The plan cannot run (e.g. out of memory); `reason` says why and `result` holds the result dict.", g_error);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const moesim::ConfigError& e) {
      raise_config_error(e);
    } catch (const moesim::InternalError& e) {
      PyErr_SetString(g_error, (std::string("internal error (this is a bug in moesim; please report it with the scenario): ") +
                                e.what()).c_str());
    } catch (const moesim::Cancelled&) {
      PyErr_SetNone(PyExc_KeyboardInterrupt);
    }
  });

  m.def("load_scenario", &py_load_scenario, py::arg("path"), "Reads a scenario JSON file into a dict.");
  m.def("save_scenario", &py_save_scenario, py::arg("scenario"), py::arg("path"),
        "Writes a scenario dict as indented JSON.");
  m.def("check", &py_check, py::arg("scenario"), py::arg("overrides"),
        "Loads and validates a scenario; returns the resolved plan.");
  m.def("simulate", &py_simulate, py::arg("scenario"), py::arg("overrides"), py::arg("fidelity"), py::arg("trace"),
        py::arg("raise_infeasible"), py::arg("wall_time"), py::arg("memory_detail") = false, py::arg("progress") = py::none(),
        "Simulates one training step; returns the result dict.");
  m.def("search", &py_search, py::arg("scenario"), py::arg("overrides"), py::arg("top"), py::arg("threads"),
        py::arg("progress"), "Searches the scenario's plan space; returns the report dict.");
  m.def("search_share", &py_search_share, py::arg("scenario"), py::arg("overrides"), py::arg("top"), py::arg("threads"),
        py::arg("rank"), py::arg("size"), py::arg("allgather"),
        "One of `size` processes sharing a search; `allgather(bytes) -> [bytes, ...]` exchanges the shares.");
  m.def("model_search", &py_model_search, py::arg("scenario"), py::arg("overrides"), py::arg("threads"),
        "Searches the scenario's model_search candidates; returns the report dict.");
  m.def("presets", &py_presets, py::arg("kind"), py::arg("name"),
        "The built-in presets' names, or one preset described (values, units, sources, derived figures).");
}
