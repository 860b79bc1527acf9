"""A client learns each pserver's checkpoint root from its STATS reply and can tell, before any
SAVE, whether a path would be refused there (aps/client/roots.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import aps
from aps.client.roots import check_checkpoint_path, outside_root


async def test_the_stats_reply_names_the_servers_real_checkpoint_root(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    os.symlink(tmp_path / "real", tmp_path / "link")
    server = await aps.serve(port=0, checkpoint_root=str(tmp_path / "link"))
    try:
        async with aps.connect(server.address) as ps:
            assert await ps.checkpoint_roots() == {server.address: str((tmp_path / "real").resolve())}
    finally:
        await server.aclose()


def test_a_path_is_taken_from_the_root_and_normalised() -> None:
    assert outside_root("model/epoch_0", "/srv/aps") is None
    assert outside_root("/srv/aps/model", "/srv/aps") is None
    assert outside_root(".", "/srv/aps") is None
    assert outside_root("a/../../x", "/srv/aps") == "/srv/x"
    assert outside_root("/srv/apsx/m", "/srv/aps") == "/srv/apsx/m"  # a sibling with the root's name as prefix
    assert outside_root("/data/m", "/") is None


def test_a_path_inside_the_root_through_a_local_symlink_counts_as_inside(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    os.symlink(root, tmp_path / "alias")
    assert outside_root(str(tmp_path / "alias" / "model"), str(root)) is None


def test_the_refusal_names_the_path_the_root_the_server_and_the_fix() -> None:
    roots = {"10.0.0.1:7164": "/srv/aps", "10.0.0.2:7164": "/srv/other", "10.0.0.3:7164": None}
    check_checkpoint_path("/srv/aps/m", {"10.0.0.1:7164": "/srv/aps", "10.0.0.3:7164": None}, "save path")
    with pytest.raises(aps.ConfigError) as err:
        check_checkpoint_path("/srv/aps/m", roots, "save path")
    assert str(err.value).startswith("save path '/srv/aps/m' is /srv/aps/m, outside the checkpoint root /srv/other "
                                     "of pserver 10.0.0.2:7164, which would refuse to save there: start the pservers "
                                     "with aps-server --checkpoint-root DIR")
