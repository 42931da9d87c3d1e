"""How each kind of variant is validated: the checks `zoo validate` runs on a file, chosen by the kind's fields.

`Kind.reference` decides how a file is compared with the fp32 reference outputs stored in test_data_set_*
(outputs within the kind's atol, labels, the artifacts' untouched export, or the fp32 file a retraining started
from); `Kind.int8` bounds the accuracy drop against fp32 by the recipe's `quantization.max_accuracy_drop`; fp32,
the reference itself, also re-exports at its listed opsets and trains on a device. zoo.validate obtains the files
and writes the report; the checks are here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from zoo.cards import ModelCard, Variant, retraining_band
from zoo.evaluate import predict
from zoo.fsutil import plural
from zoo.metrics import label_accuracy
from zoo.metadata import read_metadata
from zoo.ondevice.engine import OnnxTrainer, read_split, source_problem, training_artifacts, unpack_artifacts
from zoo.ondevice.trainable import trainable_of
from zoo.recipes import Quantization, load_recipe
from zoo.kinds import KINDS, Kind, kind_of
from zoo.variants.make import evaluation_data
from zoo.variants.opsets import AGREEMENT

OUTPUT_RTOL = 1e-3


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
    planned: bool = False  # an entry with nothing built yet: no check ran, none was left out (not a pass, not a skip)

    @property
    def verdict(self) -> str:
        return "planned" if self.planned else "skip" if self.skipped else "pass" if self.ok else "FAIL"

    @property
    def delta(self) -> float | None:
        return None if self.measured is None or self.card is None else self.measured - self.card


def summary_line(rows: list[Row], seconds: float) -> str:
    """The one wording of a validation run's outcome (its report, the docs). As Row.verdict: a skipped check is neither
    passed nor failed, and a planned entry (nothing built) is no check at all, counted apart."""
    planned = sum(r.planned for r in rows)
    checks = [r for r in rows if not r.planned]
    skipped = sum(r.skipped for r in checks)
    failed = sum(not r.ok and not r.skipped for r in checks)
    line = f"{plural(len(checks) - failed - skipped, 'check')} passed, {failed} failed, {skipped} skipped"
    if planned:
        line += f" ({planned} planned {'entry' if planned == 1 else 'entries'} not built: nothing to measure)"
    return f"{line}, in {seconds:.0f} s."


def load_test_sets(folder: Path) -> list[tuple[np.ndarray, np.ndarray]]:
    sets = []
    for test_dir in sorted(folder.glob("test_data_set_*")):
        tensors = []
        for name in ("input_0.pb", "output_0.pb"):
            proto = onnx.TensorProto()
            proto.ParseFromString((test_dir / name).read_bytes())
            tensors.append(numpy_helper.to_array(proto))
        sets.append((tensors[0], tensors[1]))
    return sets


@dataclass
class EntryChecks:
    """What the checks of one entry's variants share: the files, the reference outputs and the fp32 results."""

    card: ModelCard  # the card validated
    measured_card: ModelCard  # the card describing the files (a rebuild's own card, else the same)
    folder: Path  # the entry's files
    scratch: Path
    x: np.ndarray  # the card dataset's test split
    y: np.ndarray
    test_sets: list[tuple[np.ndarray, np.ndarray]]
    # The files are a rebuild with other bytes than the card's, made on a machine whose CPU flags or libraries differ
    # from the card's build record: accuracy is held to the retraining band (ModelCard.accuracy_band).
    retrained_elsewhere: bool = False
    # What the dataset puts in every file (Dataset.onnx_metadata: a text dataset's tokenizer); a file carrying
    # another one was trained on other ids than the test inputs it is measured on.
    dataset_metadata: dict[str, str] = field(default_factory=dict)
    fp32_logits: np.ndarray | None = None
    fp32_accuracy: float | None = None

    @property
    def name(self) -> str:
        return self.card.name

    def quantization(self) -> Quantization:
        """The recipe's quantization section (its int8 drop rule); the schema's defaults without a recipe."""
        recipe = self.card.training.recipe
        return load_recipe(recipe, model=self.card.architecture).quantization if recipe else Quantization()

    def has_artifacts(self) -> bool:
        return any(kind_of(k, v).reference == "artifacts" for k, v in self.card.variants.items() if v.built)


def variant_rows(checks: EntryChecks, key: str, variant: Variant) -> list[Row]:
    """Every check of one built variant's file, by its kind."""
    kind = kind_of(key, variant)
    name, path = checks.name, checks.folder / variant.file
    if kind.reference == "artifacts":
        return _artifact_rows(checks, key, variant, path)
    try:
        onnx.checker.check_model(str(path), full_check=True)
        rows = [Row(name, key, "onnx.checker", True)]
    except Exception as exc:  # noqa: BLE001 - any checker failure is a failed row
        return [Row(name, key, "onnx.checker", False, detail=str(exc)[:200])]
    rows += _dataset_metadata_rows(checks, key, path)
    if kind.reference == "retrained":  # the stored reference outputs are fp32's, not its own
        rows.append(_retrained_from_row(name, key, path, checks.measured_card))
        x, y = evaluation_data(checks.card, variant)
    else:
        rows += _test_set_rows(name, key, kind, path, checks.test_sets, checks.retrained_elsewhere)
        x, y = checks.x, checks.y
    logits = predict(path, x)
    accuracy = label_accuracy(logits, y)
    rows.append(_accuracy_row(checks, key, accuracy, len(y)))
    if key == "fp32":  # the reference the other variants are compared with
        checks.fp32_accuracy, checks.fp32_logits = accuracy, logits
        if not checks.has_artifacts():  # otherwise the ort-training variant's rows cover it
            rows.append(_ort_training_row(name, key, path, x, y, logits, checks.scratch))
        reference = logits.argmax(1)
        for opset, file in variant.extra_opsets.items():
            agree = label_accuracy(predict(checks.folder / file, x), reference)
            rows.append(Row(name, key, f"opset {opset}", agree >= AGREEMENT, agree, 1.0,
                            detail=f"{file}: same predictions as opset {variant.opset}"))
    elif kind.int8 and checks.fp32_accuracy is not None:
        drop, rule = checks.fp32_accuracy - accuracy, checks.quantization()
        rows.append(Row(name, key, "int8 drop", rule.allows(drop), drop, rule.max_accuracy_drop,
                        detail="accuracy lost vs fp32 (bound: the recipe's quantization.max_accuracy_drop)"))
    return rows


