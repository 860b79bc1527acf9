"""The CTR models' settings in online passes (docs/concepts.md, "The CTR models' optimizers,
measured on real data"): 32 lines a step unless ``batch_size`` is given (a pass of a few thousand
lines at the offline 1000 is a handful of steps), Adagrad at 0.011 on every table unless an
optimizer or rate is given (new ids must learn within the passes that bring them), the
embeddings then starting within 0.02 unless an init is given (a pass is scored on its new ids
before it trains on them), and one
compute worker unless a count is given (a pass's lines trained in order)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import aps
from aps.cluster import ClusterSpec
from aps.models.ctr_dnn.model import EMBEDDING, CtrDnn
from aps.models.wide_deep.model import DEEP_EMB, WIDE_BIAS, WIDE_SLOT, WideDeep
from aps.trainer import OnlineOptions, PassDir, Strategy, Trainer, TrainOptions
from tests.models.test_ctr_step_equality import make_lines, write_meta

pytestmark = pytest.mark.timeout(90)


@pytest.mark.parametrize("cls", [WideDeep, CtrDnn])
def test_the_default_batch_is_1000_offline_and_32_online_and_a_given_one_holds_in_both(cls, tmp_path: Path) -> None:
    meta = write_meta(tmp_path / "meta.json")
    default, given = cls(meta=meta), cls(meta=meta, batch_size=256)
    assert (default.batch_size, given.batch_size) == (1000, 256)
    default.begin_online()
    given.begin_online()
    assert (default.batch_size, given.batch_size) == (32, 256)
    assert default.describe()["batch_size"] == 32


ADAM, ADAGRAD = aps.Adam(lr=0.001), aps.Adagrad(lr=0.011)


def optimizers(model: WideDeep | CtrDnn, online: bool) -> dict[str, object]:
    if online:
        model.begin_online()
    return {t.name: t.optimizer for t in model.tables()}


@pytest.mark.parametrize("cls", [WideDeep, CtrDnn])
def test_every_table_takes_adam_offline_and_adagrad_online(cls, tmp_path: Path) -> None:
    meta = write_meta(tmp_path / "meta.json")
    assert set(optimizers(cls(meta=meta), online=False).values()) == {ADAM}
    assert set(optimizers(cls(meta=meta), online=True).values()) == {ADAGRAD}
    # "none" as text (--model-arg optimizer=none) leaves a setting unset too
    assert set(optimizers(cls(meta=meta, optimizer="none", lr="None"), online=True).values()) == {ADAGRAD}
    model = cls(meta=meta)
    model.begin_online()
    assert model.describe() | {"optimizer": "adagrad", "lr": 0.011, "batch_size": 32} == model.describe()


def test_what_the_user_gives_holds_online() -> None:
    # a given optimizer: every table's, online too (geo mode needs SGD on every table), at lr or 0.001
    assert set(optimizers(WideDeep(optimizer="sgd", lr=0.1), online=True).values()) == {aps.SGD(lr=0.1)}
    assert set(optimizers(CtrDnn(optimizer="adam"), online=True).values()) == {ADAM}
    # a given rate alone was chosen for Adam (the example's lr=0.003): Adam at it online too
    assert set(optimizers(CtrDnn(lr=0.003), online=True).values()) == {aps.Adam(lr=0.003)}
    # the sparse tables' own optimizer holds; its rate follows the online lr unless given
    sparse = optimizers(CtrDnn(sparse_optimizer="adam"), online=True)
    assert (sparse[EMBEDDING], sparse["fc1.w"]) == (aps.Adam(lr=0.011), ADAGRAD)
    assert optimizers(CtrDnn(sparse_optimizer="adam", sparse_lr=0.001), online=True)[EMBEDDING] == ADAM
    wide = optimizers(WideDeep(wide_optimizer="adagrad", wide_lr=0.2), online=True)
    assert (wide[DEEP_EMB], wide[WIDE_SLOT], wide[WIDE_BIAS]) == (ADAGRAD, aps.Adagrad(lr=0.2), aps.Adagrad(lr=0.2))
    ftrl = optimizers(WideDeep(wide_optimizer="ftrl"), online=True)
    assert ftrl[WIDE_SLOT] == aps.Ftrl(alpha=1.0, beta=1.0) and ftrl[DEEP_EMB] == ADAGRAD


def inits(model: WideDeep | CtrDnn, online: bool) -> dict[str, object]:
    if online:
        model.begin_online()
    return {name: t.init for t in model.tables() if (name := t.name) in model.slot_tables and name != WIDE_SLOT}


@pytest.mark.parametrize("cls, offline", [(WideDeep, 0.1), (CtrDnn, 0.05)])
def test_the_embeddings_start_narrower_online_unless_an_init_or_an_optimizer_is_given(cls, offline: float,
                                                                                    tmp_path: Path) -> None:
    meta = write_meta(tmp_path / "meta.json")
    assert set(inits(cls(meta=meta), online=False).values()) == {aps.Uniform(-offline, offline)}
    assert set(inits(cls(meta=meta), online=True).values()) == {aps.Uniform(-0.02, 0.02)}
    # a given init holds in both; so does the offline one where the user keeps an offline
    # checkpoint's optimizer (its tables' specs, init included, must match to load)
    assert set(inits(cls(meta=meta, init_range=0.3), online=True).values()) == {aps.Uniform(-0.3, 0.3)}
    assert set(inits(cls(meta=meta, optimizer="adam"), online=True).values()) == {aps.Uniform(-offline, offline)}
    assert set(inits(cls(meta=meta, init_range="none"), online=True).values()) == {aps.Uniform(-0.02, 0.02)}


@pytest.mark.parametrize("batch_size, steps", [(None, 5), (40, 4)])
async def test_an_online_pass_of_160_lines_takes_the_steps_of_its_batch(batch_size: int | None, steps: int,
                                                                        tmp_path: Path) -> None:
    data = tmp_path / "passes"
    (data / "20261127" / "0001").mkdir(parents=True)
    (data / "20261127" / "0001" / "part-00000").write_text("\n".join(make_lines(4)) + "\n")
    (data / "20261127" / "0001" / "_SUCCESS").write_text("")
    (data / "_SUCCESS").write_text("")
    metrics = tmp_path / "metrics.jsonl"
    args = {} if batch_size is None else {"batch_size": batch_size}
    model = WideDeep(meta=write_meta(tmp_path / "meta.json"), table="hash", **args)
    server = await aps.serve(port=0, checkpoint_root=str(tmp_path))
    try:
        options = TrainOptions(save_dir=None, print_period=0, live_line=False, metrics_path=str(metrics))
        # no worker count given: an online trainer runs one (ONLINE_WORKERS), whatever the CPU count
        trainer = Trainer(model, Strategy(mode="async"), ClusterSpec([server.address], 1), 0, options)
        result = await trainer.atrain_passes(PassDir(str(data), wait=0), OnlineOptions())
    finally:
        await server.aclose()
    assert [p["examples"] for p in result.passes] == [160]
    assert (trainer.strategy.workers, trainer.probe.workers) == (1, 1)
    epochs = [json.loads(line) for line in metrics.read_text().splitlines() if json.loads(line)["event"] == "epoch"]
    assert [e["steps"] for e in epochs] == [steps]


@pytest.mark.parametrize("mode", ["hybrid", "geo"])
def test_an_online_trainer_runs_one_worker_unless_a_count_is_given(mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("os.cpu_count", lambda: 8)
    cluster = ClusterSpec(["127.0.0.1:1"], 1)
    trainer = Trainer(WideDeep(optimizer="sgd"), Strategy(mode=mode), cluster)
    assert trainer.strategy.workers == 8  # offline: the CPU count
    trainer.use_online_defaults()
    # the knobs that default to the worker count follow the online count
    assert (trainer.strategy.workers, trainer.strategy.max_merge_var_num, trainer.probe.workers) == (1, 1, 1)
    trainer.use_online_defaults()
    assert trainer.strategy.workers == 1
    given = Trainer(WideDeep(optimizer="sgd"), Strategy(mode=mode, workers=3), cluster)
    given.use_online_defaults()
    assert given.strategy.workers == 3
    env = Trainer(WideDeep(optimizer="sgd"), Strategy.from_env({"CPU_NUM": "4"}, mode=mode), cluster)
    env.use_online_defaults()
    assert env.strategy.workers == 4


def test_aps_trainer_online_runs_one_worker_and_spools_one_file_a_pass_unless_told(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from aps.cli.trainer import build_parser, make_source, make_trainer

    monkeypatch.setattr("os.cpu_count", lambda: 8)
    monkeypatch.delenv("CPU_NUM", raising=False)
    monkeypatch.delenv("APS_WORKERS", raising=False)
    base = ["--pservers", "127.0.0.1:1", "--model", "wide_deep", "--metrics", str(tmp_path / "m.jsonl")]
    stream = ["--data-stream", "redis://127.0.0.1:1/clicks"]
    cases = [(base + ["--data", str(tmp_path)], 8), (base + stream, 1), (base + stream + ["--workers", "2"], 2)]
    for argv, workers in cases:
        args = build_parser().parse_args(argv)
        trainer = make_trainer(args)
        assert trainer.strategy.workers == workers, argv
        if args.data_stream:
            assert make_source(args, trainer).parts == workers  # type: ignore[attr-defined]
