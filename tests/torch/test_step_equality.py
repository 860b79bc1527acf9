"""A user's torch network trained through aps equals the same network trained by plain PyTorch.

One trainer, one worker, sync mode, a real pserver process: 20 steps of aps's
:class:`~aps.torch.TorchModel` against the same module in plain PyTorch
(:func:`aps.torch.plain.plain_network`: its ``aps.torch.Embedding`` swapped for
``torch.nn.Embedding(sparse=True)`` holding the same rows), started from the values the pserver
created, fed the same batches. SGD on everything; Adam as ``torch.optim.SparseAdam`` on the
embeddings (aps's ``bias_correction="step"``) and ``torch.optim.Adam`` on the rest. Every table
(dense, and every touched row) ends equal to float32 tolerance.

Two workers: 1 trainer x 2 worker processes in sync mode, each worker reading one of two files,
cut each step's ``batch_size`` lines in halves (:meth:`~aps.torch.TorchModel.share_batch`):
every update then equals plain PyTorch's step on both halves as one batch.

Four networks: an MLP over the slots' embeddings (CTR-DNN's shape) and the zoo's DeepFM on the
Criteo layout (one label, single-valued slots), the same DeepFM on hash tables (its rows keyed by
64-bit keys, the plain table's row i being the run's i-th smallest key), and one on a wide layout
(two labels, a behaviour sequence sharing a slot's ids with attention over it, a multi-valued
column pooled by mean), the last read by :mod:`aps.models.tabular` and padded to a zero row.
"""

from __future__ import annotations

import asyncio
import functools
import json
from pathlib import Path

import numpy as np
import pytest
import torch

import aps
import aps.torch as at
from aps.torch.plain import plain_features, plain_network, plain_optimizers
from aps.torch.zoo.deepfm import DeepFM
from aps.trainer import Strategy, Trainer, TrainOptions
from aps.trainer.model import Batch, WorkerContext
from aps.trainer.reader import Chunk
from aps.trainer.runtime import create_tables
from aps.trainer.stepwise import StepTrainer
from tests.conftest import Processes
from tests.models.test_ctr_step_equality import BATCH, BUCKETS, STEPS, finish, make_lines, pull_all, write_meta

pytestmark = pytest.mark.timeout(120)

HIST, TAGS = 4, 3


class SmallDnn(torch.nn.Module):
    """CTR-DNN's shape: embeddings of every slot and the dense columns into an MLP."""

    def __init__(self, meta: at.Meta) -> None:
        super().__init__()
        self.emb = at.Embedding("emb", dim=3, kind="fixed", init=aps.Uniform(-0.5, 0.5))
        self.mlp = torch.nn.Sequential(torch.nn.Linear(meta.slots * 3 + meta.dense, 5), torch.nn.ReLU(),
                                       torch.nn.Linear(5, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))

    def forward(self, f: at.Features) -> torch.Tensor:
        return self.mlp(torch.cat([self.emb(f.slots).flatten(1), f.dense], 1)).squeeze(1)


class TwoTasks(torch.nn.Module):
    """Attention of slot 1's embedding over the ``hist`` sequence (its ids), the mean of ``tags``,
    the slots and the dense columns into two heads."""

    def __init__(self, meta: at.Meta) -> None:
        super().__init__()
        self.emb = at.Embedding("emb", dim=3, kind="fixed", init=aps.Uniform(-0.5, 0.5))
        width = meta.slots * 3 + 3 + 3 + meta.dense
        self.mlp = torch.nn.Sequential(torch.nn.Linear(width, 5), torch.nn.ReLU(), torch.nn.Linear(5, meta.labels))

    def forward(self, f: at.Features) -> torch.Tensor:
        slots = self.emb(f.slots)                                     # [B, S, 3]
        hist = f.lists["hist"]
        keys = self.emb(hist.ids)                                     # [B, HIST, 3]
        scores = (keys * slots[:, 1:2]).sum(2).masked_fill(~hist.mask, -1e9)
        attended = (torch.softmax(scores, 1).unsqueeze(2) * keys).sum(1) * (hist.lengths > 0).unsqueeze(1)
        tags = self.emb.pool(f.lists["tags"], "mean")
        return self.mlp(torch.cat([slots.flatten(1), attended, tags, f.dense], 1))


def wide_meta(path: Path) -> str:
    meta = json.loads(Path(write_meta(path)).read_text())
    meta.update(labels=2, lists=[{"name": "hist", "max_len": HIST, "shares": 1},
                                 {"name": "tags", "max_len": TAGS, "separator": "|"}])
    path.write_text(json.dumps(meta))
    return str(path)


