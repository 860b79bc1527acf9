"""Security of a pserver: the token stays off command lines (--token-file, APS_TOKEN), wrong
tokens are answered slowly, client-named checkpoint paths are confined to a root, only a trainer
may say it is done (and only of itself), and the traffic can run over TLS. Real TCP on port 0;
real processes where the command line or the program edge matters."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import ssl
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import aps
from aps import wire
from aps.cli.common import read_token_file
from aps.errors import ConfigError, ErrorCode
from aps.server.transport.throttle import AuthThrottle
from aps.wire.auth import auth_mac
from examples.linreg.model import make_data
from tests.conftest import BIN, ROOT, Processes, eventually, wait_port_file
from tests.server.test_bad_input import Raw

pytestmark = pytest.mark.timeout(90)

SECRET = "s3cret-Zq8-not-on-argv"
EMB = aps.SparseTable("emb", rows=64, dim=4, init=aps.Constant(0.0), optimizer=aps.SGD(lr=1.0))


def token_file(directory: Path, text: str = SECRET + "\n") -> Path:
    path = directory / "token"
    path.write_text(text)
    path.chmod(0o600)
    return path


def cmdline(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")[:-1]


def one_error_line(run: subprocess.CompletedProcess, prog: str) -> str:
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    assert run.returncode == 2 and len(lines) == 1, (run.returncode, run.stderr)
    assert lines[0].startswith(f"{prog}: error: ")
    return lines[0]


# ---------------------------------------------------------------- 1. the token off the command line


def test_token_file_is_read_once_without_its_trailing_newline(tmp_path: Path) -> None:
    assert read_token_file(str(token_file(tmp_path))) == SECRET
    assert read_token_file(str(token_file(tmp_path, " two words \r\n"))) == " two words "
    with pytest.raises(ConfigError, match="the file is empty"):
        read_token_file(str(token_file(tmp_path, "\n")))
    with pytest.raises(ConfigError, match="no such file"):
        read_token_file(str(tmp_path / "missing"))


@pytest.mark.slow
@pytest.mark.parametrize("prog", ["aps-server", "aps-trainer", "aps-local"])
def test_missing_or_empty_token_file_is_one_line_and_exit_2(tmp_path: Path, prog: str) -> None:
    rest = {"aps-server": ["--port", "0"], "aps-trainer": ["--pservers", "127.0.0.1:1", "--model", "ctr_dnn", "--data", "x"],
            "aps-local": ["1x1", "--", "--model", "ctr_dnn", "--data", "x"]}[prog]
    missing = tmp_path / "nope"
    run = subprocess.run([sys.executable, str(BIN / prog), "--token-file", str(missing), *rest],
                         capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert one_error_line(run, prog) == f"{prog}: error: --token-file {missing}: no such file"
    empty = token_file(tmp_path, "")
    run = subprocess.run([sys.executable, str(BIN / prog), "--token-file", str(empty), *rest],
                         capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert one_error_line(run, prog) == f"{prog}: error: --token-file {empty}: the file is empty"


@pytest.mark.slow
async def test_server_token_file_and_token_flag_warning(processes: Processes, tmp_path: Path) -> None:
    """A pserver with --token-file serves the token's holders only and its command line does not
    hold the token; one with --token works too, and says that ps shows it."""
    path = token_file(tmp_path)
    port_file = tmp_path / "a.port"
    proc = processes.start("aps-server", "--port", "0", "--token-file", str(path), "--port-file", str(port_file),
                           "--no-exit-when-done", log_name="a.log")
    address = f"127.0.0.1:{wait_port_file(port_file, proc)}"
    assert not any(SECRET in arg for arg in cmdline(proc.pid))
    async with aps.connect([address], token=SECRET, timeout=10) as ps:
        await ps.create_table(EMB)
        assert (await ps.stats())[address]["tables"]["emb"]["rows"] == 64
    with pytest.raises(aps.ServerError) as info:
        await aps.connect([address], token=SECRET + "\n", timeout=10, retries=0)  # the newline was dropped
    assert info.value.code == ErrorCode.AUTH_FAILED

    port_file = tmp_path / "b.port"
    proc = processes.start("aps-server", "--port", "0", "--token", SECRET, "--port-file", str(port_file),
                           "--no-exit-when-done", log_name="b.log")
    address = f"127.0.0.1:{wait_port_file(port_file, proc)}"
    async with aps.connect([address], token=SECRET, timeout=10) as ps:
        await ps.ping()
    log = (tmp_path / "b.log").read_text()
    assert "--token is visible to every user of this machine in ps; prefer --token-file or APS_TOKEN" in log
    assert "prefer --token-file" not in (tmp_path / "a.log").read_text()


# A --trainer-cmd program: records its own command line, aps-local's, and every process of this
# cluster (found by the pserver list on their command lines), then trains a little and is done.
TRAINER_SPY = """
import asyncio, json, os
import numpy as np
import aps

