"""The moesim Python package against the CLI it mirrors (same loader, results and messages)."""
import json
import math
import subprocess
import threading
import time

import numpy as np
import pytest

import moesim

PANGU = "scenarios/pangu-ultra-moe-718b.json"
SMALL_SEARCH = "tests/scenarios/search_small_moe.json"
BAD_INPUT = "tests/scenarios/bad_input.json"


def run_cli(cli, root, *args):
    return subprocess.run([cli, *args], cwd=root, capture_output=True, text=True, check=False)


def cli_json(cli, root, *args):
    p = run_cli(cli, root, *args)
    assert p.returncode in (0, 3), p.stderr
    return json.loads(p.stdout)


@pytest.fixture(scope="module")
def pangu(root):
    return moesim.simulate(str(root / PANGU), wall_time=False)


@pytest.fixture(scope="module")
def pangu_traced(root):
    return moesim.simulate(str(root / PANGU), wall_time=False, trace=True)


# --- simulate: the CLI's numbers -------------------------------------------------------------


def test_simulate_equals_cli_json_of_the_718b_plan(cli, root, pangu):
    expected = cli_json(cli, root, "simulate", PANGU, "--format", "json", "--no-wall-time")
    assert pangu["step_time_s"] == expected["step_time_s"]
    assert pangu["mfu"] == expected["mfu"]
    assert pangu["breakdown_s"] == expected["breakdown_s"]
    assert pangu == expected  # the whole object, not only the headline fields
    assert "wall_s" not in pangu["simulator"]
    assert moesim.simulate(str(root / PANGU))["simulator"]["wall_s"] > 0


def test_result_carries_the_critical_path_and_every_mfu_count(pangu):
    cp = pangu["critical_path"]
    assert cp["step_s"] == pangu["step_time_s"]
    assert sum(cp["by_category_s"].values()) + cp["unattributed_s"] == pytest.approx(cp["step_s"], rel=1e-9)
    assert cp["by_stage"][0]["seconds"] >= cp["by_stage"][-1]["seconds"]  # largest first
    assert max(cp["by_category_s"], key=cp["by_category_s"].get) == "compute"
    counts = pangu["mfu_by_definition"]
    assert set(counts) == {"moesim", "megatron", "huawei"}
    assert counts["huawei"]["flops_per_token"] > counts["moesim"]["flops_per_token"]
    assert pangu["mfu_definition"] == "moesim" and counts["moesim"]["mfu"] == pangu["mfu"]


def test_result_carries_the_cross_validated_error_band_of_its_cluster(root, pangu):
    bands = json.loads((root / "models/presets/error_bands.json").read_text())["bands"]
    band = pangu["step_time_error_band"]
    assert band["scope"] == "atlas-800t-a2"
    assert band["within_pct"] == bands["atlas-800t-a2"]["within_pct"]
    assert band["runs"] == bands["atlas-800t-a2"]["cases"]


def test_overrides_change_the_result_as_cli_set_does(cli, root, pangu):
    expected = cli_json(
        cli, root, "simulate", PANGU, "--format", "json", "--no-wall-time",
        "--set", "parallelism.micro_batch_size=1", "--set", "training.global_batch_size=3072",
    )
    as_dict = moesim.simulate(
        str(root / PANGU), {"parallelism.micro_batch_size": 1, "training.global_batch_size": 3072}, wall_time=False
    )
    as_strings = moesim.simulate(
        str(root / PANGU), ["parallelism.micro_batch_size=1", "training.global_batch_size=3072"], wall_time=False
    )
    assert as_dict == expected
    assert as_strings == expected
    # Half the batch in half-size micro-batches: same count of micro-batches, a shorter step.
    assert expected["step_time_s"] < pangu["step_time_s"]


def test_a_scenario_dict_gives_the_same_result_as_its_file(root, pangu):
    doc = moesim.load_scenario(root / PANGU)
    assert doc == json.loads((root / PANGU).read_text())
    assert moesim.simulate(doc, wall_time=False) == pangu
    # An alias override on a dict that spells the key out replaces that key (as --set does on a file).
    by_alias = moesim.simulate(doc, {"parallelism.mbs": 1}, wall_time=False)
    by_name = moesim.simulate(str(root / PANGU), {"parallelism.micro_batch_size": 1}, wall_time=False)
    assert by_alias == by_name
    assert by_alias["step_time_s"] != pangu["step_time_s"]


