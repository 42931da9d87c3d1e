"""`zoo validate`: re-measure every variant of every entry, every time (what the ONNX Model Zoo's CI never did).

For each entry: obtain its files (configured LFS remotes, else a rebuild from its recipe in a scratch copy,
so the checkout is never touched), then for each variant on the card:
  sha256 against the card (and whether a rebuild reproduced it), onnx.checker full check,
  the stored test_data_set_* through onnxruntime (fp32/fp16 outputs within tolerance; int8 by labels),
  accuracy on the evaluation split against the card (minus its tolerance) and the int8 drop vs fp32,
  every extra opset giving the reference predictions; and the manifest against the cards.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from zoo import catalog
from zoo.cards import ModelCard, load_card
from zoo.catalog import Entry
from zoo.cards import from_fp32
from zoo.derived import Origin, derive, evaluation_data
from zoo.errors import IntegrityError, ObjectNotFoundError, ZooError
from zoo.provenance import machine_differences
from zoo.reproduce import reproduce
from zoo.store.fetch import fetch_object
from zoo.store.pointer import Pointer, pointer_for, read_pointer

OUTPUT_RTOL = OUTPUT_ATOL = 1e-3
FP16_ATOL = 2e-2  # fp16 arithmetic: logits agree to about 1e-2
INT8_LABEL_AGREEMENT = 0.9
MAX_INT8_DROP = 0.005


@dataclass
class Row:
    entry: str
    variant: str
    check: str
    ok: bool
    measured: float | None = None
    card: float | None = None
    detail: str = ""
    skipped: bool = False  # not measured this run (said so in the report), never silently

    @property
    def verdict(self) -> str:
        return "skip" if self.skipped else "pass" if self.ok else "FAIL"

    @property
    def delta(self) -> float | None:
        return None if self.measured is None or self.card is None else self.measured - self.card


def _variant_of(card: ModelCard, rel: Path) -> str:
    for key, variant in card.variants.items():
        if str(rel) == variant.file or str(rel) in variant.extra_opsets.values():
            return key
    return "*"


def _derivation(card: ModelCard, rel: Path):
    """(variant key, opset or None) when the file is one `zoo fetch` makes from fp32, else None."""
    for key, variant in card.variants.items():
        if str(rel) == variant.file and from_fp32(key, variant):
            return key, None
        for opset, file in variant.extra_opsets.items():
            if str(rel) == file:
                return key, opset
    return None


def _obtain(entry: Entry, scratch: Path, rows: list[Row], log,
            rebuild_budget: float | None = None) -> tuple[Path, ModelCard, str] | None:
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
            try:
                got, source, _ = fetch_object(pointer, f"{entry.name}/{rel}", checkout_path=path, show_progress=False)
            except IntegrityError as exc:
                rows.append(Row(entry.name, _variant_of(entry.card, rel), "sha256", False, detail=str(exc)[:300]))
                corrupt = True
                continue
            except ObjectNotFoundError:
                if _derivation(entry.card, rel) is None:
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
        if rebuild_budget is not None and cost > rebuild_budget:
            rows.append(Row(entry.name, "*", "obtain", True, skipped=True,
                            detail=f"no store has it and its rebuild takes ~{cost:.0f} s (> the {rebuild_budget:.0f} s "
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
    comparable = not machine_differences(t.cpu.model_dump() if t.cpu else None, t.library_versions)
    for rel, pointer in to_derive:
        key, opset = _derivation(entry.card, rel)
        variant = entry.card.variants[key]
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
            detail += " (this machine's CPU or libraries differ from the build's: reported, not failed)"
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
    Accuracy must land within the card's tolerance either way."""
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
    for key, variant in entry.card.variants.items():
        new = result.rebuilt_card.variants.get(key)
        if variant.built and new is not None:
            claimed, measured = entry.card.metric(key), result.rebuilt_card.metric(key)
            rows.append(Row(entry.name, key, "reproduce accuracy", measured >= claimed - variant.tolerance, measured,
                            claimed, detail=f"rebuilt at {result.commit[:12]}, tolerance {variant.tolerance}"))
    return rows


