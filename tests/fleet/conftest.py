"""Shared by the fleet tests: a small Criteo-format data set and running a launcher."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT


@pytest.fixture(scope="session")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """4 files of 1,000 lines (examples/ctr_dnn/make_data.py --scale small): each of 2 trainers
    gets 2 files, 40 steps of 50 lines."""
    out = tmp_path_factory.mktemp("ctr")
    subprocess.run([sys.executable, str(ROOT / "examples" / "ctr_dnn" / "make_data.py"), "--out", str(out), "--scale",
                    "small", "--train-lines", "4000", "--test-lines", "100", "--train-files", "4"],
                   check=True, capture_output=True)
    return out / "train_data"


def run(argv: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """A launcher or script to its end (well within the tests' timeout), output captured."""
    return subprocess.run(argv, cwd=cwd, env=dict(os.environ, **(env or {})), capture_output=True, text=True,
                          timeout=110)
