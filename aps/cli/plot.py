"""aps-plot: training curves from the trainers' metrics files, as one PNG.

Trainers append one JSON object per progress report and per epoch to
``LOG_DIR/trainer.K.metrics.jsonl`` (aps/trainer/monitor.py, in the format of aps/records.py).
This module reads those files strictly (aps.records.read_metrics) and draws loss, AUC (when the
model predicts) and examples/s over time, one line per trainer.

matplotlib is an optional extra (``aps[plot]``): it is imported inside :func:`plot_metrics` only,
so importing aps, or running aps-local, never needs it. The figure is drawn with the Agg canvas
directly (``Figure`` + ``FigureCanvasAgg``, no pyplot): no display, no global backend switch, no
figure registry to leak from a long-running caller such as the demo.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from ..errors import ApsError, ConfigError, DataError
from ..records import Record, read_metrics

DEFAULT_SIZE = (1200, 900)  # pixels; three stacked panels stay readable at this size
DEFAULT_DPI = 100
NEEDS_MATPLOTLIB = "needs matplotlib: pip install 'aps[plot]'"

DESCRIPTION = f"""\
Plot training curves from the JSON-lines metrics files trainers write
(LOG_DIR/trainer.K.metrics.jsonl, one per trainer): loss, AUC (when the model predicts; solid =
global AUC, dotted = AUC of the last batches) and examples/s, against seconds since the first
record, one line per trainer, as stacked panels in one PNG. Lines follow the periodic "progress"
records; a dot marks each epoch's whole-epoch numbers (the "epoch" records).

Needs matplotlib ({NEEDS_MATPLOTLIB}). Prints the path of the PNG it wrote.

exit status: 0 written; 1 the PNG could not be written; 2 usage error, LOG_DIR missing, no
metrics files in it, a malformed line (named as FILE:LINE), or matplotlib missing.
"""

EPILOG = """\
examples:
  aps-plot log                              # writes log/curves.png
  aps-plot /tmp/ctr-logs --out ctr.png --size 1600x1200
"""


class PlotUnavailable(ApsError):
    """matplotlib is not installed; plotting is an optional extra."""


# ------------------------------------------------------------------------------------ plotting


@dataclass(frozen=True)
class Panel:
    title: str
    key: str
    #: a second quantity drawn dotted in the same colour (AUC of the last batches)
    companion: str | None = None


PANELS = (
    Panel("loss", "loss"),
    Panel("AUC", "auc", companion="batch_auc"),
    Panel("examples/s", "examples_per_s"),
    #: online training: each pass's AUC of the predictions made before training on it (one dot a pass)
    Panel("online AUC", "online_auc"),
)


#: (seconds since the first record, value) points of one quantity of one trainer
Points = tuple[list[float], list[float]]


@dataclass(frozen=True)
class Curves:
    """What the picture draws, apart from how: per panel key (and companion key), per trainer,
    the line through its "progress" records and the dots of its "epoch" records. A function of
    its own so that what a run's records give a plot can be checked without looking at pixels."""

    panels: tuple[Panel, ...]
    lines: dict[str, dict[int, Points]]
    dots: dict[str, dict[int, Points]]


def _points(records: list[Record], event: str, key: str, t0: float) -> Points:
    xs, ys = [], []
    for r in records:
        if r["event"] == event and r.get(key) is not None:
            xs.append(r["time"] - t0)
            ys.append(float(r[key]))
    return xs, ys


def curves(by_trainer: dict[int, list[Record]]) -> Curves:
    """The panels that have data (AUC only when a model predicts) and their points; x is
    seconds since the first record of any trainer, so trainers share one time axis."""
    all_records = [r for records in by_trainer.values() for r in records]
    t0 = min(r["time"] for r in all_records)
    panels = tuple(p for p in PANELS if any(r.get(p.key) is not None for r in all_records))
    keys = [key for p in panels for key in (p.key, p.companion) if key]
    lines = {key: {k: _points(records, "progress", key, t0) for k, records in by_trainer.items()} for key in keys}
    dots = {p.key: {k: _points(records, "epoch", p.key, t0) for k, records in by_trainer.items()} for p in panels}
    return Curves(panels, lines, dots)


