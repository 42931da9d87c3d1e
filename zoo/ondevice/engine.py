"""onnxruntime-training artifacts for an fp32 file, and the trainer that runs them.

- `training_artifacts` turns an fp32 ONNX file into onnxruntime-training's training, eval and optimizer
  models plus the initial checkpoint (cross-entropy loss, AdamW), with the file's trainable/frozen split.
- `pack_artifacts` / `unpack_artifacts`: the artifacts as one deterministic zip (the ort-training variant).
- `OnnxTrainer` runs them (CheckpointState, Module, Optimizer) and exports a new inference ONNX.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import sys
import tempfile
import zipfile
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import onnx

from zoo.catalog import require_content
from zoo.errors import ZooError
from zoo.fsutil import atomic_write_bytes
from zoo.ondevice.trainable import TRAINABLE_GLOBS_KEY, float_weights, trainable_of
from zoo.ort import ort, training_package_without_torch
from zoo.pointer import sha256_file


training_package_without_torch()
from onnxruntime.training.api import CheckpointState, Module, Optimizer  # noqa: E402  (after the registration)

ARTIFACT_FILES = ("training_model.onnx", "eval_model.onnx", "optimizer_model.onnx", "checkpoint")
SPLIT_FILE = "trainable.json"  # the trainable/frozen initializer names, their globs and the source file's sha256


def quiet_onnxruntime() -> None:
    ort.set_default_logger_severity(3)


@contextmanager
def native_stderr_captured():
    """onnxruntime's gradient-graph builder logs every graph transformer at INFO on fd 2, whatever the logger
    severity: capture it, and show it only when generation fails."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as log:
        os.dup2(log.fileno(), 2)
        try:
            yield
        except BaseException:
            os.dup2(saved, 2)
            log.seek(0)
            sys.stderr.write(log.read().decode(errors="replace")[-4000:])
            raise
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def training_artifacts(fp32_path: Path, out_dir: Path, lr_optimizer: str = "AdamW",
                       trainable_globs: list[str] | None = None) -> dict[str, Path]:
    """onnxruntime-training artifacts for an fp32 classifier (logits output), written atomically as a folder.

    `trainable_globs` (a card's `trainable`) must be the split the file was exported with: the file's metadata
    holds the initializer names the globs resolved to, which only the exporter (holding the torch model) knows."""
    # A ClientApp makes its artifacts once, in its first round, and only trains in the others.
    from onnxruntime.training import artifacts  # lazy: imports onnxruntime.tools, which imports torch where installed
    from onnxruntime.training.onnxblock import _graph_utils  # lazy: as above

    quiet_onnxruntime()
    model = onnx.load(str(fp32_path))
    props = {p.key: p.value for p in model.metadata_props}
    if props.get("zoo.variant", "fp32") != "fp32":
        raise ZooError(f"{fp32_path} is not an fp32 export: on-device training starts from the fp32 variant")
    recorded = json.loads(props.get(TRAINABLE_GLOBS_KEY, '["*"]'))
    if trainable_globs is not None and sorted(trainable_globs) != sorted(recorded):
        raise ZooError(f"{fp32_path} was exported with trainable {recorded}, the card asks for {trainable_globs}: "
                       "rebuild the entry (`zoo build NAME`) so the fp32 file records the card's split")
    trainable = trainable_of(model)
    frozen = [n for n in float_weights(model) if n not in set(trainable)]
    _expose_layernorm_statistics(model)
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        # Graph names come from a process-wide counter: start it over so one fp32 file always gives the same bytes.
        _graph_utils._GRAPH_TOKEN = 0
        with native_stderr_captured():
            artifacts.generate_artifacts(model, requires_grad=trainable, frozen_params=frozen,
                                         loss=artifacts.LossType.CrossEntropyLoss,
                                         optimizer=getattr(artifacts.OptimType, lr_optimizer), artifact_directory=tmp)
        split = {"source_sha256": sha256_file(fp32_path), "globs": recorded, "trainable": trainable, "frozen": frozen}
        (tmp / SPLIT_FILE).write_text(json.dumps(split, indent=2) + "\n")
        if out_dir.exists():
            shutil.rmtree(out_dir)
        tmp.rename(out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return {name: out_dir / name for name in ARTIFACT_FILES}


def pack_artifacts(folder: Path, archive: Path) -> Path:
    """The artifacts as one zip (one LFS object): fixed order, timestamps and modes, so equal files give equal bytes."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as zf:
        for name in (*ARTIFACT_FILES, SPLIT_FILE):
            info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            zf.writestr(info, (Path(folder) / name).read_bytes())
    atomic_write_bytes(Path(archive), buffer.getvalue())
    return Path(archive)


def unpack_artifacts(archive: Path, dest: Path) -> Path:
    """An ort-training archive unpacked into `dest` (exactly the expected members, nothing else)."""
    try:
        with zipfile.ZipFile(require_content(Path(archive))) as zf:
            members = sorted(zf.namelist())
            if members != sorted((*ARTIFACT_FILES, SPLIT_FILE)):
                raise ZooError(f"{archive}: not an ort-training archive (members {members[:6]}; expected "
                               f"{', '.join((*ARTIFACT_FILES, SPLIT_FILE))})")
            dest = Path(dest)
            dest.mkdir(parents=True, exist_ok=True)
            for name in members:
                (dest / name).write_bytes(zf.read(name))
    except zipfile.BadZipFile:
        raise ZooError(f"{archive}: not a zip archive (an ort-training variant is one)") from None
    return dest


def read_split(folder: Path) -> dict:
    return json.loads((Path(folder) / SPLIT_FILE).read_text())


def source_problem(folder: Path, fp32_path: Path) -> str | None:
    """Why unpacked artifacts do not belong to `fp32_path` (they were made from another file), or None."""
    made_from = read_split(folder)["source_sha256"]
    return None if made_from == sha256_file(fp32_path) else f"made from another fp32 file (sha256 {made_from[:12]}…)"


def _expose_layernorm_statistics(model: onnx.ModelProto) -> None:
    """LayerNormalization's gradient reads the optional Mean and InvStdDev outputs that inference exports omit
    (onnxruntime's gradient builder fails with `i < node_->OutputDefs().size()`): name them."""
    for i, node in enumerate(model.graph.node):
        if node.op_type == "LayerNormalization" and len(node.output) < 3:
            base = node.output[0]
            node.output.extend([f"{base}_mean_{i}", f"{base}_inv_std_{i}"][len(node.output) - 1:])


class OnnxTrainer:
    """Fine-tunes from training artifacts with onnxruntime.training.api; no torch involved."""

    def __init__(self, artifact_dir: Path, lr: float, seed: int = 0):
        self.dir = Path(artifact_dir)
        self.state = CheckpointState.load_checkpoint(str(self.dir / "checkpoint"))
        options = ort.SessionOptions()
        options.log_severity_level = 3  # training sessions log every graph transformer at INFO
        self.module = Module(str(self.dir / "training_model.onnx"), self.state, str(self.dir / "eval_model.onnx"),
                             session_options=options)
        self.optimizer = Optimizer(str(self.dir / "optimizer_model.onnx"), self.module)
        self.optimizer.set_learning_rate(lr)
        self.rng = np.random.default_rng(seed)
        self.label_type = next(np.int32 if "int32" in i.type else np.int64 for i in self._inputs() if i.name == "labels")

    def _inputs(self):
        return ort.InferenceSession(str(self.dir / "eval_model.onnx"), providers=["CPUExecutionProvider"]).get_inputs()

    def step(self, x: np.ndarray, y: np.ndarray) -> float:
        self.module.train()
        loss = self.module(x, y.astype(self.label_type))
        loss = loss[0] if isinstance(loss, (list, tuple)) else loss
        self.optimizer.step()
        self.module.lazy_reset_grad()
        return float(loss)

    def eval_loss(self, x: np.ndarray, y: np.ndarray) -> float:
        self.module.eval()
        loss = self.module(x, y.astype(self.label_type))
        return float(loss[0] if isinstance(loss, (list, tuple)) else loss)

    def train(self, x: np.ndarray, y: np.ndarray, steps: int, batch: int, progress=None) -> list[float]:
        losses = []
        for _ in range(steps):
            idx = self.rng.choice(len(x), size=min(batch, len(x)), replace=False)
            losses.append(self.step(x[idx], y[idx]))
            if progress is not None:
                progress(losses[-1])
        return losses

    def parameters(self) -> np.ndarray:
        """All trainable parameters as one flat float32 vector (what federated clients send)."""
        return self.module.get_contiguous_parameters(trainable_only=True).numpy()

    def load_parameters(self, flat: np.ndarray) -> None:
        # The binding wants the C-level value under the Python wrapper.
        value = ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(flat, np.float32))
        self.module.copy_buffer_to_parameters(value._ortvalue, trainable_only=True)

    def export(self, path: Path, output_name: str = "logits") -> Path:
        """The fine-tuned inference model (the fp32 graph with the new weights), written atomically."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        self.module.export_model_for_inferencing(str(tmp), [output_name])
        tmp.replace(path)
        return path


@contextmanager
def artifacts_for(fp32_path: Path, published: Path | None = None):
    """Training artifacts for `fp32_path` in a temporary folder: a published ort-training archive (what a device
    downloads; it must have been made from this very file), else generated from the file."""
    with tempfile.TemporaryDirectory(prefix="zoo-ort-train-") as tmp:
        folder = Path(tmp) / "artifacts"
        if published is None:
            training_artifacts(fp32_path, folder)
        else:
            problem = source_problem(unpack_artifacts(published, folder), fp32_path)
            if problem:
                raise ZooError(f"{published} was {problem}, not {fp32_path}: refetch both")
        yield folder
