"""Data problems reach the user with file and line; DataGenerator scripts feed training."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

import aps
from aps.cluster import ClusterSpec
from aps.trainer import Strategy, Trainer, TrainOptions
from aps.trainer.pool import WorkerFailed
from examples.linreg.model import LinReg


async def train(tmp_path: Path, files: list[str], workers: int = 1, **options) -> list[dict]:
    server = await aps.serve(port=0, num_trainers=1)
    try:
        opts = TrainOptions(save_dir=None, print_period=60, live_line=False, **options)
        trainer = Trainer(LinReg(lr=0.2), Strategy(mode="async", workers=workers), ClusterSpec([server.address], 1), 0, opts)
        return (await trainer.atrain(files, epochs=2)).epochs
    finally:
        await server.aclose()


def write_bad_file(tmp_path: Path) -> Path:
    lines = [f"1 {0.5 + (i % 3) * 0.1} 2 {i % 50} {(i + 7) % 50}" for i in range(100)]
    lines[41] = "1 0.5 3 4 5"  # slot f says 3 values, has 2 -> line 42
    path = tmp_path / "data.txt"
    path.write_text("\n".join(lines) + "\n")
    return path


async def test_bad_line_fails_training_naming_file_and_line(tmp_path: Path) -> None:
    path = write_bad_file(tmp_path)
    with pytest.raises(WorkerFailed) as err:
        await train(tmp_path, [str(path)])
    assert f"{path}:42" in str(err.value)


async def test_a_bad_line_in_the_second_workers_part_of_one_file_names_the_files_line(tmp_path: Path) -> None:
    lines = [f"1 {0.5 + (i % 3) * 0.1} 2 {i % 50} {(i + 7) % 50}" for i in range(100)]
    lines[79] = "1 0.5 3 4 5"  # line 80: in the second half, which the second worker reads
    path = tmp_path / "data.txt"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(WorkerFailed) as err:
        await train(tmp_path, [str(path)], workers=2)
    assert f"{path}:80" in str(err.value)


def test_one_file_is_shared_by_two_trainers_and_their_workers(tmp_path: Path) -> None:
    path = tmp_path / "data.txt"
    path.write_text("".join(f"1 0.5 1 {i}\n" for i in range(1000)))
    cluster = ClusterSpec(["127.0.0.1:1"], 2)
    shares = []
    for t in range(2):
        names, per_worker = Trainer(LinReg(lr=0.2), Strategy(mode="async", workers=2), cluster, t)._share([str(path)])
        assert names == [str(path)] and all(len(w) == 1 for w in per_worker)
        shares += [w[0] for w in per_worker]
    assert [(p.start, p.stop) for p in shares] == [(a.stop if a else 0, b.stop) for a, b in zip([None, *shares], shares)]
    assert shares[-1].stop == path.stat().st_size
    sizes = [p.stop - p.start for p in shares]
    assert max(sizes) - min(sizes) <= 2 * len("1 0.5 1 999\n")  # four near-equal quarters


async def test_skip_bad_lines_counts_them(tmp_path: Path) -> None:
    path = write_bad_file(tmp_path)
    epochs = await train(tmp_path, [str(path)], skip_bad_lines=True)
    assert [e["examples"] for e in epochs] == [99, 99]
    assert epochs[-1]["bad_lines"] == 2  # one per epoch


@pytest.mark.slow
async def test_pipe_command_runs_a_data_generator(tmp_path: Path) -> None:
    raw = tmp_path / "raw.csv"
    raw.write_text("".join(f"{0.1 * (i % 5):.1f},{i % 20};{(i * 3) % 20}\n" for i in range(200)))
    gen = tmp_path / "gen.py"
    gen.write_text(
        textwrap.dedent(
            """
            from aps.trainer import DataGenerator

            class CsvToSlots(DataGenerator):
                def generate_sample(self, line):
                    def reader():
                        y, feats = line.strip().split(",")
                        yield [("y", [float(y)]), ("f", [int(f) for f in feats.split(";")])]
                    return reader

            if __name__ == "__main__":
                CsvToSlots().run_from_stdin()
            """
        )
    )
    epochs = await train(tmp_path, [str(raw)], pipe_command=f"{sys.executable} {gen}")
    assert [e["examples"] for e in epochs] == [200, 200]
    assert epochs[-1]["loss"] < epochs[0]["loss"]