def test_fidelity_argument_is_the_cli_fidelity_option(cli, root):
    expected = cli_json(cli, root, "simulate", PANGU, "--format", "json", "--no-wall-time", "--fidelity", "fast")
    got = moesim.simulate(str(root / PANGU), fidelity="fast", wall_time=False)
    assert got == expected
    assert got["simulator"]["fidelity"] == "fast"


def test_same_scenario_and_seed_give_the_same_dict(root):
    doc = moesim.load_scenario(root / PANGU)
    a = moesim.simulate(doc, {"seed": 7}, wall_time=False)
    b = moesim.simulate(doc, {"seed": 7}, wall_time=False)
    assert a == b
    assert a["simulator"]["seed"] == 7


def test_save_scenario_round_trips(root, tmp_path, pangu):
    doc = moesim.load_scenario(root / PANGU)
    out = tmp_path / "copy.json"
    moesim.save_scenario(doc, out)
    assert moesim.load_scenario(out) == doc
    assert moesim.simulate(out, wall_time=False) == pangu


def test_check_resolves_the_plan(root):
    c = moesim.check(str(root / PANGU))
    assert c["devices"] == 6144
    par = c["parallelism"]
    assert (par["tensor_model_parallel_size"], par["pipeline_model_parallel_size"]) == (8, 16)
    assert par["data_parallel_size"] == 6144 // (8 * 16)
    c4 = moesim.check(str(root / PANGU), {"parallelism.tensor_model_parallel_size": 4})
    assert c4["parallelism"]["data_parallel_size"] == 6144 // (4 * 16)
    assert c4["scenario"]["parallelism"]["tensor_model_parallel_size"] == 4


def test_presets_list_the_cli_presets(cli, root):
    p = moesim.presets()
    out = run_cli(cli, root, "presets").stdout
    for kind in ("models", "devices", "clusters"):
        assert p[kind], kind
        for name in p[kind]:
            assert "  " + name + "\n" in out
    assert "pangu-ultra-moe-718b" in p["models"]
    assert "atlas-800t-a2" in p["clusters"]
    assert moesim.presets("devices") == {"devices": p["devices"]}


def test_a_preset_reads_as_the_cli_prints_it(cli, root):
    d = moesim.presets("devices", "ascend-910b2")
    assert d == json.loads(run_cli(cli, root, "presets", "devices", "ascend-910b2", "--format", "json").stdout)
    values = {v["key"]: v for v in d["values"]}
    assert values["peak_flops.bf16"]["value"] == "353.8TFLOPS"
    assert values["peak_flops.bf16"]["source"].startswith("[S2] hardware.md")
    assert values["gemm_peak_efficiency"]["unit"] == "fraction of nominal"
    # Every value of the file is listed, with its source where the file gives one.
    assert all(v["source"] for v in d["values"] if isinstance(d["preset"].get(v["key"].split(".")[0]), dict))
    # Llama 3 70B by hand: embedding and head 2 x 128,256 x 8,192; per layer Q and O 8,192^2 each,
    # K and V 8,192 x 1,024 each, MLP 3 x 8,192 x 28,672, two norms; a final norm.
    m = moesim.presets("models", "llama3-70b")["derived"]
    layer = 2 * 8192**2 + 2 * 8192 * 1024 + 3 * 8192 * 28672 + 2 * 8192
    assert m["parameters_total"] == pytest.approx(2 * 128256 * 8192 + 80 * layer + 8192, rel=1e-9)
    assert m["layers"] == 80 and m["moe_layers"] == 0
    c = moesim.presets("clusters", "atlas-800t-a2")["derived"]
    assert c["nic_achieved_bytes_per_s"] == pytest.approx(200e9 / 8 * 0.9)
    with pytest.raises(moesim.ConfigError, match="is not a device preset"):
        moesim.presets("devices", "ascend-910")
    with pytest.raises(moesim.ConfigError, match="must be"):
        moesim.presets("gpus")


