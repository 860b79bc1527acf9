"""Which leftovers of killed saves are removed: this shard's temporaries and moved-aside copies,
never another shard's, never the only complete copy (killed between the two renames)."""

from __future__ import annotations

from pathlib import Path

from aps.checkpoints.stale import remove_stale_saves

NAME = "shard-00001-of-00002"


def make(path: Path, manifest: bool = False) -> Path:
    path.mkdir(parents=True)
    (path / "t0000-emb.values.npy").write_bytes(b"x" * 100)
    if manifest:
        (path / "manifest.json").write_text("{}")
    return path


def test_stale_temporaries_of_this_shard_go_and_nothing_else(tmp_path: Path) -> None:
    done = tmp_path / "model" / "epoch_0"
    make(done / NAME, manifest=True)
    half = make(done / f".{NAME}.tmp-aaaa")  # killed while writing
    aside = make(done / f".{NAME}.old-bbbb", manifest=True)  # killed after the new copy was in place
    other_shard = make(done / ".shard-00000-of-00002.tmp-cccc")
    # killed between moving the old copy aside and renaming the new one: the new one is whole
    torn = tmp_path / "model" / "epoch_1"
    whole = make(torn / f".{NAME}.tmp-dddd", manifest=True)
    old = make(torn / f".{NAME}.old-eeee", manifest=True)
    too_deep = make(tmp_path / "a" / "b" / "c" / f".{NAME}.tmp-ffff")
    removed = remove_stale_saves([tmp_path], NAME, depth=2)
    assert sorted(removed) == sorted([half, aside])
    assert all(p.exists() for p in (other_shard, whole, old, too_deep, done / NAME))
    assert remove_stale_saves([tmp_path / "a" / "b"], NAME, depth=1) == [too_deep]
    assert remove_stale_saves([tmp_path / "missing"], NAME, depth=2) == []
