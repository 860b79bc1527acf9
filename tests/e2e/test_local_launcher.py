"""bin/aps-local with real processes: real pservers, and small trainer programs (--trainer-cmd)
that use the real client API, fail, sleep, or kill themselves. Every test also checks that no
process aps-local started is still alive afterwards."""

from __future__ import annotations

import io
import json
import os
import pty
import re
import select
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from aps.cli.local import Board, Launcher, parse_args
from examples.linreg.model import make_data
from tests.conftest import BIN, ROOT, free_port

pytestmark = pytest.mark.timeout(90)

# A trainer that really trains a little: create a table, push a gradient to its own row, read
# back the rows, record its argv and environment, say worker_done (which ends the pservers).
TRAINER_OK = """
import asyncio, json, os, sys
import numpy as np
import aps

async def main():
    tid = int(os.environ["APS_TRAINER_ID"])
    env = {k: v for k, v in os.environ.items() if k.startswith(("APS_", "PADDLE_", "TRAINING_", "POD_"))}
    with open(f"argv.{tid}.json", "w") as f:
        json.dump({"argv": sys.argv[1:], "env": env}, f)
    async with aps.connect(os.environ["APS_PSERVERS"].split(","), token=os.environ.get("APS_TOKEN"), trainer_id=tid) as ps:
        await ps.create_table(aps.SparseTable("emb", rows=64, dim=4, init=aps.Constant(0.0), optimizer=aps.SGD(lr=1.0)))
        await ps.push_sparse_grad("emb", np.array([tid, 10 + tid], dtype=np.int64), -np.ones((2, 4), np.float32))
        print(f"trainer {tid} pushed", flush=True)
        await asyncio.sleep(0.3)
        rows = await ps.pull_sparse("emb", np.array([tid, 10 + tid], dtype=np.int64))
        print(f"trainer {tid} rows {rows.sum():.1f}", flush=True)
        await ps.worker_done()

asyncio.run(main())
"""

# Trainer 1 fails with exit 3 after 15 lines; the others sleep until they are stopped.
TRAINER_FAILS = """
import os, sys, time
tid = os.environ["APS_TRAINER_ID"]
open(f"pid.{tid}", "w").write(str(os.getpid()))
if tid == "1":
    while not os.path.exists("pid.0"):  # fail only once trainer 0 runs, so it must be stopped
        time.sleep(0.01)
    for i in range(15):
        print(f"trainer 1 line {i}")
    sys.exit(3)
time.sleep(600)
"""

TRAINER_SLEEPS = """
import os, time
print("trainer", os.environ["APS_TRAINER_ID"], "progress step 1", flush=True)
open(f"pid.{os.environ['APS_TRAINER_ID']}", "w").write(str(os.getpid()))
time.sleep(600)
"""

# trainer 1 ignores SIGTERM: only the SIGKILL that follows a second signal to aps-local stops it
TRAINER_STUBBORN = """
import os, signal, time
if os.environ["APS_TRAINER_ID"] == "1":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
open(f"pid.{os.environ['APS_TRAINER_ID']}", "w").write(str(os.getpid()))
time.sleep(600)
"""

TRAINER_KILLS_ITSELF = """
import os, signal
print("about to die", flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""

# exits 0 but leaves a child running in its process group
TRAINER_LEAKS_A_CHILD = """
import subprocess, sys
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
open("leaked.pid", "w").write(str(child.pid))
print("leaving", child.pid, "behind", flush=True)
"""

TRAINER_FORGETS_WORKER_DONE = """
print("done, but no worker_done", flush=True)
"""


def trainer_cmd(tmp_path: Path, source: str) -> str:
    script = tmp_path / "trainer_prog.py"
    script.write_text(source)
    return shlex.join([sys.executable, str(script)])


def launcher_argv(*args: str) -> list[str]:
    return [sys.executable, str(BIN / "aps-local"), *args]


def run_local(tmp_path: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(launcher_argv(*args), cwd=tmp_path, capture_output=True, text=True, timeout=timeout)


def summary(stdout: str) -> dict[str, tuple[int, str]]:
    """role -> (pid, exit status) from aps-local's final table."""
    rows = {}
    for match in re.finditer(r"^((?:pserver|trainer)\.\d+)\s+(\d+|-)\s+(.+?)\s{2,}", stdout, re.M):
        rows[match[1]] = (int(match[2]) if match[2] != "-" else 0, match[3])
    return rows