# --- infeasible plans ------------------------------------------------------------------------


def test_infeasible_plan_is_a_result_unless_asked_to_raise(cli, root):
    over = {"parallelism.micro_batch_size": 8}
    r = moesim.simulate(str(root / PANGU), over, wall_time=False)
    assert r["feasible"] is False
    assert "out of memory" in r["infeasible_reason"]
    expected = cli_json(cli, root, "simulate", PANGU, "--format", "json", "--no-wall-time",
                        "--set", "parallelism.micro_batch_size=8")
    assert r == expected
    with pytest.raises(moesim.Infeasible) as info:
        moesim.simulate(str(root / PANGU), over, raise_infeasible=True)
    assert isinstance(info.value, moesim.Error)
    assert info.value.reason == r["infeasible_reason"]
    assert info.value.result["feasible"] is False
    assert "out of memory" in str(info.value)


# --- bad input: ConfigError with the CLI's text ------------------------------------------------


def test_config_error_lists_every_problem_with_the_cli_text(cli, root):
    p = run_cli(cli, root, "simulate", BAD_INPUT)
    assert p.returncode == 2
    cli_lines = [line.strip() for line in p.stderr.splitlines()[1:]]  # after "moesim: the input has N problems:"
    with pytest.raises(moesim.ConfigError) as info:
        moesim.simulate(str(root / BAD_INPUT))
    py_lines = str(info.value).splitlines()
    assert [l.replace(str(root / BAD_INPUT), BAD_INPUT) for l in py_lines] == cli_lines
    assert len(info.value.diagnostics) == len(cli_lines) == 10
    assert info.value.diagnostics[1]["pointer"] == "/training/precison"
    assert isinstance(info.value, moesim.Error)


def test_unknown_key_in_a_dict_names_its_json_path(root):
    doc = moesim.load_scenario(root / PANGU)
    doc["parallelism"]["tensor_parallel_size"] = 8
    with pytest.raises(moesim.ConfigError) as info:
        moesim.simulate(doc)
    assert "<dict>:/parallelism/tensor_parallel_size: is not a known key here (its value: 8)" in str(info.value)


def test_unknown_override_key_is_a_config_error(root):
    with pytest.raises(moesim.ConfigError, match=r"/parallelism/tpp: is not a known key here \(its value: 4\); did you mean"):
        moesim.simulate(str(root / PANGU), {"parallelism.tpp": 4})


def test_override_of_wrong_json_type_names_the_path(root):
    with pytest.raises(moesim.ConfigError, match=r"/parallelism/micro_batch_size: \"two\""):
        moesim.simulate(str(root / PANGU), {"parallelism.micro_batch_size": "two"})


@pytest.mark.parametrize(
    "path, value",
    [
        ("/parallelism/tp", {1, 2}),          # a set is not JSON
        ("/parallelism/tp", float("nan")),    # JSON has no NaN
        ("/training/seq_length", b"4096"),    # bytes are not a string
        ("/cluster", object()),
    ],
)
def test_python_values_that_are_not_json_are_config_errors_at_their_path(root, path, value):
    doc = moesim.load_scenario(root / PANGU)
    section, key = path.strip("/").split("/")[0], path.strip("/").split("/")[1:]
    if key:
        doc[section][key[0]] = value
    else:
        doc[section] = value
    with pytest.raises(moesim.ConfigError) as info:
        moesim.simulate(doc)
    assert "<dict>:" + path + ": " in str(info.value)


def test_non_string_dict_key_is_a_config_error(root):
    doc = moesim.load_scenario(root / PANGU)
    doc["parallelism"][3] = 4
    with pytest.raises(moesim.ConfigError, match=r"<dict>:/parallelism: 3 is a key of Python type int"):
        moesim.check(doc)


def test_numpy_numbers_are_accepted_as_json_numbers(root):
    a = moesim.check(str(root / PANGU), {"parallelism.tensor_model_parallel_size": np.int64(4)})
    assert a["parallelism"]["tensor_model_parallel_size"] == 4
    b = moesim.check(str(root / PANGU), {"search.tp": np.array([4, 8]), "search.objective": np.str_("mfu")})
    assert b["scenario"]["search"]["tp"] == [4, 8] and b["scenario"]["search"]["objective"] == "mfu"


