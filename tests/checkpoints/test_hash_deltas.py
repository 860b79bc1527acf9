"""A base save and its delta saves loaded together (``ps.load(base, deltas=[...])``): 2 pservers
save, 3 load, and every key a save wrote has the row the savers held at the last delta."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import aps
from aps.errors import ServerError
from tests.checkpoints.test_hash_checkpoint import DIM, cluster, held, pending, random_keys, spec

pytestmark = pytest.mark.timeout(60)


async def push(ps: aps.PSClient, keys: np.ndarray, seed: int) -> None:
    """One push: every occurrence counts one show (delta score 0.1 >= the threshold below)."""
    grads = np.random.default_rng(seed).standard_normal((len(keys), DIM)).astype(np.float32)
    await ps.push_sparse_grad("emb", keys, grads)


@pytest.mark.slow
async def test_a_base_and_its_deltas_load_onto_another_cluster_with_the_rows_of_the_last_delta(tmp_path: Path) -> None:
    keys = random_keys(1500, seed=21)
    async with cluster(2, tmp_path) as (servers, ps):
        await ps.create_table(spec(delta_threshold=0.05))
        await ps.create_table(aps.DenseTable("w", shape=(3, 4)))
        for _ in range(2):  # admit_count=2: twice to be admitted
            await push(ps, keys[:1000], seed=1)
        await ps.save("base", mode="base")
        await push(ps, keys[500:1250], seed=2)  # changes some base keys, and counts new ones
        await push(ps, keys[1000:1250], seed=3)  # ... which are admitted now
        await ps.push_dense_grad("w", np.ones((3, 4), np.float32))
        await ps.save("d1", mode="delta")
        await push(ps, keys[250:400], seed=4)
        await push(ps, keys[1450:], seed=5)  # counted, not admitted
        await ps.save("d2", mode="delta")
        before, counters = held(servers), pending(servers)
        info = await ps.table_info("emb")
        rows, dense = await ps.pull_sparse("emb", keys), await ps.pull_dense("w")

    async with cluster(3, tmp_path) as (servers, ps):
        await ps.load("base", deltas=["d1", "d2"])
        after = held(servers)
        # the pservers reset a saved key's delta score once its save was in place; the files
        # hold it as it was when written
        for name in sorted(set(before) - {"delta_score"}):
            assert after[name].tobytes() == before[name].tobytes(), name
        assert pending(servers) == counters
        assert (await ps.pull_sparse("emb", keys)).tobytes() == rows.tobytes()
        assert (await ps.pull_dense("w")).tobytes() == dense.tobytes()
        loaded = await ps.table_info("emb")
        assert (loaded.keys, loaded.admitted, loaded.rejected, loaded.evicted) == (info.keys, info.admitted, info.rejected, info.evicted)

        # the chain is checked (from the manifests, before any table file is read): a delta
        # left out, deltas out of order, deltas onto another delta, a base as a delta
        for deltas in (["d2"], ["d2", "d1"]):
            with pytest.raises(ServerError, match="missing from the list or they are out of order"):
                await ps.load("base", deltas=deltas)
        with pytest.raises(ServerError, match="is a delta save: deltas apply onto a base save"):
            await ps.load("d1", deltas=["d2"])
        with pytest.raises(ServerError, match="is a base save, not a delta"):
            await ps.load("base", deltas=["base"])