def _load_test_sets(folder: Path) -> list[tuple[np.ndarray, np.ndarray]]:
    sets = []
    for test_dir in sorted(folder.glob("test_data_set_*")):
        tensors = []
        for name in ("input_0.pb", "output_0.pb"):
            proto = onnx.TensorProto()
            proto.ParseFromString((test_dir / name).read_bytes())
            tensors.append(numpy_helper.to_array(proto))
        sets.append((tensors[0], tensors[1]))
    return sets


def validate_entry(entry: Entry, scratch: Path, log=print, rebuild_budget: float | None = None,
                   reproduce_budget: float = 0.0) -> list[Row]:
    from zoo.data import load_dataset
    from zoo.evaluate import predict

    rows: list[Row] = []
    card = entry.card
    built = {k: v for k, v in card.variants.items() if v.built}
    if not built:
        return [Row(entry.name, "*", "built", True, detail="no variant built yet (card lists planned variants)")]
    obtained = _obtain(entry, scratch, rows, log, rebuild_budget)
    if obtained is None:
        return rows
    folder, measured_card, source = obtained
    cheap = (entry.card.training.build_time_s or float("inf")) <= reproduce_budget
    if source == "store" and cheap and not entry.card.training.imported_from and entry.card.training.git_commit:
        rows += _reproduce(entry, scratch, log)
    test_sets = _load_test_sets(folder)
    rows.append(Row(entry.name, "*", "test data", bool(test_sets), detail=f"{len(test_sets)} test_data_set(s)" if test_sets
                    else "no test_data_set_* folder: the stored reference outputs are missing"))
    split = load_dataset(card.dataset.name).test
    x, y = split.x.numpy(), split.y.numpy()
    reference_labels = fp32_logits = None
    fp32_accuracy = None
    has_artifacts = any(v.format == "ort-training" for v in built.values())
    for key, variant in built.items():
        path = folder / variant.file
        new = measured_card.variants.get(key)
        if source == "rebuilt":
            same = new is not None and new.sha256 == variant.sha256
            rows.append(Row(entry.name, key, "sha256", True, detail="rebuild reproduced the card's sha256" if same
                            else "rebuild gave different bytes (other CPU/threads); accuracy decides"))
        else:
            actual = pointer_for(path)
            same = (actual.oid, actual.size) == (variant.sha256, variant.size)
            rows.append(Row(entry.name, key, "sha256", same, detail=f"equals the card's ({variant.sha256})" if same else
                            f"file {actual.oid} ({actual.size} bytes), card {variant.sha256} ({variant.size} bytes)"))
        if variant.format == "ort-training":
            rows += _artifact_rows(entry.name, key, variant, path, folder / built["fp32"].file, fp32_logits, test_sets,
                                   x, y, scratch)
            continue
        try:
            onnx.checker.check_model(str(path), full_check=True)
            rows.append(Row(entry.name, key, "onnx.checker", True))
        except Exception as exc:  # noqa: BLE001 - any checker failure is a failed row
            rows.append(Row(entry.name, key, "onnx.checker", False, detail=str(exc)[:200]))
            continue
        if variant.recipe is not None:  # retrained weights: the stored reference outputs are fp32's, not its own
            rows.append(_retrained_from_row(entry.name, key, path, measured_card if source == "rebuilt" else card))
            x_eval, y_eval = evaluation_data(card, variant)
        else:
            rows += _test_set_rows(entry.name, key, variant.precision, path, test_sets)
            x_eval, y_eval = x, y
        logits = predict(path, x_eval)
        accuracy = float((logits.argmax(1) == y_eval).mean())
        rows.append(_accuracy_row(entry.name, key, accuracy, card.metric(key), variant.tolerance))
        if key == "fp32":
            fp32_accuracy, fp32_logits, reference_labels = accuracy, logits, logits.argmax(1)
            if not has_artifacts:  # otherwise the ort-training variant's rows cover it
                rows.append(_ort_training_row(entry.name, key, path, x, y, logits, scratch))
            for opset, file in variant.extra_opsets.items():
                agree = float((predict(folder / file, x).argmax(1) == reference_labels).mean())
                rows.append(Row(entry.name, key, f"opset {opset}", agree >= 0.999, agree, 1.0,
                                detail=f"{file}: same predictions as opset {variant.opset}"))
        elif variant.precision == "int8" and fp32_accuracy is not None:
            drop = fp32_accuracy - accuracy
            explained = "int8 loss" in card.description
            rows.append(Row(entry.name, key, "int8 drop", drop <= MAX_INT8_DROP or explained, drop, MAX_INT8_DROP,
                            detail="accuracy lost vs fp32" + (" (explained on the card)" if explained else "")))
    return rows


