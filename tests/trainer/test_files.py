"""File distribution: split_files (across trainers), assign_to_workers, expand_inputs."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aps.errors import ConfigError
from aps.trainer.files import assign_to_workers, expand_inputs, split_files


def test_split_files_matches_paddle_blocks():
    files = [f"part-{k}" for k in range(10)]
    shares = [split_files(files, t, 3) for t in range(3)]
    assert shares == [files[0:4], files[4:7], files[7:10]]


def test_split_files_sorts_so_every_trainer_agrees():
    files = ["c", "a", "d", "b", "e"]
    assert split_files(files, 0, 2) == ["a", "b", "c"]
    assert split_files(files, 1, 2) == ["d", "e"]


def test_split_files_fewer_files_than_trainers_gives_empty_shares():
    assert [split_files(["x", "y"], t, 4) for t in range(4)] == [["x"], ["y"], [], []]
    assert split_files([], 0, 1) == []


@settings(max_examples=200, deadline=None)
@given(
    names=st.lists(st.text("abcxyz0123-_.", min_size=1, max_size=6), unique=True, max_size=40),
    num_trainers=st.integers(1, 9),
    seed=st.integers(0, 2**32 - 1),
)
def test_split_files_disjoint_complete_balanced_stable(names, num_trainers, seed):
    shares = [split_files(names, t, num_trainers) for t in range(num_trainers)]
    flat = [f for share in shares for f in share]
    assert sorted(flat) == sorted(names)  # complete
    assert len(set(flat)) == len(flat)  # disjoint
    sizes = [len(s) for s in shares]
    assert max(sizes) - min(sizes) <= 1  # balanced
    assert sizes == sorted(sizes, reverse=True)  # remainder on the first trainers
    assert flat == sorted(names)  # contiguous blocks of the sorted list
    shuffled = list(names)
    random.Random(seed).shuffle(shuffled)
    assert [split_files(shuffled, t, num_trainers) for t in range(num_trainers)] == shares  # stable


@pytest.mark.parametrize("trainer_id,num", [(-1, 2), (2, 2), (0, 0), (5, 3)])
def test_split_files_rejects_bad_ids(trainer_id, num):
    with pytest.raises(ConfigError):
        split_files(["a", "b"], trainer_id, num)


def test_split_files_rejects_duplicates_and_bare_string():
    with pytest.raises(ConfigError, match="more than once"):
        split_files(["a", "b", "a"], 0, 2)
    with pytest.raises(ConfigError):
        split_files("abc", 0, 1)


def test_assign_to_workers_round_robin():
    assert assign_to_workers(["f0", "f1", "f2", "f3", "f4"], 3) == [["f0", "f3"], ["f1", "f4"], ["f2"]]
    assert assign_to_workers(["a", "b"], 4) == [["a"], ["b"], [], []]
    assert assign_to_workers([], 2) == [[], []]
    with pytest.raises(ConfigError):
        assign_to_workers(["a"], 0)


def test_expand_inputs_dirs_globs_files(tmp_path):
    d = tmp_path / "train"
    d.mkdir()
    for name in ["part-2", "part-0", "part-1", ".hidden", "notes.txt"]:
        (d / name).write_text("x\n")
    (d / "sub").mkdir()
    (d / "sub" / "inner").write_text("x\n")
    single = tmp_path / "single.txt"
    single.write_text("y\n")

    got = expand_inputs([str(d)])
    assert got == [str(d / n) for n in ["notes.txt", "part-0", "part-1", "part-2"]]

    got = expand_inputs([str(d / "part-*"), single])
    assert got == [str(d / "part-0"), str(d / "part-1"), str(d / "part-2"), str(single)]

    # duplicates dropped, first occurrence kept
    got = expand_inputs([str(d / "part-1"), str(d / "part-?")])
    assert got == [str(d / "part-1"), str(d / "part-0"), str(d / "part-2")]


def test_expand_inputs_errors_name_the_path(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(ConfigError, match="nope"):
        expand_inputs([str(missing)])
    with pytest.raises(ConfigError, match=r"zzz\*"):
        expand_inputs([str(tmp_path / "zzz*")])
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / ".only_hidden").write_text("x")
    with pytest.raises(ConfigError, match="no files"):
        expand_inputs([str(empty)])
    with pytest.raises(ConfigError):
        expand_inputs(str(tmp_path))