def cmdline(pid):
    try:
        return open(f"/proc/{pid}/cmdline", "rb").read().decode(errors="replace").split("\\0")[:-1]
    except OSError:
        return None

async def main():
    pservers = os.environ["APS_PSERVERS"]
    cluster = [c for c in (cmdline(p) for p in os.listdir("/proc") if p.isdigit()) if c and pservers in " ".join(c)]
    tid = int(os.environ["APS_TRAINER_ID"])
    token = os.environ.get("APS_TOKEN")
    try:
        await aps.connect(pservers.split(","), timeout=10, retries=0)
        refused = None
    except aps.TokenMissing as exc:  # a ConfigError: the token is this side's setting
        refused = str(exc)
    async with aps.connect(pservers.split(","), token=token, trainer_id=tid, timeout=10) as ps:
        await ps.create_table(aps.SparseTable("emb", rows=8, dim=2, init=aps.Constant(0.0), optimizer=aps.SGD(lr=1.0)))
        await ps.push_sparse_grad("emb", np.array([tid]), -np.ones((1, 2), np.float32))
        row = (await ps.pull_sparse("emb", np.array([tid]))).tolist()
        with open(f"spy.{tid}.json", "w") as f:
            json.dump({"self": cmdline(os.getpid()), "launcher": cmdline(os.getppid()), "cluster": cluster,
                       "token": token, "refused": refused, "row": row}, f)
        await ps.worker_done()

