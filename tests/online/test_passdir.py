"""Pass folders: natural order, done-files, waiting with a timeout, the ways a run ends, the
split among trainers, and a position to continue after (no processes: the source alone)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from aps.errors import ConfigError
from aps.trainer.sources import PassDir, natural_key

from .passdata import write_pass

pytestmark = pytest.mark.timeout(30)


async def names(source: PassDir) -> list[str]:
    out = []
    while (p := await source.next_pass()) is not None:
        out.append(p.name)
    return out


def test_natural_key_orders_digit_runs_by_value() -> None:
    assert sorted(["p10", "p2", "p1", "p02"], key=natural_key) == ["p1", "p02", "p2", "p10"]


async def test_passes_come_in_natural_order_each_once_with_their_data_files_only(tmp_path: Path) -> None:
    for name in ["20261127/1", "20261126/10", "20261126/7", "20261126/9"]:
        write_pass(tmp_path, name, 0, 4)
    (tmp_path / "20261126/7/.part.tmp").write_text("x")  # hidden and _-prefixed files are not data
    (tmp_path / "20261126/7/_logs").write_text("x")
    (tmp_path / "_SUCCESS").write_text("")  # no more passes after these
    source = PassDir(str(tmp_path), wait=0)
    first = await source.next_pass()
    assert first is not None and first.seq == 0 and first.name == "20261126/7"
    assert [Path(f).name for f in first.files] == ["part-00000", "part-00001"]
    assert first.position == {"source": "passes", "pass": "20261126/7", "seq": 0}
    assert await names(source) == ["20261126/9", "20261126/10", "20261127/1"]
    assert source.stop_reason is not None and "end marker" in source.stop_reason


async def test_an_incomplete_pass_is_waited_for_even_when_a_later_one_is_complete(tmp_path: Path) -> None:
    write_pass(tmp_path, "d1/p1", 0, 4)
    write_pass(tmp_path, "d1/p2", 4, 4, done=False)
    write_pass(tmp_path, "d1/p3", 8, 4)
    source = PassDir(str(tmp_path), wait=5.0, poll=0.02)
    assert (await source.next_pass()).name == "d1/p1"  # type: ignore[union-attr]
    waiting = asyncio.ensure_future(source.next_pass())
    await asyncio.sleep(0.2)
    assert not waiting.done()  # p3 is complete, but p2 comes first
    (tmp_path / "d1/p2/_SUCCESS").write_text("")
    got = await asyncio.wait_for(waiting, 5)
    assert got is not None and got.name == "d1/p2" and got.seq == 1


async def test_the_wait_times_out_with_a_reason_naming_the_pass(tmp_path: Path) -> None:
    write_pass(tmp_path, "d1/p1", 0, 4, done=False)
    source = PassDir(str(tmp_path), wait=0.3, poll=0.02)
    t0 = time.monotonic()
    assert await source.next_pass() is None
    assert 0.3 <= time.monotonic() - t0 < 3
    assert source.stop_reason == "pass d1/p1 not complete (no _SUCCESS) within --pass-wait 0.3 s"
    empty = PassDir(str(tmp_path / "d1/p1"), wait=0.1, poll=0.02)
    assert await empty.next_pass() is None
    assert empty.stop_reason == "no new pass folder within --pass-wait 0.1 s"


async def test_a_run_ends_after_the_last_pass_and_resumes_after_a_position(tmp_path: Path) -> None:
    for k in range(1, 5):
        write_pass(tmp_path, f"d1/p{k}", 0, 2)
    source = PassDir(str(tmp_path), wait=10, last_pass="d1/p2", done_file="_SUCCESS")
    assert await names(source) == ["d1/p1", "d1/p2"]
    assert source.stop_reason == "last pass d1/p2 trained"
    resumed = PassDir(str(tmp_path), wait=0)
    await resumed.open({"source": "passes", "pass": "d1/p2", "seq": 1})
    p = await resumed.next_pass()
    assert p is not None and (p.name, p.seq) == ("d1/p3", 2)
    with pytest.raises(ConfigError, match="not a pass folder's"):
        await PassDir(str(tmp_path)).open({"source": "redis", "ids": {}})


async def test_each_trainer_gets_its_share_of_a_pass_and_the_done_file_name_is_configurable(tmp_path: Path) -> None:
    write_pass(tmp_path, "d/p", 0, 10, files=5, done=False)
    (tmp_path / "d/p/DONE").write_text("")
    shares = []
    for t in range(2):
        p = await PassDir(str(tmp_path), trainer_id=t, num_trainers=2, done_file="DONE", wait=0).next_pass()
        assert p is not None
        shares.append([Path(f).name for f in p.files])
    assert shares == [["part-00000", "part-00001", "part-00002"], ["part-00003", "part-00004"]]
    with pytest.raises(ConfigError, match="no such directory"):
        PassDir(str(tmp_path / "missing"))


@pytest.mark.parametrize("args,expected", [
    (["--epochs", "2"], "--epochs is for --data: online training trains each pass once"),
    (["--resume", "--no-save"], "--resume reads the checkpoints in --save-dir: it cannot go with --no-save"),
])
def test_aps_trainer_online_misuse_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str],
                                               expected: str) -> None:
    from aps.cli.trainer import main

    code = main(["--pservers", "127.0.0.1:1", "--model", "tests.online.models:CountingLR",
                 "--data-passes", str(tmp_path), "--metrics", str(tmp_path / "m.jsonl"), *args])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and expected in err, err
