// Calibration of a device's few physical parameters against the fitting half of the cases.
//
//   moesim_fit CASES.json --cluster dgx-h100 [--precision fp8]
//       --param device.gemm_peak_efficiency:0.5:0.95 --param device.attention_efficiency.forward:0.3:0.8
//
// Only cases whose numeric id is even (the fixed fitting half, as in `moesim validate`) and
// that run on the given cluster preset (and precision) enter the objective: the mean absolute
// step-time error. Each parameter is searched by golden section inside its bounds, one at a
// time, for a few sweeps (coordinate descent). The held-out half is reported with the result
// but never used. Parameters: "device.<key>" (a key of the device preset) or
// "cluster.<path>" (a key of the cluster preset, e.g. cluster.scale_up.efficiency), or
// "device.attention_efficiency" (forward and backward together, keeping the preset's ratio).

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "moesim/models/presets.hpp"
#include "validate.hpp"

using namespace moesim;
using nlohmann::json;

namespace {

struct Param {
  std::string path;
  double lo = 0, hi = 1, value = 0;
};

int numeric_id(const std::string& id) {
  std::string d;
  for (char c : id)
    if (c >= '0' && c <= '9') d += c;
  return d.empty() ? 0 : std::stoi(d);
}

struct Objective {
  json cases;  // the selected cases
  std::string device;
  std::vector<Param>* params;
  double attention_bwd_ratio = 0.75;  // backward / forward attention efficiency of the preset
  int evaluations = 0;

  std::vector<std::string> overrides() const {
    std::vector<std::string> o{"cluster.device.preset=\"" + device + "\""};
    auto num = [](double v) {
      char buf[64];
      std::snprintf(buf, sizeof buf, "%.6g", v);
      return std::string(buf);
    };
    for (const Param& p : *params) {
      if (p.path == "device.attention_efficiency") {  // both passes, keeping the preset's ratio
        o.push_back("cluster.device.attention_efficiency.forward=" + num(p.value));
        o.push_back("cluster.device.attention_efficiency.backward=" + num(p.value * attention_bwd_ratio));
        continue;
      }
      const bool dev = p.path.rfind("device.", 0) == 0;
      o.push_back((dev ? "cluster.device." + p.path.substr(7) : p.path) + "=" + num(p.value));
    }
    return o;
  }

  tools::ValidationReport run(const json& subset) const {
    tools::ValidateOptions opt;
    opt.overrides = overrides();
    // Two halves on two threads (simulations share nothing).
    json a = json::array(), b = json::array();
    for (std::size_t i = 0; i < subset.size(); ++i) (i % 2 ? b : a).push_back(subset[i]);
    tools::ValidationReport ra, rb;
    std::thread t([&] { rb = tools::validate(b, "fit", opt); });
    ra = tools::validate(a, "fit", opt);
    t.join();
    for (auto& c : rb.cases) ra.cases.push_back(std::move(c));
    return ra;
  }

  double operator()() {
    ++evaluations;
    const auto rep = run(cases);
    double sum = 0;
    int n = 0;
    for (const auto& c : rep.cases)
      if (c.status == "ok" && c.timed) {  // a memory-only case has no step-time error
        sum += std::abs(c.error_pct);
        ++n;
      }
    return n ? sum / n : 1e9;
  }
};

double golden(Objective& f, Param& p, int steps) {
  const double g = (std::sqrt(5.0) - 1) / 2;
  double a = p.lo, b = p.hi;
  double c = b - g * (b - a), d = a + g * (b - a);
  p.value = c;
  double fc = f();
  p.value = d;
  double fd = f();
  for (int i = 0; i < steps; ++i) {
    if (fc < fd) {
      b = d;
      d = c;
      fd = fc;
      c = b - g * (b - a);
      p.value = c;
      fc = f();
    } else {
      a = c;
      c = d;
      fc = fd;
      d = a + g * (b - a);
      p.value = d;
      fd = f();
    }
  }
  p.value = fc < fd ? c : d;
  return std::min(fc, fd);
}

}  // namespace

