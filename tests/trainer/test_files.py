"""File distribution: split_files (across trainers), assign_to_workers, parts of files, expand_inputs."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aps.errors import ConfigError, DataError
from aps.trainer.files import FilePart, assign_to_workers, cut_parts, expand_inputs, lines_before, share_files, split_files


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


# ---------------------------------------------------------------- parts of files


def write_lines(path: Path, lines: list[bytes], trailing_newline: bool = True) -> bytes:
    raw = b"\n".join(lines) + (b"\n" if lines and trailing_newline else b"")
    path.write_bytes(raw)
    return raw


def part_bytes(part: FilePart) -> bytes:
    with open(part.path, "rb") as f:
        f.seek(part.start)
        return f.read(part.stop - part.start)


@settings(max_examples=150, deadline=None)
@given(
    files=st.lists(st.lists(st.binary(max_size=30).map(lambda b: b.replace(b"\n", b"")), max_size=25), min_size=1, max_size=3),
    trailing=st.booleans(),
    takers=st.integers(1, 7),
)
def test_parts_cover_every_byte_once_in_order_and_cut_only_after_a_line(tmp_path_factory, files, trailing, takers):
    root = tmp_path_factory.mktemp("parts")
    paths, raws = [], []
    for k, lines in enumerate(files):
        paths.append(str(root / f"f{k}"))
        raws.append(write_lines(Path(paths[-1]), lines, trailing))
    shares = cut_parts(paths, takers)
    assert len(shares) == takers
    flat = [p for share in shares for p in share]
    # the parts, taker after taker, are every file's bytes in order: nothing lost, nothing twice
    assert b"".join(part_bytes(p) for p in flat) == b"".join(raws)
    for p in flat:
        assert p.stop > p.start
        raw = Path(p.path).read_bytes()
        assert p.start == 0 or raw[p.start - 1 : p.start] == b"\n"  # a part starts on a line
        assert p.stop == len(raw) or raw[p.stop - 1 : p.stop] == b"\n"  # and ends with one
    # each span is within one line of an equal share of the bytes
    total, longest = sum(len(r) for r in raws), max((len(line) + 1 for lines in files for line in lines), default=0)
    for share in shares:
        assert sum(p.stop - p.start for p in share) <= total // takers + longest + 1


def test_one_file_is_cut_in_near_halves_after_lines(tmp_path: Path) -> None:
    path = tmp_path / "data"
    write_lines(path, [b"%05d" % k for k in range(100)])  # 6 bytes a line
    (first,), (second,) = cut_parts([str(path)], 2)
    assert (first.start, first.stop, second.start, second.stop) == (0, 300, 300, 600)
    assert lines_before(second) == 50 and lines_before(first) == 0


def test_fewer_lines_than_takers_leaves_the_rest_empty(tmp_path: Path) -> None:
    path = tmp_path / "two"
    write_lines(path, [b"a" * 10, b"b" * 10])
    shares = cut_parts([str(path)], 5)
    assert sum(1 for share in shares if share) == 2
    assert b"".join(part_bytes(p) for share in shares for p in share) == path.read_bytes()
    (tmp_path / "empty").write_bytes(b"")
    assert cut_parts([str(tmp_path / "empty")], 3) == [[], [], []]


def test_share_files_keeps_whole_files_when_there_are_enough_or_a_pipe_reads_them(tmp_path: Path) -> None:
    names = []
    for k in range(3):
        names.append(str(tmp_path / f"f{k}"))
        write_lines(Path(names[-1]), [b"x %d" % i for i in range(10)])
    assert share_files(names, 2) == [[names[0], names[2]], [names[1]]]
    assert share_files(names[:1], 2, whole=True) == [[names[0]], []]
    halves = share_files(names[:1], 2)
    assert all(len(share) == 1 and isinstance(share[0], FilePart) for share in halves)
    # parts can be cut again: a trainer's span shared among its workers
    quarters = [q for half in halves for q in share_files(half, 2)]
    assert b"".join(part_bytes(p) for share in quarters for p in share) == Path(names[0]).read_bytes()
    with pytest.raises(DataError, match="missing"):
        cut_parts([str(tmp_path / "missing")], 2)
