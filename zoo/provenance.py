"""Where a build came from: the clean git commit it ran at and the CPU whose kernels computed it.

A card's sha256 is a promise that these bytes come back when the card's commit is built again on the same kind
of CPU with the same libraries. So a build records the commit *before* it starts (the files it writes must not
change the stamp), refuses a tree with other uncommitted changes, and names the CPU features that change
floating-point and int8 results (AVX2/FMA, AVX-512, VNNI, AMX).
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from zoo.config import REPO_ROOT
from zoo.errors import ZooError

# Set by `zoo build` for the processes it starts: every file of one build is stamped with one commit.
COMMIT_ENV = "ZOO_SOURCE_COMMIT"
DIRTY_SUFFIX = "-dirty"
# /proc/cpuinfo flags that select different onnxruntime / torch kernels (and so can change bytes and int8 results).
NUMERIC_FLAGS = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni",
                 "avx512_bf16", "avx512_fp16", "avx_vnni", "amx_tile", "amx_int8", "amx_bf16")


# Builds pin torch's CPU kernels (ATen dispatch, MKL, oneDNN) to AVX2, the zoo's baseline CPU: measured here, the same
# recipe trained on one AVX-512 machine gave other fp32 bytes with native dispatch than with these set, so without
# them a build on an AVX-512 CPU could never be reproduced on an AVX2 one. onnxruntime's kernels (test data outputs,
# PTQ calibration, federated clients) cannot be pinned: cards record the CPU flags for those.
KERNEL_ENV = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2",
              "MKL_ENABLE_INSTRUCTIONS": "AVX2"}
KERNELS = "torch pinned to avx2 (ATEN_CPU_CAPABILITY, MKL_CBWR, ONEDNN_MAX_CPU_ISA); onnxruntime native"


def build_environment(threads: int, commit: str) -> dict[str, str]:
    """The environment of a build's processes: fixed threads, the recorded commit, pinned torch kernels."""
    return {**os.environ, "OMP_NUM_THREADS": str(threads), COMMIT_ENV: commit, **KERNEL_ENV}


def _git(*args: str, root: Path = REPO_ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=30)


@dataclass(frozen=True)
class TreeState:
    commit: str | None  # None: not a git checkout
    changed: tuple[str, ...]  # paths (relative to the repository root) with uncommitted changes, untracked included

    def outside(self, allowed: list[Path]) -> list[str]:
        """Changed paths that are not under any of `allowed` (absolute paths)."""
        keep = []
        for rel in self.changed:
            path = (REPO_ROOT / rel).resolve()
            if not any(path == a or path.is_relative_to(a) for a in allowed):
                keep.append(rel)
        return keep


def tree_state(root: Path = REPO_ROOT) -> TreeState:
    try:
        head = _git("rev-parse", "HEAD", root=root)
        status = _git("status", "--porcelain", "--untracked-files=all", "-z", root=root)
    except (OSError, subprocess.TimeoutExpired):
        return TreeState(None, ())
    if head.returncode != 0:
        return TreeState(None, ())
    changed = []
    records = iter(status.stdout.split("\0"))
    for record in records:
        if not record:
            continue
        code, path = record[:2], record[3:]
        if "R" in code or "C" in code:  # renames carry the old path as the next record
            next(records, None)
        changed.append(path)
    return TreeState(head.stdout.strip(), tuple(changed))


def source_commit() -> str:
    """The commit to stamp into files: the one a build recorded (COMMIT_ENV), else HEAD (+ '-dirty')."""
    if os.environ.get(COMMIT_ENV):
        return os.environ[COMMIT_ENV]
    state = tree_state()
    if state.commit is None:
        return "unknown"
    return state.commit + (DIRTY_SUFFIX if state.changed else "")


def require_clean(allowed: list[Path], allow_dirty: bool) -> tuple[str, bool]:
    """(commit to record, reproducible) for a build that writes only under `allowed`.

    A tree with other uncommitted changes is refused unless `allow_dirty`, which records the build as not
    reproducible (its stamp says '-dirty': nobody can check out what produced it)."""
    state = tree_state()
    if state.commit is None:
        if allow_dirty:
            return "unknown", False
        raise ZooError(f"{REPO_ROOT} is not a git checkout: a build records the commit it ran from; "
                       "build from a clone, or pass --allow-dirty (recorded as not reproducible)")
    stray = state.outside([p.resolve() for p in allowed])
    if not stray:
        return state.commit, True
    if allow_dirty:
        return state.commit + DIRTY_SUFFIX, False
    shown = ", ".join(stray[:5]) + (f" and {len(stray) - 5} more" if len(stray) > 5 else "")
    raise ZooError(f"uncommitted changes outside the entries being built ({shown}): commit or stash them so the "
                   "card's commit reproduces these bytes, or pass --allow-dirty (recorded as not reproducible)")


def cpu_info() -> dict:
    """The CPU model and the numerics-relevant ISA flags of this machine."""
    model, flags = platform.processor() or platform.machine(), set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key == "model name":
                model = value.strip()
            elif key == "flags":
                flags = set(value.split())
                break
    except OSError:
        pass
    return {"model": model, "flags": [f for f in NUMERIC_FLAGS if f in flags], "kernels": KERNELS}


