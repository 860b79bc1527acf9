"""Online training in a fleet script's own loop (StepTrainer.passes) against a real pserver
process: every pass of a pass directory is trained once, in order, a checkpoint with the
source's position follows each, and a restart resumes after the newest one, so a pass cut off by
a crash is rolled back and trained once."""

from __future__ import annotations

import asyncio
import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest

import aps
from aps.errors import ConfigError
from aps.metrics import Auc
from aps.trainer import PassDir
from aps.trainer.stepwise import StepTrainer
from tests.conftest import BIN, ROOT, Processes
from tests.fleet.conftest import run
from tests.online.models import CountingLR
from tests.online.passdata import write_pass

pytestmark = pytest.mark.timeout(60)


def lines(files: list[str]) -> list[str]:
    return [line for f in files for line in Path(f).read_text().splitlines()]


def trainer(servers: list[str], save_dir: str | None = "online") -> StepTrainer:
    options = aps.TrainOptions(save_dir=save_dir, print_period=0, live_line=False)
    return StepTrainer(CountingLR(), aps.Strategy(mode="async"), aps.ClusterSpec(servers, 1), 0, options)


def counts(servers: list[str], n: int) -> list[float]:
    async def pull() -> np.ndarray:
        async with aps.connect(servers) as ps:
            return await ps.pull_sparse("seen", np.arange(n, dtype=np.int64))

    return asyncio.run(pull())[:, 0].tolist()


@pytest.mark.slow
def test_passes_train_once_in_order_and_resume_after_the_saved_position(tmp_path: Path, processes: Processes) -> None:
    data, root = tmp_path / "passes", tmp_path / "ckpt"
    root.mkdir()
    write_pass(data, "d1/p2", 0, 16)
    write_pass(data, "d1/p10", 16, 16)  # natural order: p2 before p10
    servers = processes.start_servers(1, 1, "--checkpoint-root", str(root))
    st = trainer(servers).start()
    seen = []
    for p in st.passes(PassDir(str(data), wait=0)):
        seen.append(p.name)
        for batch in st.batches(lines(p.files)):
            st.step(batch)
    assert seen == ["d1/p2", "d1/p10"]
    assert [(r["pass"], r["examples"], r["saved"]) for r in st.records] == [
        ("d1/p2", 16, "online/pass-000000"), ("d1/p10", 16, "online/pass-000001")]
    manifest = json.loads((root / "online/pass-000001/shard-00000-of-00001/manifest.json").read_text())
    assert manifest["extra"]["online"] == {"source": "passes", "pass": "d1/p10", "seq": 1}
    assert counts(servers, 32) == [1.0] * 32

    # a crash in the middle of the next pass: part of it trained, some of it reached the pserver,
    # and the loop left without finishing the pass (nothing saved for it)
    write_pass(data, "d2/p1", 32, 16)
    for p in st.passes(PassDir(str(data), wait=0), resume=True):
        assert p.name == "d2/p1"
        for batch in list(st.batches(lines(p.files)))[:1]:
            st.step(batch)
        break
    assert [r["pass"] for r in st.records] == ["d1/p2", "d1/p10"]
    assert not (root / "online/pass-000002").exists()
    st.close()

    async def reached() -> None:
        async with aps.connect(servers) as ps:
            await ps.push_sparse_grad("seen", np.arange(40, 48), -np.ones((8, 1), np.float32))

    asyncio.run(reached())
    write_pass(data, "d2/p2", 48, 16)
    (data / "_SUCCESS").write_text("")
    again = trainer(servers, save_dir=None).start()
    names = []
    for p in again.passes(PassDir(str(data), wait=0), save_dir="online", resume=True):  # the script's own path
        names.append((p.name, p.seq))
        for batch in again.batches(lines(p.files)):
            again.step(batch)
    assert again.resumed_from == "online/pass-000001"
    assert names == [("d2/p1", 2), ("d2/p2", 3)]
    assert counts(servers, 80) == [1.0] * 64 + [0.0] * 16  # none lost, none trained twice
    again.stop()
    assert processes.procs[0].wait(timeout=15) == 0


