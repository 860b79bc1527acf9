"""aps.torch's zoo (deepfm, dcn_v2, torch_ctr_dnn, torch_wide_deep) trained by name through real
processes, and what a user sees when the input is wrong.

Data: ``make_data.py --scale small``, 16,000 training lines in two files (one a trainer at 2x2:
8,000 lines, 40 steps of 200 an epoch) and 4,000 test lines, seed 5 (Bayes-optimal test AUC
0.82); the fixed tables have 100,003 rows (the meta's buckets, cut from 1,000,001 to keep the
pservers small). Small networks (``hidden=16,16 embedding_size=4``) and Adam at lr 0.005 (0.001,
the default, barely moves them in so few steps; at 0.01 deepfm's loss, whose FM term is
quadratic in the embeddings, went from 0.35 at 1x1 to 0.41-0.52 at 2x2, and at 0.02 it
diverged). Two epochs.

What is asserted about learning, on every trainer: the second epoch's mean loss is at least
``MIN_LOSS_DROP`` below the first's (measured over two runs of the file: 0.078 to 0.132), and its
``batch_auc`` (the last 20 batches, each scored before it was trained on in this pass) is at
least ``MIN_AUC`` (measured: 0.76 to 0.83; 0.5 is chance). Where the checkpoint is scored too,
``infer.py --model NAME`` on the test lines, which no trainer saw, gives at least
``MIN_TEST_AUC``.

Cluster starts are what cost (each trainer process and its workers' fork server import torch),
so the models x kinds x modes are spread out rather than multiplied: every model in hybrid (its
default mode, 2x2) on one kind, the kinds alternating; sync, async and half_async once each, on
the other kind of deepfm, dcn_v2 and torch_wide_deep (torch_ctr_dnn, the plainest network, runs
on hash tables only).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from aps.errors import ConfigError
from aps.models import build_model
from aps.trainer.modes import mode_class
from tests.conftest import BIN, ROOT, Processes
from tests.models.test_ctr_step_equality import write_meta

pytestmark = pytest.mark.timeout(240)

TRAIN_LINES = 16_000
TEST_LINES = 4_000
BUCKETS = 100_003
SMALL = ["hidden=16,16", "embedding_size=4", "lr=0.005", "batch_size=200"]
EPOCHS = 2
#: the second epoch's batch AUC (the trainer's last 20 batches, each scored before it was trained on)
MIN_AUC = 0.65
#: the second epoch's mean loss below the first's
MIN_LOSS_DROP = 0.04
#: infer.py's AUC on the 4,000 test lines (Bayes 0.82; torch_ctr_dnn measured 0.767)
MIN_TEST_AUC = 0.70

#: (model, table kind, score the checkpoint with infer.py): each model in hybrid, kinds alternating
HYBRID = [("deepfm", "hash", False), ("dcn_v2", "fixed", False), ("torch_ctr_dnn", "hash", True),
          ("torch_wide_deep", "fixed", False)]
#: (mode, model, kind, NxM, trainer options): a model and kind hybrid did not run, each mode's own shape
OTHER_MODES = [
    ("sync", "deepfm", "fixed", "1x2", ["--workers", "1"]),
    ("async", "dcn_v2", "hash", "1x1", ["--workers", "2"]),
    ("half_async", "torch_wide_deep", "hash", "1x1", ["--workers", "2"]),
]


def _env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")


def _model_args(model_args: list[str]) -> list[str]:
    return [a for kv in model_args for a in ("--model-arg", kv)]


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("zoo") / "data"
    subprocess.run(
        [sys.executable, str(ROOT / "examples/ctr_dnn/make_data.py"), "--out", str(out), "--scale", "small",
         "--train-lines", str(TRAIN_LINES), "--test-lines", str(TEST_LINES), "--train-files", "2", "--seed", "5"],
        check=True, capture_output=True, env=_env(), timeout=60,
    )
    meta = json.loads((out / "meta.json").read_text())
    (out / "meta.json").write_text(json.dumps({**meta, "buckets": BUCKETS}))
    return out


def aps_local(tmp: Path, shape: str, mode: str | None, args: list[str],
              timeout: float = 120) -> subprocess.CompletedProcess:
    """``bin/aps-local SHAPE [--mode MODE] -- ARGS`` in ``tmp``, its output captured."""
    cmd = [sys.executable, str(BIN / "aps-local"), shape, *(["--mode", mode] if mode else []),
           "--timeout", str(int(timeout)), "--", *args]
    return subprocess.run(cmd, cwd=tmp, env=_env(), capture_output=True, text=True, timeout=timeout + 30)


def train(tmp: Path, data: Path, model: str, kind: str, shape: str, mode: str | None,
          trainer_args: list[str] | None = None) -> list[list[dict]]:
    """Train ``model`` EPOCHS epochs (one worker a trainer unless ``trainer_args`` say); every
    trainer's metrics records."""
    run = aps_local(tmp, shape, mode, [
        "--model", model, *_model_args([f"meta={data / 'meta.json'}", f"table={kind}", *SMALL]),
        "--data", str(data / "train_data"), "--epochs", str(EPOCHS), "--save-dir", str(tmp / "model"),
        *(trainer_args or ["--workers", "1"]),
    ])
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    trainers = int(shape.split("x")[1])
    return [[json.loads(line) for line in (tmp / "log" / f"trainer.{k}.metrics.jsonl").read_text().splitlines()]
            for k in range(trainers)]


