"""moesim — performance simulator for training large (mixture-of-experts) models on clusters.

A thin Python façade over the same C++ library as the ``moesim`` command line: scenarios are
plain dicts (the scenario JSON), results are the dicts ``moesim simulate --format json`` and
``moesim search --format json`` print, traces are NumPy arrays.

    import moesim
    r = moesim.simulate("scenarios/pangu-ultra-moe-718b.json", {"parallelism.micro_batch_size": 1})
    print(r["step_time_s"], r["mfu"], r["breakdown_s"]["bubble"])

Bad input of any kind raises :class:`ConfigError` with the CLI's message (one line per problem,
``file:/json/path: value constraint``). An infeasible plan (e.g. out of memory) is a result,
not an exception: ``r["feasible"]`` is False and ``r["infeasible_reason"]`` says why — the CLI
prints the same object with ``--format json`` — unless ``raise_infeasible=True`` asks for
:class:`Infeasible`. The GIL is released while the C++ code loads, simulates and searches, so
threads can run simulations in parallel.
"""

from __future__ import annotations

import os

from . import _moesim
from ._moesim import ConfigError, Error, Infeasible

__version__ = _moesim.__version__

__all__ = [
    "ConfigError",
    "Error",
    "Infeasible",
    "check",
    "load_scenario",
    "model_search",
    "presets",
    "save_scenario",
    "search",
    "simulate",
    "__version__",
]


def _argument_error(name, value, constraint):
    """A ConfigError about an argument of the call, in the loader's format."""
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    diagnostic = {"file": "<python>", "pointer": "/" + name, "value": text, "constraint": constraint}
    diagnostic["message"] = "<python>:/{}: {} {}".format(name, text, constraint)
    err = ConfigError(diagnostic["message"])
    err.diagnostics = [diagnostic]
    return err


def _path(name, value):
    if isinstance(value, (str, bytes, os.PathLike)):
        return os.fsdecode(os.fspath(value))
    raise _argument_error(name, value, "must be a path (str or os.PathLike)")


def _scenario(value):
    """A dict stays a dict; a path becomes a str; anything else is reported by the C++ side."""
    if isinstance(value, (bytes, os.PathLike)):
        return os.fsdecode(os.fspath(value))
    return value


def _bool(name, value):
    if isinstance(value, bool):
        return value
    raise _argument_error(name, value, "must be True or False")


def _int(name, value, minimum):
    if isinstance(value, bool) or not isinstance(value, int):
        try:
            import operator

            value = operator.index(value)  # NumPy integers
        except TypeError:
            raise _argument_error(name, value, "must be an integer") from None
    if value < minimum:
        raise _argument_error(name, value, "must be at least {}".format(minimum))
    return value


def load_scenario(path):
    """Read a scenario JSON file into a dict (the JSON as it is; nothing is resolved).

    Raises ConfigError when the file cannot be opened or is not valid JSON (line and column).
    """
    return _moesim.load_scenario(_path("path", path))


def save_scenario(scenario, path):
    """Write a scenario dict to ``path`` as indented JSON (keys sorted, as the library writes JSON).

    Raises ConfigError when a value is not JSON (naming its path) or the file cannot be written.
    """
    _moesim.save_scenario(scenario, _path("path", path))


def check(scenario, overrides=None):
    """Load and validate a scenario (a dict or a path), with ``moesim check``'s rules.

    ``overrides`` works as in :func:`simulate`. Raises ConfigError listing every problem.
    Returns what was resolved: ``file``, ``model``, ``cluster``, ``device``, ``devices``,
    ``num_microbatches``, ``parallelism`` (the plan with the derived ``data_parallel_size``) and
    ``scenario`` (the effective document after the overrides).
    """
    return _moesim.check(_scenario(scenario), overrides)


