"""The recipe as the last mirror: when no store has a file the training run makes (fp32, int8-qat), `zoo fetch` can
run the card's training command at the card's recorded commit (a git worktree, like `zoo reproduce`) and verify the
result like a download. An imported entry whose card names an installed upstream checkpoint (`import_source`) first
has that checkpoint converted by the commit's own code, then runs the command `zoo import` ran (`init_from`).

- Same sha256 as the card: admitted to the cache as that object, indistinguishable from a download (and every other
  file of the run that matches its card sha256 with it, so the int8 file of the same run is not built again).
- Other bytes (another CPU or library version than the card records): never cached under the card's sha256. Kept as
  a *local build* under $ZOO_HOME/local-builds, served only if the run's own measurement of the entry's test set is
  within the card's tolerance (on another CPU or libraries: the retraining band, ModelCard.accuracy_band), and
  reported as "rebuilt locally: differs from the published bytes (…)".

Never silent: the policy is `--build` / `--no-build` on the command line, else ZOO_BUILD_ON_MISS (ask, always, never;
default ask: a question on a terminal, a refusal saying how to allow it elsewhere). Concurrent fetches wait on the
object's download lock and then on one lock per entry build, so one process builds. The run writes into
$ZOO_HOME/builds/<entry>-<commit>/run with the recipe's checkpoints: a killed build resumes from its last checkpoint
on the next fetch; nothing reaches the cache or the local builds before it is complete and verified.
"""

from __future__ import annotations

import json
import math
import os
import shlex
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import typer

from zoo import faults
from zoo.cards import ModelCard
from zoo.catalog import Entry
from zoo.config import zoo_home
from zoo.errors import IntegrityError, ObjectNotFoundError, ZooError
from zoo.fsutil import atomic_copy, atomic_write_text, plural
from zoo.processes import run_stoppable
from zoo.provenance import build_environment, cpu_info, machine_differences
from zoo.recipes import command_processes, entry_training_command, load_recipe
from zoo.reproduce import card_worktree, require_card_commit
from zoo.store.cache import ObjectCache
from zoo.pointer import Pointer, pointer_for, sha256_file
from zoo.run_summary import RunSummary

POLICY_ENV = "ZOO_BUILD_ON_MISS"
POLICIES = ("ask", "always", "never")
# ZOO_TEST_FAULT=build-cpu@0: the recipe build runs torch's kernels as a CPU without AVX would (scalar ATen kernels,
# oneDNN limited to SSE4.1), so the "rebuilt locally: differs" path can be shown on the card's own kind of machine.
OLD_CPU_KERNELS = {"ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "SSE41", "MKL_CBWR": "COMPATIBLE",
                   "MKL_ENABLE_INSTRUCTIONS": "SSE4_2"}


def policy(allow: bool | None) -> str:
    """always / never / ask: the command line's --build/--no-build, else ZOO_BUILD_ON_MISS (default ask)."""
    if allow is not None:
        return "always" if allow else "never"
    value = os.environ.get(POLICY_ENV, "ask").strip().lower() or "ask"
    if value not in POLICIES:
        raise ZooError(f"{POLICY_ENV}={value!r} is not one of {', '.join(POLICIES)}: set it to one of them or unset it")
    return value


IMPORTED_WEIGHTS = "<the converted upstream checkpoint>"


def training_command(card: ModelCard, init_from: str = IMPORTED_WEIGHTS) -> list[str] | None:
    """The torchrun command that makes the card's training files: the card's own when it is a plain `torchrun
    launchers/…` run; for an imported entry whose upstream checkpoint the card names (`import_source`), the command
    `zoo import` ran after converting that checkpoint (`init_from`: where the conversion wrote it). None: nothing
    to run (an import from a checkpoint only its maintainer has)."""
    t = card.training
    command = shlex.split(t.command or "")
    if command[:2] == ["zoo", "import"]:
        if not (t.import_source and t.recipe):
            return None
        return entry_training_command(t.recipe, card.architecture, command_processes(t.command), card.trainable,
                                      init_from)
    if not command or command[0] != "torchrun" or not any(a.startswith("launchers/") for a in command):
        return None
    return command


