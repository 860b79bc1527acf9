"""A user's torch network trained through aps equals the same network trained by plain PyTorch.

One trainer, one worker, sync mode, a real pserver process: 20 steps of aps's
:class:`~aps.torch.TorchModel` against the same module in plain PyTorch
(:func:`aps.torch.plain.plain_network`: its ``aps.torch.Embedding`` swapped for
``torch.nn.Embedding(sparse=True)`` holding the same rows), started from the values
the pserver created, fed the same batches. SGD on everything; Adam as ``torch.optim.SparseAdam``
on the embeddings (aps's ``bias_correction="step"``) and ``torch.optim.Adam`` on the rest.
Every table (dense, and every touched row) ends equal to float32 tolerance.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
import torch

import aps
import aps.torch as at
from aps.torch.plain import plain_network, plain_optimizers
from aps.trainer.stepwise import StepTrainer
from tests.conftest import Processes
from tests.models.test_ctr_step_equality import BATCH, BUCKETS, DENSE, SLOTS, STEPS, make_lines, pull_all, write_meta

pytestmark = pytest.mark.timeout(120)


class SmallDnn(torch.nn.Module):
    """CTR-DNN's shape: embeddings of every slot and the dense columns into an MLP."""

    def __init__(self, meta: at.Meta) -> None:
        super().__init__()
        self.emb = at.Embedding("emb", dim=3, kind="fixed", init=aps.Uniform(-0.5, 0.5))
        self.mlp = torch.nn.Sequential(torch.nn.Linear(meta.slots * 3 + meta.dense, 5), torch.nn.ReLU(),
                                       torch.nn.Linear(5, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))

    def forward(self, f: at.Features) -> torch.Tensor:
        return self.mlp(torch.cat([self.emb(f.slots).flatten(1), f.dense], 1)).squeeze(1)


def _embedding_paths(network: torch.nn.Module) -> set[str]:
    return {path for path, m in network.named_modules() if isinstance(m, at.Embedding)}


def train_both(network_cls, optimizer: str, tmp_path: Path, processes: Processes):
    lr = 0.05 if optimizer == "adam" else 0.5
    opt = aps.Adam(lr, bias_correction="step") if optimizer == "adam" else aps.SGD(lr)
    model = at.TorchModel(network_cls, meta=write_meta(tmp_path / "meta.json"), optimizer=opt, batch_size=BATCH)
    servers = processes.start_servers(1, trainers=1)
    st = StepTrainer(model, aps.Strategy(mode="sync"), aps.ClusterSpec(servers, 1), 0).start()
    try:
        initial = asyncio.run(pull_all(servers, model))
        ref = plain_network(model.network, BUCKETS, initial)
        with torch.no_grad():
            for name, param in ref.named_parameters():
                if name in initial:  # the dense tables (the embeddings' weights are named by module path)
                    param.copy_(torch.from_numpy(initial[name]).view(param.shape))
        opts = plain_optimizers(ref, lr) if optimizer == "adam" else [torch.optim.SGD(ref.parameters(), lr=lr)]
        batches = list(st.batches(make_lines(3)))
        assert [b.examples for b in batches] == [BATCH] * STEPS
        aps_losses, ref_losses = [], []
        for batch in batches:
            aps_losses.append(st.step(batch))
            d = batch.data
            features = at.Features(torch.from_numpy(d.ids), torch.from_numpy(d.dense), torch.from_numpy(d.labels))
            loss = torch.nn.functional.binary_cross_entropy_with_logits(ref(features), torch.from_numpy(d.labels))
            for o in opts:
                o.zero_grad()
            loss.backward()
            for o in opts:
                o.step()
            ref_losses.append(float(loss.detach()))
        final = asyncio.run(pull_all(servers, model))
        st.stop()
    finally:
        if not st._stopped:
            st.close()
    assert processes.procs[0].wait(timeout=15) == 0
    want = {name: p.detach().numpy() for name, p in ref.named_parameters()}
    for path in _embedding_paths(model.network):
        want[model.network.get_submodule(path).table_name] = want.pop(f"{path}.weight")
    return initial, final, want, aps_losses, ref_losses


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_a_torch_network_through_aps_equals_plain_pytorch_step_for_step(optimizer: str, tmp_path: Path,
                                                                       processes: Processes) -> None:
    initial, final, want, aps_losses, ref_losses = train_both(SmallDnn, optimizer, tmp_path, processes)
    np.testing.assert_allclose(aps_losses, ref_losses, rtol=1e-4)
    moved = max(float(np.abs(final[k] - initial[k]).max()) for k in final)
    assert moved > 1e-2
    assert set(final) == set(want)
    for name in final:
        np.testing.assert_allclose(final[name], want[name].reshape(final[name].shape), rtol=2e-5, atol=2e-6, err_msg=name)
