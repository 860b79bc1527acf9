"""aps-ray on a local Ray started by the test (ray.init(num_cpus=2)): pservers and trainers as
Ray actors, endpoints exchanged through Ray, linreg trained to a stated loss; and a pserver
SIGKILLed mid-run failing the job loudly, with every other role stopped."""

from __future__ import annotations

import asyncio
import io
import json
import os
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import aps
from aps.cli.ray_launch import main, parse_args
from aps.launcher.ray_driver import RayJob
from examples.linreg.model import make_data
from tests.conftest import ROOT
from tests.e2e.test_local_launcher import alive
from tests.models.test_word2vec_e2e import make_corpus

ray = pytest.importorskip("ray", reason="Ray is the optional extra aps[ray]: pip install -e '.[ray]'")
pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def local_ray() -> Iterator[Any]:
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        yield ray
    finally:
        ray.shutdown()


def _args(tmp_path: Path, *trainer: str) -> list[str]:
    make_data(tmp_path / "data", files=4, lines_per_file=1000)
    return ["2x2", "--workdir", str(ROOT), "--log-dir", str(tmp_path / "log"), "--pserver-cpus", "0.5",
            "--trainer-cpus", "0.5", "--timeout", "180", "--",
            "--model", "examples.linreg.model:LinReg", "--model-arg", "lr=0.2", "--mode", "async", "--workers", "1",
            "--data", str(tmp_path / "data"), "--no-save", *trainer]