def _accuracy_row(name: str, key: str, accuracy: float, claimed: float | None, tolerance: float) -> Row:
    return Row(name, key, "accuracy", claimed is not None and accuracy >= claimed - tolerance, accuracy, claimed,
               detail=f"tolerance {tolerance}")


def _test_set_rows(name: str, key: str, precision: str, path: Path, test_sets) -> list[Row]:
    from zoo.evaluate import predict

    rows = []
    for i, (inputs, expected) in enumerate(test_sets):
        got = predict(path, inputs)
        if precision == "int8":
            agree = float((got.argmax(1) == expected.argmax(1)).mean())
            rows.append(Row(name, key, f"test_data_set_{i}", agree >= INT8_LABEL_AGREEMENT, agree, 1.0,
                            detail="label agreement with the fp32 reference outputs"))
        else:
            atol = FP16_ATOL if precision == "fp16" else OUTPUT_ATOL
            diff = float(np.abs(got - expected).max())
            close = bool(np.allclose(got, expected, rtol=OUTPUT_RTOL, atol=atol))
            rows.append(Row(name, key, f"test_data_set_{i}", close, diff, 0.0, detail=f"max |diff| (atol {atol})"))
    return rows


def _retrained_from_row(name: str, key: str, path: Path, card: ModelCard) -> Row:
    """A retrained variant must come from this entry's fp32 file (its metadata names the sha256 it started from)."""
    from zoo.export import read_metadata

    origin = read_metadata(path).get("zoo.finetuned_from_sha256")
    fp32_sha = card.variants["fp32"].sha256
    return Row(name, key, "retrained from fp32", origin == fp32_sha,
               detail=f"zoo.finetuned_from_sha256 {str(origin)[:12]}… vs fp32 {fp32_sha[:12]}…")


def _artifact_rows(name: str, key: str, variant, path: Path, fp32: Path, fp32_logits: np.ndarray | None, test_sets,
                   x: np.ndarray, y: np.ndarray, scratch: Path) -> list[Row]:
    """An ort-training archive: its members and their split, a few training steps, and the inference model its
    untouched checkpoint exports (reference outputs and accuracy, as for fp32)."""
    from zoo.evaluate import predict
    from zoo.ondevice import OnnxTrainer, read_split, source_problem, trainable_of, unpack_artifacts

    try:
        folder = unpack_artifacts(path, scratch / f"{name}-{key}")
        for model in ("training_model.onnx", "eval_model.onnx", "optimizer_model.onnx"):
            proto = onnx.load(str(folder / model))
            if model != "training_model.onnx":  # gradient ops (MaxPoolGrad, …) are onnxruntime's, unknown to onnx
                onnx.checker.check_model(proto)
            if proto.ir_version > 10:
                raise ValueError(f"{model}: IR version {proto.ir_version} > 10 (onnxruntime-training 1.19 refuses it)")
        split = read_split(folder)
        expected = trainable_of(onnx.load(str(fp32)))
        problems = [p for p in (source_problem(folder, fp32),
                                "trainable set differs from the fp32 file's zoo.trainable"
                                if split["trainable"] != expected else None) if p]
        rows = [Row(name, key, "archive", not problems, detail="; ".join(problems) or
                    f"4 artifacts + {len(split['trainable'])} trainable / {len(split['frozen'])} frozen initializers, "
                    "eval/optimizer models pass onnx.checker, IR <= 10")]
        untouched = OnnxTrainer(folder, lr=0.0).export(folder / "untouched.onnx")
    except Exception as exc:  # noqa: BLE001 - an unreadable archive is a failed row
        return [Row(name, key, "archive", False, detail=str(exc)[:300])]
    logits = predict(untouched, x)
    rows += _test_set_rows(name, key, "fp32", untouched, test_sets)
    rows.append(_accuracy_row(name, key, float((logits.argmax(1) == y).mean()), variant.metrics.get("accuracy"),
                              variant.tolerance))
    reference = fp32_logits if fp32_logits is not None else predict(fp32, x)
    rows.append(_training_steps_row(name, key, folder, x, y, reference, untouched))
    return rows