def int8_peak(flags: list[str] | set[str] | None = None) -> tuple[float, str]:
    """The most int8 can gain over fp32 on this CPU (or one with `flags`): the ratio of multiply-accumulates per cycle
    of the int8 kernels onnxruntime's MLAS runs here to its fp32 ones, from the best instructions the CPU has, and
    what they are. Counted in multiplying instructions on vectors of the same width (an accumulating add runs on the
    integer adders beside them): AMX's TDPBUSD does 1,024 int8 MACs a cycle against AVX-512's 32 fp32 FMAs (32x);
    VNNI's VPDPBUSD does 4 int8 MACs per 32-bit lane in one instruction, FMA 1 (4x); without VNNI, VPMADDUBSW then
    VPMADDWD take two for those 4 MACs (2x). Measured: on an AVX2-only EPYC, int8-qat ran up to 1.64x the fused fp32
    file with a fifth of its time outside matrix products, more than a 4/3x peak (the three instructions VPMADDUBSW +
    VPMADDWD + VPADDD counted alike) would allow (benchmarks/results/latency.md)."""
    have = set(cpu_info()["flags"] if flags is None else flags)
    return next((peak, instructions) for _, needs, peak, instructions in _INT8_TIERS if needs <= have)


# The instructions onnxruntime's int8 kernels use, best first: (name, flags it needs, int8:fp32 MACs per cycle, what).
_INT8_TIERS = [
    ("AMX", {"amx_tile", "amx_int8"}, 32.0, "AMX TDPBUSD (1,024 int8 MACs a cycle) vs AVX-512 FMA (32 fp32)"),
    ("AVX-512 VNNI", {"avx512_vnni"}, 4.0, "AVX512-VNNI VPDPBUSD (4 int8 MACs per 32-bit lane) vs AVX-512 FMA (1)"),
    ("AVX-VNNI", {"avx_vnni"}, 4.0, "AVX-VNNI VPDPBUSD (4 int8 MACs per 32-bit lane) vs AVX2 FMA (1)"),
    ("AVX-512BW", {"avx512bw"}, 2.0,
     "AVX-512BW VPMADDUBSW + VPMADDWD (4 int8 MACs per 32-bit lane in 2 multiplying instructions) vs FMA (1)"),
    ("AVX2", {"avx2"}, 2.0, "AVX2 VPMADDUBSW + VPMADDWD (4 int8 MACs per 32-bit lane in 2 multiplying instructions) vs FMA (1)"),
    ("SSE", set(), 2.0, "SSE PMADDUBSW + PMADDWD (4 int8 MACs per 32-bit lane in 2 multiplying instructions) vs MULPS (1)"),
]


def cpu_kind(cpu: dict) -> str:
    """A CPU (cpu_info's record) in a few words: its model and the best instructions its int8 kernels use."""
    have = set(cpu.get("flags", []))
    return f"{cpu.get('model', 'an unrecorded CPU')}, {next(name for name, needs, _, _ in _INT8_TIERS if needs <= have)}"


def machine_differences(training, cpu_matters: bool = True) -> list[str]:
    """How this machine differs from a card's build record (`training`: its CPU flags and library versions): empty
    when the same bytes are promised here. The CPU model name may differ; `cpu_matters=False` for files whose bytes
    do not depend on the CPU (the kinds made from fp32 on any CPU: only the libraries count)."""
    cpu = training.cpu.model_dump() if training.cpu else None
    library_versions = training.library_versions
    here = cpu_info()["flags"]
    differences = []
    if cpu_matters and (cpu is None or sorted(cpu.get("flags", [])) != sorted(here)):
        differences.append(f"CPU flags {' '.join(here)} vs the build's "
                           f"{' '.join(cpu['flags']) if cpu else 'unrecorded'}")
    current = current_versions()
    differences += [f"{k} {current.get(k)} vs the build's {v}" for k, v in library_versions.items()
                    if current.get(k) != v]
    return differences


def current_versions() -> dict[str, str]:
    """The versions a card's build records (training.library_versions): they decide the bytes with the CPU. Read
    from the installed distributions' metadata (the modules' own __version__), without importing them."""
    return dict(_installed_versions())


@cache
def _installed_versions() -> dict[str, str]:
    # Mapping modules to distributions reads every installed package's file list: about 1.4 s, once per process.
    providers = importlib.metadata.packages_distributions()
    versions = {"python": platform.python_version()}
    for module in ("torch", "onnx", "onnxruntime", "torchao"):
        for dist in providers.get(module, []):
            versions[module] = importlib.metadata.version(dist)
            break
    return versions


def commit_available(commit: str, root: Path = REPO_ROOT) -> bool:
    return _git("cat-file", "-e", f"{commit}^{{commit}}", root=root).returncode == 0


def last_commit(path: Path, root: Path = REPO_ROOT) -> str | None:
    """The commit that last changed `path` (None outside a git checkout or for a file never committed)."""
    result = _git("log", "-1", "--format=%H", "--", str(path), root=root)
    return result.stdout.strip() or None if result.returncode == 0 else None
