"""The bounded key -> row cache of a hash table in geo mode (aps/trainer/local_cache.py).

Keys map to rows that stay put while held; a full cache evicts the unpinned rows least recently
admitted, handing back the pending delta of those a worker wrote, so no trained step is lost;
the exchange's two sides (take the written rows' deltas, apply the pservers' changes) work on
the rows of the keys held.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import aps
from aps.cli.trainer import _strategy, build_parser, make_trainer
from aps.cluster import ClusterSpec
from aps.errors import ApsError, ConfigError
from aps.trainer import Strategy, Trainer
from aps.trainer.local_cache import DEFAULT_ROWS, CacheCounts, LocalCache, cache_rows, min_rows
from aps.trainer.monitor import Monitor
from aps.trainer.shared import STAT_FIELDS
from aps.trainer.stepwise import StepTrainer
from tests.trainer.hash_models import HashLinReg


def make_cache(capacity: int, dim: int = 2) -> LocalCache:
    return LocalCache("t", np.zeros((capacity, dim), np.float32), np.zeros(capacity, np.uint8), np.zeros((capacity, 2), np.float32))


def admit_filled(cache: LocalCache, keys: list[int], scale: float = 1.0):
    """Admit keys as a batch does and fill the new ones with rows [key, -key]."""
    k = np.array(keys, np.int64)
    rows, missing, evicted = cache.admit(k, scale)
    cache.fill(rows[missing], np.stack([k[missing], -k[missing]], axis=1).astype(np.float32))
    return rows, missing, evicted


def test_keys_map_to_stable_rows_and_new_ones_are_reported() -> None:
    cache = make_cache(8)
    big = [2**62 + 5, -(2**63), 7]  # any int64 is a key
    rows, missing, evicted = admit_filled(cache, big)
    assert missing.tolist() == [0, 1, 2] and len(set(rows.tolist())) == 3 and len(evicted.keys) == 0
    np.testing.assert_array_equal(cache.local[rows], cache.old[rows])
    assert cache.local[rows[2]].tolist() == [7.0, -7.0]
    again, missing2, _ = cache.admit(np.array([7, 11, 2**62 + 5], np.int64), 1.0)
    assert missing2.tolist() == [1]  # only 11 is new
    assert again[[0, 2]].tolist() == [rows[2], rows[0]]
    assert cache.lookup(np.array([7, 12], np.int64)).tolist() == [rows[2], -1]
    assert cache.pins[rows].tolist() == [2, 1, 2] and len(cache) == 4  # pinned by both batches but -2**63


def test_a_full_cache_evicts_the_least_recently_used_unpinned_rows_with_their_pending_delta() -> None:
    cache = make_cache(4)
    r1, _, _ = admit_filled(cache, [10, 11])
    r2, _, _ = admit_filled(cache, [12, 13])
    cache.release(r1)
    cache.release(r2)
    # a worker trained 11 and 13 (Hogwild writes, its shows and clicks, then the flag), and 12
    # was only read
    cache.local[r1[1]] += [0.5, 1.0]
    cache.counts[r1[1]] = [3, 1]
    cache.dirty[r1[1]] = 1
    cache.local[r2[1]] += [2.0, 2.0]
    cache.counts[r2[1]] = [1, 0]
    cache.dirty[r2[1]] = 1
    admit_filled(cache, [12])  # 12 is used again: the most recent
    cache.release(cache.lookup(np.array([12], np.int64)))
    rows, missing, evicted = admit_filled(cache, [20, 21, 22], scale=0.5)
    # three rows were needed: 10, 11 (oldest) and 13 go, 12 (used last) stays
    assert missing.tolist() == [0, 1, 2]
    assert sorted(cache.lookup(np.array([10, 11, 12, 13], np.int64)) >= 0) == [False, False, False, True]
    assert cache.lookup(np.array([12], np.int64))[0] >= 0
    # the pending deltas of the written rows (11 and 13), scaled; 10 had none
    order = np.argsort(evicted.keys)
    assert evicted.keys[order].tolist() == [11, 13]
    np.testing.assert_allclose(evicted.deltas[order], [[0.25, 0.5], [1.0, 1.0]])
    assert evicted.counts[order].tolist() == [[3, 1], [1, 0]]  # shows and clicks go with them
    assert cache.evictions == 3 and cache.evicted_deltas == 2
    assert cache.report() == CacheCounts(evictions=3, evicted_deltas=2, held=4, capacity=4)
    assert cache.dirty[rows].tolist() == [0, 0, 0]  # the rows reused start clean
    assert cache.counts[rows].tolist() == [[0, 0]] * 3
    assert cache.local[rows[0]].tolist() == [20.0, -20.0]


def test_pinned_rows_are_never_evicted_and_a_cache_all_in_use_says_so() -> None:
    cache = make_cache(4)
    pinned, _, _ = admit_filled(cache, [1, 2, 3])  # a batch in flight
    rows, _, _ = admit_filled(cache, [4])
    cache.release(rows)
    _, _, evicted = admit_filled(cache, [5])  # 4 is the only row it may take
    assert cache.lookup(np.array([1, 2, 3, 4, 5], np.int64)).tolist()[:3] == pinned.tolist()
    assert cache.lookup(np.array([4], np.int64))[0] == -1
    # the batch's own keys are pinned before anything is evicted for its new ones
    with pytest.raises(ApsError, match=r"geo cache of hash table 't': 1 more rows needed but only 0 of its 4 rows"):
        cache.admit(np.array([5, 6], np.int64), 1.0)


def test_the_exchange_sends_written_rows_and_applies_changes_of_held_keys_only() -> None:
    cache = make_cache(8)
    rows, _, _ = admit_filled(cache, [3, 4, 5])
    cache.local[rows[0]] += [1.0, 1.0]
    cache.counts[rows[0]] = [2, 1]
    cache.dirty[rows[0]] = 1
    keys, deltas, counts = cache.take_changes(0.5)
    assert keys.tolist() == [3] and counts.tolist() == [[2, 1]]
    np.testing.assert_allclose(deltas, [[0.5, 0.5]])
    np.testing.assert_allclose(cache.old[rows[0]], [3.5, -2.5])  # old += delta
    assert cache.dirty.sum() == 0 and cache.counts.sum() == 0
    assert cache.take_changes(0.5)[0].size == 0
    # another trainer moved 3 and 5 on the pservers; 9 is not held here
    applied = cache.apply_server(np.array([5, 9, 3], np.int64), np.array([[6, -6], [9, 9], [4, -2]], np.float32))
    assert applied == 2
    np.testing.assert_allclose(cache.local[rows], [[4.5, -1.5], [4, -4], [6, -6]])  # local += server - old
    np.testing.assert_allclose(cache.old[rows], [[4, -2], [4, -4], [6, -6]])


def test_the_default_size_follows_the_table_and_a_set_size_is_checked() -> None:
    bounded = aps.HashTable("h", dim=4, optimizer=aps.SGD(), max_keys=50_000)
    free = aps.HashTable("f", dim=4, optimizer=aps.SGD())
    assert min_rows(2, 100) == 400
    assert cache_rows(bounded, 2, 100, 3, None) == 150_000  # max_keys on each of 3 pservers
    assert cache_rows(free, 2, 100, 3, None) == DEFAULT_ROWS
    assert cache_rows(bounded, 2, 100_000, 1, None) == 800_000  # twice what may be in flight
    assert cache_rows(free, 2, 100, 1, 400) == 400
    with pytest.raises(ConfigError, match="geo_cache_rows 399 is too small for hash table 'f'.* use at least 400$"):
        cache_rows(free, 2, 100, 1, 399)


def test_the_size_is_set_through_the_strategy_or_its_environment_variable() -> None:
    assert Strategy.from_env({"APS_GEO_CACHE_ROWS": "5000"}).geo_cache_rows == 5000
    assert Strategy().geo_cache_rows is None
    with pytest.raises(ConfigError, match="geo_cache_rows must be >= 1, got 0"):
        Strategy(geo_cache_rows=0)


def test_the_size_has_a_flag_and_a_too_small_one_is_refused_when_the_trainer_is_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Refused where the model meets the strategy, before any process or connection: aps-trainer
    exits 2 with the ConfigError's line (cli_main). HashLinReg: 160 keys a batch at most."""
    monkeypatch.chdir(tmp_path)  # make_trainer creates log/
    argv = ["--pservers", "127.0.0.1:1", "--data", "x", "--no-save", "--model", "tests.trainer.hash_models:HashLinReg",
            "--mode", "geo", "--workers", "2"]
    args = build_parser().parse_args([*argv, "--geo-cache-rows", "640"])
    assert _strategy(args).geo_cache_rows == 640
    assert make_trainer(args).strategy.geo_cache_rows == 640
    too_small = r"^geo_cache_rows 639 is too small for hash table 'lin.w': 2 workers x 2 batches x 160 keys .* at least 640$"
    with pytest.raises(ConfigError, match=too_small):
        make_trainer(build_parser().parse_args([*argv, "--geo-cache-rows", "639"]))
    cluster = ClusterSpec(["127.0.0.1:1"], 1)
    with pytest.raises(ConfigError, match=too_small):
        Trainer(HashLinReg(), Strategy(mode="geo", workers=2, geo_cache_rows=639), cluster)
    # a step-wise trainer is one worker, whatever the CPU count: 320 rows are enough for it
    assert StepTrainer(HashLinReg(), Strategy(mode="geo", geo_cache_rows=320), cluster).strategy.geo_cache_rows == 320
    with pytest.raises(ConfigError, match="geo_cache_rows 319 is too small"):
        StepTrainer(HashLinReg(), Strategy(mode="geo", geo_cache_rows=319), cluster)
    # other modes keep no cache: the knob is not theirs to check
    assert Trainer(HashLinReg(), Strategy(mode="async", workers=2, geo_cache_rows=1), cluster).strategy.mode == "async"


