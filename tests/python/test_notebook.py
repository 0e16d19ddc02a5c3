"""examples/pangu_718b.ipynb runs headless, top to bottom, without an error, and draws its plots."""
import os
import pathlib
import time

import nbclient
import nbformat

NOTEBOOK = "examples/pangu_718b.ipynb"


def test_example_notebook_is_stored_without_outputs(root):
    nb = nbformat.read(root / NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code
    assert all(c.outputs == [] and c.execution_count is None for c in code)


def test_example_notebook_executes_without_errors(root, monkeypatch):
    # The kernel inherits this environment; its working directory is examples/, so the package's
    # PYTHONPATH entries are made absolute first.
    entries = [e for e in os.environ.get("PYTHONPATH", "").split(os.pathsep) if e]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(str(pathlib.Path(e).resolve()) for e in entries))
    monkeypatch.delenv("MPLBACKEND", raising=False)  # the kernel's inline backend
    nb = nbformat.read(root / NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(
        nb, timeout=300 * int(os.environ.get("MOESIM_TEST_TIME_SCALE", "1")), kernel_name="python3", resources={"metadata": {"path": str(root / "examples")}}
    )
    t0 = time.perf_counter()
    client.execute()  # raises CellExecutionError on the first failing cell
    elapsed = time.perf_counter() - t0
    print(f"notebook executed in {elapsed:.1f} s")
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    figures = [o for o in outputs if o.output_type == "display_data" and "image/png" in o.get("data", {})]
    assert len(figures) == 4  # breakdown, timeline, EP x micro-batch sweep, cluster size
    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert "MFU / HFU" in text and "768 NPUs:" in text and "searched in" in text
    # The search table shows plans as people read them, not the result files' keys.
    assert "TP8 PP16" in text and "tp8-pp16-" not in text
    # The log-scale throughput axis has several labelled ticks, not one.
    ticks = next(line for line in text.splitlines() if line.startswith("throughput axis ticks"))
    assert len(ticks.split(":")[1].split(",")) >= 3, ticks
