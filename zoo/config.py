"""Where the zoo keeps things and which LFS stores it talks to.

Everything is configuration, never hard-coded: ZOO_HOME (cache, tracking store, locks), the repository's own store
(`store/` in the checkout: the published objects travel with the code; ZOO_STORE points elsewhere, empty for none)
and the extra LFS stores (mirrors), tried after it in this order: ZOO_LFS_URL (when set, only it); git's `lfs.url`
(git config, then the checkout's `.lfsconfig`); then the LFS endpoint of the remote the checkout was cloned from,
resolved as git-lfs resolves it.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import platformdirs

from zoo.errors import ZooError

PACKAGE_DIR = Path(__file__).resolve().parent
REPO_ROOT = PACKAGE_DIR.parent


def zoo_home() -> Path:
    """Root of the zoo's own files: `$ZOO_HOME`, default the user cache dir (e.g. ~/.cache/zoo)."""
    home = os.environ.get("ZOO_HOME")
    return Path(home).expanduser() if home else Path(platformdirs.user_cache_dir("zoo"))


def data_dir() -> Path:
    """Where prepared datasets are cached (derived, versioned files any process may share): `$ZOO_DATA_DIR`, default
    `$ZOO_HOME/data`."""
    folder = os.environ.get("ZOO_DATA_DIR")
    return Path(folder).expanduser() if folder else zoo_home() / "data"


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


# The zoo's published store: a folder of the repository in git-lfs's object layout (store/lfs/objects/ab/cd/<oid>),
# committed with the cards and pointers that name its objects.
REPO_STORE = REPO_ROOT / "store"


def repo_store() -> Path | None:
    """The repository's store (`$ZOO_STORE`, default `<checkout>/store`; empty: none), when it exists."""
    value = os.environ.get("ZOO_STORE")
    if value is not None and not value.strip():
        return None
    folder = Path(value).expanduser().resolve() if value else REPO_STORE
    return folder if folder.is_dir() else None


DEFAULT_LFS_TIMEOUT = 5.0


def lfs_timeout() -> float:
    """Seconds an HTTP store may take to accept a connection, and to send each next piece of an answer
    (`$ZOO_LFS_TIMEOUT`, default 5): a store that hangs costs seconds and is skipped, never retried."""
    value = os.environ.get("ZOO_LFS_TIMEOUT", "").strip()
    if not value:
        return DEFAULT_LFS_TIMEOUT
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not 0 < seconds <= 3600:
        raise ZooError(f"ZOO_LFS_TIMEOUT={value!r} is not a number of seconds in (0, 3600]; unset it for "
                       f"{DEFAULT_LFS_TIMEOUT:g} s")
    return seconds


def lfs_remote_urls() -> list[str]:
    """The extra LFS stores (mirrors) to try after the repository's store, in order. ZOO_LFS_URL may list several
    (space or comma separated); set to an empty string it means none."""
    env = os.environ.get("ZOO_LFS_URL")
    if env is not None:
        return _split_urls(env)
    urls = []
    git_url = _git_config("config", "--get", "lfs.url")
    lfsconfig = REPO_ROOT / ".lfsconfig"
    if not git_url and lfsconfig.is_file():
        git_url = _git_config("config", "--file", str(lfsconfig), "--get", "lfs.url")
    if git_url:
        urls.append(git_url)
    if (remote := clone_remote_endpoint()) is not None:
        urls.append(remote)
    return list(dict.fromkeys(urls))


def clone_remote_endpoint() -> str | None:
    """The LFS endpoint of the checkout's remote (the current branch's, else origin), as git-lfs derives it:
    `remote.<name>.lfsurl` if set; https://host/path -> https://host/path.git/info/lfs; ssh `user@host:path` ->
    https://host/path.git/info/lfs; a local path or file:// URL -> that repository (its lfs/objects)."""
    branch = _git_config("symbolic-ref", "--short", "-q", "HEAD")
    name = (_git_config("config", "--get", f"branch.{branch}.remote") if branch else None) or "origin"
    if explicit := _git_config("config", "--get", f"remote.{name}.lfsurl"):
        return explicit
    url = _git_config("config", "--get", f"remote.{name}.url")
    if not url:
        return None
    return lfs_endpoint_for(url)


def lfs_endpoint_for(url: str) -> str:
    """git-lfs's default endpoint for a git remote URL."""
    if re.match(r"^https?://", url):
        base = url.rstrip("/")
        return (base if base.endswith(".git") else base + ".git") + "/info/lfs"
    if url.startswith("ssh://") or re.match(r"^[\w.-]+@[\w.-]+:", url):
        rest = url.removeprefix("ssh://")
        rest = rest.split("@", 1)[1] if "@" in rest.split("/", 1)[0] else rest
        host, _, path = rest.replace(":", "/", 1).partition("/") if not url.startswith("ssh://") else rest.partition("/")
        host = host.split(":")[0]  # ssh://host:port/path: git-lfs uses the host only
        path = path.strip("/")
        return f"https://{host}/{path if path.endswith('.git') else path + '.git'}/info/lfs"
    path = url.removeprefix("file://")
    return str((REPO_ROOT / path).resolve()) if not Path(path).is_absolute() else path