def summary_cells(stdout: str) -> dict[str, dict[str, str]]:
    """role -> {column: cell} from aps-local's final table, cut at the header's column starts
    (cells may be blank, so splitting on spaces would shift them)."""
    lines = stdout.splitlines()
    top = max(i for i, line in enumerate(lines) if line.startswith("role "))
    header = lines[top]
    columns = list(re.finditer(r"\S+(?: \S+)*", header))  # "exit status" is one column
    names, starts = [m[0] for m in columns], [m.start() for m in columns]
    table = {}
    for line in lines[top + 1:]:
        if not re.match(r"(pserver|trainer)\.\d+ ", line):
            break
        cells = [line[a:b].strip() for a, b in zip(starts, starts[1:] + [len(line)])]
        table[cells[0]] = dict(zip(names, cells))
    return table


def alive(pid: int) -> bool:
    """Running (zombies count as dead: init in a container may never reap them)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False
    except OSError:  # pragma: no cover - no /proc
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True


def children(pid: int) -> list[int]:
    kids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        kids.append(int(entry))
            except (OSError, IndexError, ValueError):
                pass
    return kids


def assert_all_gone(pids: list[int], within: float = 5.0) -> None:
    assert pids
    deadline = time.monotonic() + within
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [p for p in pids if alive(p)] == []


def wait_files(paths: list[Path], proc: subprocess.Popen[str], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not all(p.exists() and p.read_text() for p in paths):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, f"{paths} not written"
        time.sleep(0.05)


# ----------------------------------------------------------------------------- argument handling


def test_own_options_and_passthrough_are_split() -> None:
    opts, trainer = parse_args(["2x3", "--mode", "geo", "--epochs", "1", "--mo", "x", "--token", "t",
                                "--server-args", "--max-frame 1024", "--", "--log-dir", "inner", "--mode", "sync"])
    assert opts.layout == (2, 3) and opts.mode == "geo" and opts.token == "t" and opts.log_dir == "log"
    assert opts.server_argv == ["--max-frame", "1024"]
    # unknown options (no abbreviation of --mode!) first, then everything after --, unchanged
    assert trainer == ["--epochs", "1", "--mo", "x", "--log-dir", "inner", "--mode", "sync"]


@pytest.mark.parametrize("layout", ["0x2", "2x0", "2", "axb", "2x2x2"])
def test_bad_layout_is_a_usage_error(layout: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_args([layout])
    assert exc.value.code == 2 and "layout must be NxM" in capsys.readouterr().err


def test_a_command_after_double_dash_is_a_script_run_in_every_role() -> None:
    opts, trainer = parse_args(["1x2", "--log-dir", "logs", "--", "python", "train.py", "--epochs", "1", "--mode", "geo"])
    assert opts.script_argv == [sys.executable, "train.py", "--epochs", "1", "--mode", "geo"] and trainer == []
    assert parse_args(["1x1", "--", "train.py"])[0].script_argv == [sys.executable, "train.py"]
    assert parse_args(["1x1", "--", "./run.sh", "a"])[0].script_argv == ["./run.sh", "a"]
    assert parse_args(["1x1", "--", "--epochs", "1"])[0].script_argv is None  # options: aps-trainer's


@pytest.mark.parametrize("argv,message", [
    (["1x2", "--mode", "geo", "--", "python", "t.py"], "--mode does not apply to a script"),
    (["1x2", "--trainer-cmd", "python x.py", "--", "python", "t.py"], "--trainer-cmd does not apply"),
    (["1x2", "--server-args", "--max-frame 4096", "--", "python", "t.py"], "--server-args does not apply"),
    (["1x2", "--epochs", "1", "--", "python", "t.py"], "unknown option --epochs: a script run in every role"),
])
def test_script_mode_refuses_what_does_not_apply(argv: list[str], message: str,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_args(argv)
    assert exc.value.code == 2 and message in capsys.readouterr().err


def test_aps_launch_spells_the_same_job_as_aps_local(capsys: pytest.CaptureFixture[str]) -> None:
    from aps.cli.launch import build_parser, local_argv
    from aps.cli.launch import main as launch_main

    args = build_parser().parse_args(["--server_num=2", "--worker_num", "3", "--log_dir=x", "--timeout", "9",
                                      "train.py", "--lr", "0.1", "--server-num", "7"])
    assert local_argv(args) == ["2x3", "--log-dir", "x", "--timeout", "9", "--", "train.py", "--lr", "0.1",
                                "--server-num", "7"]
    for bad, message in ((["--server-num", "1", "t.py"], "--worker-num"), (["--server-num", "0", "--worker-num", "1",
                                                                             "t.py"], "must be >= 1")):
        with pytest.raises(SystemExit) as exc:
            launch_main(bad)
        assert exc.value.code == 2 and message in capsys.readouterr().err


SCRIPT_NEVER_SERVES = """
import os, time
open(f"pid.{os.environ['APS_ROLE']}.{os.getpid()}", "w").write(str(os.getpid()))
time.sleep(600)
"""


def test_a_script_pserver_that_never_listens_fails_the_start(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT_NEVER_SERVES)
    result = run_local(tmp_path, "1x1", "--start-timeout", "1", "--", "python", str(script))
    assert result.returncode == 1
    assert ("FAILED: pserver.0 did not start listening within 1 s (does the script call fleet.run_server()?)"
            in result.stderr)
    assert summary(result.stdout)["trainer.0"][1] == "not started"
    pids = [int(p.read_text()) for p in tmp_path.glob("pid.pserver.*")]
    assert len(pids) == 1
    assert_all_gone(pids)


# ----------------------------------------------------------------------------- whole clusters


@pytest.mark.slow
def test_2x2_cluster_trains_and_every_role_exits_0(tmp_path: Path) -> None:
    (tmp_path / "log").mkdir()
    (tmp_path / "log" / "trainer.0.log").write_text("STALE from an earlier run\n")
    result = run_local(
        tmp_path, "2x2", "--mode", "geo", "--token", "s3cret", "--status-interval", "0.25",
        "--trainer-cmd", trainer_cmd(tmp_path, TRAINER_OK), "--epochs", "1", "--", "--log-dir", "inner",
    )
    assert result.returncode == 0, result.stdout + result.stderr
    table = summary(result.stdout)
    assert {role: status for role, (_, status) in table.items()} == {
        "pserver.0": "exit 0", "pserver.1": "exit 0", "trainer.0": "exit 0", "trainer.1": "exit 0",
    }
    assert "aps-local: ok, every role exited 0" in result.stdout
    assert re.search(r"^aps-local \[\d+s\] pserver\.0 running", result.stdout, re.M)  # periodic, not a TTY
    assert "\r" not in result.stdout

    seen = [json.loads((tmp_path / f"argv.{i}.json").read_text()) for i in range(2)]
    pservers = seen[0]["env"]["APS_PSERVERS"]
    addresses = pservers.split(",")
    assert len(addresses) == 2 and all(a.startswith("127.0.0.1:") for a in addresses)
    for k, address in enumerate(addresses):
        assert re.search(rf"^  pserver\.{k}\s+{address}\s+log/pserver\.{k}\.log$", result.stdout, re.M)
    for i, got in enumerate(seen):
        assert got["argv"] == ["--pservers", pservers, "--trainers", "2", "--trainer-id", str(i),
                               "--mode", "geo", "--epochs", "1", "--log-dir", "inner"]
        env = got["env"]
        assert env["PADDLE_PSERVERS_IP_PORT_LIST"] == pservers
        assert (env["APS_TRAINERS"], env["PADDLE_TRAINERS_NUM"]) == ("2", "2")
        assert (env["APS_TRAINER_ID"], env["PADDLE_TRAINER_ID"]) == (str(i), str(i))
        assert env["TRAINING_ROLE"] == "TRAINER" and env["POD_IP"] == "127.0.0.1"
        assert env["APS_TOKEN"] == "s3cret" and "s3cret" not in " ".join(got["argv"])

    logs = tmp_path / "log"
    assert sorted(p.name for p in logs.iterdir()) == ["pserver.0.log", "pserver.1.log", "trainer.0.log", "trainer.1.log"]
    for i in range(2):
        text = (logs / f"trainer.{i}.log").read_text()
        assert "STALE" not in text and f"trainer {i} pushed" in text
        # each trainer's rows got +1 from its own push (the other trainer touched other rows)
        assert f"trainer {i} rows 8.0" in text
    for k in range(2):
        text = (logs / f"pserver.{k}.log").read_text()
        assert "pserver listening" in text and "all trainers sent worker_done" in text  # exited by itself
    assert_all_gone([pid for pid, _ in table.values()])


def test_failing_trainer_stops_the_cluster_and_shows_its_log(tmp_path: Path) -> None:
    result = run_local(tmp_path, "2x2", "--trainer-cmd", trainer_cmd(tmp_path, TRAINER_FAILS))
    assert result.returncode == 1
    assert "aps-local: FAILED: trainer.1 exit 3 (log: log/trainer.1.log)" in result.stderr
    tail = result.stderr.split("--- last 10 lines of log/trainer.1.log ---", 1)[1]
    assert [line.strip() for line in tail.strip().splitlines()] == [f"trainer 1 line {i}" for i in range(5, 15)]
    table = summary(result.stdout)
    assert table["trainer.1"][1] == "exit 3"
    assert table["trainer.0"][1] == "killed by SIGTERM (aps-local sent SIGTERM)"
    assert table["pserver.0"][1].endswith("(aps-local sent SIGTERM)")
    assert_all_gone([pid for pid, _ in table.values()] + [int((tmp_path / "pid.0").read_text())])


def test_trainer_killed_by_sigkill_is_reported_as_such(tmp_path: Path) -> None:
    result = run_local(tmp_path, "1x1", "--trainer-cmd", trainer_cmd(tmp_path, TRAINER_KILLS_ITSELF))
    assert result.returncode == 1
    assert "aps-local: FAILED: trainer.0 killed by SIGKILL (log: log/trainer.0.log)" in result.stderr
    assert "about to die" in result.stderr
    table = summary(result.stdout)
    assert table["trainer.0"][1] == "killed by SIGKILL"
    assert_all_gone([pid for pid, _ in table.values()])


def test_pserver_that_cannot_bind_fails_fast_before_any_trainer(tmp_path: Path) -> None:
    """A port taken between choosing and binding (forced here with --server-args overriding
    --port with one in use) is reported as such, and no trainer is started."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_local(tmp_path, "2x1", "--server-args", f"--port {port}",
                           "--trainer-cmd", trainer_cmd(tmp_path, TRAINER_SLEEPS))
    assert result.returncode == 1
    assert re.search(r"FAILED: pserver\.\d exit 2 before listening \(log: log/pserver\.\d\.log\)", result.stderr)
    assert "could not bind its port: another process took it" in result.stderr
    assert f"cannot listen on 127.0.0.1:{port}: address already in use" in result.stderr  # the log's tail
    table = summary(result.stdout)
    assert table["trainer.0"] == (0, "not started") and not (tmp_path / "pid.0").exists()
    assert_all_gone([pid for pid, _ in table.values() if pid])


