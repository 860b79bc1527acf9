"""The fleet examples as user scripts, run in every role by the launchers with real processes:
aps-local NxM -- python script.py in sync, async and geo; aps-launch --server-num 1
--worker-num 2; the port of the reference's local_cluster.sh; and the older Paddle environment
names set by hand. Each asserts that every process exits 0 and that the loss the script prints
per step goes down by a stated amount.

The data: Criteo-format lines from examples/ctr_dnn/make_data.py (about 17% positives, so the best
constant prediction has a log loss of 0.456 and the untrained wide&deep model 0.693). "Goes down"
means: from above 0.6 at the first step (of the trainer that started first, on the untrained
model) to below 0.44, under the best constant prediction, as the mean of the last 10 steps of
every trainer: a drop of at least 0.16. (Alone the CTR-DNN script's two async trainers end at
0.35-0.40; in a parallel test run, with another test's processes on the same 2 cores, one ended
at 0.435: more staleness, slower descent.)"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import BIN, ROOT, free_port, free_ports
from tests.fleet.conftest import run

pytestmark = pytest.mark.timeout(120)

EXAMPLES = ROOT / "examples" / "fleet"
WIDE_DEEP, CTR_DNN = EXAMPLES / "wide_deep_train.py", EXAMPLES / "ctr_dnn_train.py"
FIRST_STEP_ABOVE = 0.6  # the untrained model: 0.693 (wide&deep), about 1.0 (CTR-DNN's wide embeddings)
LAST_STEPS_BELOW = 0.44  # the best constant prediction scores 0.456 on this data
LOSS = {WIDE_DEEP: re.compile(r"^TRAIN ---> pass: \d+ step: \d+ loss: ([0-9.]+)$", re.M),
        CTR_DNN: re.compile(r"^epoch \d+ step \d+ loss ([0-9.]+)$", re.M)}


def script_args(data: Path, mode: str, lr: float) -> list[str]:
    return ["--data", str(data), "--mode", mode, "--batch-size", "50", "--lr", str(lr), "--hidden", "16,16",
            "--k-steps", "5"]


def step_losses(log: Path, script: Path) -> list[float]:
    return [float(x) for x in LOSS[script].findall(log.read_text())]


def assert_trained(log_dir: Path, script: Path, trainers: int, steps: int) -> None:
    """From above FIRST_STEP_ABOVE to below LAST_STEPS_BELOW (see the module's docstring)."""
    losses = [step_losses(log_dir / f"trainer.{k}.log", script) for k in range(trainers)]
    assert [len(x) for x in losses] == [steps] * trainers
    # the trainer that pulled first trained its first step on the untrained model (every push
    # follows some trainer's first pull); later starters may already see trained parameters
    assert max(x[0] for x in losses) > FIRST_STEP_ABOVE, [x[0] for x in losses]
    last = [float(np.mean(x[-10:])) for x in losses]
    assert max(last) < LAST_STEPS_BELOW, last


def summary_exits(stdout: str) -> dict[str, str]:
    """role -> exit status, from the launcher's summary table."""
    return dict(re.findall(r"^((?:pserver|trainer)\.\d+)\s+\d+\s+(exit \d+|killed by \w+)", stdout, re.M))


# (mode, lr): wide&deep with Adam, or SGD in geo (the reference: geo trains with SGD only)
MODES = [("sync", 0.01), ("async", 0.01), ("geo", 0.5)]


@pytest.mark.slow
@pytest.mark.parametrize("mode,lr", MODES, ids=[m for m, _ in MODES])
def test_aps_local_runs_the_script_in_every_role(tmp_path: Path, data: Path, mode: str, lr: float) -> None:
    done = run([sys.executable, str(BIN / "aps-local"), "1x2", "--status-interval", "0", "--",
                "python", str(WIDE_DEEP), *script_args(data, mode, lr)], tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert summary_exits(done.stdout) == {"pserver.0": "exit 0", "trainer.0": "exit 0", "trainer.1": "exit 0"}
    assert_trained(tmp_path / "log", WIDE_DEEP, trainers=2, steps=40)
    if mode == "sync":  # both trainers' first step ran on the untrained model
        for k in range(2):
            assert step_losses(tmp_path / "log" / f"trainer.{k}.log", WIDE_DEEP)[0] > 0.6
    # the trainers' metrics records reach the launcher's summary, with the strategy's mode
    for k in range(2):
        assert f'"mode": "{mode}"' in (tmp_path / "log" / f"trainer.{k}.metrics.jsonl").read_text()
    assert "pserver stopped" in (tmp_path / "log" / "pserver.0.log").read_text()


@pytest.mark.slow
def test_aps_launch_runs_ctr_dnn_and_the_first_worker_saves(tmp_path: Path, data: Path) -> None:
    done = run([sys.executable, str(BIN / "aps-launch"), "--server-num", "1", "--worker-num", "2", "--status-interval",
                "0", str(CTR_DNN), *script_args(data, "sync", 0.01), "--epochs", "2", "--save", "model/ctr"], tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert summary_exits(done.stdout) == {"pserver.0": "exit 0", "trainer.0": "exit 0", "trainer.1": "exit 0"}
    assert_trained(tmp_path / "log", CTR_DNN, trainers=2, steps=80)  # its embeddings start far off: 2 epochs
    for epoch in range(2):
        assert [p.name for p in (tmp_path / "model" / "ctr" / f"epoch_{epoch}").iterdir()] == ["shard-00000-of-00001"]
    assert not (tmp_path / "model" / "ctr").with_name("trainer_1").exists()
    log0 = (tmp_path / "log" / "trainer.0.log").read_text()
    assert re.search(r"^epoch 1 step 80 auc 0\.\d+$", log0, re.M)
    assert re.search(r"^epoch 1 finished: 2000 examples, loss 0\.\d+, auc 0\.\d+", log0, re.M)

    # incremental training: the pservers of a second job warm-start from the saved tables
    # (fleet.init_server(model_path)), so even the first step is far below the untrained model's
    # (about 1.0 for CTR-DNN; one batch of 50 lines is noisy, hence the wide margin)
    one = tmp_path / "one_file"  # a short second job: one trainer, one file
    one.mkdir()
    (one / "part-00000").symlink_to(sorted(data.iterdir())[0])
    again = run([sys.executable, str(BIN / "aps-launch"), "--server-num", "1", "--worker-num", "1", "--status-interval",
                 "0", str(CTR_DNN), *script_args(one, "async", 0.01), "--init-model", "model/ctr/epoch_1"], tmp_path)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    first = step_losses(tmp_path / "log" / "trainer.0.log", CTR_DNN)[0]
    assert first < FIRST_STEP_ABOVE, first
    assert "model/ctr/epoch_1" in (tmp_path / "log" / "pserver.0.log").read_text()


@pytest.mark.slow
def test_local_cluster_sh_runs_the_program_it_is_given(tmp_path: Path, data: Path) -> None:
    ports = ",".join(map(str, free_ports(2)))
    program = " ".join([str(WIDE_DEEP), *script_args(data, "sync", 0.01)])
    done = run(["bash", str(EXAMPLES / "local_cluster.sh")], tmp_path,
               env={"PROGRAM": program, "PYTHON": sys.executable, "PSERVER_PORTS": ports, "TRAINERS": "2"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "every role exited 0" in done.stdout
    # 2 pservers this time: the tables are sharded over both, the training is the same
    assert_trained(tmp_path / "log", WIDE_DEEP, trainers=2, steps=40)
    for k in range(2):
        assert "all trainers sent worker_done" in (tmp_path / "log" / f"pserver.{k}.log").read_text()


def test_local_cluster_sh_fails_fast_and_leaves_nothing_behind(tmp_path: Path, data: Path) -> None:
    """A trainer that fails (a bad option for its model) stops the others at once."""
    marker = tmp_path / "never-saved"  # in every role's argv, to find any process left behind
    program = " ".join([str(WIDE_DEEP), *script_args(data, "sync", 0.01), "--hidden", "0", "--save", str(marker)])
    done = run(["bash", str(EXAMPLES / "local_cluster.sh")], tmp_path,
               env={"PROGRAM": program, "PYTHON": sys.executable, "PSERVER_PORTS": str(free_port()), "TRAINERS": "2"})
    assert done.returncode == 1
    assert re.search(r"FAILED: trainer\.\d exited with status 1", done.stderr), done.stderr
    assert "hidden must be comma-separated positive widths" in done.stderr  # the failed role's log tail
    leftover = subprocess.run(["pgrep", "-f", str(marker)], capture_output=True, text=True).stdout.split()
    assert leftover == []


@pytest.mark.slow
def test_older_paddle_names_run_a_pserver_and_a_trainer(tmp_path: Path, data: Path) -> None:
    """PADDLE_TRAINING_ROLE / PADDLE_PSERVER_IPS / PADDLE_PSERVER_PORT / PADDLE_TRAINERS /
    PADDLE_CURRENT_IP / PADDLE_TRAINER_ID, set by hand, no launcher."""
    port = str(free_port())
    common = {"PADDLE_PSERVER_IPS": "127.0.0.1", "PADDLE_PSERVER_PORT": port, "PADDLE_TRAINERS": "1"}
    argv = [sys.executable, str(WIDE_DEEP), *script_args(data, "async", 0.01)]
    for name in ("APS_ROLE", "APS_PSERVERS", "TRAINING_ROLE", "PADDLE_PSERVERS_IP_PORT_LIST", "PADDLE_TRAINERS_NUM"):
        assert name not in os.environ
    with open(tmp_path / "pserver.log", "wb") as log:
        server = subprocess.Popen(argv, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT,
                                  env=dict(os.environ, PADDLE_TRAINING_ROLE="PSERVER", PADDLE_CURRENT_IP="127.0.0.1",
                                           **common))
    try:
        trainer = run(argv, tmp_path, env={"PADDLE_TRAINING_ROLE": "TRAINER", "PADDLE_TRAINER_ID": "0", **common})
        assert trainer.returncode == 0, trainer.stdout[-2000:] + trainer.stderr[-2000:]
        assert server.wait(timeout=30) == 0
    finally:
        if server.poll() is None:
            server.send_signal(signal.SIGKILL)
            server.wait()
    (tmp_path / "trainer.0.log").write_text(trainer.stdout)
    losses = step_losses(tmp_path / "trainer.0.log", WIDE_DEEP)
    assert len(losses) == 80 and np.mean(losses[-10:]) < LAST_STEPS_BELOW and losses[0] > FIRST_STEP_ABOVE
    assert f"127.0.0.1:{port}" in (tmp_path / "pserver.log").read_text()