def assert_learned(records: list[dict], lines: int) -> tuple[float, float, float]:
    """One trainer's epochs: all its lines in each, the loss's drop and the batch AUC as the
    module says. Returns (first epoch's loss, second's, second's batch AUC)."""
    epochs = [r for r in records if r["event"] == "epoch"]
    assert [(r["epoch"], r["examples"]) for r in epochs] == [(e, lines) for e in range(EPOCHS)], epochs
    first, last = epochs[0], epochs[-1]
    assert last["loss"] <= first["loss"] - MIN_LOSS_DROP, (first, last)
    assert last["batch_auc"] >= MIN_AUC, last
    return first["loss"], last["loss"], last["batch_auc"]


@pytest.mark.slow
@pytest.mark.parametrize("model,kind,score", HYBRID, ids=[f"{m}-{k}" for m, k, _ in HYBRID])
def test_zoo_model_learns_in_hybrid_on_two_pservers_and_two_trainers(
        tmp_path: Path, data: Path, model: str, kind: str, score: bool) -> None:
    """``aps-local 2x2`` with no ``--mode``: the model's own, hybrid; both trainers learn, and
    where ``score`` the last checkpoint scores the test lines through ``infer.py --model NAME``."""
    trainers = train(tmp_path, data, model, kind, "2x2", None)  # no --mode: the model's preferred, hybrid
    for records in trainers:
        assert {r.get("mode") for r in records if r["event"] == "epoch"} == {"hybrid"}
        print(model, kind, "loss %.3f -> %.3f, batch AUC %.3f" % assert_learned(records, TRAIN_LINES // 2))
    if score:
        out = tmp_path / "infer.json"
        run = subprocess.run(
            [sys.executable, str(ROOT / "examples/wide_deep/infer.py"), "--model", model,
             "--checkpoint", str(tmp_path / "model" / f"epoch_{EPOCHS - 1}"), "--data", str(data / "test_data"),
             *_model_args([f"meta={data / 'meta.json'}", f"table={kind}", *SMALL]), "--json", str(out)],
            cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=120,
        )
        assert run.returncode == 0, run.stdout + run.stderr
        result = json.loads(out.read_text())
        print(model, kind, f"test AUC {result['auc']:.4f}")
        assert result["examples"] == TEST_LINES and result["auc"] >= MIN_TEST_AUC, result


@pytest.mark.slow
@pytest.mark.parametrize("mode,model,kind,shape,trainer_args", OTHER_MODES, ids=[m[0] for m in OTHER_MODES])
def test_zoo_model_trains_in_the_other_modes(tmp_path: Path, data: Path, mode: str, model: str, kind: str,
                                             shape: str, trainer_args: list[str]) -> None:
    """sync, async and half_async each run to the end, and learn as much as hybrid."""
    trainers = train(tmp_path, data, model, kind, shape, mode, trainer_args)
    per_trainer = TRAIN_LINES // len(trainers)
    for records in trainers:
        assert {r.get("mode") for r in records if r["event"] == "epoch"} == {mode}
        print(mode, model, kind, "loss %.3f -> %.3f, batch AUC %.3f" % assert_learned(records, per_trainer))


# ------------------------------------------------------------------ geo: refused before any work


@pytest.mark.slow
def test_geo_is_refused_before_any_work(tmp_path: Path, data: Path) -> None:
    """Geo trains locally with SGD and the zoo's tables have Adam: the trainer exits 2 with one
    line naming the mode, a table and its optimizer, before any table exists on the pserver."""
    run = aps_local(tmp_path, "1x1", "geo", [
        "--model", "deepfm", *_model_args([f"meta={data / 'meta.json'}", *SMALL]),
        "--data", str(data / "train_data"), "--epochs", "1", "--workers", "1",
    ], timeout=60)
    assert run.returncode == 1 and re.search(r"^trainer\.0\s+\d+\s+exit 2\s", run.stdout, re.M), run.stdout
    log = (tmp_path / "log" / "trainer.0.log").read_text().strip().splitlines()
    assert len(log) == 1, log
    assert re.fullmatch(r"aps-trainer: error: .*geo mode .*table 'fm\.first' declares Adam.*", log[0]), log
    assert "table created" not in (tmp_path / "log" / "pserver.0.log").read_text()
    metrics = tmp_path / "log" / "trainer.0.metrics.jsonl"
    assert not metrics.exists() or '"epoch"' not in metrics.read_text()


@pytest.mark.parametrize("model", ["deepfm", "dcn_v2", "torch_ctr_dnn", "torch_wide_deep"])
def test_geo_refusal_names_the_modes_that_work(tmp_path: Path, model: str) -> None:
    """The refusal also says which modes train the zoo's Adam tables, and how to get SGD."""
    net = build_model(model, [f"meta={write_meta(tmp_path / 'meta.json')}", *SMALL])
    with pytest.raises(ConfigError) as refused:
        net.check_mode(mode_class("geo"))
    line = str(refused.value)
    assert "\n" not in line and all(m in line for m in ("sync", "async", "half_async", "hybrid")), line


@pytest.mark.parametrize("model", ["deepfm", "dcn_v2", "din", "mmoe", "torch_ctr_dnn", "torch_wide_deep"])
def test_every_zoo_model_trains_in_geo_with_optimizer_sgd(tmp_path: Path, model: str) -> None:
    meta = json.loads(Path(write_meta(tmp_path / "meta.json")).read_text())
    meta.update(labels=2, lists=[{"name": "history", "max_len": 4, "shares": 1}])  # what din and mmoe need
    (tmp_path / "meta.json").write_text(json.dumps(meta))
    net = build_model(model, [f"meta={tmp_path / 'meta.json'}", "optimizer=sgd", "lr=0.1"])
    net.check_mode(mode_class("geo"))  # no refusal
    assert {type(t.optimizer).__name__ for t in net.tables()} == {"SGD"}


def test_a_zoo_model_on_data_without_dense_columns_has_no_empty_table(tmp_path: Path) -> None:
    (tmp_path / "meta.json").write_text(json.dumps({"dense": 0, "slots": 3, "cont_min": [], "cont_diff": [], "buckets": 60}))
    net = build_model("deepfm", [f"meta={tmp_path / 'meta.json'}", *SMALL])
    names = [t.name for t in net.tables()]
    assert "dense_first.weight" not in names and "dense_first.bias" in names


# ------------------------------------------------------------------ bad input


@pytest.mark.slow
def test_trainers_whose_networks_differ_in_a_shape_the_second_fails_naming_the_table(
        tmp_path: Path, data: Path, processes: Processes) -> None:
    """Trainer 0 builds deepfm with hidden=16,16 and creates its tables; trainer 1, hidden=16,8,
    is refused by the pserver at the first table whose shape differs and exits 1 at once, with
    the table's name. (Trainer 0 then waits at hybrid's step barrier for a peer that will not come,
    until its rpc timeout: aps-local would stop it; here the fixture kills it.)"""
    servers = processes.start_servers(1, trainers=2)
    common = ["--pservers", ",".join(servers), "--trainers", "2", "--model", "deepfm",
              *_model_args([f"meta={data / 'meta.json'}", "embedding_size=4"]),
              "--data", str(data / "train_data"), "--epochs", "1", "--workers", "1"]
    tables = len(build_model("deepfm", [f"meta={data / 'meta.json'}", "embedding_size=4", "hidden=16,16"]).tables())
    processes.start("aps-trainer", *common, "--trainer-id", "0", "--model-arg", "hidden=16,16",
                    log_name="trainer.0.log")
    pserver_log = tmp_path / "pserver.0.0.log"
    deadline = time.monotonic() + 60
    while pserver_log.read_text().count("table created") < tables:
        assert time.monotonic() < deadline and processes.procs[1].poll() is None, pserver_log.read_text()
        time.sleep(0.1)
    second = processes.start("aps-trainer", *common, "--trainer-id", "1", "--model-arg", "hidden=16,8",
                             log_name="trainer.1.log")
    assert second.wait(timeout=60) == 1
    failure = (tmp_path / "trainer.1.log").read_text().strip().splitlines()[-1]
    # mlp.0 is 121 -> 16 in both; mlp.2 (16 -> 16 or 8) and mlp.4 (16 or 8 -> 1) differ
    assert re.match(r"aps-trainer: failed: \[127\.0\.0\.1:\d+\] TABLE_EXISTS: table "
                    r"'(mlp\.2\.weight|mlp\.2\.bias|mlp\.4\.weight)' exists with a different spec", failure), failure
    assert processes.procs[0].poll() is None  # the pserver serves on


BAD_SLOT = '''
import torch
import aps.torch as at


class BadSlot(torch.nn.Module):
    def __init__(self, meta: at.Meta) -> None:
        super().__init__()
        self.emb = at.Embedding("emb", dim=2)
        self.out = torch.nn.Linear(2, 1)

    def forward(self, f: at.Features) -> torch.Tensor:
        return self.out(self.emb(f.slots[:, 99])).squeeze(1)  # the data has 26 slots


def build(meta: str) -> at.TorchModel:
    return at.TorchModel(BadSlot, meta=meta)
'''


@pytest.fixture(scope="module")
def bad_slot_run(tmp_path_factory: pytest.TempPathFactory,
                 data: Path) -> tuple[subprocess.CompletedProcess, Path, float]:
    """aps-local 1x1 with a network that indexes slot 99 of data with 26: its result, its
    folder and its wall time (run once for the tests below)."""
    tmp = tmp_path_factory.mktemp("bad_slot")
    (tmp / "bad_slot.py").write_text(BAD_SLOT)
    started = time.monotonic()
    run = aps_local(tmp, "1x1", None, [
        "--model", f"{tmp / 'bad_slot.py'}:build", "--model-arg", f"meta={data / 'meta.json'}",
        "--data", str(data / "train_data"), "--epochs", "1", "--workers", "1",
    ], timeout=60)
    return run, tmp, time.monotonic() - started


@pytest.mark.slow
def test_a_network_indexing_a_slot_the_data_lacks_fails_at_once(
        bad_slot_run: tuple[subprocess.CompletedProcess, Path, float]) -> None:
    """What a user sees today: the trainer exits 1 on the first batch, aps-local stops the
    pserver and shows torch's IndexError as the last line of the trainer's log. Nothing hangs."""
    run, tmp, seconds = bad_slot_run
    assert run.returncode == 1 and re.search(r"^trainer\.0\s+\d+\s+exit 1\s", run.stdout, re.M), run.stdout
    # aps-local prints the failed role's last log lines on stderr
    assert "IndexError: index 99 is out of bounds for dimension 1 with size 26" in run.stderr, run.stderr
    assert "pserver.0 exited" in run.stdout and seconds < 60
    metrics = tmp / "log" / "trainer.0.metrics.jsonl"
    assert not metrics.exists() or '"epoch"' not in metrics.read_text()


@pytest.mark.slow
def test_a_network_indexing_a_slot_the_data_lacks_is_told_in_one_line(
        bad_slot_run: tuple[subprocess.CompletedProcess, Path, float]) -> None:
    """One line that says the network's forward failed, where (the user's file and line), the
    error, and the data's shape (26 slots), with no traceback of aps."""
    run, tmp, _ = bad_slot_run
    log = (tmp / "log" / "trainer.0.log").read_text()
    assert "Traceback" not in log, log[-3000:]
    failure = log.strip().splitlines()[-1]
    assert failure.startswith("aps-trainer: ") and "IndexError" in failure, failure
    assert "bad_slot.py" in failure and re.search(r"\b26 slots\b", failure), failure
