"""`zoo validate`: re-measure every variant of every entry, every time (what the ONNX Model Zoo's CI never did).

For each entry: obtain its files (configured LFS remotes; derived files no store has made from fp32 and checked
against the card; else a rebuild from its recipe in a scratch copy, so the checkout is never touched), check each
file's sha256 against the card (and whether a rebuild reproduced it), then run the checks its kind calls for
(zoo.variants.checks: onnx.checker, the stored test_data_set_* outputs, accuracy against the card minus its
tolerance, the int8 drop bound, other opsets, on-device training steps); and the manifest against the cards.
This module obtains, orchestrates and reports; `zoo evaluate` is its one-variant, no-checks sibling.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict
from pathlib import Path

from zoo import catalog
from zoo.cards import ModelCard, load_card
from zoo.catalog import Entry
from zoo.data import load_dataset
from zoo.errors import IntegrityError, ObjectNotFoundError, ZooError
from zoo.evaluate import accuracy
from zoo.fsutil import plural
from zoo.processes import StoppedError, stop_on_sigterm
from zoo.provenance import machine_differences
from zoo.reproduce import reproduce
from zoo.store.fetch import fetch, fetch_object
from zoo.pointer import Pointer, pointer_for, read_pointer
from zoo.kinds import kind_of, made_from_fp32
from zoo.variants.checks import EntryChecks, Row, load_test_sets, summary_line, variant_rows
from zoo.variants.make import derive, evaluation_data, inference_model
from zoo.variants.opsets import Origin

def _variant_of(card: ModelCard, rel: Path) -> str:
    for key, variant in card.variants.items():
        if str(rel) == variant.file or str(rel) in variant.extra_opsets.values():
            return key
    return "*"


def _derivation(card: ModelCard, rel: Path):
    """(variant key, opset or None) when the file is one `zoo fetch` makes from fp32, else None."""
    for key, variant in card.variants.items():
        if str(rel) == variant.file and made_from_fp32(key, variant):
            return key, None
        for opset, file in variant.extra_opsets.items():
            if str(rel) == file:
                return key, opset
    return None


class RebuildBudget:
    """Seconds of rebuilding left for the whole validation run, shared by the processes that validate entries side
    by side: a rebuild takes its card's build time out before it starts, so two processes never spend the same
    seconds. `None`: no limit."""

    def __init__(self, seconds: float | None, context=None):
        self.unlimited = seconds is None
        self._left = (context or multiprocessing).Value("d", 0.0 if seconds is None else float(seconds))
        # Rebuilds and reproductions train on both CPUs and add git worktrees: one at a time across the processes.
        self._one_at_a_time = (context or multiprocessing).Lock()

    def rebuilding(self):
        """Held while an entry is rebuilt or reproduced."""
        return self._one_at_a_time

    @property
    def left(self) -> float:
        return float("inf") if self.unlimited else self._left.value

    def take(self, seconds: float) -> bool:
        if self.unlimited:
            return True
        with self._left.get_lock():
            if seconds > self._left.value:
                return False
            self._left.value -= seconds
            return True


def _obtain(entry: Entry, scratch: Path, rows: list[Row], log,
            rebuild_budget: RebuildBudget | None = None) -> tuple[Path, ModelCard, str] | None:
    """A folder holding the entry's real files, the card describing them, and where they came from. Primaries and
    test data come from the stores; derived files a store lacks are made from fp32 and must match the card."""
    folder = scratch / entry.name
    folder.mkdir(parents=True)
    corrupt = False
    to_derive = []
    try:
        for path in sorted(p for p in entry.dir.rglob("*") if p.is_file() and p.name != "card.yaml"):
            rel = path.relative_to(entry.dir)
            pointer = read_pointer(path) or pointer_for(path)
            derivable = _derivation(entry.card, rel) is not None
            try:  # a derived file from a store, else made again below (never what this machine cached before)
                got, source, *_ = fetch_object(pointer, f"{entry.name}/{rel}", checkout_path=path, show_progress=False,
                                               cached=not derivable)
            except IntegrityError as exc:
                rows.append(Row(entry.name, _variant_of(entry.card, rel), "sha256", False, detail=str(exc)[:300]))
                corrupt = True
                continue
            except ObjectNotFoundError:
                if not derivable:
                    raise
                to_derive.append((rel, pointer))
                continue
            (folder / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(got, folder / rel)
    except ObjectNotFoundError as exc:
        training = entry.card.training
        if not training.recipe or (training.imported_from and not training.import_source):
            rows.append(Row(entry.name, "*", "obtain", False, detail=f"not in any store and cannot be rebuilt here: {exc}"))
            return None
        cost = training.build_time_s or 0.0
        if rebuild_budget is not None and not rebuild_budget.take(cost):
            rows.append(Row(entry.name, "*", "obtain", True, skipped=True,
                            detail=f"no store has it and its rebuild takes ~{cost:.0f} s (> the {rebuild_budget.left:.0f} s "
                                   "left of the run's rebuild budget): "
                                   "validated by `make validate-full` or against a published store"))
            return None
        log(f"[{entry.name}] not in any configured store: rebuilding from recipe {entry.card.training.recipe}")
    else:
        if corrupt:
            return None
        rows += _derive_rows(entry, folder, to_derive, log)
        return folder, entry.card, "store"
    shutil.rmtree(folder)
    with rebuild_budget.rebuilding() if rebuild_budget is not None else contextlib.nullcontext():
        rebuilt = _rebuild(entry, scratch)
    if isinstance(rebuilt, str):
        rows.append(Row(entry.name, "*", "obtain", False, detail=rebuilt))
        return None
    rows.append(Row(entry.name, "*", "obtain", True, detail="rebuilt from its recipe (no store had it)"))
    return rebuilt, load_card(rebuilt / "card.yaml"), "rebuilt"


def _derive_rows(entry: Entry, folder: Path, to_derive: list[tuple[Path, Pointer]], log) -> list[Row]:
    """Make the derived files no store had from the fetched fp32 file; each must have the card's sha256 (when this
    machine's CPU features and libraries are the build's; otherwise the difference is reported)."""
    rows = []
    fp32 = folder / entry.card.variants["fp32"].file
    origin = Origin.of(entry.card)
    t = entry.card.training
    for rel, pointer in to_derive:
        key, opset = _derivation(entry.card, rel)
        variant = entry.card.variants[key]
        # Kinds made from fp32 on any CPU must give the card's bytes wherever the libraries are the build's.
        comparable = not machine_differences(t, cpu_matters=opset is None and kind_of(key, variant).cpu_dependent)
        log(f"[{entry.name}] {rel}: not in the store, deriving it from fp32")
        target = folder / rel
        try:
            derive(key, variant, fp32, target, origin, opset)
        except Exception as exc:  # noqa: BLE001 - a failed derivation is a failed row
            rows.append(Row(entry.name, key, "derived", False, detail=f"{rel}: {str(exc)[:250]}"))
            continue
        got = pointer_for(target)
        same = got == pointer
        detail = (f"{rel} made from fp32: sha256 {'equals the card' if same else f'{got.oid} differs from {pointer.oid}'}")
        if not same and not comparable:
            detail += (" (this machine's libraries (or, for a CPU-dependent kind, CPU) differ from the build's: "
                       "reported, not failed)")
        rows.append(Row(entry.name, key, "derived", same or not comparable, detail=detail))
    return rows


def _rebuild(entry: Entry, scratch: Path) -> Path | str:
    """Run `zoo build` on a scratch copy of the entry's card: the folder, or the error text. It checks the current
    code's recipe run, not the card's bytes (those need the card's commit: `zoo reproduce`)."""
    entries = scratch / "rebuild"
    (entries / entry.name).mkdir(parents=True)
    shutil.copyfile(entry.dir / "card.yaml", entries / entry.name / "card.yaml")
    env = {**os.environ, "ZOO_ENTRIES": str(entries)}
    result = subprocess.run([sys.executable, "-m", "zoo.cli", "build", entry.name, "--allow-dirty"], env=env,
                            capture_output=True, text=True)
    if result.returncode != 0:
        return f"rebuild failed: {result.stderr.strip()[-500:]}"
    return entries / entry.name


def _reproduce(entry: Entry, scratch: Path, log) -> list[Row]:
    """Rebuild the card's recorded commit (`zoo reproduce`): every file's sha256 must equal the card's when this
    machine's CPU features and library versions are the build's; otherwise differences are reported, not failed.
    Accuracy must land within the card's tolerance (other bytes on another machine: the retraining band,
    ModelCard.accuracy_band)."""
    try:
        result = reproduce(entry, log, scratch=scratch)
    except ZooError as exc:
        return [Row(entry.name, "*", "reproduce", False, detail=str(exc)[:300])]
    rows = []
    for f in result.files:
        if f.same:
            detail = f"{f.file}: sha256 reproduced ({f.card_sha256})"
        else:
            detail = f"{f.file}: rebuilt {f.rebuilt_sha256}, card {f.card_sha256}"
            if not result.comparable:
                detail += " (expected: " + "; ".join(result.differences) + ")"
        rows.append(Row(entry.name, _variant_of(entry.card, Path(f.file)), "reproduce", f.same or not result.comparable,
                        detail=detail))
    examples = entry.card.dataset.splits.get("test", 0)
    for key, variant in entry.card.variants.items():
        new = result.rebuilt_card.variants.get(key)
        if variant.built and new is not None:
            claimed, measured = entry.card.metric(key), result.rebuilt_card.metric(key)
            retrained = not result.comparable and new.sha256 != variant.sha256
            band = entry.card.accuracy_band(key, examples, retrained)
            rows.append(Row(entry.name, key, "reproduce accuracy", measured >= claimed - band, measured,
                            claimed, detail=f"rebuilt at {result.commit[:12]}, tolerance {band:.4g}"))
    return rows


def validate_entry(entry: Entry, scratch: Path, log=print, rebuild_budget: float | RebuildBudget | None = None,
                   reproduce_budget: float = 0.0) -> list[Row]:
    if rebuild_budget is not None and not isinstance(rebuild_budget, RebuildBudget):
        rebuild_budget = RebuildBudget(rebuild_budget)
    rows: list[Row] = []
    card = entry.card
    built = {k: v for k, v in card.variants.items() if v.built}
    if not built:
        return [Row(entry.name, "*", "built", True, planned=True,
                    detail="not built: the card lists planned variants, nothing to measure (not counted as a pass)")]
    obtained = _obtain(entry, scratch, rows, log, rebuild_budget)
    if obtained is None:
        return rows
    folder, measured_card, source = obtained
    cheap = (entry.card.training.build_time_s or float("inf")) <= reproduce_budget
    if source == "store" and cheap and not entry.card.training.imported_from and entry.card.training.git_commit:
        with rebuild_budget.rebuilding() if rebuild_budget is not None else contextlib.nullcontext():
            rows += _reproduce(entry, scratch, log)
    test_sets = load_test_sets(folder)
    rows.append(Row(entry.name, "*", "test data", bool(test_sets), detail=plural(len(test_sets), "test_data_set") if test_sets
                    else "no test_data_set_* folder: the stored reference outputs are missing"))
    data = load_dataset(card.dataset.name)
    split = data.test
    differences = machine_differences(card.training) if source == "rebuilt" else []
    retrained_elsewhere = source == "rebuilt" and bool(differences) and any(
        measured_card.variants.get(k) is None or measured_card.variants[k].sha256 != v.sha256 for k, v in built.items())
    checks = EntryChecks(card, measured_card, folder, scratch, split.x.numpy(), split.y.numpy(), test_sets,
                         retrained_elsewhere, data.onnx_metadata)
    for key, variant in built.items():
        path = folder / variant.file
        new = measured_card.variants.get(key)
        if source == "rebuilt":
            same = new is not None and new.sha256 == variant.sha256
            rows.append(Row(entry.name, key, "sha256", True, detail="rebuild reproduced the card's sha256" if same
                            else "rebuild gave different bytes; accuracy decides" +
                            (f" ({'; '.join(differences)})" if differences else "")))
        else:
            actual = pointer_for(path)
            same = (actual.oid, actual.size) == (variant.sha256, variant.size)
            rows.append(Row(entry.name, key, "sha256", same, detail=f"equals the card's ({variant.sha256})" if same else
                            f"file sha256 {actual.oid} ({actual.size} bytes) differs from the card's sha256 "
                            f"{variant.sha256} ({variant.size} bytes)"))
        rows += variant_rows(checks, key, variant)
    return rows


def evaluate_variant(name: str, variant: str = "fp32", split: str = "test", show_progress: bool = True) -> dict:
    """`zoo evaluate`: fetch a catalog variant (verified) and measure its accuracy on a split of the data its card
    metric is measured on (the card's dataset; a retraining recipe's data for retrained variants)."""
    card = catalog.get_card(name)
    fetched = fetch(name, variant, show_progress=show_progress)
    spec = card.variants[variant]
    x, y = evaluation_data(card, spec, split)
    with inference_model(fetched.path, kind_of(variant, spec)) as model:
        measured = accuracy(model, x, y)
    claimed = card.metric(variant)
    return {"name": name, "variant": variant, "split": split, "accuracy": measured, "card": claimed,
            "delta": None if claimed is None else measured - claimed, "path": str(fetched.path), "source": fetched.source}


def validate(names: list[str] | None = None, log=print, rebuild_budget: float | None = None,
             reproduce_budget: float = 0.0, jobs: int = 1) -> tuple[list[Row], float]:
    """Validate the entries (default: all). `jobs` > 1 validates that many entries side by side, each in a process of
    its own (every onnxruntime session runs one thread, so a 2-core machine measures two entries at once); the rows
    come back in the same order either way, and the rebuild budget is shared."""
    started = time.perf_counter()
    catalog.reload()
    targets = names or catalog.list_models()
    rows: list[Row] = []
    committed = catalog.manifest_path()
    current = committed.exists() and committed.read_text() == catalog.manifest_text()
    rows.append(Row("*", "*", "manifest", current, detail=f"{committed.name} matches the cards" if current else
                    f"{committed.name} differs from the cards: run `zoo manifest` and commit it"))
    # A broken card fails its own entry here; the others are validated as usual.
    rows += [Row(name, "*", "card", False, detail=error[:300]) for name, error in catalog.broken().items()
             if not names or name in names]
    targets = [n for n in targets if n not in catalog.broken()]
    # The rebuild budget is for the whole run: cheapest entries first, each rebuild spends its card's build time
    # (side by side, the entries start in order of measuring_work instead).
    targets = sorted(targets, key=lambda n: catalog.get_card(n).training.build_time_s or float("inf"))
    with tempfile.TemporaryDirectory(prefix="zoo-validate-") as tmp:
        if jobs <= 1 or len(targets) <= 1:
            budget = RebuildBudget(rebuild_budget)
            for name in targets:
                rows += _validate_named(name, Path(tmp), budget, reproduce_budget, log)
        else:
            # spawn, not fork: the parent has torch's and onnxruntime's thread pools, which a forked child inherits broken.
            context = multiprocessing.get_context("spawn")
            budget = RebuildBudget(rebuild_budget, context)
            with ProcessPoolExecutor(jobs, mp_context=context, initializer=_worker_init, initargs=(budget,)) as pool:
                try:
                    # The longest measurements start first, so the last one does not run alone at the end.
                    submitted = {name: pool.submit(_validate_in_worker, name, Path(tmp), reproduce_budget)
                                 for name in sorted(targets, key=measuring_work, reverse=True)}
                    for name in targets:  # rows in the order one process gives them
                        rows += submitted[name].result()
                except BaseException:  # stopped (SIGTERM, Ctrl-C): no entry starts, none goes on, then tmp goes
                    for worker in multiprocessing.active_children():  # a rebuild's child is stopped with it
                        worker.terminate()
                    pool.shutdown(wait=False, cancel_futures=True)
                    raise
    return rows, time.perf_counter() - started


def measuring_work(name: str) -> int:
    """How much inference validating an entry takes, to order side-by-side validation: parameters x test examples x
    built variants (each variant predicts the whole test split; a BERT entry takes minutes on one thread, a CNN entry
    seconds besides its reproduction build)."""
    card = catalog.get_card(name)
    return card.num_params * card.dataset.splits.get("test", 0) * sum(1 for v in card.variants.values() if v.built)


_WORKER_BUDGET: RebuildBudget | None = None


def _worker_init(budget: RebuildBudget) -> None:
    global _WORKER_BUDGET
    _WORKER_BUDGET = budget


def _validate_in_worker(name: str, scratch: Path, reproduce_budget: float) -> list[Row]:
    """One entry in a worker of `validate --jobs`. Terminated by the parent (stopped) while it validates, its
    with-blocks (a rebuild's worktree) clean up and the worker ends, so it starts no entry already queued for it;
    idle, it ends at once (Python's default)."""
    stop_on_sigterm()
    try:
        return _validate_named(name, scratch, None, reproduce_budget)
    except StoppedError:
        os._exit(StoppedError.exit_code)
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _print_err(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _validate_named(name: str, scratch: Path, budget: RebuildBudget | None, reproduce_budget: float,
                    log=_print_err) -> list[Row]:
    entry = catalog.get_entry(name)
    log(f"[{name}] validating")
    return validate_entry(entry, scratch, log, budget or _WORKER_BUDGET, reproduce_budget)


def markdown_report(rows: list[Row], seconds: float) -> str:
    lines = ["# Validation report", "", summary_line(rows, seconds), "",
             "| entry | variant | check | verdict | measured | card | delta | detail |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in sorted(rows, key=lambda r: r.ok):
        fmt = lambda v: "" if v is None else f"{v:.4f}"  # noqa: E731
        lines.append(f"| {r.entry} | {r.variant} | {r.check} | {r.verdict} | {fmt(r.measured)} | "
                     f"{fmt(r.card)} | {'' if r.delta is None else f'{r.delta:+.4f}'} | {r.detail} |")
    return "\n".join(lines) + "\n"


def rows_json(rows: list[Row], seconds: float) -> str:
    return json.dumps({"seconds": seconds, "passed": all(r.ok for r in rows),
                       "rows": [{**asdict(r), "delta": r.delta, "verdict": r.verdict}
                                for r in sorted(rows, key=lambda r: r.ok)]}, indent=2)