def wide_lines(seed: int) -> list[str]:
    """make_lines' Criteo lines widened: a second label, a history of slot-1-like values (0 to 4 of
    them) and 0 to 3 tags."""
    rng = np.random.default_rng(seed)
    out = []
    for line in make_lines(seed):
        label, *rest = line.split("\t")
        hist = ",".join(f"{int(rng.integers(0, 4)):x}" for _ in range(int(rng.integers(0, HIST + 1))))
        tags = "|".join(f"t{int(rng.integers(0, 6))}" for _ in range(int(rng.integers(0, TAGS + 1))))
        out.append("\t".join([label, str(int(rng.random() < 0.5)), *rest, hist, tags]))
    return out


class HashKeys:
    """The keys of a run on hash tables, in one sorted array: the plain network's embedding row
    ``i`` is key ``keys[i]``'s row (every keyed table of these networks sees the same keys)."""

    def __init__(self, batches: list[Batch]) -> None:
        self.keys = np.unique(np.concatenate([k for b in batches for k in b.sparse_ids.values()]))

    def features(self, model: at.TorchModel, batch: Batch) -> at.Features:
        """The batch for plain PyTorch: each slot's key (:func:`plain_features`) as its row in
        the plain table."""
        f = plain_features(model, batch)
        return at.Features(torch.from_numpy(np.searchsorted(self.keys, f.slots.numpy())), f.dense, f.labels)


def aps_optimizer(optimizer: str) -> tuple[float, aps.Optimizer]:
    """The learning rate and aps's optimizer of each test: SGD, or Adam as SparseAdam corrects it."""
    lr = 0.05 if optimizer == "adam" else 0.5
    return lr, aps.Adam(lr, bias_correction="step") if optimizer == "adam" else aps.SGD(lr)


def plain_twin(model: at.TorchModel, rows: int, initial: dict[str, np.ndarray], optimizer: str, lr: float):
    """Plain PyTorch's copy of ``model``'s network, started from the tables the pserver created,
    and its optimizers."""
    ref = plain_network(model.network, rows, initial, padding=bool(model.meta.lists))
    with torch.no_grad():
        for name, param in ref.named_parameters():
            if name in initial:  # the dense tables (the embeddings' weights are named by module path)
                param.copy_(torch.from_numpy(initial[name]).view(param.shape))
    opts = plain_optimizers(ref, lr) if optimizer == "adam" else [torch.optim.SGD(ref.parameters(), lr=lr)]
    return ref, opts


def plain_step(ref: torch.nn.Module, opts: list[torch.optim.Optimizer], f: at.Features) -> float:
    """One step of plain PyTorch on ``f``: aps's loss (summed, over the batch's examples)."""
    loss = torch.nn.functional.binary_cross_entropy_with_logits(ref(f), f.labels, reduction="sum") / BATCH
    for o in opts:
        o.zero_grad()
    loss.backward()
    for o in opts:
        o.step()
    return float(loss.detach())


def plain_tables(model: at.TorchModel, ref: torch.nn.Module, rows: int) -> dict[str, np.ndarray]:
    """The plain network's parameters under aps's table names."""
    want = {name: p.detach().numpy()[:rows] for name, p in ref.named_parameters()}
    for path in _embedding_paths(model.network):
        want[model.network.get_submodule(path).table_name] = want.pop(f"{path}.weight")
    return want