def simulate(scenario, overrides=None, fidelity=None, trace=False, *, raise_infeasible=False, wall_time=True,
             memory_detail=False, progress=None):
    """Simulate one training step; return the result dict of ``moesim simulate --format json``.

    scenario: a dict (the scenario JSON) or a path to a scenario file.
    overrides: ``{"parallelism.tp": 4, "training.global_batch_size": 3072}`` — dotted JSON
        paths, each applied like the CLI's ``--set KEY=VALUE`` (values are any JSON-like Python
        value), or a list of ``"KEY=VALUE"`` strings exactly as given to ``--set``.
    fidelity: None (the scenario's), ``"fast"``, ``"balanced"`` or ``"full"`` (``--fidelity``).
    trace: also return ``result["trace"]``: ``tasks`` — equal-length NumPy arrays, one row per
        (task, stream) busy interval as in the ``--trace`` timeline: ``rank`` (global rank),
        ``sim_rank`` (index of the simulated rank), ``stage``, ``stream``, ``category``,
        ``label``, ``microbatch`` (int32) and ``start``, ``end`` (float64 seconds) —
        ``pandas.DataFrame(result["trace"]["tasks"])`` makes a table of it; ``streams``,
        ``categories`` and ``labels`` are the names the integer columns index; ``ranks`` lists
        the simulated ranks ({rank, stage, weight}).
    raise_infeasible: raise Infeasible instead of returning ``feasible: False``.
    wall_time: keep ``simulator.wall_s`` (False: like ``--no-wall-time``, byte-identical
        results for the same scenario and seed).
    memory_detail: also return ``result["memory"]["detail"]`` (like ``--memory-detail``): every
        activation term per operator of the largest stage, with what recomputation drops and
        the source of each size, and the static parts (weights, gradients, optimizer, ...).
    The result also holds ``critical_path``: the chain of tasks that set the step time, summed
    by category (``by_category_s``: ``{"compute": s, "ep_comm": s, ...}``) and by the pipeline
    stage whose device ran them (``by_stage``, largest first), as ``moesim simulate`` prints
    "the step is gated by: ...".
    progress: called as ``progress(phase, done, total)`` from the calling thread while the
        simulation runs (every 50 ms when something changed): ``phase`` names the work
        (``"building the task graph"``, ``"simulating 622080 tasks"``, ...), ``done`` of
        ``total`` units (``total`` 0: not known). An exception it raises cancels the simulation
        and is re-raised.

    Raises ConfigError for bad input (message as the CLI's, exit status 2).
    """
    if progress is not None and not callable(progress):
        raise _argument_error("progress", progress, "must be callable as progress(phase, done, total) or None")
    return _moesim.simulate(
        _scenario(scenario),
        overrides,
        fidelity,
        _bool("trace", trace),
        _bool("raise_infeasible", raise_infeasible),
        _bool("wall_time", wall_time),
        _bool("memory_detail", memory_detail),
        progress,
    )


def search(scenario, overrides=None, top=10, threads=0, progress=None, client=None, processes=None):
    """Search the scenario's space of parallel plans; return ``moesim search --format json``'s dict.

    With a ``dask.distributed`` ``client``, ``processes`` Dask tasks (default: one per worker)
    share the search as MPI ranks would (``mpirun -n N moesim search``): each screens and
    simulates its share and the shares are exchanged through the scheduler; the result is
    identical to one process's. Every task must be able to run at once (a worker slot each).

    The space is the scenario's ``search`` section (absent axes take automatic values);
    ``overrides`` work as in :func:`simulate` (``{"search.tp": [4, 8]}``). ``top`` plans are
    shown in ``ranked`` (and at least as many event-simulated); ``threads`` 0 uses every core.
    ``progress``, when given, is called as ``progress(phase, done, total)`` — ``phase`` is
    ``"screening"``, ``"replaying pipelines"``, ``"refining"`` or ``"simulating"``, ``done`` and ``total`` are ints — from the calling
    thread with the GIL held; an exception it raises stops the calls and is re-raised when the
    search returns. The result is identical for any number of threads.
    """
    top = _int("top", top, 1)
    threads = _int("threads", threads, 0)
    if progress is not None and not callable(progress):
        raise _argument_error("progress", progress, "must be callable as progress(phase, done, total) or None")
    if client is not None:
        return _dask_search(client, _scenario(scenario), overrides, top, threads, processes)
    return _moesim.search(_scenario(scenario), overrides, top, threads, progress)


