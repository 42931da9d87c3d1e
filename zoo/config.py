"""Where the zoo keeps things and which LFS remotes it talks to.

Everything is configuration, never hard-coded: ZOO_HOME (cache, tracking store, locks) and the LFS
remotes, taken from ZOO_LFS_URL, else git's `lfs.url`, else the checkout's `.lfsconfig`.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import platformdirs

PACKAGE_DIR = Path(__file__).resolve().parent
REPO_ROOT = PACKAGE_DIR.parent


def zoo_home() -> Path:
    """Root of the zoo's own files: `$ZOO_HOME`, default the user cache dir (e.g. ~/.cache/zoo)."""
    home = os.environ.get("ZOO_HOME")
    return Path(home).expanduser() if home else Path(platformdirs.user_cache_dir("zoo"))


def entries_dir() -> Path:
    """Folder holding one sub-folder per catalog entry; `$ZOO_ENTRIES` points elsewhere (tests, forks)."""
    override = os.environ.get("ZOO_ENTRIES")
    return Path(override).expanduser().resolve() if override else PACKAGE_DIR / "entries"


def _split_urls(value: str) -> list[str]:
    return [u for u in re.split(r"[\s,]+", value.strip()) if u]


def _git_config(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def lfs_remote_urls() -> list[str]:
    """LFS endpoints to try, in order. ZOO_LFS_URL may list several (space or comma separated)."""
    env = os.environ.get("ZOO_LFS_URL")
    if env is not None:
        return _split_urls(env)
    git_url = _git_config("config", "--get", "lfs.url")
    if git_url:
        return [git_url]
    lfsconfig = REPO_ROOT / ".lfsconfig"
    if lfsconfig.is_file():
        url = _git_config("config", "--file", str(lfsconfig), "--get", "lfs.url")
        if url:
            return [url]
    return []