def test_passes_misuse_is_a_clear_error(tmp_path: Path) -> None:
    servers = ["127.0.0.1:1"]
    with pytest.raises(ConfigError, match="resume needs a save dir"):
        trainer(servers, save_dir=None).passes(PassDir(str(tmp_path)), resume=True)
    with pytest.raises(ConfigError, match="save_every and keep_passes must be >= 0"):
        trainer(servers).passes(PassDir(str(tmp_path)), save_every=-1)
    geo = StepTrainer(CountingLR(), aps.Strategy(mode="geo"), aps.ClusterSpec(servers, 1), 0,
                      aps.TrainOptions(save_dir="online"))
    with pytest.raises(ConfigError, match="geo mode"):
        geo.passes(PassDir(str(tmp_path)), resume=True)


def make_pass(root: Path, name: str, source: Path) -> None:
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "part-00000").write_bytes(source.read_bytes())
    (folder / "_SUCCESS").write_text("")


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_the_ctr_dnn_fleet_script_trains_pass_folders_and_resumes(tmp_path: Path, data: Path) -> None:
    script = ROOT / "examples" / "fleet" / "ctr_dnn_train.py"
    files = sorted(data.iterdir())
    for k in range(2):
        make_pass(tmp_path / "passes", f"d1/p{k + 1}", files[k])
    (tmp_path / "passes" / "_SUCCESS").write_text("")
    argv = [sys.executable, str(BIN / "aps-local"), "1x1", "--status-interval", "0", "--", "python", str(script),
            "--data-passes", "passes", "--save", "online/ctr", "--pass-wait", "0", "--batch-size", "50", "--lr", "0.01",
            "--hidden", "8", "--print-period", "5", "--resume"]
    done = run(argv, tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    log = (tmp_path / "log" / "trainer.0.log").read_text()
    assert re.findall(r"^pass (\S+) \(seq (\d)\): 1 files$", log, re.M) == [("d1/p1", "0"), ("d1/p2", "1")]
    assert "passes stopped: " in log and "2 trained" in log and "resumed" not in log
    online = [float(x) for x in re.findall(r"^pass d1/p\d online auc ([0-9.]+)$", log, re.M)]
    assert len(online) == 2 and online[1] > 0.55, online  # the second pass is scored by a trained model
    assert sorted(p.name for p in (tmp_path / "online" / "ctr").iterdir()) == ["pass-000000", "pass-000001"]

    make_pass(tmp_path / "passes", "d1/p3", files[2])
    again = run(argv, tmp_path)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    log = (tmp_path / "log" / "trainer.0.log").read_text()
    assert re.findall(r"^pass (\S+) \(seq (\d)\): 1 files$", log, re.M) == [("d1/p3", "2")]
    assert "1 trained, resumed from online/ctr/pass-000001" in log
    assert (tmp_path / "online" / "ctr" / "pass-000002").is_dir()


@pytest.mark.parametrize("mode", ["async", "sync"])
def test_predict_then_train_scores_each_pass_with_the_parameters_before_it(tmp_path: Path, processes: Processes,
                                                                           mode: str) -> None:
    """Online AUC in the step loop: a pass predicted before it is trained is scored by the model
    of the passes before it (feature 0 always clicked, feature 1 never): chance on the first pass,
    1 once trained; predicting updates nothing."""
    data = tmp_path / "passes"
    write_pass(data, "d1/p1", 0, 16)
    write_pass(data, "d1/p2", 16, 16)
    servers = processes.start_servers(1, 1)
    st = StepTrainer(CountingLR(), aps.Strategy(mode=mode), aps.ClusterSpec(servers, 1), 0,
                     aps.TrainOptions(save_dir=None, print_period=0, live_line=False)).start()
    online = []
    for p in st.passes(PassDir(str(data), wait=0)):
        auc = Auc()
        for batch in st.batches(lines(p.files)):
            predicted = st.predict(batch)
            assert predicted is not None
            auc.update(*predicted)
        assert counts(servers, 32) == [1.0] * (16 * len(online)) + [0.0] * (32 - 16 * len(online))
        online.append(auc.global_auc())
        for batch in st.batches(lines(p.files)):  # read again: compute may change a batch it ran on
            st.step(batch)
    assert online == [0.5, 1.0]
    assert st.steps == 4 and [r["examples"] for r in st.records] == [16, 16]
    st.stop()