def model_search(scenario, overrides=None, threads=0):
    """Architecture search: the scenario's ``model_search`` candidates, each with its best plan.

    Returns ``moesim search --format json``'s dict for such a scenario: ``candidates`` best
    first, each with its config overrides, total and active parameters, and best plan (or why it
    was skipped). ``overrides`` work as in :func:`simulate` (``{"model_search.axes.num_hidden_layers": [58, 61]}``).
    """
    threads = _int("threads", threads, 0)
    return _moesim.model_search(_scenario(scenario), overrides, threads)


def _dask_allgather(token, rank, size):
    """An allgather among the Dask tasks of one search, through distributed Variables."""
    from distributed import Variable

    generation = [0]

    def allgather(mine):
        g = generation[0]
        generation[0] += 1
        Variable(f"moesim-{token}-{g}-{rank}").set(bytes(mine))
        out = [Variable(f"moesim-{token}-{g}-{r}").get() for r in range(size)]
        return out

    return allgather


def _dask_share(scenario, overrides, top, threads, rank, size, token):
    """One task of a search shared by Dask tasks (runs on a worker)."""
    from moesim import _moesim as core

    return core.search_share(scenario, overrides, top, threads, rank, size, _dask_allgather(token, rank, size))


def _dask_search(client, scenario, overrides, top, threads, processes):
    import uuid

    workers = list(client.scheduler_info()["workers"].items())
    slots = sum(int(info.get("nthreads", 1)) for _, info in workers)
    size = slots if processes is None else _int("processes", processes, 1)
    if size > slots:
        raise _argument_error("processes", processes, f"must be at most the client's {slots} worker threads (the tasks run at once)")
    if isinstance(scenario, str) and os.path.exists(scenario):
        scenario = os.path.abspath(scenario)  # the workers may run elsewhere
    token = uuid.uuid4().hex
    # Each task on its own worker slot, round-robin over the workers.
    addrs = []
    for addr, info in workers:
        addrs += [addr] * int(info.get("nthreads", 1))
    futures = [
        client.submit(_dask_share, scenario, overrides, top, threads or 1, r, size, token, pure=False,
                      workers=[addrs[r]], allow_other_workers=False, key=f"moesim-search-{token}-{r}")
        for r in range(size)
    ]
    results = client.gather(futures)
    return results[0]


def presets(kind=None, name=None):
    """The built-in presets.

    ``presets()``: their names, ``{"models": [...], "devices": [...], "clusters": [...]}``.
    ``presets("devices", "ascend-910b2")`` (kind ``"models"``, ``"devices"`` or ``"clusters"``):
    one preset as ``moesim presets KIND NAME --format json`` gives it: ``values`` (each
    ``{"key", "value", "unit", "source"}``), ``derived`` (a model's parameter counts and FLOPs
    per token at 4K and 8K; a cluster's achieved bandwidths) and ``preset`` (the file, sources
    kept). Raises ConfigError for an unknown kind or name.
    """
    if name is None:
        if kind is not None and kind not in ("models", "devices", "clusters"):
            raise _argument_error("kind", kind, "must be \"models\", \"devices\" or \"clusters\"")
        names = _moesim.presets("", "")
        return names if kind is None else {kind: names[kind]}
    if kind is None:
        raise _argument_error("kind", kind, "must be given with name: \"models\", \"devices\" or \"clusters\"")
    return _moesim.presets(str(kind), str(name))