def plot_metrics(log_dir: str | Path, out: str | Path | None = None, size: tuple[int, int] = DEFAULT_SIZE,
                 dpi: int = DEFAULT_DPI) -> Path:
    """Draw the curves of every metrics file in ``log_dir`` into a PNG of ``size`` pixels;
    returns its path (default ``log_dir/curves.png``).

    Raises ConfigError (no directory / no files / no records), DataError (a malformed line),
    PlotUnavailable (no matplotlib), OSError (cannot write)."""
    log_dir = Path(log_dir)
    out = Path(out) if out is not None else log_dir / "curves.png"
    data = curves(read_metrics(log_dir))
    try:  # lazily: plotting is an optional extra, see the module docstring
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise PlotUnavailable(NEEDS_MATPLOTLIB) from exc

    width, height = size
    fig = Figure(figsize=(width / dpi, height / dpi), dpi=dpi)
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(data.panels), 1, sharex=True, squeeze=False)[:, 0]
    trainers = sorted(data.dots[data.panels[0].key])
    colours = [f"C{i % 10}" for i in range(len(trainers))]
    for ax, panel in zip(axes, data.panels):
        for colour, k in zip(colours, trainers):
            ax.plot(*data.lines[panel.key][k], color=colour, label=f"trainer {k}")
            if panel.companion:
                ax.plot(*data.lines[panel.companion][k], color=colour, linestyle=":", alpha=0.7)
            ax.plot(*data.dots[panel.key][k], color=colour, linestyle="none", marker="o")
        ax.set_ylabel(panel.title + (" (dotted: last batches)" if panel.companion else ""))
        ax.grid(True, alpha=0.3)
    axes[0].legend(loc="best", fontsize="small")
    axes[0].set_title(f"aps training curves: {log_dir} (dots: whole-epoch numbers)")
    axes[-1].set_xlabel("seconds since the first record")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, format="png", dpi=dpi)
    return out


# ------------------------------------------------------------------------------------ command


def parse_size(text: str) -> tuple[int, int]:
    """``WxH`` in pixels, each 100..10000."""
    match = re.fullmatch(r"\s*(\d+)\s*[xX]\s*(\d+)\s*", text)
    if not match or not all(100 <= int(v) <= 10000 for v in match.groups()):
        raise argparse.ArgumentTypeError(f"size must be WxH pixels, each 100..10000 (e.g. 1200x900), got {text!r}")
    return int(match[1]), int(match[2])


def parse_dpi(text: str) -> int:
    if not text.isdigit() or not 50 <= int(text) <= 400:
        raise argparse.ArgumentTypeError(f"dpi must be an integer 50..400, got {text!r}")
    return int(text)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="aps-plot", description=DESCRIPTION, epilog=EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("log_dir", metavar="LOG_DIR", type=Path, help="directory with trainer.K.metrics.jsonl files")
    parser.add_argument("--out", metavar="PNG", type=Path, help="where to write the plot (default LOG_DIR/curves.png)")
    parser.add_argument("--size", type=parse_size, default=DEFAULT_SIZE, metavar="WxH",
                        help=f"image size in pixels (default {DEFAULT_SIZE[0]}x{DEFAULT_SIZE[1]})")
    parser.add_argument("--dpi", type=parse_dpi, default=DEFAULT_DPI, metavar="DPI",
                        help=f"dots per inch: bigger text at the same size (50..400, default {DEFAULT_DPI})")
    return parser


def main(argv: list[str] | None = None) -> int:
    """The cli_main contract (aps/cli/common.py) without an event loop or logging, which a plot
    needs neither of: a usage or input error exits 2, anything else 1, each as one line."""
    args = build_parser().parse_args(argv)
    try:
        out = plot_metrics(args.log_dir, args.out, args.size, args.dpi)
    except PlotUnavailable as exc:
        print(f"aps-plot: {exc}", file=sys.stderr)
        return 2
    except (ConfigError, DataError) as exc:
        print(f"aps-plot: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"aps-plot: failed: cannot write {args.out or args.log_dir / 'curves.png'}: {exc}", file=sys.stderr)
        return 1
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