int main(int argc, char** argv) {
  std::string file, cluster, precision;
  std::vector<Param> params;
  int sweeps = 2, steps = 12;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (a == "--cluster") cluster = next();
    else if (a == "--precision") precision = next();
    else if (a == "--sweeps") sweeps = std::stoi(next());
    else if (a == "--steps") steps = std::stoi(next());
    else if (a == "--param") {
      const std::string spec = next();
      const auto c1 = spec.find(':'), c2 = spec.rfind(':');
      if (c1 == std::string::npos || c1 == c2) {
        std::cerr << "moesim_fit: --param PATH:LO:HI\n";
        return 2;
      }
      Param p{spec.substr(0, c1), std::stod(spec.substr(c1 + 1, c2 - c1 - 1)), std::stod(spec.substr(c2 + 1)), 0};
      p.value = 0.5 * (p.lo + p.hi);
      params.push_back(p);
    } else file = a;
  }
  if (file.empty() || cluster.empty() || params.empty()) {
    std::cerr << "usage: moesim_fit CASES.json --cluster PRESET [--precision bf16|fp16|fp8] --param PATH:LO:HI ...\n";
    return 2;
  }
  try {
    Diagnostics diag(file);
    const auto all = read_json_file(file, diag);
    diag.throw_if_any();
    // Device preset of the cluster.
    std::string device;
    double ratio = 0.75;
    {
      Diagnostics d2("fit");
      const auto c = topologies::load_cluster(json{{"preset", cluster}, {"devices", 8}}, "/cluster", d2);
      device = c.device.name;
      ratio = c.device.attention_bwd_efficiency / c.device.attention_fwd_efficiency;
    }
    json fit = json::array(), held = json::array();
    for (const auto& c : *all) {
      const auto conv = tools::case_to_scenario(c);
      if (!conv.skip_reason.empty() || conv.scenario["cluster"]["preset"] != cluster) continue;
      if (!precision.empty() && conv.scenario["training"].value("precision", "bf16") != precision) continue;
      (numeric_id(c.value("id", "")) % 2 == 0 ? fit : held).push_back(c);
    }
    std::printf("cluster %s (device %s): %zu fitting cases, %zu held out\n", cluster.c_str(), device.c_str(), fit.size(),
                held.size());
    Objective f{fit, device, &params, ratio};
    const auto t0 = std::chrono::steady_clock::now();
    double best = f();
    std::printf("start: fit MAPE %.2f%%\n", best);
    for (int s = 0; s < sweeps; ++s)
      for (Param& p : params) {
        best = golden(f, p, steps);
        std::printf("sweep %d  %-45s = %.4g   fit MAPE %.2f%%\n", s + 1, p.path.c_str(), p.value, best);
        std::fflush(stdout);
      }
    const auto rep_fit = f.run(fit);
    const auto rep_held = f.run(held);
    auto show = [](const char* name, const tools::ValidationReport& r) {
      double sum = 0, mx = 0;
      int n = 0;
      for (const auto& c : r.cases)
        if (c.status == "ok") {
          sum += std::abs(c.error_pct);
          mx = std::max(mx, std::abs(c.error_pct));
          ++n;
          std::printf("    %-9s %+7.1f%%\n", c.id.c_str(), c.error_pct);
        }
      std::printf("  %s: %d cases, MAPE %.2f%%, max %.2f%%\n", name, n, n ? sum / n : 0.0, mx);
    };
    std::printf("result (%d evaluations, %.0f s):\n", f.evaluations,
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    for (const Param& p : params) std::printf("  %s = %.4g\n", p.path.c_str(), p.value);
    show("fit half", rep_fit);
    show("held-out half", rep_held);
  } catch (const std::exception& e) {
    std::cerr << "moesim_fit: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
