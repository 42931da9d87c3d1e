"""Real git-lfs: push an .onnx to a bare repo, clone it (pointers only), pull one file, and `zoo fetch` from the bare repo."""

from __future__ import annotations

import json
import shutil
import subprocess

from tests.helpers import REPO, write_entry, zoo_cli
from zoo.pointer import read_pointer, sha256_file


def git(*args, cwd, env=None):
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True, env=env)


def test_git_lfs_push_clone_pull_and_zoo_fetch(tmp_path):
    assert shutil.which("git-lfs"), "git-lfs is missing: `make setup` installs it"
    bare = tmp_path / "remote.git"
    git("init", "-q", "--bare", "-b", "main", str(bare), cwd=tmp_path)

    work = tmp_path / "work"
    work.mkdir()
    git("init", "-q", "-b", "main", cwd=work)
    git("lfs", "install", "--local", cwd=work)  # filters in this temporary repo only
    shutil.copy(REPO / ".gitattributes", work / ".gitattributes")
    (work / ".lfsconfig").write_text("[lfs]\n\tfetchexclude = *\n")
    folder = write_entry(work / "entries", "tiny")
    content_sha = sha256_file(folder / "model.onnx")
    git("add", ".", cwd=work)
    git("commit", "-q", "-m", "tiny", cwd=work)
    git("remote", "add", "origin", str(bare), cwd=work)
    git("push", "-q", "origin", "main", cwd=work)
    assert (bare / "lfs" / "objects" / content_sha[:2] / content_sha[2:4] / content_sha).is_file()

    # A clone without LFS filters leaves the pointer, as a zoo checkout does.
    clone = tmp_path / "clone"
    git("clone", "-q", str(bare), str(clone), cwd=tmp_path)
    pointer = read_pointer(clone / "entries" / "tiny" / "model.onnx")
    assert pointer is not None and pointer.oid == content_sha

    # `git lfs pull --include` fetches exactly that file.
    git("lfs", "install", "--local", cwd=clone)
    # .lfsconfig excludes everything from fetches; an explicit pull lifts that for one file.
    git("-c", "lfs.fetchexclude=", "lfs", "pull", "--include", "entries/tiny/model.onnx", cwd=clone)
    assert sha256_file(clone / "entries" / "tiny" / "model.onnx") == content_sha

    # `zoo fetch` reads the same bare repo as a file remote.
    fresh = tmp_path / "fresh"
    git("clone", "-q", str(bare), str(fresh), cwd=tmp_path)
    env = {"ZOO_ENTRIES": str(fresh / "entries"), "ZOO_HOME": str(tmp_path / "home"), "ZOO_LFS_URL": str(bare)}
    result = json.loads(zoo_cli("fetch", "tiny", "--json", env=env, check=True).stdout)
    assert result["source"] == str(bare) and result["sha256"] == content_sha
    assert sha256_file(result["path"]) == content_sha
    # and `zoo publish` into a bare repo lays objects out where git-lfs reads them
    other = tmp_path / "other.git"
    git("init", "-q", "--bare", "-b", "main", str(other), cwd=tmp_path)
    write_entry(tmp_path / "entries2", "tiny2", seed=3)
    env2 = {"ZOO_ENTRIES": str(tmp_path / "entries2"), "ZOO_HOME": str(tmp_path / "home2")}
    zoo_cli("publish", "tiny2", "--to", f"file://{other}", env=env2, check=True)
    oid = read_pointer(tmp_path / "entries2" / "tiny2" / "model.onnx").oid
    assert (other / "lfs" / "objects" / oid[:2] / oid[2:4] / oid).is_file()
