"""Hostile and huge inputs (issue 20): every row of the issue's table answers with exit 2 and a
message naming the file, the JSON path (or option) and the value -- within seconds and without
the machine's memory -- never a crash, a hang or an "internal error".

Each case runs the CLI in its own process; the time is checked against a limit with room for a
slow CI machine, and the largest child's resident memory against 1 GB at the end.
"""
import json
import os
import resource
import subprocess
import time

import pytest

import moesim

PANGU = "scenarios/pangu-ultra-moe-718b.json"
TIME_SCALE = float(os.environ.get("MOESIM_TEST_TIME_SCALE", "1"))
SANITIZED = "asan" in os.environ.get("LD_PRELOAD", "") or TIME_SCALE > 1


def run(cli, root, *args, stdin=None, limit_s=3.0):
    t0 = time.monotonic()
    p = subprocess.run([cli, *args], cwd=root, capture_output=True, text=True, check=False, stdin=stdin,
                       timeout=60 * TIME_SCALE)
    wall = time.monotonic() - t0
    assert wall < limit_s * TIME_SCALE, "took {:.1f} s: {}".format(wall, args)
    assert "internal error" not in p.stderr, p.stderr
    return p


def scenario(tmp_path, name, mutate):
    doc = json.loads((moesim_root() / PANGU).read_text())
    mutate(doc)
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return str(path)


def moesim_root():
    import pathlib
    return pathlib.Path(__file__).resolve().parents[2]


def test_deep_nesting_is_refused_with_its_path(cli, root, tmp_path):
    path = tmp_path / "deep.json"
    path.write_text('{"cluster": ' * 100000 + "1" + "}" * 100000)
    p = run(cli, root, "check", str(path))
    assert p.returncode == 2, p.stderr
    assert "deep.json:/cluster/cluster/" in p.stderr and "nested more than 64 levels" in p.stderr


def test_an_endless_model_file_is_refused_not_read(cli, root, tmp_path):
    path = scenario(tmp_path, "zero.json", lambda d: d.__setitem__("model", "/dev/zero"))
    p = run(cli, root, "check", path)
    assert p.returncode == 2
    assert "/dev/zero:/: is not a regular file" in p.stderr


def test_an_endless_stdin_stops_at_the_size_limit(cli, root):
    with open("/dev/zero", "rb") as zero:
        p = run(cli, root, "check", "-", stdin=zero, limit_s=10.0)
    assert p.returncode == 2
    assert "<stdin>:/: is larger than 64 MiB" in p.stderr


def test_a_dimension_beyond_any_published_model_is_an_input_error(cli, root, tmp_path):
    cfg = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_layer": 24, "n_embd": 2048, "n_head": 16,
           "n_inner": 2 ** 32, "vocab_size": 50257, "n_positions": 2048}
    (tmp_path / "gpt.json").write_text(json.dumps(cfg))
    doc = {"model": "gpt.json", "cluster": {"preset": "dgx-h100", "devices": 64},
           "training": {"seq_length": 2048, "global_batch_size": 64}, "parallelism": {"tp": 1, "pp": 1}}
    (tmp_path / "s.json").write_text(json.dumps(doc))
    for command in ("check", "simulate"):
        p = run(cli, root, command, str(tmp_path / "s.json"))
        assert p.returncode == 2
        assert "gpt.json:/n_inner: 4294967296 must be between 1 and 1048576" in p.stderr


@pytest.mark.parametrize("text", ["2e308", "-1e400"])
def test_a_number_beyond_a_double_names_its_path(cli, root, tmp_path, text):
    doc = (moesim_root() / PANGU).read_text().replace('"seq_length": 4096', '"seq_length": ' + text)
    (tmp_path / "big.json").write_text(doc)
    p = run(cli, root, "check", str(tmp_path / "big.json"))
    assert p.returncode == 2
    assert "big.json:/training/seq_length: {} is out of range for a number".format(text) in p.stderr


def test_validate_accepts_ids_of_any_form(cli, root, tmp_path):
    doc = json.loads((root / "tests/scenarios/validation_mixed_cases.json").read_text())
    cases = doc["cases"] if isinstance(doc, dict) else doc
    for i, c in enumerate(cases):
        c["id"] = "run-2024-12-04-{:03d}".format(i)
    (tmp_path / "cases.json").write_text(json.dumps(doc))
    p = run(cli, root, "validate", str(tmp_path / "cases.json"), limit_s=60.0)
    assert p.returncode == 0, p.stderr
    assert "run-2024-12-04-000" in p.stdout