@pytest.mark.parametrize(
    "call, pointer",
    [
        (lambda p: moesim.simulate(42), "/scenario"),
        (lambda p: moesim.simulate(p, overrides=5), "/overrides"),
        (lambda p: moesim.simulate(p, overrides={1: 2}), "/overrides"),
        (lambda p: moesim.simulate(p, overrides=[7]), "/overrides"),
        (lambda p: moesim.simulate(p, fidelity="fastest"), "/fidelity"),
        (lambda p: moesim.simulate(p, trace="yes"), "/trace"),
        (lambda p: moesim.search(p, top="ten"), "/top"),
        (lambda p: moesim.search(p, threads=-1), "/threads"),
        (lambda p: moesim.search(p, progress=3), "/progress"),
        (lambda p: moesim.load_scenario(None), "/path"),
        (lambda p: moesim.save_scenario([1], "x.json"), "/scenario"),
    ],
)
def test_wrong_argument_types_are_config_errors_not_type_errors(root, call, pointer):
    with pytest.raises(moesim.ConfigError) as info:
        call(str(root / PANGU))
    assert str(info.value).startswith("<python>:" + pointer + ": ")
    assert info.value.diagnostics[0]["pointer"] == pointer


def test_missing_file_is_a_config_error(root):
    with pytest.raises(moesim.ConfigError, match="does_not_exist.json:/: cannot be opened"):
        moesim.load_scenario(root / "tests/scenarios/does_not_exist.json")
    with pytest.raises(moesim.ConfigError, match="cannot be opened"):
        moesim.simulate(str(root / "tests/scenarios/does_not_exist.json"))


def test_invalid_json_file_is_a_config_error(tmp_path):
    f = tmp_path / "broken.json"
    f.write_text('{"model": "pangu-ultra-moe-718b",\n "cluster": }')
    with pytest.raises(moesim.ConfigError, match=r"is not valid JSON \(line 2"):
        moesim.load_scenario(f)


# --- trace -----------------------------------------------------------------------------------


def test_trace_arrays_are_consistent_and_span_the_step(pangu_traced, pangu):
    tr = pangu_traced["trace"]
    tasks = tr["tasks"]
    n = len(tasks["start"])
    assert n > 100_000
    assert {len(v) for v in tasks.values()} == {n}
    assert tasks["start"].dtype == np.float64 and tasks["end"].dtype == np.float64
    assert (tasks["end"] > tasks["start"]).all()  # zero-length tasks are not drawn
    assert tasks["start"].min() >= 0
    assert math.isclose(tasks["end"].max(), pangu["step_time_s"], rel_tol=1e-9)
    assert tasks["stream"].max() < len(tr["streams"]) and tasks["category"].max() < len(tr["categories"])
    assert tasks["label"].max() < len(tr["labels"])
    # One simulated rank per pipeline stage for this plan; rank/stage columns follow `ranks`.
    assert len(tr["ranks"]) == pangu["simulator"]["ranks_simulated"] == 16
    ranks = np.array([r["rank"] for r in tr["ranks"]])
    stages = np.array([r["stage"] for r in tr["ranks"]])
    assert (ranks[tasks["sim_rank"]] == tasks["rank"]).all()
    assert (stages[tasks["sim_rank"]] == tasks["stage"]).all()
    # The rest of the result is unchanged by asking for the trace.
    assert {k: v for k, v in pangu_traced.items() if k != "trace"} == pangu


def busy_seconds(start, end):
    """Length of the union of [start, end) intervals."""
    order = np.argsort(start, kind="stable")
    total, cur_s, cur_e = 0.0, None, None
    for s, e in zip(start[order], end[order]):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    return total + (cur_e - cur_s if cur_e is not None else 0.0)


