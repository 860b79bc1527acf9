"""Checkpoint save/load: atomic per shard, re-sharding N -> M preserves rows, state and training."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from aps.checkpoints import kinds as checkpoint_kinds
from aps.checkpoints import shards as checkpoint
from aps.checkpoints.shards import load_shards, save_shard, shard_dir_name
from aps.errors import ApsError, ConfigError
from aps.sharding import ModuloSharding
from aps.specs import SGD, Adagrad, Adam, DenseTable, ExponentialDecay, Normal, SparseTable, Uniform
from aps.storage.tables import DenseShard, SparseShard, make_shard

DECAY = ExponentialDecay(decay_steps=2, decay_rate=0.8)
SPECS = [
    SparseTable("emb/user:v1", rows=53, dim=4, init=Uniform(-0.1, 0.1), optimizer=Adam(lr=0.01, decay=DECAY), seed=5),
    SparseTable("emb_item", rows=7, dim=3, optimizer=Adagrad(lr=0.1, initial_accumulator=0.1)),
    SparseTable("emb_step", rows=11, dim=2, optimizer=Adam(lr=0.01, bias_correction="step")),  # no per-row t
    DenseTable("fc/w", shape=(4, 5000), init=Normal(0.0, 0.1), optimizer=Adam(lr=0.01, decay=DECAY)),
    DenseTable("fc/b", shape=(10,), optimizer=SGD(lr=0.1)),
]

Cluster = list  # list (one entry per server) of {table name: shard}


def make_cluster(n: int) -> Cluster:
    return [{spec.name: make_shard(spec, k, n) for spec in SPECS} for k in range(n)]


def train(cluster: Cluster, steps: int, seed: int) -> None:
    """Push the same random grads a trainer would, split the way a client splits them."""
    rng = np.random.default_rng(seed)
    n = len(cluster)
    for _ in range(steps):
        for spec in SPECS:
            if isinstance(spec, SparseTable):
                ids = rng.integers(0, spec.rows, size=30).astype(np.int64)
                grads = rng.normal(size=(30, spec.dim)).astype(np.float32)
                sharding = ModuloSharding(n)
                order, bounds = sharding.group(ids)
                for k, tables in enumerate(cluster):
                    mine = order[bounds[k] : bounds[k + 1]]
                    tables[spec.name].push_grad(sharding.local_rows(ids[mine]), grads[mine], scale=0.5)
            else:
                grads = rng.normal(size=spec.size).astype(np.float32)
                for tables in cluster:
                    shard = tables[spec.name]
                    for i, block in shard.blocks.items():
                        g = grads[block.start : block.stop]
                        cut = block.size // 3
                        shard.push_grad(i, 0, g[:cut], advance_step=False)
                        shard.push_grad(i, cut, g[cut:])


def gather(cluster: Cluster) -> dict[str, np.ndarray]:
    """Every table's values and optimizer state laid out globally (by global id / flat index)."""
    out: dict[str, np.ndarray] = {}
    for spec in SPECS:
        for tables in cluster:
            shard = tables[spec.name]
            if isinstance(shard, SparseShard):
                for name, arr in shard.state_arrays().items():
                    full = out.setdefault(f"{spec.name}.{name}", np.zeros((spec.rows,) + arr.shape[1:], arr.dtype))
                    full[shard.global_ids()] = arr
            else:
                for i, block in shard.blocks.items():
                    arrays = {"values": shard.values[i], **shard.state[i]}
                    for name, arr in arrays.items():
                        full = out.setdefault(f"{spec.name}.{name}", np.zeros(spec.size, arr.dtype))
                        full[block.start : block.stop] = arr
                    steps = out.setdefault(f"{spec.name}.steps", np.zeros(spec.size, np.int64))
                    steps[block.start : block.stop] = shard.steps[i]
    return out


