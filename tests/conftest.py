from __future__ import annotations

import os
import shutil
import tempfile

import pytest

from tests.helpers import LfsServer
from zoo import catalog


def pytest_configure(config):
    """One prepared-data cache for the whole run (zoo.config.data_dir): tests isolate $ZOO_HOME, but the prepared
    datasets are derived, versioned files that every test and subprocess may share (the text data takes minutes)."""
    if "ZOO_DATA_DIR" not in os.environ:
        config._zoo_data_dir = tempfile.mkdtemp(prefix="zoo-test-data-")
        os.environ["ZOO_DATA_DIR"] = config._zoo_data_dir


def pytest_unconfigure(config):
    folder = getattr(config, "_zoo_data_dir", None)
    if folder:
        shutil.rmtree(folder, ignore_errors=True)
        os.environ.pop("ZOO_DATA_DIR", None)


@pytest.fixture
def zoo_env(tmp_path, monkeypatch):
    """An isolated zoo: its own cache ($ZOO_HOME), catalog ($ZOO_ENTRIES) and no remotes."""
    home, entries = tmp_path / "home", tmp_path / "entries"
    entries.mkdir()
    monkeypatch.setenv("ZOO_HOME", str(home))
    monkeypatch.setenv("ZOO_ENTRIES", str(entries))
    monkeypatch.setenv("ZOO_LFS_URL", "")
    monkeypatch.setenv("ZOO_STORE", "")  # nor the repository's store
    catalog.reload()
    yield {"home": home, "entries": entries, "tmp": tmp_path}
    catalog.reload()


@pytest.fixture
def lfs_server(tmp_path):
    server = LfsServer(tmp_path / "lfs-storage").start()
    yield server
    server.stop()
