"""The CTR models on hash tables (``table=hash``) through the trainer, step for step.

A hash table's keys are any int64, so the trainer's replica holds only the rows of the batches
in flight (a slot area per worker and mailbox half) and the model indexes them by position among
the batch's unique keys. If a worker computed with rows other than the pserver's rows of its
keys, or a gradient went to another key, the tables would leave the reference: one trainer, one
worker, sync (and hybrid with fresh rows), 20 SGD steps on a real pserver equal the numpy
reference of tests/models/test_ctr_step_equality.py run over the same keys. The shows and clicks
pushed with the gradients are checked through ``shrink``, which deletes by them.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

import aps
from aps.errors import ConfigError
from aps.models.criteo import CriteoFormat, slot_key
from aps.models.ctr_dnn.model import CtrDnn
from aps.trainer.reader import Chunk
from aps.trainer.stepwise import StepTrainer
from tests.conftest import Processes
from tests.models.test_ctr_step_equality import (
    MODELS,
    STEPS,
    STRATEGIES,
    Reference,
    assert_tables_equal,
    make_lines,
    max_rel_error,
    write_meta,
)

pytestmark = pytest.mark.timeout(120)


def test_full_keys_are_the_64_bit_hash_without_modulo(tmp_path: Path) -> None:
    fmt = CriteoFormat.from_meta(write_meta(tmp_path / "meta.json"))
    data = b"1\t3\t\tab\t\tzz\n0\t\t2\tab\tq\t\n"
    chunk = Chunk("f", 1, data, 2)
    full = fmt.parse(chunk, full_keys=True).ids
    want = [[slot_key(3, "ab"), slot_key(4, ""), slot_key(5, "zz")], [slot_key(3, "ab"), slot_key(4, "q"), slot_key(5, "")]]
    assert full.tolist() == want
    assert (full < 0).any() or (full >= 2**32).any()  # really 64-bit keys
    assert fmt.parse(chunk).ids.tolist() == (np.asarray(want).astype(np.uint64) % np.uint64(60)).astype(np.int64).tolist()


async def _pull(servers: list[str], model: aps.Model, keys: np.ndarray) -> dict[str, np.ndarray]:
    async with aps.connect(servers) as ps:
        out = {t.name: await ps.pull_sparse(t.name, keys) for t in model.sparse_tables()}
        for t in model.dense_tables():
            out[t.name] = await ps.pull_dense(t.name)
        return out


async def _shrink(servers: list[str], table: str, threshold: float) -> tuple[int, int]:
    async with aps.connect(servers) as ps:
        before = (await ps.table_info(table)).keys
        return before, await ps.shrink(table, decay=1.0, threshold=threshold)


#: the modes whose steps equal the reference's with one trainer and one worker: those of the
#: fixed tables' test, and geo exchanging every step (its local steps are the reference's; it
#: trains with SGD only)
HASH_STRATEGIES = {**STRATEGIES, "geo": aps.Strategy(mode="geo", k_steps=1)}
RUNS = [(mode, opt) for mode in sorted(HASH_STRATEGIES) for opt in ("sgd", "adam") if (mode, opt) != ("geo", "adam")]


@pytest.mark.slow
@pytest.mark.parametrize("mode,optimizer", RUNS, ids=[f"{m}-{o}" for m, o in RUNS])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_hash_table_steps_equal_the_reference(name: str, mode: str, optimizer: str, tmp_path: Path, processes: Processes) -> None:
    steps_equal_the_reference(name, mode, optimizer, tmp_path, processes)


@pytest.mark.slow
@pytest.mark.parametrize("mode", sorted(HASH_STRATEGIES))
def test_disk_table_steps_equal_the_reference(mode: str, tmp_path: Path, processes: Processes) -> None:
    """The same steps on disk tables (``table_disk_ram``): each mode's pushes, pulls and GEO's
    reads of changed rows reach the disk kind's threads, sync rounds included, and give the
    reference's rows."""
    optimizer = "sgd" if mode == "geo" else "adam"
    steps_equal_the_reference("ctr_dnn", mode, optimizer, tmp_path, processes, table_disk_ram=4 << 20)


