"""The variant kinds: one table says what each kind of file is, and everything else iterates over it.

A kind is what a card's variant *is*: its default file name, the precision and quantization the card and the file's
metadata declare, the tolerance its metric is re-measured with, how it is made, how validation compares it with the
stored reference outputs, and how the docs show it. Build, export, fetch, validate, evaluate, docs and the CLI read
these fields; they never branch on a kind's name or format.

How a kind is made (`made`):
- `training`: the trainer's run makes it from the torch model (fp32, int8-qat). It needs the recipe: a store must
  hold it (a *primary*).
- `from-fp32`: a deterministic function of the built fp32 file, by `tool` (see zoo.variants.make): `zoo build`, `zoo
  export` and `zoo fetch` (when no store has it) make the same bytes with the same libraries, on any CPU, unless the
  kind is `cpu_dependent` (int8-ptq: its calibration runs onnxruntime's native kernels), which the store holds.
- `retraining`: the fp32 weights retrained by another recipe (federated). A primary too.

This module is the table only and imports nothing heavy, so light commands (`zoo list`, `zoo card`) can read it;
zoo.variants.make makes files of a kind and zoo.variants.checks validates them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from zoo.errors import ZooError

Made = Literal["training", "from-fp32", "retraining"]
# How validation compares a kind's file with the fp32 reference outputs stored in test_data_set_*:
# outputs: logits within `atol`; labels: predicted labels agree on `label_agreement` of the examples;
# artifacts: onnxruntime-training archive (its untouched export is compared as fp32); retrained: the weights moved
# on purpose, so the file must name the fp32 file it started from instead.
Reference = Literal["outputs", "labels", "artifacts", "retrained"]
# Embedding tables in int8 files: s8 per row (symmetric), gathered as int8 and scaled after the lookup.
EMBEDDING_SCHEME = "embedding tables s8 per-row symmetric (weight-only, gathered then scaled)"
_FP32 = {"zoo.precision.weights": "fp32", "zoo.precision.activations": "fp32", "zoo.precision.compute": "fp32",
         "zoo.precision.accumulation": "fp32", "zoo.quantization": "none"}
_INT8 = {"zoo.precision.weights": "int8", "zoo.precision.activations": "uint8",
         "zoo.precision.compute": "int8 (u8 activations x s8 weights)", "zoo.precision.accumulation": "int32"}


@dataclass(frozen=True)
class Training:
    """How a training run makes a kind after the fp32 phase, when the recipe's quantization.scheme is `scheme`."""
    scheme: str  # the recipe's quantization.scheme that asks for it
    # "module:function" (every rank): (trained fp32 model, recipe, data, ctx, strategy, train) -> this kind's torch
    # model, where train(phase, model, strategy, after_step) runs one more phase of the one training loop
    hook: str
    exporter: str  # "module:function" (rank 0): (torch model, example input, path) -> the ONNX file written


@dataclass(frozen=True)
class Kind:
    key: str  # the card's variant key (and the file's zoo.variant)
    file: str  # default file name in the entry folder
    precision: str
    quantization: str
    made: Made
    summary: str  # how it is made, one line (docs, `zoo card`, CLI help)
    tolerance: float  # allowed absolute drop of the card's metric when re-measured (other CPU kernels)
    reference: Reference
    metadata: dict[str, str] = field(default_factory=dict)  # zoo.precision.* / zoo.quantization stamped in the file
    format: Literal["onnx", "ort-training"] = "onnx"
    tool: str | None = None  # made == "from-fp32": the function of zoo.variants.make.TOOLS that makes it
    atol: float = 1e-3  # reference "outputs": logits within this of fp32's
    label_agreement: float = 0.9  # reference "labels"
    in_recipe: bool = False  # a recipe's export.variants may list it: the training run makes and measures it
    # Made from fp32 with numbers only onnxruntime's native kernels compute (PTQ's calibration ranges), so another CPU
    # makes other bytes: the store holds the build's file (a primary), and fetch makes it only when no store has it.
    cpu_dependent: bool = False
    fixed_opset: int | None = None  # the opset its exporter always writes (None: the recipe's primary opset)
    docs_column: bool = False  # an accuracy column of the models index (the others are on each model's page)
    training: Training | None = None  # made by a training phase of its own (made == "training", not fp32)
    # Why a file of this kind can run slower than fp32 on a CPU (cards, `zoo card` and the docs say it where measured).
    slower_because: str = "it runs the fp32 file's operators on the same weights; the difference is measurement noise"

    @property
    def primary(self) -> bool:
        """A store must hold it: only training (or retraining) makes it, or only the build's CPU makes its bytes."""
        return self.made != "from-fp32" or self.cpu_dependent

    @property
    def inference(self) -> bool:
        """One ONNX inference model: evaluated, timed on the card, and a candidate for `zoo fetch --fastest`."""
        return self.format == "onnx"

    @property
    def int8(self) -> bool:
        """Quantized to int8: its accuracy drop against fp32 is bounded by the recipe's max_accuracy_drop."""
        return self.precision == "int8"

    def card_fields(self, opset: int) -> dict:
        """The hand-independent fields of a planned variant of this kind (what `zoo build --no-train` writes)."""
        fields = {"file": self.file, "precision": self.precision, "quantization": self.quantization,
                  "opset": self.fixed_opset or opset, "tolerance": self.tolerance}
        return fields | ({"format": self.format} if self.format != "onnx" else {})


