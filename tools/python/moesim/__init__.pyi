# Type stub of the moesim package (tools/python/moesim/__init__.py; C++ core in _moesim.cpp).
from os import PathLike
from typing import Any, Callable, Mapping, Sequence, TypedDict, Union

import numpy as np
import numpy.typing as npt

__version__: str

Scenario = dict[str, Any]
"""A scenario document (the scenario JSON as a dict)."""
ScenarioLike = Union[Scenario, str, PathLike[str]]
Overrides = Union[Mapping[str, Any], Sequence[str], None]
"""{"parallelism.tp": 4} (dotted JSON paths, like --set) or ["parallelism.tp=4", ...]."""

class Error(Exception):
    """Base class of moesim's exceptions."""

class ConfigError(Error):
    """Bad input; one line per problem: 'file:/json/pointer: value constraint' (the CLI's text)."""
    diagnostics: list[dict[str, str]]  # {file, pointer, value, constraint, message}

class Infeasible(Error):
    """The plan cannot run (simulate(..., raise_infeasible=True))."""
    reason: str
    result: dict[str, Any]

class TraceTasks(TypedDict):
    rank: npt.NDArray[np.int32]
    sim_rank: npt.NDArray[np.int32]
    stage: npt.NDArray[np.int32]
    stream: npt.NDArray[np.int32]
    category: npt.NDArray[np.int32]
    label: npt.NDArray[np.int32]
    microbatch: npt.NDArray[np.int32]
    start: npt.NDArray[np.float64]
    end: npt.NDArray[np.float64]

class Trace(TypedDict):
    tasks: TraceTasks
    streams: list[str]
    categories: list[str]
    labels: list[str]
    ranks: list[dict[str, Any]]

def load_scenario(path: Union[str, PathLike[str]]) -> Scenario:
    """Read a scenario JSON file into a dict."""

def save_scenario(scenario: Scenario, path: Union[str, PathLike[str]]) -> None:
    """Write a scenario dict as indented JSON."""

def check(scenario: ScenarioLike, overrides: Overrides = None) -> dict[str, Any]:
    """Load and validate; return the resolved plan. Raises ConfigError."""

def simulate(
    scenario: ScenarioLike,
    overrides: Overrides = None,
    fidelity: Union[str, None] = None,
    trace: bool = False,
    *,
    raise_infeasible: bool = False,
    wall_time: bool = True,
    memory_detail: bool = False,
) -> dict[str, Any]:
    """One training step: the dict of `moesim simulate --format json` (+ "trace": Trace)."""

def search(
    scenario: ScenarioLike,
    overrides: Overrides = None,
    top: int = 10,
    threads: int = 0,
    progress: Union[Callable[[str, int, int], object], None] = None,
    client: Any = None,
    processes: Union[int, None] = None,
) -> dict[str, Any]:
    """Strategy search: the dict of `moesim search --format json`; with a dask.distributed
    client, `processes` tasks share it (the same result)."""

def model_search(
    scenario: ScenarioLike,
    overrides: Overrides = None,
    threads: int = 0,
) -> dict[str, Any]:
    """Architecture search: the scenario's model_search candidates, each with its best plan."""

def presets(kind: str | None = None, name: str | None = None) -> dict[str, Any]:
    """{"models": [...], "devices": [...], "clusters": [...]}."""