def steps_equal_the_reference(name: str, mode: str, optimizer: str, tmp_path: Path, processes: Processes, **model_args: object) -> None:
    cls, ref_grads = MODELS[name]
    model = cls(meta=write_meta(tmp_path / "meta.json"), hidden="5,4", embedding_size=3, batch_size=8,
                optimizer=optimizer, lr=0.5 if optimizer == "sgd" else 0.05, init_range=0.5, table="hash", **model_args)
    assert all(isinstance(t, aps.HashTable) for t in model.sparse_tables())
    assert all((t.disk is not None) == ("table_disk_ram" in model_args) for t in model.sparse_tables())
    disk_dir = ("--data-dir", str(tmp_path / "disk")) if "table_disk_ram" in model_args else ()
    servers = processes.start_servers(1, 1, *disk_dir)
    st = StepTrainer(model, HASH_STRATEGIES[mode], aps.ClusterSpec(servers, 1), 0).start()
    try:
        batches = list(st.batches(make_lines(1)))
        assert len(batches) == STEPS
        # every key of the run, in one index space for the reference: key k is row universe[k]
        universe = np.unique(np.concatenate([b.sparse_ids[model.slot_tables[0]] for b in batches]))
        initial = asyncio.run(_pull(servers, model, universe))  # unknown keys read their initial rows
        sparse = set(model.slot_tables)
        ref = Reference(initial, sparse, model.lr, None if optimizer == "sgd" else "row")
        shows = np.zeros(len(universe))
        clicks = np.zeros(len(universe))
        for batch in batches:
            d = batch.data
            keys = batch.sparse_ids[model.slot_tables[0]]
            rows = np.searchsorted(universe, keys)
            st.step(batch)
            p64 = {k: v.astype(np.float64) for k, v in ref.p.items()}
            _, g, _ = ref_grads(p64, rows[d.ids], d.dense.astype(np.float64), d.labels.astype(np.float64), len(model.layers))
            ref.apply(g, {t: rows for t in sparse})
            np.add.at(shows, rows[d.ids].reshape(-1), 1)
            np.add.at(clicks, rows[d.ids].reshape(-1), np.repeat(d.labels, d.ids.shape[1]))
        st.end_epoch()  # geo: the last local steps reach the pservers
        final = asyncio.run(_pull(servers, model, universe))
        assert max_rel_error(final, initial) > 1e-2  # the steps moved the tables
        assert_tables_equal(final, ref.p)
        # shows = occurrences, clicks = the labels of the examples they occur in: shrink's score
        # (geo: what the local steps saw, pushed with the deltas)
        threshold = 0.55
        score = 0.1 * (shows - clicks) + clicks
        held, deleted = asyncio.run(_shrink(servers, model.slot_tables[0], threshold))
        assert held == len(universe)
        assert 0 < deleted == int((score < threshold).sum()) < len(universe)
        st.stop()
    finally:
        if not st._stopped:
            st.close()
    assert processes.procs[0].wait(timeout=15) == 0


def test_table_argument_is_checked(tmp_path: Path) -> None:
    meta = write_meta(tmp_path / "meta.json")
    with pytest.raises(ConfigError, match="table must be one of fixed, hash"):
        CtrDnn(meta=meta, table="dict")
    with pytest.raises(ConfigError, match="admit_probability"):
        CtrDnn(meta=meta, table="hash", admit_probability=0)
    spec = CtrDnn(meta=meta, table="hash", admit_count=3, max_keys=1000).sparse_tables()[0]
    assert isinstance(spec, aps.HashTable) and (spec.admit_count, spec.max_keys) == (3, 1000)