def buildable(card: ModelCard) -> bool:
    """`zoo fetch --build` can make this card's training files: a clean recorded commit and a command to run."""
    t = card.training
    return bool(t.git_commit) and t.reproducible is not False and training_command(card) is not None


def training_flops(card: ModelCard) -> float | None:
    """Training compute of the card's recipe, 6 x parameters x tokens (Kaplan et al. 2020), QAT steps included."""
    if not card.training.recipe:
        return None
    recipe = load_recipe(card.training.recipe, model=card.architecture)
    examples = (recipe.steps * recipe.global_batch_size if recipe.steps
                else recipe.epochs * card.dataset.splits.get("train", 0))
    if recipe.quantization.scheme == "qat-int8":
        examples += recipe.quantization.qat_steps * recipe.global_batch_size
    tokens = 1
    for dim in card.inputs[0].shape:
        tokens *= dim if isinstance(dim, int) else 1
    return 6.0 * card.num_params * examples * tokens


def build_estimate(card: ModelCard, others: dict) -> str:
    """An unbuilt entry's build time, scaled by training compute from the largest built entry of its family."""
    flops = training_flops(card)
    refs = [(training_flops(e.card), e.card) for e in others.values()
            if e.card.family == card.family and e.card.training.build_time_s and e.card.name != card.name]
    refs = [(f, ref) for f, ref in refs if f]
    if not flops:
        return ""
    compute = f"training compute about {flops / 1e15:.3g} PFLOP (6 x parameters x tokens)"
    if not refs:
        return compute
    ref_flops, ref = max(refs, key=lambda r: r[0])
    cpu = f" on {ref.training.cpu.model}" if ref.training.cpu else ""
    return (f"{compute}, {flops / ref_flops:.0f}x "
            f"{ref.name}'s, whose whole build took {ref.training.build_time_s:.0f} s{cpu} with "
            f"{plural(command_processes(ref.training.command), 'process')} x {plural(ref.training.threads or 1, 'thread')}: "
            f"about {ref.training.build_time_s * flops / ref_flops / 3600:.1f} hours on that CPU, scaled by compute "
            "(no GPU build has been measured)")


def build_took(training) -> str:
    """How long the card says its build took, on what (the hints and the build-on-miss plan say it)."""
    if not training.build_time_s:
        return "the card records no build time"
    return (f"the card's build took {training.build_time_s:.0f} s on "
            f"{training.cpu.model if training.cpu else 'its CPU'} ({plural(training.threads or 1, 'thread')} per process)")


def plan(entry: Entry) -> str:
    """What a build on a miss would do, and how long the card says it took."""
    t = entry.card.training
    convert = f"convert {t.import_source}, then " if t.import_source and t.imported_from else ""
    return f"at commit {t.git_commit[:12]}: {convert}`{t.command}` in a git worktree; {build_took(t)}"


@dataclass
class LocalBuild:
    """A rebuilt file whose bytes differ from the card's: where it is, and why it is still served."""

    entry: str
    variant: str
    card_sha256: str
    sha256: str
    size: int
    file: str  # its name in the record's folder
    commit: str
    cpu: str
    differences: list[str]
    accuracy: float
    card_accuracy: float
    tolerance: float

    def describe(self) -> str:
        why = "; ".join(self.differences) or "same CPU flags and libraries as the card's build"
        return (f"rebuilt locally: differs from the published bytes (CPU {self.cpu}; {why}), accuracy "
                f"{self.accuracy:.4f} vs card {self.card_accuracy:.4f} (tolerance {self.tolerance})")


def _local_dir(card_sha256: str) -> Path:
    return zoo_home() / "local-builds" / card_sha256