asyncio.run(main())
"""


@pytest.mark.slow
def test_aps_local_gives_the_token_file_to_children_by_environment_only(tmp_path: Path) -> None:
    (tmp_path / "spy.py").write_text(TRAINER_SPY)
    path = token_file(tmp_path)
    run = subprocess.run(
        [sys.executable, str(BIN / "aps-local"), "1x2", "--token-file", str(path), "--status-interval", "0",
         "--timeout", "60", "--trainer-cmd", f"{sys.executable} spy.py"],
        cwd=tmp_path, env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True, timeout=80,
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert "warning" not in run.stderr
    for tid in range(2):
        spy = json.loads((tmp_path / f"spy.{tid}.json").read_text())
        assert spy["token"] == SECRET  # the environment carried it
        assert "requires a token and none was given" in spy["refused"]  # the pservers did ask for it
        assert spy["row"] == [[1.0, 1.0]]
        assert "--token-file" in spy["launcher"] and str(path) in spy["launcher"]
        servers = [c for c in spy["cluster"] if any(a.endswith("aps-server") for a in c)]
        trainers = [c for c in spy["cluster"] if "spy.py" in c]
        assert len(servers) == 1 and len(trainers) >= 1, spy["cluster"]
        for argv in [spy["self"], spy["launcher"], *spy["cluster"]]:
            assert not any(SECRET in arg for arg in argv), argv


def test_aps_local_token_on_its_command_line_warns() -> None:
    from aps.cli.local import parse_args

    opts, _ = parse_args(["1x1", "--token", "t"])
    assert opts.token == "t" and opts.token_file is None
    # the warning comes first; the missing --data then stops aps-local before any process starts
    run = subprocess.run([sys.executable, str(BIN / "aps-local"), "1x1", "--token", "t", "--", "--model", "ctr_dnn"],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2
    assert run.stderr.splitlines()[0] == ("aps-local: warning: --token is visible to every user of this machine in ps; "
                                          "prefer --token-file or APS_TOKEN")


# ---------------------------------------------------------------- 2. wrong tokens are answered slowly


async def _attempt(address: str, token: str) -> float:
    began = time.monotonic()
    with pytest.raises(aps.ServerError) as info:
        await aps.connect([address], token=token, timeout=30, retries=0)
    assert info.value.code == ErrorCode.AUTH_FAILED
    return time.monotonic() - began


@pytest.mark.slow
@pytest.mark.alone  # a latency bound: a valid client's connect took 0.79 s once with a training run beside it
async def test_wrong_tokens_in_a_loop_are_slowed_while_a_valid_client_is_served_at_once() -> None:
    # the real backoff (0.05 s doubling to 1 s), its ceiling lowered to keep the test short
    srv = await aps.serve(port=0, token=SECRET, auth_fail_delay=0.05, auth_fail_max_delay=0.1)
    try:
        attack_done = asyncio.Event()
        valid: list[float] = []

        async def valid_client() -> None:
            while not attack_done.is_set():
                began = time.monotonic()
                async with aps.connect([srv.address], token=SECRET, timeout=10) as ps:
                    await ps.ping()
                valid.append(time.monotonic() - began)
                await asyncio.sleep(0.05)

        legit = asyncio.ensure_future(valid_client())
        began = time.monotonic()
        waits = [await _attempt(srv.address, "guess-%d" % i) for i in range(20)]
        elapsed = time.monotonic() - began
        attack_done.set()
        await legit
    finally:
        await srv.aclose()
    # 0.05 + 0.1 * 19 = 1.95 s at least: about 10 guesses/s instead of thousands
    assert elapsed >= 1.9, elapsed
    assert min(waits[1:]) >= 0.099 and waits[0] >= 0.049
    assert srv.auth_throttle.failures_total == 20
    assert len(valid) >= 5 and max(valid) < 0.5, valid  # the right token: never held up


@pytest.mark.slow
async def test_parallel_guesses_are_bounded_per_address_with_default_settings() -> None:
    """Opening connections in parallel does not buy guesses: with the defaults (2 held failures
    per address, delays 0.05, 0.1, 0.2, 0.4, 0.8, 1, 1 ... s) 8 parallel guesses take 2.5 s."""
    srv = await aps.serve(port=0, token=SECRET)
    assert (srv.config.auth_fail_delay, srv.config.auth_fail_max_delay, srv.config.auth_fail_concurrent) == (0.05, 1.0, 2)
    try:
        began = time.monotonic()
        await asyncio.gather(*[_attempt(srv.address, f"parallel-{i}") for i in range(8)])
        elapsed = time.monotonic() - began
    finally:
        await srv.aclose()
    assert 2.4 <= elapsed < 6, elapsed  # at most ~3 guesses/s from one address
    assert srv.auth_throttle.failures_total == 8


async def test_pipelined_auths_on_one_connection_get_one_check() -> None:
    srv = await aps.serve(port=0, token=SECRET, auth_fail_delay=0.2, auth_fail_max_delay=0.2)
    try:
        raw = await Raw.open(srv)
        hello = await raw.hello(client_id=9)
        good = auth_mac(SECRET, hello.nonce, 9)
        began = time.monotonic()
        raw.send_bytes(b"".join(wire.encode_bytes(m, rid) for rid, m in
                                [(2, wire.Auth(mac=b"\1" * 32)), (3, wire.Auth(mac=good)), (4, wire.Ping())]))
        rid, err = await raw.recv()
        assert rid == 2 and isinstance(err, wire.Error) and err.code == ErrorCode.AUTH_FAILED
        assert time.monotonic() - began >= 0.19
        assert await raw.closed_by_peer() == b""  # the right MAC behind it was never looked at
        raw.close()
        assert srv.auth_throttle.failures_total == 1 and srv.core.stats.ops.get("Ping") is None
    finally:
        await srv.aclose()


def _never_shed() -> None:
    raise AssertionError("shed while under the throttle's bounds")


async def test_throttle_backoff_doubles_is_capped_and_is_forgotten() -> None:
    now = [100.0]
    throttle = AuthThrottle(0.001, 0.016, concurrent=1, forget_after=60.0, clock=lambda: now[0])
    verdicts: list[tuple[str, bool, str]] = []
    delays = []
    for i in range(7):
        delays.append(throttle.next_delay("10.0.0.1"))
        throttle.submit("10.0.0.1", lambda: False, lambda ok, why, i=i: verdicts.append((f"bad{i}", ok, why)), _never_shed)
    # each failure is counted when it is checked (at once); one slot: refusals go out one after another
    assert delays == [0.001, 0.002, 0.004, 0.008, 0.016, 0.016, 0.016] and verdicts == []
    assert throttle.pending("10.0.0.1") == 7 and throttle.pending_total == 7
    throttle.submit("10.0.0.2", lambda: True, lambda ok, why: verdicts.append(("other", ok, why)), _never_shed)
    throttle.submit("10.0.0.1", lambda: True, lambda ok, why: verdicts.append(("right", ok, why)), _never_shed)
    # another address is not held up, nor is a right MAC from the address with failures pending
    assert verdicts == [("other", True, ""), ("right", True, "")]
    await asyncio.sleep(0.2)
    assert [v[0] for v in verdicts[2:]] == [f"bad{i}" for i in range(7)]
    assert all(not ok and why == "bad token" for _, ok, why in verdicts[2:])
    assert throttle.pending("10.0.0.1") == 0 and throttle.pending_total == 0
    assert throttle.next_delay("10.0.0.1") == 0.016  # 0.001 * 2**7, capped
    now[0] += 61
    assert throttle.next_delay("10.0.0.1") == 0.001
    gone: list[bool] = []
    throttle.submit("10.0.0.1", lambda: None, lambda ok, why: gone.append(ok), _never_shed)  # its connection closed
    assert gone == [] and throttle.failures_total == 7
    many = AuthThrottle(0.0, 0.0, concurrent=10_000, max_pending=2000, max_pending_total=2000)
    answered: list[bool] = []
    for _ in range(1500):  # 2.0 ** 1500 would overflow a float
        many.submit("10.0.0.3", lambda: False, lambda ok, why: answered.append(ok), _never_shed)
    await asyncio.sleep(0.05)
    assert answered == [False] * 1500 and many.next_delay("10.0.0.3") == 0.0


async def test_throttle_sheds_wrong_auths_over_its_bounds_and_still_answers_right_ones() -> None:
    """What the throttle keeps is bounded per address and in all: a wrong AUTH beyond the bounds
    is shed (its connection is left to the handshake deadline), never queued; a right one is
    answered at once whatever the bounds."""
    throttle = AuthThrottle(0.05, 0.05, concurrent=1, max_pending=3, max_pending_total=5)
    events: list[str] = []

    def wrong(address: str, i: int) -> None:
        throttle.submit(address, lambda: False, lambda ok, why: events.append(f"refused {address} {i}"),
                        lambda: events.append(f"shed {address} {i}"))

    for i in range(5):
        wrong("10.0.0.1", i)
    assert events == ["shed 10.0.0.1 3", "shed 10.0.0.1 4"] and throttle.pending("10.0.0.1") == 3
    for i in range(3):
        wrong("10.0.0.2", i)  # the server-wide bound (5) is reached at its third
    assert events[2:] == ["shed 10.0.0.2 2"] and throttle.pending_total == 5
    throttle.submit("10.0.0.1", lambda: True, lambda ok, why: events.append(f"right {ok}"), _never_shed)
    assert events[-1] == "right True"
    assert (throttle.failures_total, throttle.shed_total) == (8, 3)
    await eventually(lambda: len(events) >= 9)  # 3 slot times of 0.05 s on 10.0.0.1's one slot
    assert sorted(events[4:]) == sorted([f"refused 10.0.0.1 {i}" for i in range(3)] + ["refused 10.0.0.2 0", "refused 10.0.0.2 1"])
    assert throttle.pending_total == 0
    wrong("10.0.0.1", 9)  # room again: scheduled, not shed
    assert throttle.pending("10.0.0.1") == 1 and throttle.shed_total == 3


@pytest.mark.slow
async def test_wrong_auths_over_the_bounds_are_closed_at_the_handshake_deadline() -> None:
    """Held-open guessing connections beyond what the throttle keeps are not answered early
    (that would tell the guesser sooner): the handshake deadline closes them; meanwhile a client
    with the token from the same address is served at once."""
    srv = await aps.serve(port=0, token=SECRET, handshake_timeout=2.0, auth_fail_delay=0.3, auth_fail_max_delay=0.3)
    srv.auth_throttle.max_pending = 2
    try:
        opened = time.monotonic()
        raws = []
        for i in range(4):
            raw = await Raw.open(srv)
            await raw.hello(client_id=100 + i)
            raw.send_bytes(wire.encode_bytes(wire.Auth(mac=bytes(32)), 2))
            raws.append(raw)
        await asyncio.sleep(0.1)
        assert srv.auth_throttle.pending("127.0.0.1") == 2 and srv.auth_throttle.shed_total == 2
        began = time.monotonic()
        async with aps.connect([srv.address], token=SECRET, timeout=10) as ps:
            await ps.ping()
        assert time.monotonic() - began < 0.5
        # the two scheduled ones are refused after 0.3 s (one per slot); the shed ones get no answer
        for raw in raws[:2]:
            rid, err = await raw.recv()
            assert rid == 2 and isinstance(err, wire.Error) and err.code == ErrorCode.AUTH_FAILED
        assert 0.29 <= time.monotonic() - opened < 1.5
        for raw in raws[2:]:
            assert await raw.closed_by_peer() == b""
        assert time.monotonic() - opened >= 1.99  # closed at the 2 s handshake deadline
        for raw in raws:
            raw.close()
    finally:
        await srv.aclose()


# ---------------------------------------------------------------- 3. checkpoint paths under a root


async def test_save_and_load_are_confined_to_the_checkpoint_root(tmp_path: Path) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (root / "escape").symlink_to(outside)
    srv = await aps.serve(port=0, checkpoint_root=str(root))
    try:
        async with aps.connect([srv.address], timeout=10) as ps:
            await ps.create_table(EMB)
            await ps.push_sparse_grad("emb", [3], -np.ones((1, 4), np.float32))
            await ps.save("rel/ckpt")  # relative: under the root, not under the cwd
            await ps.save(str(root / "abs"))
            assert (root / "rel" / "ckpt" / "shard-00000-of-00001" / "manifest.json").is_file()
            assert (root / "abs" / "shard-00000-of-00001" / "manifest.json").is_file()
            for bad in ["../outside/x", str(outside / "x"), "escape/x", "rel/../../outside", "/etc/aps"]:
                with pytest.raises(aps.ServerError) as info:
                    await ps.save(bad)
                assert info.value.code == ErrorCode.BAD_REQUEST
                assert f"outside this pserver's checkpoint root {os.path.realpath(root)}" in str(info.value)
            assert list(outside.iterdir()) == [] and not Path("/etc/aps").exists()
            shutil.copytree(root / "abs", outside / "ckpt")  # a real checkpoint, but out of bounds
            for bad in [str(outside / "ckpt"), "escape/ckpt", "../outside/ckpt"]:
                with pytest.raises(aps.ServerError) as info:
                    await ps.load(bad)
                assert info.value.code == ErrorCode.BAD_REQUEST and "outside" in str(info.value)
            await ps.push_sparse_grad("emb", [3], -np.ones((1, 4), np.float32))
            await ps.load("rel/ckpt")
            assert (await ps.pull_sparse("emb", [3])).tolist() == [[1.0] * 4]
    finally:
        await srv.aclose()


async def test_default_root_is_the_working_directory_at_start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    srv = await aps.serve(port=0)
    monkeypatch.chdir(tmp_path)  # later changes of the cwd do not move the root
    try:
        assert srv.core.checkpointing.root == os.path.realpath(work)
        async with aps.connect([srv.address], timeout=10) as ps:
            await ps.create_table(EMB)
            await ps.save("model/epoch_0")
            assert (work / "model" / "epoch_0" / "shard-00000-of-00001").is_dir()
            with pytest.raises(aps.ServerError) as info:
                await ps.save(str(tmp_path / "model"))
            assert info.value.code == ErrorCode.BAD_REQUEST
    finally:
        await srv.aclose()
    assert not (tmp_path / "model").exists()


@pytest.mark.slow
def test_init_model_is_trusted_and_a_missing_root_is_refused(processes: Processes, tmp_path: Path) -> None:
    root, elsewhere = tmp_path / "root", tmp_path / "elsewhere"
    root.mkdir()

    async def save() -> None:
        srv = await aps.serve(port=0, checkpoint_root=str(tmp_path))
        try:
            async with aps.connect([srv.address], timeout=10) as ps:
                await ps.create_table(EMB)
                await ps.push_sparse_grad("emb", [5], -np.ones((1, 4), np.float32))
                await ps.save(str(elsewhere))
        finally:
            await srv.aclose()

    asyncio.run(save())
    port_file = tmp_path / "ps.port"
    proc = processes.start("aps-server", "--port", "0", "--checkpoint-root", str(root), "--init-model", str(elsewhere),
                           "--port-file", str(port_file), "--trainers", "1")
    address = f"127.0.0.1:{wait_port_file(port_file, proc)}"

    async def check() -> None:
        async with aps.connect([address], timeout=10, trainer_id=0) as ps:
            assert (await ps.pull_sparse("emb", [5])).tolist() == [[1.0] * 4]  # the operator's --init-model
            with pytest.raises(aps.ServerError) as info:
                await ps.load(str(elsewhere))  # the same path named by a client
            assert info.value.code == ErrorCode.BAD_REQUEST
            await ps.worker_done()

    asyncio.run(check())
    assert proc.wait(timeout=30) == 0
    run = subprocess.run([sys.executable, str(BIN / "aps-server"), "--port", "0", "--checkpoint-root", str(tmp_path / "no")],
                         capture_output=True, text=True, timeout=60)
    assert one_error_line(run, "aps-server") == f"aps-server: error: --checkpoint-root {tmp_path / 'no'}: no such directory"


# ---------------------------------------------------------------- 4. worker_done only from that trainer


async def test_worker_done_only_from_the_trainer_itself() -> None:
    srv = await aps.serve(port=0, num_trainers=2, exit_when_done=True)
    try:
        async with aps.connect([srv.address], timeout=10) as anyone:  # a library client: trainer_id -1
            with pytest.raises(aps.ServerError) as info:
                await anyone.worker_done(trainer_id=0)
            assert info.value.code == ErrorCode.BAD_REQUEST and "not a trainer" in str(info.value)
        raw = await Raw.open(srv)
        await raw.hello()
        err = await raw.call(wire.WorkerDone(trainer_id=1), 2)
        assert isinstance(err, wire.Error) and err.code == ErrorCode.BAD_REQUEST
        raw.close()
        async with aps.connect([srv.address], timeout=10, trainer_id=1) as one:
            with pytest.raises(aps.ServerError) as info:
                await one.worker_done(trainer_id=0)
            assert info.value.code == ErrorCode.BAD_REQUEST and "from trainer 1" in str(info.value)
            assert srv.core.done_trainers == set()
            await one.worker_done()  # its own id: taken
            await one.worker_done(trainer_id=1)
            assert srv.core.done_trainers == {1} and not srv.closing
        async with aps.connect([srv.address], timeout=10, trainer_id=0) as zero:
            await zero.worker_done()
        await asyncio.wait_for(srv.wait_closed(), 5)
        assert srv.exit_reason == "all trainers sent worker_done"
    finally:
        await srv.aclose()


# ---------------------------------------------------------------- 5. TLS


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """A self-signed certificate for localhost and 127.0.0.1, and its key (PEM files)."""
    d = tmp_path_factory.mktemp("tls")
    cert, key = d / "cert.pem", d / "key.pem"
    try:
        import datetime
        import ipaddress

        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import rsa
        from cryptography.x509.oid import NameOID
    except ImportError:
        if shutil.which("openssl") is None:
            pytest.skip("neither the cryptography package nor the openssl program is available to make a certificate")
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
             "-subj", "/CN=localhost", "-days", "1", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
            check=True, capture_output=True, timeout=60,
        )
        return str(cert), str(key)
    private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.timezone.utc)
    built = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(private.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                    x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(private, hashes.SHA256())
    )
    cert.write_bytes(built.public_bytes(serialization.Encoding.PEM))
    key.write_bytes(private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL,
                                          serialization.NoEncryption()))
    return str(cert), str(key)


async def test_tls_round_trip_with_a_self_signed_certificate(certificate: tuple[str, str]) -> None:
    cert, key = certificate
    srv = await aps.serve(port=0, token=SECRET, tls_cert=cert, tls_key=key)
    try:
        trusted = ssl.create_default_context(cafile=cert)
        async with aps.connect([srv.address], token=SECRET, ssl=trusted, timeout=10) as ps:
            await ps.create_table(EMB)
            await ps.push_sparse_grad("emb", [1, 2], -np.arange(8, dtype=np.float32).reshape(2, 4))
            assert (await ps.pull_sparse("emb", [2, 1])).tolist() == [[4, 5, 6, 7], [0, 1, 2, 3]]
        # the bytes on the wire are a TLS record, not the aps magic
        reader, writer = await asyncio.open_connection(srv.host, srv.port, ssl=trusted, server_hostname="localhost")
        assert writer.get_extra_info("ssl_object").version() in ("TLSv1.2", "TLSv1.3")
        writer.close()
        with pytest.raises(aps.ConnectionLost, match="certificate verify failed"):
            await aps.connect([srv.address], token=SECRET, ssl=True, timeout=10, retries=0)  # not a public CA
        with pytest.raises((aps.ConnectionLost, aps.RequestTimeout)):
            await aps.connect([srv.address], token=SECRET, timeout=3, retries=0)  # plain TCP to a TLS server
        with pytest.raises(ConfigError, match="ssl must be"):
            aps.connect([srv.address], ssl="yes")
    finally:
        await srv.aclose()


async def test_busy_poll_is_off_over_tls(certificate: tuple[str, str]) -> None:
    """Spinning on the raw socket would read TLS records: a TLS link never spins, and works."""
    cert, key = certificate
    srv = await aps.serve(port=0, tls_cert=cert, tls_key=key)
    try:
        trusted = ssl.create_default_context(cafile=cert)
        async with aps.connect([srv.address], ssl=trusted, timeout=10, busy_poll=0.001) as ps:
            await ps.create_table(EMB)
            assert all(link is not None and link._spin_sock is None for link in ps._links)
            assert (await ps.pull_sparse("emb", [1])).shape == (1, 4)
    finally:
        await srv.aclose()


@pytest.mark.slow
def test_tls_trainer_and_server_processes(processes: Processes, tmp_path: Path, certificate: tuple[str, str]) -> None:
    """Real processes, every option of this file together: aps-server with --token-file,
    --tls-cert/--tls-key and its cwd as checkpoint root; aps-trainer with --token-file and
    --tls-ca trains, saves ``model/epoch_0`` (relative, so under the pserver's root), says it is
    done, and the pserver exits by itself."""
    cert, key = certificate
    path = token_file(tmp_path)
    make_data(tmp_path / "data", files=1, lines_per_file=200)
    port_file = tmp_path / "ps.port"
    env = {"PYTHONPATH": str(ROOT)}
    proc = processes.start("aps-server", "--port", "0", "--trainers", "1", "--token-file", str(path), "--tls-cert", cert,
                           "--tls-key", key, "--port-file", str(port_file), log_name="pserver.log", cwd=tmp_path, env=env)
    address = f"127.0.0.1:{wait_port_file(port_file, proc)}"
    trainer = processes.start(
        "aps-trainer", "--pservers", address, "--token-file", str(path), "--tls-ca", cert, "--model",
        "examples.linreg.model:LinReg", "--data", str(tmp_path / "data"), "--workers", "1", "--epochs", "1",
        "--save-dir", "model", "--print-period", "60", log_name="trainer.log", cwd=tmp_path, env=env,
    )
    assert trainer.wait(timeout=80) == 0, (tmp_path / "trainer.log").read_text()[-3000:]
    assert proc.wait(timeout=20) == 0, (tmp_path / "pserver.log").read_text()[-3000:]
    assert (tmp_path / "model" / "epoch_0" / "shard-00000-of-00001" / "manifest.json").is_file()
    text = (tmp_path / "pserver.log").read_text()
    assert "tls=True" in text and "all trainers sent worker_done" in text and "authentication failed" not in text
    record = [json.loads(x) for x in (tmp_path / "log" / "trainer.0.metrics.jsonl").read_text().splitlines()][-1]
    assert record["event"] == "epoch" and record["saved"] == "model/epoch_0"


@pytest.mark.slow
def test_tls_options_misused_are_one_line_and_exit_2(tmp_path: Path, certificate: tuple[str, str]) -> None:
    cert, _ = certificate
    run = subprocess.run([sys.executable, str(BIN / "aps-server"), "--port", "0", "--tls-cert", cert],
                         capture_output=True, text=True, timeout=60)
    assert one_error_line(run, "aps-server") == "aps-server: error: --tls-cert and --tls-key go together"
    run = subprocess.run([sys.executable, str(BIN / "aps-server"), "--port", "0", "--tls-cert", cert, "--tls-key", cert],
                         capture_output=True, text=True, timeout=60)
    assert "aps-server: error: TLS: cannot load certificate" in one_error_line(run, "aps-server")