# Why a static int8 file (QAT or PTQ) can be slower than fp32: the same for both, and for every family.
_INT8_OVERHEAD = ("each int8 layer quantizes its input and dequantizes its output, and only the matrix products run in "
                  "integer arithmetic; in narrow layers at small batches those conversions and the per-operator "
                  "overhead cost more than the integer products save")

KINDS: dict[str, Kind] = {k.key: k for k in [
    Kind("fp32", "model.onnx", "fp32", "none", "training",
         "the trained weights, exported by the TorchScript exporter at the recipe's opsets",
         tolerance=0.001, reference="outputs", metadata=_FP32, in_recipe=True, docs_column=True),
    Kind("int8-qat", "model.int8-qat.onnx", "int8", "qat", "training",
         "quantization-aware fine-tuning (torchao PT2E), exported as QDQ by the dynamo exporter",
         tolerance=0.01, reference="labels", in_recipe=True, fixed_opset=20, docs_column=True,
         slower_because=_INT8_OVERHEAD,
         training=Training("qat-int8", "zoo.train.qat:fine_tune", "zoo.export:export_int8_qat"),
         metadata={**_INT8, "zoo.quantization": "qat: torchao PT2E X86InductorQuantizer, QDQ, activations u8 per-tensor "
                   "affine (7-bit range), weights s8 per-channel symmetric, biases int32, " + EMBEDDING_SCHEME}),
    Kind("int8-ptq", "model.int8-ptq.onnx", "int8", "ptq", "from-fp32",
         "onnxruntime quantize_static of the fp32 file, calibrated on the recipe's seeded training batches",
         tolerance=0.01, reference="labels", tool="quantize_static", in_recipe=True, cpu_dependent=True,
         slower_because=_INT8_OVERHEAD,
         metadata={**_INT8, "zoo.quantization": "ptq: onnxruntime quantize_static, QDQ, MinMax calibration, "
                   "activations u8 per-tensor, weights s8 per-channel, reduce_range, " + EMBEDDING_SCHEME}),
    Kind("int8-dynamic", "model.int8-dynamic.onnx", "int8", "dynamic", "from-fp32",
         "onnxruntime quantize_dynamic of the fp32 file (transformers: after onnxruntime's transformer optimizer, so "
         "attention runs as QAttention): int8 weights, activations quantized per batch at run time",
         tolerance=0.01, reference="labels", tool="quantize_dynamic", in_recipe=True, docs_column=True,
         slower_because="only the matrix-multiplication layers become int8, each finding its input's range at run "
                        "time; convolutions and recurrences stay fp32, so a model made mostly of them gains little and "
                        "pays the conversions",
         metadata={"zoo.precision.weights": "int8", "zoo.precision.activations": "fp32 (u8 per batch inside the "
                   "integer ops)", "zoo.precision.compute": "int8 (u8 activations x s8 weights)",
                   "zoo.precision.accumulation": "int32",
                   "zoo.quantization": "dynamic: onnxruntime quantize_dynamic (transformers fused by onnxruntime's "
                   "transformer optimizer first: QAttention), weights s8 per-channel, activations u8 per-tensor "
                   "computed per batch, " + EMBEDDING_SCHEME}),
    Kind("fp16", "model.fp16.onnx", "fp16", "none", "from-fp32",
         "fp16 weights and compute, fp32 inputs and outputs (onnxruntime's float16 converter)",
         tolerance=0.002, reference="outputs", atol=2e-2, tool="float16", in_recipe=True,
         slower_because="x86 CPUs without AVX512-FP16 have no fp16 arithmetic: onnxruntime's CPU kernels for most "
                        "operators are fp32 only, so the file runs with Casts converting around them; fp16 halves the "
                        "download and pays off on GPUs",
         metadata={"zoo.precision.weights": "fp16", "zoo.precision.activations": "fp16", "zoo.precision.compute": "fp16",
                   "zoo.precision.accumulation": "fp32", "zoo.quantization": "none"}),
    Kind("ort-training", "model.ort-training.zip", "fp32", "none", "from-fp32",
         "onnxruntime-training artifacts (training, eval, optimizer models, checkpoint) for the card's trainable "
         "split, in one zip", tolerance=0.001, reference="artifacts", format="ort-training", tool="ort_training"),
    Kind("federated", "model.federated.onnx", "fp32", "none", "retraining",
         "the fp32 weights retrained by a federated recipe (launchers/federated.py), measured on its data",
         tolerance=0.02, reference="retrained"),
]}


