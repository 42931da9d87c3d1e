"""The model card schema: what an entry is, where its data came from, and what was measured.

Architecture, weights provenance, preprocessing and measured results are separate sections (as
timm's pretrained configs separate them). Every measured field is written by code (`zoo build`,
`zoo import`), never by hand. Unknown and missing fields are errors naming the file and the field.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Literal, TypeVar

import yaml
from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator

from zoo.errors import CardError, ZooError
from zoo.fsutil import contained
from zoo.strict import Strict
from zoo.kinds import KINDS, kind_of

CARD_FILE = "card.yaml"
SHA256_PATTERN = r"^[0-9a-f]{64}$"
FRACTION_METRICS = {"accuracy"}  # and every "*_accuracy": shares of examples, in [0, 1]
# A rebuild on another machine (CPU flags or library versions other than the card records) trains along another
# rounding path: its accuracy moves the way another seed's does, not the way the same bytes re-measured on other
# kernels do. It is held to this many standard errors of the card's accuracy on the examples measured.
RETRAINING_STANDARD_ERRORS = 3.0


def retraining_band(rate: float, examples: int) -> float:
    """How far a rate measured on `examples` examples (an accuracy, a label agreement) may land below `rate` when the
    files are a retraining with other bytes: RETRAINING_STANDARD_ERRORS standard errors, the count smoothed by one
    right and one wrong answer so that a perfect rate still allows for an error or two."""
    share = (rate * examples + 1) / (examples + 2)
    return RETRAINING_STANDARD_ERRORS * math.sqrt(share * (1 - share) / examples)


class DatasetRecord(Strict):
    name: str
    source: str  # provenance: package, generator or upstream location it was built from
    license: str
    splits: dict[str, int]  # split name -> number of examples
    class_balance: dict[str, int] | None = None  # label -> examples in the training split


class Tensor(Strict):
    name: str
    shape: list[int | str]  # str = symbolic dimension ("batch")
    dtype: str
    labels: list[str] | None = None  # class names, for classifier outputs


class Cpu(Strict):
    model: str  # /proc/cpuinfo "model name"
    flags: list[str]  # the ISA flags that change numerics (zoo.provenance.NUMERIC_FLAGS) this CPU has
    kernels: str | None = None  # which libraries' kernels the build pinned to which ISA (zoo.provenance.KERNELS)


class PublishedFile(Strict):
    """A file a card published, named by its content (the card's sha256 and size): what a recipe continues training
    from (`init_from`) and what the card it makes names as its starting point (`training.continued_from`)."""

    entry: str  # the entry whose card published it
    variant: str = "fp32"
    sha256: str = Field(pattern=SHA256_PATTERN)
    size: int = Field(gt=0)

    def label(self) -> str:
        return f"{self.entry} {self.variant} (sha256 {self.sha256[:12]})"


class Training(Strict):
    recipe: str | None = None  # recipes/<name>.yaml
    command: str  # the exact command that produced the weights
    seed: int | None = None
    threads: int | None = None
    build_time_s: float | None = None
    library_versions: dict[str, str] = Field(default_factory=dict)
    imported_from: str | None = None  # upstream checkpoint, for imported entries
    continued_from: PublishedFile | None = None  # the published file the recipe's training started from (init_from)
    # Where `zoo build` finds that checkpoint again: "python-package:<module>/<folder>" (an installed package).
    import_source: str | None = None
    # The clean commit the build ran from (stamped into every file as zoo.git_commit): `zoo reproduce` rebuilds it.
    git_commit: str | None = None
    cpu: Cpu | None = None  # the CPU the build ran on
    # False: built with --allow-dirty from uncommitted changes, so no commit reproduces these bytes.
    reproducible: bool | None = None


class Timing(Strict):
    median_ms: float = Field(gt=0)
    p90_ms: float = Field(gt=0)
    vs_fp32: float = Field(gt=0)  # fp32's median over this variant's: above 1 is faster than fp32, below 1 slower


class Speed(Strict):
    """onnxruntime CPU latency, measured by `zoo build` on the card's training.cpu with every variant side by side."""

    threads: int = Field(ge=1)  # intra-op threads of each session
    runs: int = Field(ge=1)  # timed runs per batch size, after a warm-up
    batch_1: Timing
    batch_32: Timing

    def at(self, batch: int) -> Timing:
        return self.batch_1 if batch == 1 else self.batch_32


# onnx: one inference model. ort-training: a zip of onnxruntime-training artifacts (training, eval and optimizer
# models, initial checkpoint, trainable.json) made from the fp32 file with the card's trainable split (zoo.kinds).
Format = Literal["onnx", "ort-training"]


class Variant(Strict):
    file: str  # path inside the entry folder
    precision: str  # the kind's (zoo.kinds): fp32, fp16, int8
    quantization: str = "none"  # the kind's: none, qat, ptq, dynamic
    opset: int
    format: Format = "onnx"
    # Weights retrained from the fp32 file by another recipe (e.g. federated-digits); its metrics are measured on
    # that recipe's evaluation data, and `zoo build`/`zoo export` rerun it.
    recipe: str | None = None
    sha256: str | None = Field(default=None, pattern=SHA256_PATTERN)  # None: not built yet
    size: int | None = Field(default=None, ge=0)
    metrics: dict[str, float] = Field(default_factory=dict)
    tolerance: float = 0.01  # allowed absolute drop of the primary metric when re-measured
    extra_opsets: dict[int, str] = Field(default_factory=dict)  # opset -> file, same weights exported again
    # fp32: the opsets the family exports these weights at with fp32's predictions (measured by `zoo build`):
    # `zoo fetch NAME --opset N` serves any of them.
    opset_range: list[int] | None = Field(default=None, min_length=2, max_length=2)
    speed: Speed | None = None  # latency at batch 1 and 32 relative to fp32 (measured by `zoo build`)

    @field_validator("metrics")
    @classmethod
    def _fractions(cls, metrics: dict[str, float]) -> dict[str, float]:
        bad = {k: v for k, v in metrics.items() if k in FRACTION_METRICS or k.endswith("_accuracy")
               if not 0.0 <= v <= 1.0}
        if bad:
            raise ValueError(f"{', '.join(f'{k} {v}' for k, v in bad.items())}: accuracies are fractions in [0, 1]")
        return metrics

    @model_validator(mode="after")
    def _built_together(self) -> "Variant":
        if (self.sha256 is None) != (self.size is None):
            raise ValueError("sha256 and size are set together (both measured by `zoo build`) or not at all")
        if self.opset_range is not None and not self.opset_range[0] <= self.opset <= self.opset_range[1]:
            raise ValueError(f"opset_range {self.opset_range} does not contain the file's opset {self.opset}")
        if self.format != "onnx":  # a file format is one kind, made from the fp32 file as it is
            kind = next(k for k in KINDS.values() if k.format == self.format)
            if (self.precision, self.quantization, self.recipe) != (kind.precision, kind.quantization, None):
                raise ValueError(f"{kind.key} variants are made from the fp32 file as it is: precision "
                                 f"{kind.precision}, quantization {kind.quantization}, no recipe")
        return self

    @property
    def built(self) -> bool:
        return self.sha256 is not None


class ModelCard(Strict):
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9.\-]*$")
    architecture: str  # registry name in zoo.models (the code); `name` is these weights
    family: str
    task: str
    description: str
    license: str
    dataset: DatasetRecord
    preprocessing: list[str]  # exact steps, in order
    inputs: list[Tensor]
    outputs: list[Tensor]
    num_params: int = Field(ge=0)
    primary_metric: str = "accuracy"
    # Parameter-name globs on-device training may change (the rest frozen): `zoo build` records the matching
    # initializers in the fp32 file's metadata (zoo.trainable) and the ort-training artifacts follow them.
    trainable: list[str] = Field(default_factory=lambda: ["*"], min_length=1)
    training: Training
    variants: dict[str, Variant]

    @model_validator(mode="after")
    def _has_fp32(self) -> "ModelCard":
        if "fp32" not in self.variants:
            raise ValueError("variants: every entry has an 'fp32' variant (the reference the others are measured against)")
        for key, variant in self.variants.items():
            try:
                kind = kind_of(key, variant)
            except ZooError as exc:
                raise ValueError(str(exc)) from None
            if (variant.precision, variant.quantization) != (kind.precision, kind.quantization):
                raise ValueError(f"variants.{key}: precision {variant.precision}, quantization {variant.quantization}; "
                                 f"a {kind.key} file is {kind.precision}, quantization {kind.quantization}")
        return self

    def metric(self, variant: str) -> float | None:
        return self.variants[variant].metrics.get(self.primary_metric)

    def accuracy_band(self, variant: str, examples: int, retrained: bool = False) -> float:
        """How far below the card's primary metric a measurement of `variant` on `examples` examples may land.

        The card's bytes (or a rebuild that reproduced them): the variant's tolerance. A retraining on a machine whose
        CPU flags or libraries differ from the card's build record (`retrained`): at least RETRAINING_STANDARD_ERRORS
        standard errors of the card's accuracy on that many examples, the count smoothed by one right and one wrong
        answer so that a perfect score still allows for an error or two."""
        tolerance = self.variants[variant].tolerance
        claimed = self.metric(variant)
        if not retrained or claimed is None or examples <= 0:
            return tolerance
        return max(tolerance, retraining_band(claimed, examples))

    def keeps_accuracy(self, variant: str) -> bool:
        """The variant's primary metric is within its tolerance of fp32's (what `--fastest` may pick)."""
        mine, reference = self.metric(variant), self.metric("fp32")
        return mine is not None and reference is not None and mine >= reference - self.variants[variant].tolerance

    def inference_variants(self, wanted: list[str] | None = None) -> list[str]:
        """The built variants that are one ONNX inference model each (what `zoo bench` times and `zoo register`
        registers): all of them, or `wanted`, refusing one that is not among them."""
        built = [k for k, v in self.variants.items() if v.built and v.sha256 and kind_of(k, v).inference]
        unknown = [v for v in wanted or [] if v not in built]
        if unknown:
            raise ZooError(f"'{self.name}' has no built ONNX variant {', '.join(unknown)}; it has {', '.join(built)}")
        return list(wanted) if wanted else built

    def registrable_variants(self, wanted: list[str] | None = None) -> list[str]:
        """What `zoo register` registers (inference_variants), refusing an entry with none built."""
        if not self.inference_variants():
            raise ZooError(f"'{self.name}' has no built ONNX variant to register: `zoo build {self.name}` makes them")
        return self.inference_variants(wanted)

    def fastest(self, batch: int = 1) -> str:
        """The ONNX file of these weights with the lowest measured latency at `batch` (1 or 32) among those that keep
        fp32's accuracy within their tolerance; fp32 when none beats it."""
        # Retrained variants (federated) hold other weights: another model, not a faster file of this one.
        timed = {k: v.speed.at(batch).median_ms for k, v in self.variants.items()
                 if kind_of(k, v).inference and kind_of(k, v).reference != "retrained" and v.speed is not None
                 and v.sha256 and self.keeps_accuracy(k)}
        if "fp32" not in timed:
            raise ZooError(f"'{self.name}' has no latency measurements on its card: `zoo build {self.name}` measures them")
        return min(timed, key=timed.get)