def _dataset_metadata_rows(checks: EntryChecks, key: str, path: Path) -> list[Row]:
    """The file carries the dataset's own metadata (its tokenizer): else its inputs mean something else to it."""
    if not checks.dataset_metadata:
        return []
    meta, dataset = read_metadata(path), checks.card.dataset.name
    rows = []
    for field_name, value in sorted(checks.dataset_metadata.items()):
        same = meta.get(field_name) == value
        rows.append(Row(checks.name, key, field_name, same, detail=f"{field_name} equals the {dataset} dataset's" if same
                        else f"{field_name} differs from the {dataset} dataset's: the file was trained on other ids "
                             "than it is measured on; rebuild the entry (zoo build)"))
    return rows


def _accuracy_row(checks: EntryChecks, key: str, accuracy: float, examples: int) -> Row:
    card = checks.card
    claimed, band = card.metric(key), card.accuracy_band(key, examples, checks.retrained_elsewhere)
    detail = f"tolerance {band:.4g}"
    if checks.retrained_elsewhere:
        detail += (f" (rebuilt with other bytes on another CPU or libraries than the card's: the retraining band of "
                   f"{examples} examples; the card's own tolerance is {card.variants[key].tolerance})")
    return Row(checks.name, key, "accuracy", claimed is not None and accuracy >= claimed - band, accuracy, claimed,
               detail=detail)


def _test_set_rows(name: str, key: str, kind: Kind, path: Path, test_sets, retrained: bool = False) -> list[Row]:
    """The stored fp32 reference outputs, reproduced as the kind promises: logits within its atol, or labels. Files
    retrained elsewhere (other bytes than the card's) hold their label agreement to the kind's rate less the
    retraining band of the examples compared (a few examples: one disagreement is noise, not a defect)."""
    rows = []
    for i, (inputs, expected) in enumerate(test_sets):
        got = predict(path, inputs)
        if kind.reference == "labels":
            agree = label_accuracy(got, expected.argmax(1))
            floor = kind.label_agreement - (retraining_band(kind.label_agreement, len(inputs)) if retrained else 0.0)
            detail = "label agreement with the fp32 reference outputs"
            if retrained:
                detail += (f" (rebuilt with other bytes on another CPU or libraries: at least {floor:.3f}, the "
                           f"retraining band of {len(inputs)} examples below {kind.label_agreement})")
            rows.append(Row(name, key, f"test_data_set_{i}", agree >= floor, agree, 1.0, detail=detail))
        else:
            atol = kind.atol
            diff = float(np.abs(got - expected).max())
            close = bool(np.allclose(got, expected, rtol=OUTPUT_RTOL, atol=atol))
            rows.append(Row(name, key, f"test_data_set_{i}", close, diff, 0.0, detail=f"max |diff| (atol {atol})"))
    return rows


def _retrained_from_row(name: str, key: str, path: Path, card: ModelCard) -> Row:
    """A retrained variant must come from this entry's fp32 file (its metadata names the sha256 it started from)."""
    origin = read_metadata(path).get("zoo.finetuned_from_sha256")
    fp32_sha = card.variants["fp32"].sha256
    return Row(name, key, "retrained from fp32", origin == fp32_sha,
               detail=f"zoo.finetuned_from_sha256 {str(origin)[:12]}… vs fp32 {fp32_sha[:12]}…")


def _artifact_rows(checks: EntryChecks, key: str, variant: Variant, path: Path) -> list[Row]:
    """An ort-training archive: its members and their split, a few training steps, and the inference model its
    untouched checkpoint exports (reference outputs and accuracy, as for fp32)."""
    name, fp32, x, y = checks.name, checks.folder / checks.card.variants["fp32"].file, checks.x, checks.y
    try:
        folder = unpack_artifacts(path, checks.scratch / f"{name}-{key}")
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
    rows += _test_set_rows(name, key, KINDS["fp32"], untouched, checks.test_sets)
    rows.append(_accuracy_row(checks, key, label_accuracy(logits, y), len(y)))
    reference = checks.fp32_logits if checks.fp32_logits is not None else predict(fp32, x)
    rows.append(_training_steps_row(name, key, folder, x, y, reference, untouched))
    return rows


def _ort_training_row(name: str, key: str, path: Path, x: np.ndarray, y: np.ndarray, logits: np.ndarray,
                      scratch: Path) -> Row:
    """The fp32 file trains on a device: onnxruntime-training artifacts from its `zoo.trainable` split."""
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
    ok = untouched <= KINDS["fp32"].atol and after < before
    return Row(name, key, "ort-training", ok, after, before,
               detail=f"onnxruntime-training: loss {before:.4f} -> {after:.4f} after 10 steps; untouched export "
                      f"max |diff| {untouched:.1e}")


