"""The launcher as an API (aps.launch, aps.LocalCluster, aps.PServerProcess) with real processes,
the one die-with-parent helper (aps.procs) against a real SIGKILL, and the public face of
``import aps``: every exported name resolves, and a client-only import pulls in no numba."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

import aps
from aps.launcher import LocalCluster, PServerProcess
from aps.launcher.roles import program
from examples.linreg.model import make_data
from tests.conftest import ROOT
from tests.e2e.test_local_launcher import alive, assert_all_gone

pytestmark = pytest.mark.timeout(120)

ENV = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))


def python(code: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], env=ENV, capture_output=True, text=True, timeout=timeout)


# ----------------------------------------------------------------------------- import aps


def test_import_aps_loads_no_numba_and_every_public_name_resolves() -> None:
    run = python(
        "import sys, json, aps\n"
        "before = 'numba' in sys.modules\n"
        "client = (aps.connect, aps.SparseTable, aps.ClusterSpec, aps.launch, aps.LocalCluster)\n"
        "missing = [n for n in aps.__all__ if getattr(aps, n, None) is None]\n"
        "import aps.trainer, aps.trainer.pool\n"
        "same = [aps.Model is aps.trainer.Model, aps.Batch is aps.trainer.Batch, aps.Params is aps.trainer.Params,\n"
        "        aps.Grads is aps.trainer.Grads, aps.Trainer is aps.trainer.Trainer, aps.Strategy is aps.trainer.Strategy,\n"
        "        aps.trainer.pool.WorkerFailed is aps.WorkerFailed]\n"
        "print(json.dumps({'numba_at_import': before, 'missing': missing, 'same': same, 'dir': 'Trainer' in dir(aps)}))\n"
    )
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout) == {"numba_at_import": False, "missing": [], "same": [True] * 7, "dir": True}


def test_the_launcher_runs_the_checkouts_bin_shims() -> None:
    """In a checkout the roles run bin/aps-server and bin/aps-trainer (what the process list and
    the tests that read it show), not ``-m`` modules."""
    for name, module in (("aps-server", "aps.cli.server"), ("aps-trainer", "aps.cli.trainer")):
        assert program(name, module) == [sys.executable, str(ROOT / "bin" / name)]


def test_unknown_attribute_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'Trainr'"):
        aps.Trainr  # noqa: B018 - the typo is the point


def test_errors_sit_in_the_one_tree() -> None:
    assert issubclass(aps.WorkerFailed, aps.ApsError) and not issubclass(aps.WorkerFailed, aps.ConfigError)
    assert issubclass(aps.TokenMissing, aps.ConfigError) and not issubclass(aps.TokenMissing, aps.ServerError)


# ----------------------------------------------------------------------------- aps.procs

# A parent that starts a grandchild calling aps.procs.die_with_parent(), reports the pid and
# sleeps; the test SIGKILLs the parent and expects the grandchild to die with it.
PARENT = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", '''
import sys, time
from aps.procs import die_with_parent
ok = die_with_parent()
print("armed" if ok else "unsupported", flush=True)
time.sleep(120)
'''], stdout=subprocess.PIPE, text=True)
print(child.pid, child.stdout.readline().strip(), flush=True)
time.sleep(120)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux only")
def test_a_process_that_asked_to_die_with_its_parent_does_when_the_parent_is_sigkilled() -> None:
    parent = subprocess.Popen([sys.executable, "-c", PARENT], env=ENV, stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        pid, state = parent.stdout.readline().split()
        assert state == "armed"
        assert alive(int(pid))
        parent.send_signal(signal.SIGKILL)
        parent.wait(10)
        assert_all_gone([int(pid)])
    finally:
        parent.kill()
        parent.wait()


# ----------------------------------------------------------------------------- aps.launch


@pytest.mark.slow
def test_launch_trains_a_user_model_and_returns_each_roles_result(tmp_path: Path) -> None:
    # the model by its module name, as every test loads it: numba's on-disk cache of its kernels
    # remembers the module name it was compiled under, so one file must not be loaded under two
    make_data(tmp_path / "data", files=2, lines_per_file=300)
    result = aps.launch(
        1, 2, ["--model", "examples.linreg.model:LinReg", "--data", str(tmp_path / "data"), "--workers", "1",
               "--epochs", "2", "--save-dir", str(tmp_path / "model")],
        mode="async", log_dir=tmp_path / "logs", cwd=tmp_path, env=ENV,
    )
    assert result.code == 0 and result.ok and result.failed == [] and result.reason == ""
    assert [(r.name, r.returncode, r.state, r.failure) for r in result.roles] == [
        ("pserver.0", 0, "exit 0", None), ("trainer.0", 0, "exit 0", None), ("trainer.1", 0, "exit 0", None)]
    for i in range(2):
        epoch = result.role(f"trainer.{i}").last_epoch
        assert epoch is not None and epoch["epoch"] == 1 and epoch["trainer"] == i and 0 <= epoch["loss"] < 1.0
    assert result.role("pserver.0").last_epoch is None
    assert (tmp_path / "logs" / "trainer.1.metrics.jsonl").exists()
    assert any("listening" in line for line in result.role("pserver.0").log_tail(50))
    assert_all_gone([r.pid for r in result.roles if r.pid is not None])


FAILS = "import os, sys, time\nif os.environ['APS_TRAINER_ID'] == '1':\n    sys.exit(3)\ntime.sleep(60)\n"


def test_a_failed_trainer_stops_the_others_and_comes_first_in_the_result(tmp_path: Path) -> None:
    cluster = LocalCluster(1, 2, trainer_cmd=[sys.executable, "-c", FAILS], log_dir=tmp_path)
    started = time.monotonic()
    result = cluster.run()
    assert time.monotonic() - started < 30  # not the sleeping trainer's 60 s
    assert result.code == 1 and not result.ok
    assert [(r.name, r.failure) for r in result.failed] == [("trainer.1", "exit 3")]
    assert result.role("trainer.0").state == "killed by SIGTERM (aps.launch sent SIGTERM)"
    assert result.role("pserver.0").state.endswith("(aps.launch sent SIGTERM)")
    assert_all_gone([r.pid for r in result.roles if r.pid is not None])


async def test_arun_times_out_with_124_inside_an_event_loop(tmp_path: Path) -> None:
    cluster = LocalCluster(1, 1, trainer_cmd=[sys.executable, "-c", "import time; time.sleep(60)"],
                           log_dir=tmp_path, timeout=1.5)
    result = await cluster.arun()
    assert (result.code, result.reason) == (124, "timed out after 1.5 s")
    assert result.failed == []  # stopped, not failed
    assert_all_gone([r.pid for r in result.roles if r.pid is not None])


@pytest.mark.parametrize("kwargs,message", [
    ({"servers": 0, "trainers": 1}, "at least 1 pserver"),
    ({"servers": 1, "trainers": 1, "mode": "fast"}, "mode must be one of"),
    ({"servers": 1, "trainers": 1, "script": ["t.py"], "mode": "geo"}, "mode does not apply to a script"),
    ({"servers": 1, "trainers": 1, "trainer_cmd": []}, "trainer_cmd is empty"),
    ({"servers": 1, "trainers": 1, "timeout": 0}, "timeout must be > 0"),
    ({"servers": 2, "trainers": 2, "metrics_port": 65533}, "must lie in 1..65535"),
])
def test_bad_settings_are_config_errors_before_anything_starts(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(aps.ConfigError, match=message):
        LocalCluster(**kwargs)  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- aps.PServerProcess


async def test_a_pserver_process_serves_and_stops(tmp_path: Path) -> None:
    server = PServerProcess.start("--no-exit-when-done", log_path=tmp_path / "ps.log", cwd=tmp_path)
    assert server.alive() and server.address == f"127.0.0.1:{server.port}"
    async with aps.connect([server.address], timeout=30) as ps:
        await ps.create_table(aps.SparseTable("emb", rows=8, dim=2, init=aps.Constant(0.5), optimizer=aps.SGD(lr=1.0)))
        assert (await ps.pull_sparse("emb", [3])).tolist() == [[0.5, 0.5]]
    assert server.stop() == 0 and not server.alive()
    assert_all_gone([server.pid])


def test_a_pserver_process_that_cannot_start_is_a_config_error_with_its_log(tmp_path: Path) -> None:
    with pytest.raises(aps.ConfigError, match=r"aps-server exit 2 before listening; see .*ps\.log: .*--no-such-flag"):
        PServerProcess.start("--no-such-flag", log_path=tmp_path / "ps.log")


@pytest.mark.slow
def test_a_trainer_started_before_its_pserver_waits_for_it(tmp_path: Path) -> None:
    """aps-trainer --wait-pservers: started 1.5 s before the pserver it names, it trains and
    exits 0; without the flag it fails at once, naming the pserver."""
    make_data(tmp_path / "data", files=1, lines_per_file=200)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    trainer = [sys.executable, str(ROOT / "bin" / "aps-trainer"), "--pservers", f"127.0.0.1:{port}", "--trainers", "1",
               "--model", "examples.linreg.model:LinReg", "--data", str(tmp_path / "data"), "--workers", "1",
               "--mode", "async", "--no-save", "--rpc-deadline", "1"]
    refused = subprocess.run(trainer, env=ENV, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert refused.returncode != 0 and f"127.0.0.1:{port}" in refused.stdout + refused.stderr
    waiting = subprocess.Popen([*trainer, "--wait-pservers", "30"], env=ENV, cwd=tmp_path,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    server = None
    try:
        time.sleep(1.5)
        assert waiting.poll() is None, waiting.communicate()[0]  # still waiting, not failed
        server = subprocess.Popen([sys.executable, str(ROOT / "bin" / "aps-server"), "--port", str(port), "--trainers", "1"],
                                  env=ENV, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        out, _ = waiting.communicate(timeout=60)
        assert waiting.returncode == 0, out
        assert server.wait(timeout=30) == 0  # its only trainer finished: the pserver exits by itself
    finally:
        for proc in (waiting, server):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()


def test_aps_trainer_reaps_its_fork_server_before_it_exits() -> None:
    """stop_fork_server (what aps-trainer calls at its end) leaves no fork server: it is killed
    and reaped at once, so its workers' CPU time is the program's children's, not lost."""
    run = python(
        "import os, multiprocessing.forkserver as fs\n"
        "from aps.trainer.pool import start_fork_server, stop_fork_server\n"
        "start_fork_server('aps.trainer.worker')\n"
        "pid = fs._forkserver._forkserver_pid\n"
        "os.kill(pid, 0)\n"
        "stop_fork_server()\n"
        "try:\n"
        "    os.kill(pid, 0)\n"
        "    print('alive')\n"
        "except ProcessLookupError:\n"
        "    print('gone', fs._forkserver._forkserver_pid)\n"
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["gone", "None"]