T = TypeVar("T", bound=BaseModel)


def validate_file_data(schema: type[T], data: object, source: str) -> T:
    """Validate YAML data against a schema; errors name the file and every bad field on one line."""
    try:
        return schema.model_validate(data)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            kind = {"extra_forbidden": "unknown field", "missing": "missing required field"}.get(err["type"], err["msg"])
            problems.append(f"{'.'.join(_shown(part) for part in err['loc']) or '(top level)'}: {kind}")
        message = f"{source}: " + "; ".join(problems)  # values quoted by validators may hold anything: escape it
        raise CardError("".join(c if c.isprintable() else repr(c)[1:-1] for c in message)) from None


def _shown(part: object) -> str:
    """A field name as it reads in a one-line error: odd names (control characters, blanks) quoted."""
    text = str(part)
    return text if text and text.isprintable() and text.strip() == text else repr(text)


def parse_card(data: object, source: str) -> ModelCard:
    return validate_file_data(ModelCard, data, source)


def read_yaml(path: Path) -> object:
    """A card's or recipe's YAML document; unreadable, non-UTF-8 or malformed files are one-line CardErrors."""
    try:
        return yaml.safe_load(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise CardError(f"{path}: not UTF-8 text (byte {exc.start}): save it as UTF-8 YAML") from None
    except yaml.YAMLError as exc:
        problem = getattr(exc, "problem", None) or str(exc)
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise CardError(f"{path}: not valid YAML ({' '.join(str(problem).split())}{where})") from None
    except OSError as exc:
        raise CardError(f"{path}: cannot read it ({exc.strerror or exc})") from None


def load_card(path: Path) -> ModelCard:
    data = read_yaml(path)
    card = parse_card(data, str(path))
    if card.name != path.parent.name:
        raise CardError(f"{path}: name: '{card.name}' differs from its folder '{path.parent.name}'")
    check_paths(data, path.parent, str(path))
    return card


def check_inside(entry_dir: Path, file: str, where: str) -> Path:
    """A card's file path inside its entry folder (zoo.fsutil.contained), as a card error."""
    return contained(entry_dir, file, where, CardError, role="entry folder")


def check_paths(raw: object, entry_dir: Path, source: str) -> None:
    """Every file path a card (parsed or still raw, as `zoo build` reads it) names stays inside its entry folder."""
    variants = raw.get("variants") if isinstance(raw, dict) else None
    for key, variant in (variants.items() if isinstance(variants, dict) else []):
        if isinstance(variant, dict):
            extra = variant.get("extra_opsets")
            for file in [variant.get("file"), *(extra.values() if isinstance(extra, dict) else [])]:
                if isinstance(file, (str, Path)):
                    check_inside(entry_dir, str(file), f"{source}: variants.{key}.file")


class _CardDumper(yaml.SafeDumper):
    """Short lists of scalars (shapes, labels) on one line; everything else in block style."""


def _represent_list(dumper: yaml.SafeDumper, data: list):
    flow = all(isinstance(v, (int, float, str)) and len(str(v)) < 40 for v in data)
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=flow)


_CardDumper.add_representer(list, _represent_list)


def dump_card(card: ModelCard) -> str:
    data = card.model_dump(mode="json", exclude_none=True)
    for variant in data["variants"].values():
        if not variant.get("extra_opsets"):
            variant.pop("extra_opsets", None)
        if variant.get("format") == "onnx":  # the default: cards stay short
            variant.pop("format")
    return yaml.dump(data, Dumper=_CardDumper, sort_keys=False, allow_unicode=True, width=110)