def local_build(card_sha256: str) -> tuple[Path, LocalBuild] | None:
    """The local build kept for a card object, if one is there and its file still has the recorded bytes."""
    folder = _local_dir(card_sha256)
    try:
        record = LocalBuild(**json.loads((folder / "local-build.json").read_text()))
    except (OSError, ValueError, TypeError):
        return None
    path = folder / record.file
    if not path.is_file() or path.stat().st_size != record.size or sha256_file(path) != record.sha256:
        return None
    return path, record


def build_on_miss(entry: Entry, key: str, pointer: Pointer, label: str, missing: ObjectNotFoundError,
                  allow: bool | None, log) -> tuple[Path, str]:
    """(path, source) of `key` built from the recipe, or `missing` re-raised when the policy or the entry forbids it."""
    kept = local_build(pointer.oid)
    if kept is not None:
        return kept[0], kept[1].describe()
    if not buildable(entry.card):
        raise missing
    decided = policy(allow)
    if decided == "never":
        raise missing
    what = f"{label} is in no store; it can be built from its recipe {plan(entry)}"
    if decided == "ask":
        if not (sys.stdin.isatty() and sys.stderr.isatty()):
            raise ObjectNotFoundError(f"{missing}\nNot on a terminal, `zoo fetch` builds only when told: pass --build "
                                      f"(or set {POLICY_ENV}=always)") from None
        if not typer.confirm(f"{what}. Build it now?", default=False, err=True):
            raise missing
    else:
        log(f"{what}; building it (--build / {POLICY_ENV}=always)")
    cache = ObjectCache()
    commit = require_card_commit(entry)
    folder = zoo_home() / "builds" / f"{entry.name}-{commit[:12]}"
    with cache.lock(f"build-{entry.name}-{commit}"):
        # Another fetch may have built it (or another file of the same run) while this one waited.
        if (hit := cache.get(pointer)) is not None:
            return hit, "cache"
        if (kept := local_build(pointer.oid)) is not None:
            return kept[0], kept[1].describe()
        out = _run(entry, commit, folder, log)
        result = _admit(entry, key, pointer, out, commit, log)
    shutil.rmtree(folder, ignore_errors=True)  # complete: the checkpoints are not needed any more
    return result


def _run(entry: Entry, commit: str, folder: Path, log) -> Path:
    """Run the card's training command at `commit` into folder/run (resuming from its checkpoints)."""
    t = entry.card.training
    out = folder / "run"
    if (out / "summary.json").is_file():  # a finished run whose files were not admitted yet (killed right after it)
        try:
            RunSummary.read(out)
            return out
        except (OSError, ValueError):  # unreadable or incomplete: run again
            pass
    env = build_environment(t.threads or 1, commit)
    if faults.armed("build-cpu") is not None:
        env |= OLD_CPU_KERNELS
    resuming = (out / "checkpoints").is_dir()
    with card_worktree(commit, folder / "src") as worktree:
        env["PYTHONPATH"] = str(worktree)
        env.pop("ZOO_ENTRIES", None)  # the recipe and model come from the commit's own tree
        command = training_command(entry.card, _convert(entry, worktree, env) if t.import_source else IMPORTED_WEIGHTS)
        log(f"[{entry.name}] {'resuming' if resuming else 'running'} `{shlex.join(command)}` at {commit[:12]} "
            f"(run folder {out})")
        full = [str(Path(sys.executable).with_name("torchrun")), *command[1:], "--output-dir", str(out), "--resume"]
        # stdout is the caller's (--json); a SIGTERM stops the ranks and keeps the checkpoints to resume from
        done = run_stoppable(full, f"building '{entry.name}' (checkpoints kept in {out})", cwd=worktree, env=env,
                             stdout=sys.stderr)
    if done.returncode != 0:
        raise ZooError(f"building '{entry.name}' from its recipe failed (exit {done.returncode}, output above); "
                       f"its checkpoints stay in {out}: fetch again to resume")
    return out