@pytest.mark.slow
def test_pservers_still_running_after_trainers_is_a_failure(tmp_path: Path) -> None:
    result = run_local(tmp_path, "1x1", "--server-grace", "1",
                       "--trainer-cmd", trainer_cmd(tmp_path, TRAINER_FORGETS_WORKER_DONE))
    assert result.returncode == 1
    assert ("FAILED: pserver.0 still running 1 s after every trainer finished "
            "(did each trainer call worker_done?)") in result.stderr
    table = summary(result.stdout)
    assert table["trainer.0"][1] == "exit 0" and table["pserver.0"][1] == "exit 0 (aps-local sent SIGTERM)"
    assert_all_gone([pid for pid, _ in table.values()])


@pytest.mark.slow
def test_processes_a_role_leaves_behind_are_killed(tmp_path: Path) -> None:
    # --no-exit-when-done: the pserver is stopped as soon as the trainers are done, by design
    result = run_local(tmp_path, "1x1", "--server-args=--no-exit-when-done",
                       "--trainer-cmd", trainer_cmd(tmp_path, TRAINER_LEAKS_A_CHILD))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "aps-local: trainer.0 left processes behind in its group; killed them" in result.stderr
    table = summary(result.stdout)
    assert table["trainer.0"][1] == "exit 0" and table["pserver.0"][1] == "exit 0 (aps-local sent SIGTERM)"
    assert_all_gone([int((tmp_path / "leaked.pid").read_text())] + [pid for pid, _ in table.values()])


