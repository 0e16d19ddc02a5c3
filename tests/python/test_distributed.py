"""Searches shared by Dask tasks (moesim.search(..., client=...)) rank exactly as one process."""
import json

import pytest

import moesim

distributed = pytest.importorskip("distributed")  # Debian: python3-distributed (tools/setup.sh installs it)

SMALL = "tests/scenarios/search_small_moe.json"


def test_dask_local_cluster_ranks_like_one_process(root):
    scenario = str(root / SMALL)
    one = moesim.search(scenario, threads=1, top=100)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                                  dashboard_address=None) as cluster, distributed.Client(cluster) as client:
        two = moesim.search(scenario, threads=1, top=100, client=client)
        three = moesim.search(scenario, threads=1, top=100, client=client, processes=1)
        # Every task must run at once: more than the worker slots is refused.
        with pytest.raises(moesim.ConfigError, match="at most the client's 2 worker threads"):
            moesim.search(scenario, client=client, processes=3)
    assert json.dumps(two, sort_keys=True) == json.dumps(one, sort_keys=True)
    assert json.dumps(three, sort_keys=True) == json.dumps(one, sort_keys=True)
    assert two["ranked"], "the shared search ranks plans"


def test_model_search_from_python(root):
    """moesim.model_search gives the CLI's candidates (here two depths of the small model)."""
    scenario = json.loads((root / SMALL).read_text())
    scenario["search"] = {"tp": [1], "pp": [1, 2], "vpp": [1], "mbs": [1], "recompute": ["none"],
                          "pipeline_schedule": ["auto"]}
    scenario["model_search"] = {"axes": {"num_hidden_layers": [4, 8]}, "top_k": 2, "refine_k": 0}
    r = moesim.model_search(scenario, threads=1)
    assert [c["model"]["num_hidden_layers"] for c in r["candidates"]] == [4, 8]  # fewer layers: faster
    assert all(c["best_plan"] and c["tokens_per_s"] > 0 for c in r["candidates"])
    assert r["candidates"][0]["total_params"] < r["candidates"][1]["total_params"]
    with pytest.raises(moesim.ConfigError, match="/model_search"):
        moesim.model_search(str(root / SMALL))
