"""bin/aps-plot on recorded metrics files: the PNG it writes (signature, size, pixel size from
the IHDR chunk), its one-line errors, the lenient reader aps-local's summary uses, and the
curves a short real training run gives it."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import aps
from aps.cli.plot import curves, plot_metrics
from aps.records import last_epoch_record, read_metrics
from aps.cluster import ClusterSpec
from aps.trainer import Strategy, Trainer, TrainOptions
from examples.linreg.model import make_data
from tests.conftest import BIN, ROOT
from tests.trainer.fault_models import SlowLinReg

pytestmark = pytest.mark.timeout(60)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
T0 = 1_700_000_000.0


def recorded(trainer: int, auc: bool = True) -> list[dict[str, Any]]:
    """Two epochs of 4 progress reports and an epoch record each, as aps/trainer/monitor.py writes them."""
    records = []
    for epoch in range(2):
        for i in range(1, 5):
            step = epoch * 4 + i
            r = {"event": "progress", "trainer": trainer, "epoch": epoch, "time": T0 + 2.0 * step + 0.3 * trainer,
                 "steps": 10 * step, "examples": 320 * step, "loss": 0.7 / step + 0.01 * trainer,
                 "examples_per_s": 4000.0 + 150 * i - 300 * trainer, "wait_share": 0.2}
            if auc:
                r |= {"auc": 0.6 + 0.02 * step, "batch_auc": 0.62 + 0.02 * step}
            records.append(r)
        e = {"event": "epoch", "trainer": trainer, "epoch": epoch, "time": T0 + 8.0 * (epoch + 1) + 0.5,
             "steps": 40, "examples": 1280, "loss": 0.5 / (epoch + 1), "examples_per_s": 4100.0, "wait_share": 0.2,
             "seconds": 8.0, "bad_lines": 0, "mode": "async"}
        if auc:
            e |= {"auc": 0.7 + 0.05 * epoch, "batch_auc": 0.72}
        records.append(e)
    return records


def write_metrics(log_dir: Path, trainers: int = 2, auc: bool = True) -> Path:
    log_dir.mkdir(parents=True, exist_ok=True)
    for k in range(trainers):
        lines = [json.dumps(r) for r in recorded(k, auc)]
        (log_dir / f"trainer.{k}.metrics.jsonl").write_text("\n".join(lines) + "\n")
    return log_dir


def aps_plot(*args: str, cwd: Path, prelude: str = "") -> subprocess.CompletedProcess[str]:
    """Run bin/aps-plot; ``prelude`` is Python run first in the same interpreter (e.g. to hide a module)."""
    if prelude:
        code = "\n".join([prelude, "import runpy, sys", f"sys.argv = {['aps-plot', *args]!r}",
                          f"runpy.run_path({str(BIN / 'aps-plot')!r}, run_name='__main__')"])
        argv = [sys.executable, "-c", code]
    else:
        argv = [sys.executable, str(BIN / "aps-plot"), *args]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=60, env=env)


def png_size(path: Path) -> tuple[int, int]:
    """(width, height) from the IHDR chunk, which a PNG must start with after its signature."""
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE
    length, kind = struct.unpack(">I4s", data[8:16])
    assert (length, kind) == (13, b"IHDR")
    return struct.unpack(">II", data[16:24])


# ----------------------------------------------------------------------------- the picture


def test_plots_two_trainers_into_log_dir_curves_png(tmp_path: Path) -> None:
    write_metrics(tmp_path / "log")
    result = aps_plot("log", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "log/curves.png\n" and result.stderr == ""
    png = tmp_path / "log" / "curves.png"
    assert png.read_bytes()[:8] == PNG_SIGNATURE
    assert png.stat().st_size > 10_000  # three panels of curves, not an empty canvas
    assert png_size(png) == (1200, 900)


def test_out_size_and_dpi_are_honoured(tmp_path: Path) -> None:
    write_metrics(tmp_path / "log")
    result = aps_plot("log", "--out", "figs/run.png", "--size", "640x480", "--dpi", "80", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "figs/run.png\n"
    png = tmp_path / "figs" / "run.png"
    assert png.stat().st_size > 10_000 and png_size(png) == (640, 480)
    assert not (tmp_path / "log" / "curves.png").exists()


def test_library_call_without_auc_returns_the_path(tmp_path: Path) -> None:
    """Models that do not predict (word2vec) have no AUC: two panels, same pixel size."""
    write_metrics(tmp_path, trainers=1, auc=False)
    out = plot_metrics(tmp_path, size=(500, 400))
    assert out == tmp_path / "curves.png" and png_size(out) == (500, 400) and out.stat().st_size > 10_000


@pytest.mark.slow
async def test_a_short_real_run_draws_curves_not_dots(tmp_path: Path) -> None:
    """A trainer with default options that trains for about 3 s (15 batches of 0.2 s: the
    demo's 20-second epoch, shorter) writes enough progress records for every curve to be a
    line of many points, not one dot per epoch."""
    make_data(tmp_path / "data", files=1, lines_per_file=15 * 32, features=50)
    log_dir = tmp_path / "log"
    log_dir.mkdir()
    server = await aps.serve(port=0, num_trainers=1)
    options = TrainOptions(save_dir=None, live_line=False, metrics_path=str(log_dir / "trainer.0.metrics.jsonl"))
    trainer = Trainer(SlowLinReg(features=50), Strategy(mode="async", workers=1), ClusterSpec([server.address], 1),
                      0, options)
    try:
        result = await trainer.atrain([str(tmp_path / "data")], 1)
    finally:
        await server.aclose()
    assert result.epochs[0]["examples"] == 15 * 32 and result.epochs[0]["seconds"] >= 2.9
    data = curves(read_metrics(log_dir))
    assert [p.key for p in data.panels] == ["loss", "examples_per_s"]  # linear regression: no AUC
    for key in ("loss", "examples_per_s"):
        xs, ys = data.lines[key][0]
        assert xs == sorted(xs) and all(y >= 0 for y in ys)
        assert len([y for y in ys if y > 0]) > 5, (key, xs, ys)  # zero until the first batch is done
        assert len(data.dots[key][0][0]) == 1  # and the epoch's own number
    png = plot_metrics(log_dir)
    assert png == log_dir / "curves.png" and png_size(png) == (1200, 900) and png.stat().st_size > 10_000


# ----------------------------------------------------------------------------- errors: one line, exit 2


def one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 2 and result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def test_missing_dir_is_named(tmp_path: Path) -> None:
    assert one_line_error(aps_plot("nowhere", cwd=tmp_path)) == "aps-plot: error: nowhere: no such directory"


def test_dir_without_metrics_files_is_named(tmp_path: Path) -> None:
    (tmp_path / "log").mkdir()
    (tmp_path / "log" / "trainer.0.log").write_text("not metrics\n")
    assert one_line_error(aps_plot("log", cwd=tmp_path)) == (
        "aps-plot: error: log: no metrics files (trainer.*.metrics.jsonl) in it")


@pytest.mark.parametrize("bad,why", [
    ('{"event": "epoch", "trainer": 1, "ti', "not JSON (Unterminated string starting at)"),
    ("[1, 2]", "not a JSON object"),
    ('{"trainer": 1, "time": 5}', "no \"event\": \"progress\" or \"epoch\" (got None)"),
    ('{"event": "epoch", "time": "soon"}', "no numeric \"time\""),
    ('{"event": "epoch", "time": 5, "loss": "high"}', "'loss' is not a number: 'high'"),
])
def test_malformed_line_is_named_by_file_and_line(tmp_path: Path, bad: str, why: str) -> None:
    write_metrics(tmp_path / "log")
    path = tmp_path / "log" / "trainer.1.metrics.jsonl"
    lines = path.read_text().splitlines()
    lines.insert(2, bad)
    path.write_text("\n".join(lines) + "\n")
    assert one_line_error(aps_plot("log", cwd=tmp_path)) == f"aps-plot: error: log/trainer.1.metrics.jsonl:3: {why}"
    assert not (tmp_path / "log" / "curves.png").exists()


def test_empty_metrics_files_are_an_error(tmp_path: Path) -> None:
    (tmp_path / "log").mkdir()
    (tmp_path / "log" / "trainer.0.metrics.jsonl").write_text("")
    assert one_line_error(aps_plot("log", cwd=tmp_path)).startswith("aps-plot: error: log: the metrics files are empty")


def test_without_matplotlib_says_how_to_install_it(tmp_path: Path) -> None:
    write_metrics(tmp_path / "log")
    result = aps_plot("log", cwd=tmp_path, prelude="import sys; sys.modules['matplotlib'] = None")
    assert one_line_error(result) == "aps-plot: needs matplotlib: pip install 'aps[plot]'"


def test_bad_size_is_a_usage_error(tmp_path: Path) -> None:
    result = aps_plot("log", "--size", "12x9", cwd=tmp_path)
    assert result.returncode == 2 and "size must be WxH pixels, each 100..10000" in result.stderr


def test_help_explains(tmp_path: Path) -> None:
    result = aps_plot("--help", cwd=tmp_path)
    assert result.returncode == 0
    text = " ".join(result.stdout.split())
    for words in ("trainer.K.metrics.jsonl", "loss, AUC", "examples/s", "LOG_DIR/curves.png", "pip install 'aps[plot]'"):
        assert words in text, words


def test_importing_aps_and_its_clis_never_imports_matplotlib() -> None:
    code = "import sys, aps, aps.cli.plot, aps.cli.local; print('matplotlib' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert result.stdout == "False\n", result.stderr


# ----------------------------------------------------------------------------- the summary's reader


def test_last_epoch_record_skips_partial_lines_other_trainers_and_earlier_runs(tmp_path: Path) -> None:
    path = tmp_path / "shared.metrics.jsonl"
    rows = [recorded(0)[-1], recorded(1)[-1] | {"loss": 0.125}, recorded(0)[0]]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"event": "epo')
    assert last_epoch_record(path) == rows[1]  # the progress record and the cut-off line are skipped
    assert last_epoch_record(path, trainer=0) == rows[0]
    assert last_epoch_record(path, trainer=0, since=rows[0]["time"] + 1) is None  # only an earlier run's
    assert last_epoch_record(path, trainer=2) is None
    assert last_epoch_record(tmp_path / "missing.jsonl") is None
