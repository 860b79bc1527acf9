"""README's "Bring your own script" example runs as written, through both launchers."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import BIN
from tests.fleet.conftest import run
from tests.test_docs import README, fenced_blocks, section

pytestmark = pytest.mark.timeout(120)


def readme_script() -> str:
    blocks = fenced_blocks(section(README.read_text(encoding="utf-8"), "Bring your own script"), "python")
    assert blocks, "no ```python block under '## Bring your own script'"
    return blocks[0]


def losses(log: Path) -> list[float]:
    return [float(x) for x in re.findall(r"^TRAIN ---> pass: \d+ step: \d+ loss: ([0-9.]+)$", log.read_text(), re.M)]


@pytest.mark.slow
def test_readme_script_trains_in_every_role(tmp_path: Path, data: Path) -> None:
    """Through aps-launch, as README shows it, on 2 pservers in geo (test_scripts.py runs the
    same kind of script through aps-local in every mode)."""
    (tmp_path / "train.py").write_text(readme_script(), encoding="utf-8")
    done = run([sys.executable, str(BIN / "aps-launch"), "--server-num", "2", "--worker-num", "2",
                "--status-interval", "0", "train.py", "--data", str(data), "--mode", "geo"], tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    runs = [losses(tmp_path / "log" / f"trainer.{k}.log") for k in range(2)]
    assert [len(x) for x in runs] == [20, 20]  # 2,000 lines each, batches of 100
    # from the untrained model (0.693) to below the best constant prediction (0.456)
    assert max(x[0] for x in runs) > 0.6 and max(np.mean(x[-5:]) for x in runs) < 0.45, runs
    assert sorted(p.name for p in (tmp_path / "model" / "final").iterdir()) == [
        "shard-00000-of-00002", "shard-00001-of-00002"]