def _convert(entry: Entry, worktree: Path, env: dict) -> str:
    """An imported entry's first step, by the commit's own code: its upstream checkpoint (installed by `make setup`)
    converted and parity-checked (zoo.importer); returns where the weights were written."""
    script = ("import sys\nfrom zoo.importer import convert, resolve_source\n"
              "print(convert(resolve_source(sys.argv[1]).resolve(), sys.argv[2])[0])")
    done = subprocess.run([sys.executable, "-c", script, entry.card.training.import_source, entry.name], cwd=worktree,
                          env=env, capture_output=True, text=True)
    if done.returncode != 0:
        error = (done.stderr.strip().splitlines() or ["(no output)"])[-1].removeprefix("zoo.errors.ZooError: ")
        raise ZooError(f"building '{entry.name}': its upstream checkpoint {entry.card.training.import_source} could "
                       f"not be converted: {error}")
    return done.stdout.strip().splitlines()[-1]


def _admit(entry: Entry, key: str, pointer: Pointer, out: Path, commit: str, log) -> tuple[Path, str]:
    """Every file of the run the card lists: cached when it has the card's bytes, else kept as a local build when its
    accuracy is within the card's tolerance (the retraining band on another machine); then the requested one, or why
    it cannot be served."""
    summary = RunSummary.read(out)
    if key not in summary.variants:
        raise ZooError(f"the recipe run of '{entry.name}' made no '{key}' file (it made {', '.join(summary.variants)})")
    cache = ObjectCache()
    served: dict[str, tuple[Path, str]] = {}
    refused: dict[str, str] = {}
    for other, made in summary.variants.items():
        spec = entry.card.variants.get(other)
        if spec is None or not spec.built or not (out / made.file).is_file():
            continue
        card = Pointer(spec.sha256, spec.size)
        path = out / made.file
        got = pointer_for(path)
        if got == card:
            log(f"[{entry.name}] {other}: sha256 {got.oid[:12]}… equals the card's: cached as the published object")
            served[other] = (cache.get(card) or cache.admit(path, card),
                             f"built from its recipe at {commit[:12]} (same sha256 as the card)")
            continue
        record = _local_record(entry, other, card, got, Path(made.file).name, made.accuracy, commit,
                               entry.card.dataset.splits.get(summary.eval_split, 0))
        if math.isnan(record.card_accuracy) or record.accuracy < record.card_accuracy - record.tolerance:
            refused[other] = record.describe()
            continue
        folder = _local_dir(card.oid)
        folder.mkdir(parents=True, exist_ok=True)
        atomic_copy(path, folder / record.file)
        atomic_write_text(folder / "local-build.json", json.dumps(asdict(record), indent=2) + "\n")  # last
        log(f"[{entry.name}] {other}: {record.describe()}; kept in {folder}, never under the card's sha256")
        served[other] = (folder / record.file, record.describe())
    if key in served:
        return served[key]
    raise IntegrityError(f"{entry.name} {key} {refused.get(key, 'was not made by the run')}: outside the card's "
                         "tolerance, so it is not kept (nothing was cached)")


def _local_record(entry: Entry, key: str, card: Pointer, got: Pointer, file: str, accuracy: float,
                  commit: str, examples: int) -> LocalBuild:
    t = entry.card.training
    differences = machine_differences(t)
    if faults.armed("build-cpu") is not None:
        differences.append("torch kernels of a CPU without AVX (ZOO_TEST_FAULT build-cpu) vs the build's AVX2")
    card_accuracy = entry.card.metric(key)
    band = entry.card.accuracy_band(key, examples, retrained=bool(differences))
    return LocalBuild(entry.name, key, card.oid, got.oid, got.size, file, commit, cpu_info()["model"], differences,
                      round(accuracy, 6), float("nan") if card_accuracy is None else card_accuracy, round(band, 6))
