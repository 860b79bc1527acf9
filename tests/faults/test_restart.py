"""A pserver killed with SIGKILL mid-training and restarted with --resume: the job finishes with
the trainers' default flags, and its model is about as good as that of a run without the fault."""

from __future__ import annotations

import signal
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.conftest import Processes
from tests.faults.cluster import Cluster, model_loss, wait_for
from tests.trainer.linreg_model import make_data

EPOCHS = 3
#: how much worse (absolute, in mean 0.5 * squared error) the model of a job whose pserver 1 was
#: killed and resumed may be than the fault-free model (both were 0.008-0.009 when measured)
LOSS_BOUND = 0.01


def run_job(processes: Processes, tmp: Path, data: Path, mode: str, kill: bool) -> tuple[float, Cluster]:
    tmp.mkdir()
    cluster = Cluster(processes, tmp, 2, 1, "--checkpoint-dir", "ckpt", "--checkpoint-every", "0.3")
    trainer = cluster.start_trainer(0, data, mode, "--epochs", str(EPOCHS), pause=0.01)
    if kill:
        saved = tmp / "ckpt"
        wait_for(lambda: cluster.examples(0) >= 2000, 60, "training started")
        wait_for(lambda: any(saved.glob("auto-*-shard-00001-of-00002/shard-00001-of-00002/manifest.json")), 10, "shard 1 saved")
        cluster.servers[1].send_signal(signal.SIGKILL)
        assert cluster.servers[1].wait(timeout=10) == -signal.SIGKILL
        cluster.restart_server(1, "--resume", "ckpt")
        log = cluster.server_log(1, 1).read_text()
        assert "resumed: this shard is rolled back to its checkpoint" in log
    assert trainer.wait(timeout=120) == 0, cluster.trainer_log(0).read_text()[-3000:]
    assert [s.wait(timeout=30) for s in cluster.servers] == [0, 0]  # worker_done reached the new one too
    return model_loss(tmp / "model" / f"epoch_{EPOCHS - 1}", data), cluster


@pytest.mark.parametrize("mode", ["async", "geo"])
def test_pserver_killed_and_resumed_mid_training(processes: Processes, tmp_path: Path, mode: str) -> None:
    data = tmp_path / "data"
    make_data(data, files=4, lines_per_file=2000)
    with ThreadPoolExecutor(1) as pool:  # the fault-free run alongside, to halve the wall time
        clean_job = pool.submit(run_job, processes, tmp_path / "clean", data, mode, False)
        faulty, _ = run_job(processes, tmp_path / "killed", data, mode, kill=True)
        clean, _ = clean_job.result()
    print(f"{mode}: clean {clean:.5f} killed {faulty:.5f}")
    assert faulty <= clean + LOSS_BOUND, (clean, faulty)
    # the restarted server goes on writing checkpoints, keeping the newest 3 of its own
    own = sorted((tmp_path / "killed" / "ckpt").glob("auto-*-shard-00001-of-00002"))
    assert 1 <= len(own) <= 3
