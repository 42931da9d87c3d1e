"""`zoo finetune --onnx`: fine-tune an entry's fp32 file on new data with onnxruntime-training alone."""

from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import onnx
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

from zoo.evaluate import accuracy
from zoo.metadata import read_metadata, write_metadata
from zoo.ondevice.engine import OnnxTrainer, artifacts_for
from zoo.ondevice.trainable import trainable_of
from zoo.pointer import sha256_file

def finetune(fp32_path: Path, train: tuple[np.ndarray, np.ndarray], test: tuple[np.ndarray, np.ndarray],
             out_path: Path, steps: int = 200, lr: float = 1e-3, batch: int = 32, seed: int = 0,
             show_progress: bool = True, published: Path | None = None) -> dict:
    """Fine-tune `fp32_path` on `train` with onnxruntime-training alone; export and measure the result on `test`.
    `published`: the entry's ort-training archive, used instead of generating artifacts."""
    x, y = train
    source_sha = sha256_file(fp32_path)
    before = accuracy(fp32_path, test[0], test[1])
    with artifacts_for(fp32_path, published) as folder, _progress(show_progress, steps) as advance:
        trainer = OnnxTrainer(folder, lr=lr, seed=seed)
        losses = trainer.train(x.astype(np.float32) if x.dtype.kind == "f" else x, y, steps, batch, advance)
        exported = trainer.export(out_path.with_name(f".{out_path.name}.raw"))
    props = {**read_metadata(fp32_path), "zoo.finetuned_from_sha256": source_sha,
             "zoo.finetune": json.dumps({"steps": steps, "lr": lr, "batch": batch, "seed": seed, "tool": "onnxruntime-training"})}
    write_metadata(onnx.load(str(exported)), props, out_path)
    exported.unlink()
    after = accuracy(out_path, test[0], test[1])
    return {"source": str(fp32_path), "source_sha256": source_sha, "output": str(out_path),
            "output_sha256": sha256_file(out_path), "steps": steps, "first_loss": losses[0], "final_loss": losses[-1],
            "accuracy_before": before, "accuracy_after": after, "trainable": len(trainable_of(onnx.load(str(fp32_path)))),
            "artifacts": "generated from the fp32 file" if published is None else f"published archive {Path(published).name}"}


@contextmanager
def _progress(show: bool, total: int):
    if not show:
        yield None
        return

    with Progress(TextColumn("on-device fine-tuning"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("loss {task.fields[loss]:.4f}"), console=Console(stderr=True)) as bar:
        task = bar.add_task("finetune", total=total, loss=float("nan"))
        yield lambda loss: bar.update(task, advance=1, loss=loss)