def test_trace_compute_stream_time_matches_the_breakdown(pangu_traced):
    # The compute stream runs the model's kernels and the optimizer step: its busy time, averaged
    # over all devices (each simulated rank weighted by the ranks it stands for), is the
    # breakdown's compute + other.
    tr = pangu_traced["trace"]
    t = tr["tasks"]
    compute = tr["streams"].index("compute")
    weighted, weights = 0.0, 0.0
    for i, r in enumerate(tr["ranks"]):
        m = (t["sim_rank"] == i) & (t["stream"] == compute)
        weighted += r["weight"] * busy_seconds(t["start"][m], t["end"][m])
        weights += r["weight"]
    b = pangu_traced["breakdown_s"]
    assert math.isclose(weighted / weights, b["compute"] + b["other"], rel_tol=1e-6)


def test_trace_of_an_infeasible_plan_is_empty_but_well_formed(root):
    r = moesim.simulate(str(root / PANGU), {"parallelism.micro_batch_size": 8}, trace=True)
    assert r["feasible"] is False
    assert {len(v) for v in r["trace"]["tasks"].values()} <= {0, len(r["trace"]["tasks"]["start"])}


# --- search ----------------------------------------------------------------------------------


def test_search_returns_the_cli_ranking_and_reports_progress(cli, root):
    calls = []
    rep = moesim.search(str(root / SMALL_SEARCH), top=5, threads=2, progress=lambda *a: calls.append(a))
    expected = cli_json(cli, root, "search", SMALL_SEARCH, "--format", "json", "--top", "5", "--threads", "2")
    assert rep == expected
    ranked = rep["ranked"]
    assert [p["rank"] for p in ranked] == [1, 2, 3, 4, 5]
    tps = [p["tokens_per_s"] for p in ranked]
    assert tps == sorted(tps, reverse=True)
    assert all(isinstance(p["plan"]["tensor_model_parallel_size"], int) for p in ranked)
    # Progress: plain (phase, done, total) values, each phase ending complete.
    assert calls
    assert all(isinstance(ph, str) and type(d) is int and type(t) is int and 0 <= d <= t for ph, d, t in calls)
    screening = [c for c in calls if c[0] == "screening"]
    assert screening[-1][1] == screening[-1][2] > 0
    assert any(c[0] == "simulating" for c in calls)


def test_search_result_does_not_depend_on_threads(root):
    a = moesim.search(str(root / SMALL_SEARCH), top=8, threads=1)
    b = moesim.search(str(root / SMALL_SEARCH), top=8, threads=2)
    assert a == b


def test_search_overrides_narrow_the_space(root):
    rep = moesim.search(str(root / SMALL_SEARCH), {"search.tensor_model_parallel_size": [2]}, top=50, threads=2)
    assert rep["ranked"]
    assert {p["plan"]["tensor_model_parallel_size"] for p in rep["ranked"]} == {2}


def test_search_axis_with_no_valid_plan_is_a_config_error(root):
    with pytest.raises(moesim.ConfigError, match=r"/search/expert_model_parallel_size.*leaves no valid plan"):
        moesim.search(str(root / SMALL_SEARCH), {"search.ep": [3, 5]})


def test_exception_in_the_progress_callback_is_raised_after_the_search(root):
    calls = []

    def progress(phase, done, total):
        calls.append(phase)
        raise KeyError("stop")

    with pytest.raises(KeyError, match="stop"):
        moesim.search(str(root / SMALL_SEARCH), threads=2, progress=progress)
    assert len(calls) == 1  # not called again after it raised


# --- the GIL ---------------------------------------------------------------------------------


def test_simulate_releases_the_gil(root):
    # While simulations run in another thread, this thread keeps running Python. Were the GIL
    # held, this thread would stall for (nearly) the whole C++ run; released, it stalls only
    # while results are converted to Python objects and when the OS deschedules it (the test
    # shares two cores with the rest of the suite), so long stalls add up to a small share.
    path = str(root / PANGU)
    worker = threading.Thread(target=lambda: [moesim.simulate(path) for _ in range(2)])
    t0 = last = time.perf_counter()
    stalled = 0.0
    iterations = 0
    worker.start()
    while worker.is_alive():
        now = time.perf_counter()
        if now - last > 0.02:
            stalled += now - last
        last = now
        iterations += 1
    worker.join()
    total = time.perf_counter() - t0
    assert iterations > 1000
    assert stalled < 0.5 * total, (stalled, total)
