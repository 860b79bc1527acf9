"""examples/online/predict.py scores CTR lines with parameters from aps-serve exactly as
offline inference scores them from a checkpoint of the same pserver state."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import aps
from aps.models import build_model
from aps.models.ctr_eval import evaluate, load_params
from aps.serving.server import serve_exports
from tests.conftest import ROOT

pytestmark = pytest.mark.timeout(180)


@pytest.mark.slow
async def test_predict_through_aps_serve_equals_inference_from_a_checkpoint(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, str(ROOT / "examples/ctr_dnn/make_data.py"), "--out", str(tmp_path / "data"), "--scale", "small",
         "--train-lines", "10", "--train-files", "1", "--test-lines", "3000"],
        check=True, capture_output=True, timeout=120,
    )
    test_files = sorted(str(p) for p in (tmp_path / "data" / "test_data").iterdir())
    model_args = ["table=hash"]
    net = build_model("ctr_dnn", model_args)
    server = await aps.serve(checkpoint_root=str(tmp_path))
    try:
        async with aps.connect([server.address]) as ps:
            rng = np.random.default_rng(1)
            for spec in net.tables():
                await ps.create_table(spec)
                if isinstance(spec, aps.DenseTable):  # away from the initial values, so scores differ by line
                    await ps.push_dense_grad(spec.name, rng.standard_normal(spec.shape).astype(np.float32))
            await ps.export("ex", kind="base")
            await ps.save("ckpt")
    finally:
        await server.aclose()
    expected = await asyncio.to_thread(evaluate, net, load_params(net, tmp_path / "ckpt"), test_files)
    serving = await serve_exports(tmp_path / "ex")
    try:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, str(ROOT / "examples/online/predict.py"), "--serve", serving.address, "--data", *test_files,
            *[a for arg in model_args for a in ("--model-arg", arg)], "--out", str(tmp_path / "scores.txt"),
            "--json", str(tmp_path / "result.json"), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )
        output, _ = await asyncio.wait_for(proc.communicate(), 150)
    finally:
        await serving.aclose()
    assert proc.returncode == 0, output.decode()
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["examples"] == expected["examples"] == 3000
    assert result["auc"] == expected["auc"] and result["logloss"] == pytest.approx(expected["logloss"], rel=1e-9)
    assert result["model_versions"] == [1]
    scores = np.loadtxt(tmp_path / "scores.txt")
    assert scores.shape == (3000,) and 0 < scores.min() < scores.max() < 1