def save_cluster(path: Path, cluster: Cluster, extra: dict | None = None) -> None:
    for k, tables in enumerate(cluster):
        save_shard(path, tables, k, len(cluster), extra if extra is not None else {"global_step": 3})


def load_cluster(path: Path, m: int) -> Cluster:
    cluster = []
    for k in range(m):
        tables, extra = load_shards(path, k, m)
        assert extra == {"global_step": 3}
        cluster.append(tables)
    return cluster


def assert_same(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    assert sorted(a) == sorted(b)
    for name in a:
        assert a[name].tobytes() == b[name].tobytes(), name


@pytest.mark.parametrize("n, m", [(2, 3), (3, 1), (2, 2)])
def test_reshard_round_trip_and_continued_training(tmp_path: Path, n: int, m: int) -> None:
    original = make_cluster(n)
    train(original, steps=3, seed=1)
    save_cluster(tmp_path, original)
    loaded = load_cluster(tmp_path, m)
    assert_same(gather(loaded), gather(original))
    for spec in SPECS:
        if isinstance(spec, SparseTable):
            assert {t[spec.name].step for t in loaded} == {3}
    train(original, steps=4, seed=2)
    train(loaded, steps=4, seed=2)
    assert_same(gather(loaded), gather(original))  # bit-identical to the un-resharded run


def test_loaded_shards_match_a_fresh_layout(tmp_path: Path) -> None:
    save_cluster(tmp_path, make_cluster(2))
    fresh = make_cluster(3)
    for k in range(3):
        tables, _ = load_shards(tmp_path, k, 3)
        for name, shard in tables.items():
            assert type(shard) is type(fresh[k][name]) and shard.spec == fresh[k][name].spec
            if isinstance(shard, DenseShard):
                assert shard.blocks == fresh[k][name].blocks
            else:
                assert shard.values.tobytes() == fresh[k][name].values.tobytes()


def test_manifest_and_files(tmp_path: Path) -> None:
    cluster = make_cluster(2)
    final = save_shard(tmp_path, cluster[1], 1, 2, {"global_step": 3, "note": "x"})
    assert final == tmp_path / "shard-00001-of-00002"
    manifest = json.loads((final / "manifest.json").read_text())
    assert manifest["shard"] == 1 and manifest["num_shards"] == 2
    assert manifest["extra"] == {"global_step": 3, "note": "x"}
    assert manifest["version"] == checkpoint.FORMAT_VERSION and manifest["written_at"] > 0
    entry = manifest["tables"]["emb/user:v1"]
    assert entry["kind"] == "sparse" and entry["step"] == 0 and set(entry["files"]) == {"values", "m", "v", "t"}
    dense = manifest["tables"]["fc/w"]["blocks"]
    assert all({"start", "stop", "step", "files"} <= set(b) for b in dense)
    names = sorted(p.name for p in final.iterdir())
    assert all("/" not in n and ":" not in n for n in names)
    for name in names:
        if name.endswith(".npy"):
            np.load(final / name, allow_pickle=False)  # plain arrays, no pickle needed
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shard-00001-of-00002"]  # no temp left


def test_missing_shard_is_named(tmp_path: Path) -> None:
    save_cluster(tmp_path, make_cluster(3))
    os.rename(tmp_path / "shard-00001-of-00003", tmp_path / "elsewhere")
    with pytest.raises(ConfigError, match="shard-00001-of-00003"):
        load_shards(tmp_path, 0, 2)


def test_empty_or_absent_checkpoint(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no shard"):
        load_shards(tmp_path, 0, 1)
    with pytest.raises(ConfigError, match="does not exist"):
        load_shards(tmp_path / "nope", 0, 1)


def test_mixed_cluster_sizes_rejected(tmp_path: Path) -> None:
    save_cluster(tmp_path, make_cluster(1))
    save_cluster(tmp_path, make_cluster(2))
    with pytest.raises(ConfigError, match="different cluster sizes"):
        load_shards(tmp_path, 0, 1)


def test_shards_from_different_saves_rejected(tmp_path: Path) -> None:
    cluster = make_cluster(2)
    save_shard(tmp_path, cluster[0], 0, 2, {"global_step": 3})
    save_shard(tmp_path, cluster[1], 1, 2, {"global_step": 4})
    with pytest.raises(ApsError, match="different save"):
        load_shards(tmp_path, 0, 1)


def test_corrupt_array_shape_rejected(tmp_path: Path) -> None:
    save_cluster(tmp_path, make_cluster(2))
    d = tmp_path / shard_dir_name(0, 2)
    file = json.loads((d / "manifest.json").read_text())["tables"]["emb_item"]["files"]["values"]
    np.save(d / file, np.zeros((1, 3), np.float32))
    with pytest.raises(ConfigError, match="emb_item"):
        load_shards(tmp_path, 0, 1)


def test_failed_save_leaves_no_partial_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cluster = make_cluster(1)
    train(cluster, steps=3, seed=1)
    save_cluster(tmp_path, cluster)
    good = gather(load_cluster(tmp_path, 1))
    train(cluster, steps=1, seed=5)

    real = checkpoint_kinds.write_array
    calls = {"n": 0}

    def failing(path: Path, array: np.ndarray) -> None:
        calls["n"] += 1
        if calls["n"] == 3:
            raise OSError(28, "No space left on device")
        real(path, array)

    monkeypatch.setattr(checkpoint_kinds, "write_array", failing)
    with pytest.raises(OSError, match="No space"):
        save_shard(tmp_path, cluster[0], 0, 1, {"global_step": 3})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shard-00000-of-00001"]
    assert_same(gather(load_cluster(tmp_path, 1)), good)  # previous checkpoint intact

    monkeypatch.setattr(checkpoint_kinds, "write_array", real)
    save_shard(tmp_path, cluster[0], 0, 1, {"global_step": 3})  # a later save replaces it
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shard-00000-of-00001"]
    assert_same(gather(load_cluster(tmp_path, 1)), gather(cluster))


def test_failed_first_save_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(path: Path, array: np.ndarray) -> None:
        raise OSError(5, "I/O error")

    monkeypatch.setattr(checkpoint_kinds, "write_array", boom)
    with pytest.raises(OSError):
        save_shard(tmp_path, make_cluster(1)[0], 0, 1, {})
    assert list(tmp_path.iterdir()) == []


def test_more_servers_than_rows(tmp_path: Path) -> None:
    """Shards with zero rows save and load (rows=7 over 9 servers, back to 2)."""
    spec = SparseTable("tiny", rows=7, dim=2, optimizer=Adam())
    cluster = [{"tiny": make_shard(spec, k, 9)} for k in range(9)]
    for k in range(9):
        save_shard(tmp_path, cluster[k], k, 9, {})
    rows = np.zeros((7, 2), np.float32)
    for k in range(2):
        tables, extra = load_shards(tmp_path, k, 2)
        assert extra == {}
        rows[tables["tiny"].global_ids()] = tables["tiny"].values
    expected = np.zeros((7, 2), np.float32)
    for tables in cluster:
        expected[tables["tiny"].global_ids()] = tables["tiny"].values
    assert rows.tobytes() == expected.tobytes()


def test_interrupted_swap_is_explained(tmp_path: Path) -> None:
    save_cluster(tmp_path, make_cluster(2))
    name = shard_dir_name(1, 2)
    os.rename(tmp_path / name, tmp_path / f".{name}.old-deadbeef")  # crash between the two renames
    with pytest.raises(ConfigError, match=r"shard-00001-of-00002 \(previous copies set aside"):
        load_shards(tmp_path, 0, 1)


def test_extra_must_be_json(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="JSON"):
        save_shard(tmp_path, make_cluster(1)[0], 0, 1, {"bad": object()})
    assert list(tmp_path.iterdir()) == []