def slower_than_fp32(card) -> list[tuple[str, str]]:
    """(who, why) for each reason a card's timed variants are slower than fp32 at batch 1 or 32, one per reason:
    ("int8-qat and int8-ptq are slower than fp32 at batch 1", "each int8 layer ...")."""
    grouped: dict[str, list[str]] = {}
    for key, v in card.variants.items():
        slow = [b for b in (1, 32) if key != "fp32" and v.speed and v.speed.at(b).vs_fp32 < 1]
        if slow:
            grouped.setdefault(kind_of(key, v).slower_because, []).append((key, " and ".join(map(str, slow))))
    said = []
    for why, slow in grouped.items():
        batches = {b for _, b in slow}
        names = [k if len(batches) == 1 else f"{k} (batch {b})" for k, b in slow]
        who = f"{' and '.join(names)} {'is' if len(slow) == 1 else 'are'} slower than fp32" + (
            f" at batch {batches.pop()}" if len(batches) == 1 else "")
        said.append((who, why))
    return said


def kind_of(key: str, variant) -> Kind:
    """The kind of a card's variant (a Variant or its raw dict): retrained when it names a recipe, the artifacts kind
    for its format, else the kind its key names."""
    get = variant.get if isinstance(variant, dict) else lambda name, default=None: getattr(variant, name, default)
    if get("recipe") is not None:
        return KINDS["federated"]
    fmt = get("format", "onnx") or "onnx"
    if fmt != "onnx":
        return next(k for k in KINDS.values() if k.format == fmt)
    if key not in KINDS or KINDS[key].format != "onnx" or KINDS[key].made == "retraining":
        raise ZooError(f"variant '{key}' is no kind the zoo knows: name one of {', '.join(onnx_kinds())}, or set "
                       "`format: ort-training`, or `recipe: <federated recipe>`")
    return KINDS[key]


def onnx_kinds() -> list[str]:
    return [k for k, kind in KINDS.items() if kind.format == "onnx" and kind.made != "retraining"]


def recipe_kinds() -> list[str]:
    """What a recipe's export.variants may list (made and measured by the training run)."""
    return [k for k, kind in KINDS.items() if kind.in_recipe]


def quantization_schemes() -> list[str]:
    """What a recipe's quantization.scheme may say: none, or the scheme of a kind made by its own training phase."""
    return ["none", *(kind.training.scheme for kind in KINDS.values() if kind.training)]


def trained_kinds(scheme: str) -> list[Kind]:
    """The kinds a run whose recipe says quantization.scheme `scheme` makes with their own training phase."""
    return [kind for kind in KINDS.values() if kind.training and kind.training.scheme == scheme]


def is_primary(key: str, variant) -> bool:
    """A store must hold it (fp32, int8-qat, int8-ptq, retrained): it needs training or the build's CPU."""
    return kind_of(key, variant).primary


def made_from_fp32(key: str, variant) -> bool:
    """A deterministic function of the fp32 file: `zoo fetch` makes it when no store has it."""
    return kind_of(key, variant).made == "from-fp32"
