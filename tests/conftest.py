from __future__ import annotations

import pytest

from tests.helpers import LfsServer
from zoo import catalog


@pytest.fixture
def zoo_env(tmp_path, monkeypatch):
    """An isolated zoo: its own cache ($ZOO_HOME), catalog ($ZOO_ENTRIES) and no remotes."""
    home, entries = tmp_path / "home", tmp_path / "entries"
    entries.mkdir()
    monkeypatch.setenv("ZOO_HOME", str(home))
    monkeypatch.setenv("ZOO_ENTRIES", str(entries))
    monkeypatch.setenv("ZOO_LFS_URL", "")
    catalog.reload()
    yield {"home": home, "entries": entries, "tmp": tmp_path}
    catalog.reload()


@pytest.fixture
def lfs_server(tmp_path):
    server = LfsServer(tmp_path / "lfs-storage").start()
    yield server
    server.stop()