def assert_same_tables(initial: dict[str, np.ndarray], final: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    """Every table moved, and ended where plain PyTorch's ended, to float32 tolerance."""
    moved = max(float(np.abs(final[k] - initial[k]).max()) for k in final)
    assert moved > 1e-2
    assert set(final) == set(want)
    for name in final:
        np.testing.assert_allclose(final[name], want[name].reshape(final[name].shape), rtol=2e-5, atol=2e-6, err_msg=name)


def train_both(network_cls, optimizer: str, meta: str, lines: list[str], hash_tables: bool, processes: Processes):
    """Plain PyTorch is fed each batch by :func:`~aps.torch.plain.plain_features` (fixed tables:
    keys are rows) or :class:`HashKeys`."""
    lr, opt = aps_optimizer(optimizer)
    model = at.TorchModel(network_cls, meta=meta, optimizer=opt, batch_size=BATCH)
    servers = processes.start_servers(1, trainers=1)
    st = StepTrainer(model, aps.Strategy(mode="sync"), aps.ClusterSpec(servers, 1), 0).start()
    try:
        batches = list(st.batches(lines))
        hashed = HashKeys(batches) if hash_tables else None
        features = functools.partial(plain_features if hashed is None else hashed.features, model)
        keys = None if hashed is None else hashed.keys
        initial = asyncio.run(pull_all(servers, model, keys))
        rows = BUCKETS if keys is None else len(keys)
        ref, opts = plain_twin(model, rows, initial, optimizer, lr)
        assert [b.examples for b in batches] == [BATCH] * STEPS
        aps_losses, ref_losses = [], []
        for batch in batches:
            aps_losses.append(st.step(batch))
            ref_losses.append(plain_step(ref, opts, features(batch)))
        final = finish(st, servers, model, keys)
    finally:
        if not st._stopped:
            st.close()
    assert processes.procs[0].wait(timeout=15) == 0
    return initial, final, plain_tables(model, ref, rows), aps_losses, ref_losses


def _embedding_paths(network: torch.nn.Module) -> set[str]:
    return {path for path, m in network.named_modules() if isinstance(m, at.Embedding)}


def small_deepfm(meta: at.Meta) -> torch.nn.Module:
    """The zoo's DeepFM (its FM term, first-order weights and MLP), small, on fixed tables."""
    return DeepFM(meta.slots, meta.dense, dim=3, hidden=(5, 4), kind="fixed")


def small_deepfm_on_hash_tables(meta: at.Meta) -> torch.nn.Module:
    """The same DeepFM with its rows in hash tables: keys, not positions in a fixed array."""
    return DeepFM(meta.slots, meta.dense, dim=3, hidden=(5, 4), kind="hash")


LAYOUTS = {
    "criteo": (SmallDnn, write_meta, lambda: make_lines(3), False),
    "deepfm": (small_deepfm, write_meta, lambda: make_lines(3), False),
    "deepfm on hash tables": (small_deepfm_on_hash_tables, write_meta, lambda: make_lines(3), True),
    "two labels and lists": (TwoTasks, wide_meta, lambda: wide_lines(3), False),
}


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_a_torch_network_through_aps_equals_plain_pytorch_step_for_step(layout: str, optimizer: str, tmp_path: Path,
                                                                       processes: Processes) -> None:
    network, meta, lines, hash_tables = LAYOUTS[layout]
    initial, final, want, aps_losses, ref_losses = train_both(
        network, optimizer, meta(tmp_path / "meta.json"), lines(), hash_tables, processes)
    np.testing.assert_allclose(aps_losses, ref_losses, rtol=1e-4)
    assert_same_tables(initial, final, want)


async def train_on_a_pserver(model: at.TorchModel, files: list[Path], strategy: Strategy, pipe_command: str | None = None):
    """One epoch of one trainer of worker processes on a pserver in this loop: the tables as
    created, as trained, and the run's result."""
    server = await aps.serve(port=0, num_trainers=1, exit_when_done=False)
    try:
        async with aps.connect([server.address]) as ps:
            await create_tables(ps, model)
        initial = await pull_all([server.address], model)
        options = TrainOptions(save_dir=None, print_period=60, live_line=False, pipe_command=pipe_command)
        result = await Trainer(model, strategy, aps.ClusterSpec([server.address], 1), 0, options).atrain(
            [str(f) for f in files])
        return initial, await pull_all([server.address], model), result
    finally:
        await server.aclose()


async def test_one_file_is_shared_by_both_workers_in_half_batches(tmp_path: Path) -> None:
    """hybrid (the default), 2 workers, one file: each worker trains about half of its lines, in
    batches of batch_size / 2 lines, so each update still averages batch_size lines."""
    model = at.TorchModel(SmallDnn, meta=write_meta(tmp_path / "meta.json"), batch_size=BATCH)
    (tmp_path / "part-0").write_text("\n".join(make_lines(3)) + "\n")
    _, _, result = await train_on_a_pserver(model, [tmp_path / "part-0"], Strategy(workers=2))
    assert result.epochs[0]["examples"] == STEPS * BATCH  # every line once
    assert 2 * STEPS <= result.epochs[0]["steps"] <= 2 * STEPS + 2  # half batches: a short one each at most


async def test_a_pipe_command_gives_one_file_to_one_worker_in_whole_batches(tmp_path: Path) -> None:
    """A pipe command reads whole files: with one file, one worker has data, and it alone makes
    each update, of batch_size lines."""
    model = at.TorchModel(SmallDnn, meta=write_meta(tmp_path / "meta.json"), batch_size=BATCH)
    (tmp_path / "part-0").write_text("\n".join(make_lines(3)) + "\n")
    _, _, result = await train_on_a_pserver(model, [tmp_path / "part-0"], Strategy(workers=2), pipe_command="cat")
    assert result.epochs[0]["steps"] == STEPS
    assert result.epochs[0]["examples"] == STEPS * BATCH


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
async def test_two_workers_share_each_step_and_equal_plain_pytorch_on_the_whole_batch(optimizer: str,
                                                                                  tmp_path: Path) -> None:
    """sync, 1 trainer x 2 workers, batch_size BATCH: worker k trains file k in batches of
    BATCH / 2 lines, and update s (their mean) equals plain PyTorch's step on the s-th half of
    both files as one batch of BATCH lines."""
    lr, opt = aps_optimizer(optimizer)
    meta = write_meta(tmp_path / "meta.json")
    model = at.TorchModel(SmallDnn, meta=meta, optimizer=opt, batch_size=BATCH)
    lines = make_lines(3)
    halves = [lines[: len(lines) // 2], lines[len(lines) // 2 :]]
    files = [tmp_path / f"part-{k}" for k in range(2)]
    for path, part in zip(files, halves):
        path.write_text("\n".join(part) + "\n")
    initial, final, result = await train_on_a_pserver(model, files, Strategy(mode="sync", workers=2))
    assert result.epochs[0]["steps"] == 2 * STEPS  # every worker's half batches

    whole = at.TorchModel(SmallDnn, meta=meta, optimizer=opt, batch_size=BATCH)  # never shared: whole batches
    ref, opts = plain_twin(whole, BUCKETS, initial, optimizer, lr)
    ctx = WorkerContext(0, 0, 1, 1, np.random.default_rng(0))
    half = BATCH // 2
    for s in range(STEPS):
        step = halves[0][s * half : (s + 1) * half] + halves[1][s * half : (s + 1) * half]
        (batch,) = whole.batches(Chunk("step", 1, ("\n".join(step) + "\n").encode(), BATCH), ctx)
        plain_step(ref, opts, plain_features(whole, batch))
    assert_same_tables(initial, final, plain_tables(whole, ref, BUCKETS))


@pytest.mark.parametrize("queue", [None, 1])
async def test_hybrid_pushes_each_updates_sparse_gradients_once_after_its_round(queue: int | None, tmp_path: Path) -> None:
    """hybrid (the default), 1 trainer x 2 workers sharing each update's batch: the two shares'
    sparse gradients reach the pserver merged, in one push per update (not one per worker's
    share), and the embeddings train. A send queue of one batch cannot hold both shares: the
    second worker's merge then lets the first share go, rather than wait for a round that waits
    for it."""
    model = at.TorchModel(SmallDnn, meta=write_meta(tmp_path / "meta.json"), batch_size=BATCH)
    lines = make_lines(3)
    files = [tmp_path / f"part-{k}" for k in range(2)]
    for k, path in enumerate(files):
        path.write_text("\n".join(lines[k * len(lines) // 2 : (k + 1) * len(lines) // 2]) + "\n")
    server = await aps.serve(port=0, num_trainers=1, exit_when_done=False)
    try:
        async with aps.connect([server.address]) as ps:
            await create_tables(ps, model)
            initial = await ps.pull_sparse("emb", np.arange(BUCKETS, dtype=np.int64))
            options = TrainOptions(save_dir=None, print_period=60, live_line=False)
            strategy = Strategy(workers=2, send_queue_size=queue)
            result = await Trainer(model, strategy, aps.ClusterSpec([server.address], 1), 0, options).atrain(
                [str(f) for f in files])
            ops = (await ps.stats())[server.address]["ops"]
            trained = await ps.pull_sparse("emb", np.arange(BUCKETS, dtype=np.int64))
    finally:
        await server.aclose()
    assert result.epochs[0]["steps"] == 2 * STEPS  # each worker's half batches
    if queue is None:
        assert ops["PushSparseGrad"]["count"] == STEPS  # one push per update
    else:
        assert STEPS < ops["PushSparseGrad"]["count"] <= 2 * STEPS
    assert ops["PushDenseGrad"]["count"] == STEPS * len(model.dense_tables())
    assert np.abs(trained - initial).max() > 1e-3