# ----------------------------------------------------------------------------- signals


def test_sigterm_to_launcher_stops_everything_and_twice_kills_at_once(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        launcher_argv("1x2", "--trainer-cmd", trainer_cmd(tmp_path, TRAINER_STUBBORN)),
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        wait_files([tmp_path / "pid.0", tmp_path / "pid.1"], proc)
        kids = children(proc.pid)
        assert len(kids) == 3
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)  # trainer 1 ignores SIGTERM; without this: SIGKILL after 5 s
        started = time.monotonic()
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 143 and time.monotonic() - started < 3
    assert "interrupted by SIGTERM; stopped every role" in err and "SIGTERM again, killing everything" in err
    table = summary(out)
    assert sorted(pid for pid, _ in table.values()) == sorted(kids)
    assert table["trainer.0"][1] == "killed by SIGTERM (aps-local sent SIGTERM)"
    assert table["trainer.1"][1] == "killed by SIGKILL (aps-local sent SIGKILL)"
    assert_all_gone(kids)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux-only")
def test_children_die_when_launcher_is_sigkilled(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        launcher_argv("1x1", "--trainer-cmd", trainer_cmd(tmp_path, TRAINER_SLEEPS)),
        cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        wait_files([tmp_path / "pid.0"], proc)  # type: ignore[arg-type]
        kids = children(proc.pid)
        assert len(kids) == 2 and int((tmp_path / "pid.0").read_text()) in kids
    finally:
        proc.kill()
        proc.wait()
    assert_all_gone(kids)


@pytest.mark.slow
def test_tty_status_line_then_ctrl_c(tmp_path: Path) -> None:
    """On a terminal the status line is rewritten in place and shows each trainer's last log
    line; SIGINT (Ctrl-C) stops everything with exit 130."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        launcher_argv("1x1", "--trainer-cmd", trainer_cmd(tmp_path, TRAINER_SLEEPS)),
        cwd=tmp_path, stdin=subprocess.DEVNULL, stdout=slave, stderr=subprocess.PIPE,
        env=dict(os.environ, COLUMNS="120"),
    )
    os.close(slave)
    status = re.compile(rb"\r\[\d+s\] ps0 run \| t0 run: trainer 0 progress step 1\x1b\[K")
    output = b""
    try:
        deadline = time.monotonic() + 30
        while not status.search(output) and time.monotonic() < deadline:
            if select.select([master], [], [], 1)[0]:
                output += os.read(master, 65536)
        assert status.search(output), output
        proc.send_signal(signal.SIGINT)
        while True:  # drain until the launcher closed the terminal
            if not select.select([master], [], [], 30)[0]:
                break
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the other side is closed
                break
            if not chunk:
                break
            output += chunk
        proc.wait(timeout=30)
        err = proc.stderr.read().decode() if proc.stderr else ""
    finally:
        proc.kill()
        os.close(master)
    assert proc.returncode == 130 and "interrupted by SIGINT; stopped every role" in err
    text = output.decode(errors="replace").replace("\r\n", "\n")
    table = summary(text)
    assert table["trainer.0"][1] == "killed by SIGTERM (aps-local sent SIGTERM)"  # forwarded as one SIGTERM
    assert_all_gone([pid for pid, _ in table.values()])


@pytest.mark.slow
def test_timeout_stops_everything_with_124(tmp_path: Path) -> None:
    result = run_local(tmp_path, "1x1", "--timeout", "1.5", "--trainer-cmd", trainer_cmd(tmp_path, TRAINER_SLEEPS))
    assert result.returncode == 124
    assert "--timeout 1.5 s expired" in result.stderr and "timed out after 1.5 s; stopped every role" in result.stderr
    assert_all_gone([pid for pid, _ in summary(result.stdout).values() if pid])


# ----------------------------------------------------------------------------- metrics: summary, ports


@pytest.mark.slow
def test_summary_shows_each_trainers_last_epoch_from_its_metrics_file(tmp_path: Path) -> None:
    """Real aps-trainers (a small linear regression): aps-local names each one's metrics file
    under --log-dir (replacing last run's), and the summary shows that file's last epoch."""
    make_data(tmp_path / "data", files=2, lines_per_file=300)
    logs = tmp_path / "runlogs"
    logs.mkdir()
    stale = json.dumps({"event": "epoch", "trainer": 0, "epoch": 9, "time": time.time(), "loss": 99.0,
                        "examples_per_s": 1.0})
    (logs / "trainer.0.metrics.jsonl").write_text(stale + "\n")
    result = subprocess.run(
        launcher_argv("1x2", "--log-dir", "runlogs", "--", "--model", "examples.linreg.model:LinReg",
                      "--data", str(tmp_path / "data"), "--epochs", "2", "--workers", "1", "--no-save"),
        cwd=tmp_path, env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "--trainer-id 0 --metrics runlogs/trainer.0.metrics.jsonl --model" in result.stdout
    assert not (tmp_path / "log").exists()  # aps-trainer's default (./log) was not used
    table = summary_cells(result.stdout)
    assert list(table) == ["pserver.0", "trainer.0", "trainer.1"]
    assert list(table["trainer.0"]) == ["role", "pid", "exit status", "duration", "examples/s", "loss", "log"]
    for k in range(2):
        records = [json.loads(line) for line in (logs / f"trainer.{k}.metrics.jsonl").read_text().splitlines()]
        assert [r["epoch"] for r in records if r["event"] == "epoch"] == [0, 1]  # the stale epoch 9 is gone
        last = [r for r in records if r["event"] == "epoch"][-1]
        row = table[f"trainer.{k}"]
        assert row["exit status"] == "exit 0" and row["log"] == f"runlogs/trainer.{k}.log"
        assert row["examples/s"] == f"{last['examples_per_s']:,.0f}" and float(row["examples/s"].replace(",", "")) > 0
        assert row["loss"] == f"{last['loss']:.4g}" and 0 < float(row["loss"]) < 1  # labels have variance ~0.75
    assert (table["pserver.0"]["examples/s"], table["pserver.0"]["loss"]) == ("", "")


# Writes its own metrics where aps-local looks (log/trainer.K.metrics.jsonl): an epoch from an
# earlier run, two epochs of this run (with AUC), and a half-written line; trainer 1 writes none.
TRAINER_WRITES_METRICS = """
import json, os, sys, time
tid = int(os.environ["APS_TRAINER_ID"])
assert "--metrics" not in sys.argv  # a custom program is not handed flags it may not know
if tid == 0:
    def rec(epoch, when, loss, rate, auc):
        return json.dumps({"event": "epoch", "trainer": 0, "epoch": epoch, "time": when, "loss": loss,
                           "examples_per_s": rate, "auc": auc, "batch_auc": auc}) + "\\n"
    with open("log/trainer.0.metrics.jsonl", "a") as f:
        f.write(rec(0, time.time() + 1, 0.5, 1000.0, 0.7) + rec(1, time.time() + 2, 0.25, 123456.7, 0.81234))
        f.write('{"event": "epoch", "trainer": 0, "epo')
"""


def test_summary_shows_auc_and_ignores_earlier_runs_and_partial_lines(tmp_path: Path) -> None:
    (tmp_path / "log").mkdir()
    earlier = {"event": "epoch", "trainer": 1, "epoch": 0, "time": time.time() - 3600, "loss": 9.0,
               "examples_per_s": 5.0, "auc": 0.5}
    (tmp_path / "log" / "trainer.1.metrics.jsonl").write_text(json.dumps(earlier) + "\n")
    result = run_local(tmp_path, "1x2", "--server-args=--no-exit-when-done",
                       "--trainer-cmd", trainer_cmd(tmp_path, TRAINER_WRITES_METRICS))
    assert result.returncode == 0, result.stdout + result.stderr
    table = summary_cells(result.stdout)
    assert table["trainer.0"] | {"pid": "", "duration": ""} == {
        "role": "trainer.0", "pid": "", "exit status": "exit 0", "duration": "",
        "examples/s": "123,457", "loss": "0.25", "auc": "0.8123", "log": "log/trainer.0.log",
    }
    assert [table[r][c] for r in ("trainer.1", "pserver.0") for c in ("examples/s", "loss", "auc")] == [""] * 6
    assert_all_gone([int(row["pid"]) for row in table.values()])


def test_metrics_ports_go_to_every_role_and_into_the_layout(tmp_path: Path) -> None:
    opts, trainer_args = parse_args(["2x2", "--metrics-port", "9100", "--log-dir", str(tmp_path),
                                     "--epochs", "1", "--metrics", "m.jsonl"])
    out = io.StringIO()
    launcher = Launcher(opts, trainer_args, Board(out, out))
    launcher.plan(["aps-server"], ["aps-trainer"], tmp_path)
    flags = [(r.name, r.argv[r.argv.index("--metrics-port") + 1]) for r in launcher.roles]
    assert flags == [("pserver.0", "9100"), ("pserver.1", "9101"), ("trainer.0", "9102"), ("trainer.1", "9103")]
    # the user's --metrics is kept (given once), and the summary reads from it
    assert [r.argv.count("--metrics") for r in launcher.trainers] == [1, 1]
    assert [r.metrics_path for r in launcher.trainers] == [Path("m.jsonl")] * 2
    launcher.print_layout()
    for name, port in flags:
        assert re.search(rf"^  {re.escape(name)}\s.* http://127\.0\.0\.1:{port}/metrics  ", out.getvalue(), re.M)

    plain, _ = parse_args(["2x2", "--epochs", "1"])
    launcher = Launcher(plain, ["--epochs", "1"], Board(io.StringIO(), io.StringIO()))
    launcher.plan(["aps-server"], ["aps-trainer"], tmp_path)
    assert not any("--metrics-port" in r.argv for r in launcher.roles)  # only when asked for


def free_port_run(n: int) -> int:
    """A base port with n free ports from it (checked by binding; another process may still race)."""
    for _ in range(50):
        base = free_port()  # below the ephemeral range, where port-0 binds of other tests do not land
        if base + n > 65536:
            continue
        held = []
        try:
            for port in range(base, base + n):
                s = socket.socket()
                held.append(s)
                s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for s in held:
                s.close()
    raise RuntimeError(f"no {n} consecutive free ports")


@pytest.mark.slow
def test_real_roles_serve_metrics_on_the_ports_aps_local_gives_them(tmp_path: Path) -> None:
    make_data(tmp_path / "data", files=2, lines_per_file=100)
    base = free_port_run(3)
    result = subprocess.run(
        launcher_argv("1x2", "--metrics-port", str(base), "--", "--model", "examples.linreg.model:LinReg",
                      "--data", str(tmp_path / "data"), "--workers", "1", "--no-save"),
        cwd=tmp_path, env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    for role, port in (("pserver.0", base), ("trainer.0", base + 1), ("trainer.1", base + 2)):
        assert f"  {role}" in result.stdout and f"http://127.0.0.1:{port}/metrics" in result.stdout
        log = (tmp_path / "log" / f"{role}.log").read_text()
        assert re.search(rf"metrics endpoint .*port={port}\b", log), log


@pytest.mark.parametrize("base", ["0", "65533"])
def test_metrics_ports_out_of_range_are_a_usage_error(base: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_args(["2x2", "--metrics-port", base])
    assert exc.value.code == 2 and "must lie in 1..65535" in capsys.readouterr().err


def test_aps_trainers_start_with_the_pservers_other_programs_after_them(tmp_path: Path) -> None:
    """aps-trainer waits for its pservers itself (--wait-pservers, the launcher's start timeout),
    so the launcher starts it with them; another trainer program gets no such flag and starts
    only once every pserver listens."""
    opts, trainer_args = parse_args(["1x2", "--log-dir", str(tmp_path), "--start-timeout", "45", "--epochs", "1"])
    launcher = Launcher(opts, trainer_args, Board(io.StringIO(), io.StringIO()))
    launcher.plan(None, None, tmp_path)
    for role in launcher.trainers:
        assert role.waits_for_pservers
        assert role.argv[role.argv.index("--wait-pservers") + 1] == "45"
    launcher.plan(["aps-server"], ["my-trainer"], tmp_path)
    assert not any(r.waits_for_pservers or "--wait-pservers" in r.argv for r in launcher.trainers)
