"""Real pserver and trainer processes for fault tests: start, watch, kill, restart, evaluate."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from aps.checkpoints.shards import load_shards
from tests.conftest import ROOT, Processes, free_ports, wait_port_file

MODEL = "tests.faults.models:PacedLinReg"


def wait_for(check: Callable[[], bool], timeout: float, what: str, step: float = 0.02) -> float:
    """Poll ``check`` until it holds; return the seconds it took (AssertionError after ``timeout``)."""
    started = time.monotonic()
    while not check():
        assert time.monotonic() - started < timeout, f"{what}: not within {timeout} s"
        time.sleep(step)
    return time.monotonic() - started


class Cluster:
    """pservers on fixed ports (so one can be restarted at its address) and trainers, all with
    their logs in ``tmp``; the pservers' working directory (checkpoint root) is ``tmp``."""

    def __init__(self, processes: Processes, tmp: Path, servers: int, trainers: int, *server_args: str) -> None:
        self.processes = processes
        self.tmp = tmp
        self.trainers = trainers
        self.server_args = list(server_args)
        self.trainers_started: list[subprocess.Popen] = []
        self.addresses = [f"127.0.0.1:{port}" for port in free_ports(servers)]
        self.servers: list[subprocess.Popen] = [self.start_server(k) for k in range(servers)]
        for k, proc in enumerate(self.servers):
            wait_port_file(self.port_file(k), proc)

    def port_file(self, k: int) -> Path:
        return self.tmp / f"pserver.{k}.port"

    def server_log(self, k: int, generation: int = 0) -> Path:
        return self.tmp / f"pserver.{k}.{generation}.log"

    def start_server(self, k: int, *extra: str, generation: int = 0) -> subprocess.Popen:
        self.port_file(k).unlink(missing_ok=True)
        return self.processes.start(
            "aps-server", "--port", self.addresses[k].rsplit(":", 1)[1], "--index", str(k),
            "--pservers", ",".join(self.addresses), "--trainers", str(self.trainers), "--port-file", str(self.port_file(k)),
            *self.server_args, *extra, log_name=self._log_name(self.server_log(k, generation)), cwd=self.tmp,
        )

    def restart_server(self, k: int, *extra: str, generation: int = 1) -> float:
        """Start server ``k`` again at its address; return the seconds until it listens."""
        started = time.monotonic()
        self.servers[k] = self.start_server(k, *extra, generation=generation)
        wait_port_file(self.port_file(k), self.servers[k])
        return time.monotonic() - started

    def start_trainer(
        self, trainer: int, data: Path, mode: str, *extra: str, pause: float = 0.005, workers: int = 1
    ) -> subprocess.Popen:
        proc = self.processes.start(
            "aps-trainer", "--pservers", ",".join(self.addresses), "--trainers", str(self.trainers),
            "--trainer-id", str(trainer), "--model", MODEL, "--model-arg", f"pause={pause}", "--data", str(data),
            "--workers", str(workers), "--mode", mode, "--print-period", "0.2", "--metrics", str(self.metrics(trainer)),
            "--save-dir", "model", *extra, log_name=self._log_name(self.trainer_log(trainer)), cwd=self.tmp,
            env={"PYTHONPATH": str(ROOT)},  # the model lives in tests/
        )
        self.trainers_started.append(proc)
        return proc

    def trainer_log(self, trainer: int) -> Path:
        return self.tmp / f"trainer.{trainer}.log"

    def _log_name(self, path: Path) -> str:
        return str(path.relative_to(self.processes.tmp))

    def metrics(self, trainer: int) -> Path:
        return self.tmp / f"trainer.{trainer}.metrics.jsonl"

    def examples(self, trainer: int) -> int:
        """Examples trainer ``trainer`` has reported so far (its progress records)."""
        path = self.metrics(trainer)
        if not path.exists():
            return 0
        records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        return max((r["examples"] for r in records if r["event"] == "progress"), default=0)


def read_data(data: Path) -> tuple[list[np.ndarray], np.ndarray]:
    """Feature ids and labels of every line of MultiSlot linreg files."""
    features, labels = [], []
    for file in sorted(data.iterdir()):
        for line in file.read_text().splitlines():
            parts = line.split()
            labels.append(float(parts[1]))
            features.append(np.array([int(x) for x in parts[3:]], dtype=np.int64))
    return features, np.array(labels)


def model_loss(checkpoint: Path, data: Path) -> float:
    """Mean 0.5 * (prediction - label)^2 of a saved linreg model over ``data``."""
    tables, _ = load_shards(checkpoint, 0, 1)
    w = tables["lin.w"].values[:, 0].astype(np.float64)
    b = float(tables["lin.b"].values[0][0])
    features, labels = read_data(data)
    predictions = np.array([b + w[f].sum() for f in features])
    return float(np.mean(0.5 * (predictions - labels) ** 2))