def test_records_carry_the_evictions_since_the_start_or_in_the_epoch_and_the_rows_held() -> None:
    """As ``steps``: a progress record counts since the trainer started, an epoch record in
    its epoch; held and capacity are the caches' at the record's time. The monitor reads them
    from the mode's one report dict, and only those keys (not ``pushes`` or ``geo_syncs``)."""
    fields = ("geo_cache_evictions", "geo_cache_evicted_deltas", "geo_cache_held", "geo_cache_capacity")

    def report(evictions: int, evicted_deltas: int, held: int, capacity: int) -> dict[str, float]:
        return {"pushes": 0, "geo_syncs": 3, **dict(zip(fields, (evictions, evicted_deltas, held, capacity)))}

    reports = [report(5, 2, 10, 16)]  # 5 before the epoch
    monitor = Monitor(np.zeros((1, len(STAT_FIELDS))), 0.0, 0, record_period=0.0, mode_report=lambda: reports[-1])
    monitor.start_epoch()
    reports.append(report(9, 3, 16, 16))
    progress = monitor.tick(1)
    assert progress is not None and [progress[f] for f in fields] == [9, 3, 16, 16]
    reports.append(report(12, 3, 14, 16))
    epoch = monitor.end_epoch(1, {})
    assert [epoch[f] for f in fields] == [7, 1, 14, 16]
    assert not {"pushes", "geo_syncs"} & (set(progress) | set(epoch))
    # a trainer without caches (another mode, or geo on fixed tables only) has no such fields
    bare = Monitor(np.zeros((1, len(STAT_FIELDS))), 0.0, 0, record_period=0.0, mode_report=lambda: {"pushes": 4, "geo_syncs": 0})
    bare.start_epoch()
    assert not set(fields) & set(bare.end_epoch(0, {}))