def test_a_model_directory_stands_for_its_config(cli, root, tmp_path):
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text((root / "models/presets/models/llama3-70b.json").read_text())
    doc = {"model": "hf", "cluster": {"preset": "dgx-h100", "devices": 64},
           "training": {"seq_length": 4096, "global_batch_size": 64}, "parallelism": {"tp": 8, "pp": 1}}
    (tmp_path / "s.json").write_text(json.dumps(doc))
    p = run(cli, root, "check", str(tmp_path / "s.json"))
    assert p.returncode == 0, p.stderr
    # A directory without a config.json, given where a JSON file is expected.
    (tmp_path / "empty").mkdir()
    p = run(cli, root, "check", str(tmp_path / "empty"))
    assert p.returncode == 2
    assert "empty:/: is a directory, not a JSON file" in p.stderr


def test_full_fidelity_beyond_the_memory_limit_is_refused_up_front(cli, root, tmp_path):
    def big(d):
        d["cluster"]["devices"] = 98304
        d["training"]["global_batch_size"] = 24576
    path = scenario(tmp_path, "big.json", big)
    p = run(cli, root, "simulate", path, "--fidelity", "full", "--max-memory", "6GB", limit_s=5.0)
    assert p.returncode == 2
    assert '/simulation/fidelity: "full" would simulate 98304 ranks' in p.stderr
    assert "above the 6.0 GB limit" in p.stderr and 'the default fidelity "balanced"' in p.stderr


def test_an_override_is_blamed_for_its_own_error(cli, root):
    p = run(cli, root, "check", PANGU, "--set", "parallelism.tensor_model_parallel_size=3")
    assert p.returncode == 2
    assert "--set parallelism.tensor_model_parallel_size=3:/parallelism/tensor_model_parallel_size: 3" in p.stderr
    assert "pangu-ultra-moe-718b.json:/parallelism/tensor_model_parallel_size" not in p.stderr
    with pytest.raises(moesim.ConfigError) as e:
        moesim.simulate(str(root / PANGU), {"parallelism.tensor_model_parallel_size": 3})
    assert "override parallelism.tensor_model_parallel_size=3:/parallelism/tensor_model_parallel_size" in str(e.value)


def test_cross_server_tensor_parallelism_and_partial_servers_are_flagged(cli, root):
    p = run(cli, root, "check", PANGU, "--set", "parallelism.tensor_model_parallel_size=16",
            "--set", "parallelism.expert_model_parallel_size=2")
    assert p.returncode == 2
    assert "places tensor-parallel groups across servers of 8 devices" in p.stderr
    assert "allow_cross_node_tp" in p.stderr
    p = run(cli, root, "check", PANGU, "--set", "cluster.devices=6148")
    assert p.returncode == 2
    assert "/cluster/devices: 6148 leaves the last server partly used (6148 = 768 x 8 + 4)" in p.stderr
    assert "allow_partial_node" in p.stderr


def test_a_type_error_has_no_follow_on_errors(cli, root):
    p = run(cli, root, "check", PANGU, "--set", "training.seq_length=4096.5")
    assert p.returncode == 2
    assert "/training/seq_length: 4096.5 must be an integer" in p.stderr
    assert "must be divisible" not in p.stderr
    assert "the input has 1 problem" in p.stderr


def test_a_trace_can_be_filtered_and_is_refused_above_its_size_limit(cli, root, tmp_path):
    out = tmp_path / "t.json"
    p = run(cli, root, "simulate", PANGU, "--trace", str(out), "--trace-max-size", "10MB", limit_s=10.0)
    assert p.returncode == 2
    assert "--trace: 622212 events would make a trace of about" in p.stderr or "above the 0.01 GB limit" in p.stderr
    assert not out.exists()
    p = run(cli, root, "simulate", PANGU, "--trace", str(out), "--trace-ranks", "0", "--trace-window", "0:2",
            "--trace-streams", "compute,ep", limit_s=10.0)
    assert p.returncode == 0, p.stderr
    trace = json.loads(out.read_text())
    events = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert events and {e["pid"] for e in events} == {0} and {e["tid"] for e in events} <= {0, 3}
    assert all(e["ts"] < 2e6 for e in events)
    p = run(cli, root, "simulate", PANGU, "--trace", str(out), "--trace-ranks", "7", "--trace-streams", "gpu")
    assert p.returncode == 2
    assert "--trace-ranks: 7 is not a simulated rank" in p.stderr and '--trace-streams: "gpu" is not a stream' in p.stderr


def test_no_case_took_more_than_a_gigabyte():
    if SANITIZED:
        pytest.skip("sanitizer shadow memory counts in the resident size")
    peak_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    assert peak_kb < 1024 * 1024, "a child process peaked at {:.0f} MB".format(peak_kb / 1024)
