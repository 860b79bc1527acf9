"""aps-local and an absolute --save-dir: the pservers get a checkpoint root that holds it, so a
run started from another directory saves where it was told instead of failing at the end."""

from __future__ import annotations

import io
import os
import subprocess
from pathlib import Path

import pytest

from aps.cli.local import Board, Launcher, parse_args
from examples.linreg.model import make_data
from tests.conftest import ROOT
from tests.e2e.test_local_launcher import assert_all_gone, launcher_argv, summary

pytestmark = pytest.mark.timeout(90)


@pytest.mark.slow
def test_an_absolute_save_dir_outside_the_working_directory_gets_the_checkpoint(tmp_path: Path) -> None:
    make_data(tmp_path / "data", files=1, lines_per_file=300)
    run_dir, save = tmp_path / "run", tmp_path / "out" / "model"  # neither below the other; save not made yet
    run_dir.mkdir()
    result = subprocess.run(
        launcher_argv("1x1", "--", "--model", "examples.linreg.model:LinReg", "--data", str(tmp_path / "data"),
                      "--epochs", "1", "--workers", "1", "--save-dir", str(save)),
        cwd=run_dir, env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True, timeout=80,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert (save / "epoch_0" / "shard-00000-of-00001" / "manifest.json").is_file()
    assert not (run_dir / "model").exists()
    assert_all_gone([pid for pid, _ in summary(result.stdout).values()])


def plan(tmp_path: Path, *argv: str) -> list[list[str]]:
    opts, trainer_args = parse_args(["2x1", "--log-dir", str(tmp_path / "log"), *argv])
    launcher = Launcher(opts, trainer_args, Board(io.StringIO(), io.StringIO()))
    launcher.plan(None, None, tmp_path)
    return [role.argv for role in launcher.servers]


def roots(argv: list[str]) -> list[str]:
    return [argv[i + 1] for i, arg in enumerate(argv) if arg == "--checkpoint-root"]


def test_the_pservers_root_is_the_absolute_save_dir_unless_the_user_chose_one(tmp_path: Path) -> None:
    save = tmp_path / "a" / "b"
    for argv in (["--save-dir", str(save)], ["--", f"--save-dir={save}"]):
        assert [roots(a) for a in plan(tmp_path, *argv)] == [[str(save)], [str(save)]]
        assert save.is_dir()  # made now: aps-server's --checkpoint-root must exist
    # a relative save dir is already taken from the pservers' directory; --no-save saves nothing;
    # a root in --server-args is the user's
    assert [roots(a) for a in plan(tmp_path, "--save-dir", "model")] == [[], []]
    assert [roots(a) for a in plan(tmp_path, "--save-dir", str(tmp_path / "n"), "--no-save")] == [[], []]
    mine = str(tmp_path)
    assert [roots(a) for a in plan(tmp_path, "--server-args", f"--checkpoint-root {mine}", "--save-dir",
                                   str(save))] == [[mine], [mine]]
    assert not (tmp_path / "n").exists()


def test_a_save_dir_that_cannot_be_made_is_a_usage_error_before_anything_starts(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from aps.cli.local import main

    (tmp_path / "file").write_text("")
    bad = tmp_path / "file" / "model"
    code = main(["1x1", "--log-dir", str(tmp_path / "log"), "--", "--model", "examples.linreg.model:LinReg",
                 "--data", str(tmp_path), "--save-dir", str(bad)])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith(f"aps-local: error: --save-dir {bad}: cannot create it (") and err.count("\n") == 1
    assert not (tmp_path / "log" / "pserver.0.log").exists()
