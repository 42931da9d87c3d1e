"""The zoo's ONNX metadata (ModelProto.metadata_props, read back as onnxruntime's custom_metadata_map): the keys,
reading and writing them, with the onnx library alone (no torch), so a federated client or a device can check what a
file is. ONNX has no standard key for compute or accumulation precision, so the zoo defines these; `METADATA_KEYS`
says what each means (docs/guides/quantization.md shows the table)."""

from __future__ import annotations

from pathlib import Path

import onnx

from zoo.fsutil import atomic_write_bytes
from zoo.pointer import sha256_file
from zoo.kinds import KINDS, onnx_kinds

METADATA_KEYS = {
    "zoo.model": "catalog / architecture name",
    "zoo.variant": "the variant kind (zoo.kinds): " + " | ".join(onnx_kinds()),
    "zoo.precision.weights": "storage type of the weights (fp32, fp16, int8)",
    "zoo.precision.activations": "type of activations between ops (fp32, fp16, uint8)",
    "zoo.precision.compute": "arithmetic the kernels are meant to use (fp32, fp16, int8 u8xs8)",
    "zoo.precision.accumulation": "accumulator type (fp32, int32)",
    "zoo.quantization": "none, or the scheme: tool, granularity, symmetry, activation/weight types",
    "zoo.source_sha256": "for derived variants: sha256 of the fp32 ONNX file they were made from",
    "zoo.recipe": "recipe name",
    "zoo.recipe_sha256": "sha256 of the resolved recipe (after overrides)",
    "zoo.git_commit": "the clean commit `zoo build` recorded before it started (card: training.git_commit); "
                      "'-dirty' for builds allowed on a tree with uncommitted changes",
    "zoo.opset": "default-domain opset of the file",
    "zoo.trainable": "fp32 only: JSON list of the initializers on-device training may change (the rest stay frozen)",
    "zoo.trainable.globs": "fp32 only: the recipe's parameter-name patterns (export.trainable) behind zoo.trainable",
    "zoo.parameter_aliases": "fp32 only: JSON {parameter: initializer} for the parameters the exporter stored under "
                             "another initializer's name (it deduplicates value-identical tensors); every other "
                             "parameter is the initializer of its own name, so the file maps back onto the torch model",
    "zoo.finetuned_from_sha256": "fine-tuned or federated files: sha256 of the fp32 file they started from",
    "zoo.finetune": "files from `zoo finetune --onnx`: steps, learning rate, batch, seed (JSON)",
    "zoo.federated": "files from launchers/federated.py: rounds, clients, aggregation (JSON)",
    "zoo.tokenizer": "text models: the tokenizer that makes the input ids, as the `tokenizers` library's JSON "
                     "(`Tokenizer.from_str`), from the dataset (zoo.data)",
}


TOKENIZER_KEY = "zoo.tokenizer"  # text models: `tokenizers.Tokenizer.from_str(metadata[TOKENIZER_KEY])`


# Keys only some files carry: fp32 exports (on-device training split) and files trained from a zoo file.
FP32_ONLY_KEYS = {"zoo.trainable", "zoo.trainable.globs", "zoo.parameter_aliases"}


# What a file made from the fp32 file inherits from it: the same model, recipe and build.
INHERITED_KEYS = ("zoo.model", "zoo.recipe", "zoo.recipe_sha256", "zoo.git_commit", TOKENIZER_KEY)


RETRAINED_KEYS = {"zoo.finetuned_from_sha256", "zoo.finetune", "zoo.federated"}


# Keys only files of some datasets carry (their Dataset.onnx_metadata).
DATASET_KEYS = {TOKENIZER_KEY}


ALIASES_KEY = "zoo.parameter_aliases"


def read_metadata(path: Path) -> dict[str, str]:
    return {p.key: p.value for p in onnx.load(str(path), load_external_data=False).metadata_props}


def inherited_metadata(fp32_path: Path) -> dict[str, str]:
    """The provenance keys a derived file copies from the fp32 file it was made from (so deriving it again, anywhere,
    stamps the same bytes)."""
    props = read_metadata(fp32_path)
    return {k: props[k] for k in INHERITED_KEYS if k in props}


def save_onnx(model: onnx.ModelProto, path: Path) -> Path:
    atomic_write_bytes(path, model.SerializeToString())
    return path


def stamp(path: Path, variant: str, common: dict[str, str], source: Path | None = None) -> Path:
    """Write the zoo's metadata into an ONNX file (replacing any it had), then check the file."""
    model = onnx.load(str(path))
    opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    props = {**common, **KINDS[variant].metadata, "zoo.variant": variant, "zoo.opset": str(opset)}
    if source is not None:
        props["zoo.source_sha256"] = sha256_file(source)
    return write_metadata(model, props, path)


def write_metadata(model: onnx.ModelProto, props: dict[str, str], path: Path) -> Path:
    """Replace the model's metadata with `props`, check it, and save it atomically to `path`."""
    del model.metadata_props[:]
    for key in sorted(props):
        model.metadata_props.append(onnx.StringStringEntryProto(key=key, value=props[key]))
    onnx.checker.check_model(model, full_check=True)
    return save_onnx(model, path)
