"""Progress of long commands (issues 20 and 22): one redrawn line with an ETA on a terminal's
stderr, nothing at all when stderr is piped; the same phases reach a Python callback.
"""
import os
import pty
import re
import select
import subprocess
import time

import moesim
import pytest

PANGU = "scenarios/pangu-ultra-moe-718b.json"
SMALL = "tests/scenarios/search_small_moe.json"
TIME_SCALE = float(os.environ.get("MOESIM_TEST_TIME_SCALE", "1"))


def run_on_terminal(cli, root, *args):
    """Runs the CLI with stderr on a pseudo-terminal; returns (exit code, stdout, terminal bytes)."""
    master, slave = pty.openpty()
    p = subprocess.Popen([cli, *args], cwd=root, stdout=subprocess.PIPE, stderr=slave, stdin=subprocess.DEVNULL)
    os.close(slave)
    seen = b""
    deadline = time.time() + 120 * TIME_SCALE
    while time.time() < deadline:
        ready, _, _ = select.select([master], [], [], 0.2)
        if ready:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # the child closed the terminal
                break
            if not chunk:
                break
            seen += chunk
        elif p.poll() is not None:
            break
    out = p.stdout.read()
    rc = p.wait(timeout=60 * TIME_SCALE)
    os.close(master)
    return rc, out, seen


def test_search_draws_progress_with_an_eta_on_a_terminal_and_clears_it(cli, root):
    # The 718B's default search takes about 2 s: long enough for the line (drawn from 1 s on).
    rc, out, seen = run_on_terminal(cli, root, "search", PANGU, "--top", "2", "--format", "json")
    assert rc == 0
    text = seen.decode()
    frames = [f for f in text.split("\r") if f.strip()]
    assert frames, "no progress line was drawn"
    assert any(re.search(r"(screening|replaying pipelines|refining|simulating) \[[#.]{20}\] +\d+%", f) for f in frames)
    # The ETA's arithmetic and text are checked in C++ ([progress]); here phases are too short to
    # promise one.
    assert all(len(f) < 80 for f in frames)  # one terminal line: never wraps
    assert text.endswith("\r")  # the last frame is blanks: the line is cleared before the result
    assert "\n" not in text  # nothing but the redrawn line
    assert out.startswith(b"{")  # the result itself is untouched


def test_piped_stderr_stays_silent(cli, root):
    p = subprocess.run([cli, "search", PANGU, "--top", "2", "--format", "json"], cwd=root, capture_output=True,
                       check=False)
    assert p.returncode == 0
    assert p.stderr == b""


def test_short_commands_draw_nothing_even_on_a_terminal(cli, root):
    rc, out, seen = run_on_terminal(cli, root, "simulate", SMALL, "--format", "json")
    assert rc == 0
    assert seen == b""


def test_python_simulate_reports_the_engine_phases(root):
    calls = []
    r = moesim.simulate(str(root / PANGU), progress=lambda *a: calls.append(a))
    assert r["feasible"] in (True, False)
    assert calls
    assert all(isinstance(ph, str) and type(d) is int and type(t) is int for ph, d, t in calls)
    assert calls[0][0] == "building the task graph"
    engine = [c for c in calls if c[0].startswith("simulating ")]
    assert engine, calls
    tasks = int(engine[-1][0].split()[1])
    assert all(t == tasks and 0 <= d <= t for _, d, t in engine)
    assert calls[-1][1] == calls[-1][2] == tasks  # the last state arrives: every task of the last run ended


def test_an_exception_in_the_simulate_callback_cancels_it(root):
    calls = []

    def progress(phase, done, total):
        calls.append(phase)
        raise KeyError("stop")

    with pytest.raises(KeyError, match="stop"):
        moesim.simulate(str(root / PANGU), progress=progress)
    assert len(calls) == 1


def test_simulate_progress_must_be_callable(root):
    with pytest.raises(moesim.ConfigError, match="progress"):
        moesim.simulate(str(root / SMALL), progress=3)