def _ort_training_row(name: str, key: str, path: Path, x: np.ndarray, y: np.ndarray, logits: np.ndarray,
                      scratch: Path) -> Row:
    """The fp32 file trains on a device: onnxruntime-training artifacts from its `zoo.trainable` split."""
    from zoo.ondevice import training_artifacts

    try:
        folder = scratch / f"{name}-ort-training"
        training_artifacts(path, folder)
    except Exception as exc:  # noqa: BLE001 - any failure to build the artifacts is a failed row
        return Row(name, key, "ort-training", False, detail=f"artifacts failed: {str(exc)[:200]}")
    return _training_steps_row(name, key, folder, x, y, logits)


def _training_steps_row(name: str, key: str, folder: Path, x: np.ndarray, y: np.ndarray, logits: np.ndarray,
                        untouched: Path | None = None) -> Row:
    """The model exported before any step (`untouched`, when already exported) predicts like the fp32 file's
    `logits`, and 10 steps lower the loss on a fixed batch."""
    from zoo.evaluate import predict
    from zoo.ondevice import OnnxTrainer

    try:
        trainer = OnnxTrainer(folder, lr=1e-3)
        untouched = untouched or trainer.export(folder / "untouched.onnx")
        untouched = float(np.abs(predict(untouched, x[:64]) - logits[:64]).max())
        batch_x, batch_y = x[:32], y[:32]
        before = trainer.eval_loss(batch_x, batch_y)
        for _ in range(10):
            trainer.step(batch_x, batch_y)
        after = trainer.eval_loss(batch_x, batch_y)
    except Exception as exc:  # noqa: BLE001 - any failure to run the artifacts is a failed row
        return Row(name, key, "ort-training", False, detail=f"artifacts failed: {str(exc)[:200]}")
    ok = untouched <= OUTPUT_ATOL and after < before
    return Row(name, key, "ort-training", ok, after, before,
               detail=f"onnxruntime-training: loss {before:.4f} -> {after:.4f} after 10 steps; untouched export "
                      f"max |diff| {untouched:.1e}")


def validate(names: list[str] | None = None, log=print, rebuild_budget: float | None = None,
             reproduce_budget: float = 0.0) -> tuple[list[Row], float]:
    started = time.perf_counter()
    catalog.reload()
    targets = names or catalog.list_models()
    rows: list[Row] = []
    committed = catalog.manifest_path()
    rows.append(Row("*", "*", "manifest", committed.exists() and committed.read_text() == catalog.manifest_text(),
                    detail=f"{committed.name} matches the cards" ))
    # The rebuild budget is for the whole run: cheapest entries first, each rebuild spends its card's build time.
    targets = sorted(targets, key=lambda n: catalog.get_card(n).training.build_time_s or float("inf"))
    remaining = rebuild_budget
    with tempfile.TemporaryDirectory(prefix="zoo-validate-") as tmp:
        for name in targets:
            entry = catalog.get_entry(name)
            log(f"[{name}] validating")
            entry_rows = validate_entry(entry, Path(tmp), log, remaining, reproduce_budget)
            if remaining is not None and any(r.check == "obtain" and "rebuilt" in r.detail for r in entry_rows):
                remaining -= entry.card.training.build_time_s or 0.0
            rows += entry_rows
    return rows, time.perf_counter() - started


def markdown_report(rows: list[Row], seconds: float) -> str:
    failed = [r for r in rows if not r.ok]
    skipped = [r for r in rows if r.skipped]
    lines = ["# Validation report", "", f"{len(rows) - len(failed) - len(skipped)} checks passed, {len(failed)} failed, "
             f"{len(skipped)} skipped, in {seconds:.0f} s.", "", "| entry | variant | check | verdict | measured | card | delta | detail |",
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
