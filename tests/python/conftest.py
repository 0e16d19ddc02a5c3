# Shared set-up of the Python tests. ctest runs them with PYTHONPATH=<build>/python and
# MOESIM_CLI=<build>/bin/moesim (tests/CMakeLists.txt); by hand, from the repository root:
#   PYTHONPATH=build/python /usr/bin/python3 -m pytest -q tests/python
import os
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def root():
    return ROOT


@pytest.fixture(scope="session")
def cli():
    path = pathlib.Path(os.environ.get("MOESIM_CLI", ROOT / "build" / "bin" / "moesim"))
    if not path.exists():
        pytest.fail("the moesim CLI is not at {} (set MOESIM_CLI)".format(path))
    return str(path)
