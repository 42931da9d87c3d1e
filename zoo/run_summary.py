"""The trainer's `summary.json`: what one training run made and measured, read by `zoo build` and the benchmarks.

A schema, not string keys: the trainer writes it through these models and readers validate it, so a renamed or
missing field fails where it is written, not three stages later.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from zoo.fsutil import atomic_write_text
from zoo.strict import Strict

SUMMARY_FILE = "summary.json"


class ExtraOpset(Strict):
    """The fp32 weights exported again at another opset of the recipe."""

    file: str
    sha256: str
    size: int
    opset: int
    accuracy: float
    agreement_with_primary: float  # share of eval examples predicted as the primary opset predicts them


class VariantResult(Strict):
    """One exported file, measured with onnxruntime on the recipe's eval split."""

    file: str
    sha256: str
    size: int
    opset: int
    accuracy: float
    extra_opsets: dict[str, ExtraOpset] = Field(default_factory=dict)  # fp32 only
    int8_kernels: list[str] | None = None  # int8 kinds: the int8 kernels onnxruntime runs after its fusions
    accuracy_drop: float | None = None  # int8 kinds: fp32 accuracy minus this file's
    within_bound: bool | None = None  # int8 kinds: accuracy_drop <= the recipe's quantization.max_accuracy_drop


class PhaseSummary(Strict):
    steps: int
    seconds: float
    first_loss: float | None = None
    final_loss: float | None = None
    losses: list[float]
    step_seconds: list[float]
    peak_rss_mib: list[float]  # per rank, at the end of the phase (before export)
    # launcher --profile-memory: live tensor MiB by category (zoo.train.memory) in the last two steps, per rank
    memory_mib: dict[str, list[float]] | None = None
    # per rank, median step: CPU seconds of the training thread and of all other threads (zoo.train.measure.cpu_profile)
    cpu_seconds_per_step: dict[str, list[float]] | None = None
    ranks_consistent: bool | None = None  # every rank ended with the same full weights


class TrackedRun(Strict):
    uri: str | None = None  # MLflow tracking URI (None: tracking off)
    run_id: str | None = None


class RunSummary(Strict):
    model: str
    recipe: str
    recipe_sha256: str
    launcher: str
    strategy: str
    world_size: int
    backend: str
    threads: int
    seed: int
    num_params: int
    dataset: str
    eval_split: str
    eval_examples: int | None = None  # how many of its examples the models were measured on (recipe.eval_examples)
    phases: dict[str, PhaseSummary]  # "fp32", then "qat" when the recipe quantizes
    baseline_rss_mib: list[float]  # per rank, after imports and data, before any model exists
    torch_accuracy: dict[str, float]  # the torch models' accuracy before export (fp32, int8-qat)
    variants: dict[str, VariantResult]
    wall_seconds: float
    library_versions: dict[str, str]
    allocator: str | None = None  # the malloc rank 0 ran on: jemalloc (zoo train, benchmarks) or system
    tracking: TrackedRun

    def write(self, output_dir: Path) -> Path:
        path = Path(output_dir) / SUMMARY_FILE
        atomic_write_text(path, self.model_dump_json(indent=2, exclude_none=True) + "\n")
        return path

    @classmethod
    def read(cls, output_dir: Path) -> "RunSummary":
        return cls.model_validate_json((Path(output_dir) / SUMMARY_FILE).read_text())