@pytest.mark.slow
def test_two_by_two_trains_through_ray(local_ray: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(_args(tmp_path, "--epochs", "6")) == 0
    out = capsys.readouterr().out
    listed = re.search(r"pservers listening: (\S+)", out)
    assert listed, out
    addresses = listed[1].split(",")
    node = ray.util.get_node_ip_address()
    assert [a.rpartition(":")[0] for a in addresses] == [node, node]  # the node's address, from Ray
    assert len({a.rpartition(":")[2] for a in addresses}) == 2
    for name in ("pserver.0", "pserver.1", "trainer.0", "trainer.1"):
        assert re.search(rf"^{name}\s+\S+\s+exit 0\s", out, re.M), out
    for k in range(2):
        records = [json.loads(line) for line in (tmp_path / "log" / f"trainer.{k}.metrics.jsonl").read_text().splitlines()]
        epochs = [r for r in records if r["event"] == "epoch"]
        assert [r["epoch"] for r in epochs] == list(range(6))
        first, last = epochs[0]["loss"], epochs[-1]["loss"]
        print(f"trainer {k}: loss {first:.4f} -> {last:.4f}")
        assert last < 0.05 and last < 0.25 * first, (first, last)
        assert f"epoch 5 loss {last:.4f}" in out
    assert "pserver listening" in (tmp_path / "log" / "pserver.1.log").read_text()


async def wait_for_connections(addresses: list[str], k: int, count: int, timeout: float = 60.0) -> None:
    """Until pserver ``k`` has ``count`` connections besides this probe's."""
    async with asyncio.timeout(timeout), aps.connect(addresses, timeout=5) as probe:
        while (await probe.stats())[addresses[k]]["connections"] - 1 < count:
            await asyncio.sleep(0.05)


@pytest.mark.slow
def test_a_killed_pserver_fails_the_job_and_stops_the_rest(local_ray: Any, tmp_path: Path) -> None:
    opts, trainer_args = parse_args(_args(tmp_path, "--epochs", "200"))
    out = io.StringIO()
    job = RayJob(ray, opts, trainer_args, out=out, err=out)
    try:
        addresses = job.start()
        trainer_pids = ray.get([t.actor.pid.remote() for t in job.trainers])
        # kill it once both trainers are connected to it: a kill before a trainer's first connect
        # fails that trainer first (it names the pserver it cannot reach), a different story
        asyncio.run(wait_for_connections(addresses, 1, 2))
        os.kill(ray.get(job.servers[1].actor.pid.remote()), signal.SIGKILL)
        started = time.monotonic()
        assert job.supervise() == 1
        assert time.monotonic() - started < 30
    finally:
        job.finish()
    text = out.getvalue()
    assert "pserver.1 failed: killed by SIGKILL; stopping every role" in text, text
    assert "--- last lines of pserver.1" in text and "pserver listening" in text
    deadline = time.monotonic() + 20
    while any(map(alive, trainer_pids)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(map(alive, trainer_pids)), "a trainer outlived the failed job"
    assert all(m.stopped and m.code is not None for m in [job.servers[0], *job.trainers])
    assert job.servers[1].failure == "killed by SIGKILL" and not job.servers[1].stopped


def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    for argv, message in ((["2x2"], "trainer options go after --"),
                          (["2x2", "--", "--model", "x", "--data", "d", "--trainer-id", "1"], "--trainer-id is set by aps-ray"),
                          (["0x2", "--", "--model", "x", "--data", "d"], "layout must be NxM"),
                          (["1x1", "--", "--data", "d"], "--model")):
        with pytest.raises(SystemExit) as exited:
            parse_args(argv)
        assert exited.value.code == 2
        assert message in capsys.readouterr().err


@pytest.mark.slow
def test_roles_ray_cannot_place_fail_with_the_cpus_asked(local_ray: Any, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    argv = _args(tmp_path, "--epochs", "1")
    argv[argv.index("--pserver-cpus") + 1] = "3"  # no pserver fits a 2-CPU Ray: none is ever placed
    argv[1:1] = ["--start-timeout", "2"]
    assert main(argv) == 1
    out, err = capsys.readouterr()
    asked = "the job asks Ray for 7 CPUs (2 x --pserver-cpus 3 + 2 x --trainer-cpus 0.5) and the cluster has 2"
    assert f"aps-ray: {asked}: roles Ray cannot place wait for free CPUs, up to --start-timeout 2 s" in err, err
    assert f"aps-ray: the pservers did not start within --start-timeout 2 s: {asked}" in err, err
    assert re.search(r"^pserver.1\s+\S+\s+not started", out, re.M) and "trainer.0" not in out, out


def _word2vec_args(tmp_path: Path, *extra: str) -> list[str]:
    """aps-ray 1x2 on word2vec with a tiny corpus (two topics); ``extra`` goes before ``--``."""
    corpus = make_corpus(tmp_path / "w2v", families=2, sentences_per_word=20, files=2)
    return ["1x2", "--workdir", str(ROOT), "--log-dir", str(tmp_path / "log"), "--timeout", "120", *extra, "--",
            "--model", "word2vec", "--model-arg", f"dict_path={corpus / 'dict.txt'}", "--data", str(corpus / "train"),
            "--workers", "1", "--no-save"]


@pytest.mark.slow
def test_a_trainer_failing_at_start_fails_the_job_while_a_role_waits_for_cpus(
        local_ray: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """1 pserver + 2 trainers at 1 CPU each on the 2-CPU Ray: one trainer cannot be placed while
    the others run. The placed trainer exits 2 at once (its dictionary does not exist); the job
    fails within seconds naming it, not after --start-timeout spent waiting for the other."""
    argv = _word2vec_args(tmp_path, "--start-timeout", "100", "--pserver-cpus", "1", "--trainer-cpus", "1")
    argv[argv.index(next(a for a in argv if a.startswith("dict_path=")))] = "dict_path=/nonexistent/dict.txt"
    began = time.monotonic()
    assert main(argv) == 1
    ended, elapsed = time.time(), time.monotonic() - began
    captured = capsys.readouterr()
    failed = re.search(r"^aps-ray: (trainer\.(\d)) failed: exit 2; stopping every role$", captured.err, re.M)
    assert failed, captured.err + captured.out
    name, waiting = failed[1], f"trainer.{1 - int(failed[2])}"
    log = tmp_path / "log" / f"{name}.log"
    assert ended - log.stat().st_mtime < 10, "the failure was seen more than 10 s after the trainer's last word"
    assert elapsed < 40, elapsed  # a pserver and a trainer started, and the failure seen: no --start-timeout
    assert f"--- last lines of {name} " in captured.err and "/nonexistent/dict.txt" in captured.err, captured.err
    tail = [line for line in log.read_text().splitlines() if "/nonexistent/dict.txt" in line]
    assert tail and tail[-1] in captured.err
    assert re.search(rf"^{waiting}\s+\S+\s+not started", captured.out, re.M), captured.out
    assert re.search(r"^pserver.0\s+\S+\s+stopped \(", captured.out, re.M), captured.out


@pytest.mark.slow
def test_word2vec_one_by_two_async_with_the_defaults(local_ray: Any, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """word2vec with its default setting (linear schedule) in async mode, the trainer's default,
    through Ray with aps-ray's defaults: on the 2-CPU Ray the three roles share its CPUs (at 1
    each the third would wait for ever), every role exits 0 and each trainer's epoch is in the
    summary."""
    argv = _word2vec_args(tmp_path)
    code = main(argv)
    captured = capsys.readouterr()
    assert code == 0, captured.err + captured.out
    assert "aps-ray: the cluster has 2 CPUs for 3 role(s) without a CPU setting: each reserves 0.666" in captured.out
    for name in ("pserver.0", "trainer.0", "trainer.1"):
        assert re.search(rf"^{name}\s+\S+\s+exit 0\s", captured.out, re.M), captured.out
    for k in range(2):
        assert re.search(rf"^trainer.{k}\s.*epoch 0 loss \d+\.\d+$", captured.out, re.M), captured.out
