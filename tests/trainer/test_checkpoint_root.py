"""A save path the pservers would refuse is refused by the trainer first: aps-trainer's
--save-dir before its first step (not after its first epoch), a step-wise trainer's save()
(fleet.save_persistables) before anything is flushed or sent, each naming the pservers'
checkpoint root and the flag that moves it."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

import aps
from aps.cluster import ClusterSpec
from aps.fleet import Fleet, Role, UserDefinedRoleMaker
from aps.trainer import Strategy, Trainer, TrainOptions
from aps.trainer.stepwise import StepTrainer
from examples.linreg.model import LinReg, make_data

pytestmark = pytest.mark.timeout(60)

PUSHES = {"PUSH_SPARSE_GRAD", "PUSH_DENSE_GRAD", "PUSH_SPARSE_DELTA", "PUSH_DENSE_DELTA"}


def dirs(tmp_path: Path) -> tuple[Path, Path]:
    tmp = tmp_path.resolve()  # the server names real paths
    root, outside = tmp / "root", tmp / "elsewhere"
    root.mkdir()
    return root, outside


@pytest.mark.parametrize("where", ["absolute", "relative"])
async def test_a_save_dir_outside_the_root_is_refused_before_the_first_step(tmp_path: Path, where: str) -> None:
    root, outside = dirs(tmp_path)
    save_dir = str(outside) if where == "absolute" else "../elsewhere"
    make_data(tmp_path / "data", files=1, lines_per_file=2000)
    server = await aps.serve(port=0, checkpoint_root=str(root))
    try:
        options = TrainOptions(save_dir=save_dir, print_period=60, live_line=False)
        trainer = Trainer(LinReg(lr=0.2), Strategy(mode="async", workers=1), ClusterSpec([server.address], 1), 0, options)
        with pytest.raises(aps.ConfigError) as err:
            await trainer.atrain([str(tmp_path / "data")], epochs=1)
        message = str(err.value)
        assert f"save_dir (aps-trainer --save-dir) {save_dir!r} is {outside}, outside the checkpoint root {root}" in message
        assert f"of pserver {server.address}" in message and "aps-server --checkpoint-root DIR" in message
        async with aps.connect(server.address) as ps:
            ops = (await ps.stats())[server.address]["ops"]
        assert PUSHES.isdisjoint(ops) and "SAVE" not in ops  # not one step trained, nothing saved
        assert not outside.exists()
    finally:
        await server.aclose()


async def test_a_save_dir_inside_the_root_trains_and_saves_there(tmp_path: Path) -> None:
    root, _ = dirs(tmp_path)
    make_data(tmp_path / "data", files=1, lines_per_file=200)
    server = await aps.serve(port=0, checkpoint_root=str(root))
    try:
        for save_dir in ("model", str(root / "abs")):
            options = TrainOptions(save_dir=save_dir, print_period=60, live_line=False)
            trainer = Trainer(LinReg(lr=0.2), Strategy(mode="async", workers=1), ClusterSpec([server.address], 1), 0,
                              options)
            result = await trainer.atrain([str(tmp_path / "data")], epochs=1)
            assert result.epochs[0]["saved"] == f"{save_dir}/epoch_0"
        assert (root / "model" / "epoch_0" / "shard-00000-of-00001" / "manifest.json").is_file()
        assert (root / "abs" / "epoch_0" / "shard-00000-of-00001" / "manifest.json").is_file()
    finally:
        await server.aclose()


def serve_in_thread(root: Path) -> tuple[str, asyncio.AbstractEventLoop, aps.PServer]:
    """A pserver on its own event loop thread, for a step-wise trainer (blocking API) to use."""
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    server = asyncio.run_coroutine_threadsafe(aps.serve(port=0, checkpoint_root=str(root)), loop).result(30)
    return server.address, loop, server


def stop_server(loop: asyncio.AbstractEventLoop, server: aps.PServer) -> None:
    asyncio.run_coroutine_threadsafe(server.aclose(), loop).result(30)
    loop.call_soon_threadsafe(loop.stop)


def test_a_step_trainers_save_outside_the_root_is_refused_before_anything_is_sent(tmp_path: Path) -> None:
    root, outside = dirs(tmp_path)
    make_data(tmp_path / "data", files=1, lines_per_file=200)
    lines = next((tmp_path / "data").iterdir()).read_text().splitlines()
    address, loop, server = serve_in_thread(root)
    try:
        # a save_dir given at start is checked at start
        with pytest.raises(aps.ConfigError, match=r"save_dir '\.\./x' is .*outside the checkpoint root"):
            StepTrainer(LinReg(lr=0.2), Strategy(mode="async"), ClusterSpec([address], 1), 0,
                        TrainOptions(save_dir="../x")).start()
        fleet = Fleet().init(UserDefinedRoleMaker(current_id=0, role=Role.WORKER, worker_num=1,
                                                  server_endpoints=[address]))
        worker = fleet.init_worker(LinReg(lr=0.2), Strategy(mode="async"))
        for batch in worker.batches(lines):
            worker.step(batch)
        for save in (worker.save, fleet.save_persistables):
            with pytest.raises(aps.ConfigError) as err:
                save(str(outside))
            assert (f"save path {str(outside)!r} is {outside}, outside the checkpoint root {root} "
                    f"of pserver {address}") in str(err.value)
            assert "aps-server --checkpoint-root DIR" in str(err.value)
        assert not outside.exists()
        fleet.save_persistables(str(root / "final"))  # the refusal left the trainer usable
        assert (root / "final" / "shard-00000-of-00001" / "manifest.json").is_file()
        fleet.stop_worker()
    finally:
        stop_server(loop, server)
