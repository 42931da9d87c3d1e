"""`zoo import`: turn an upstream BERT checkpoint folder (config.json + model.safetensors) into a zoo entry.

1. Map its weights onto the zoo's BertModel (same names and shapes as Hugging Face's) and check parity
   against the upstream implementation (transformers' BertModel) on real inputs, in torch and through
   an fp32 ONNX export of the encoder run by onnxruntime.
2. Fine-tune a classifier head on the entry's task with the entry's recipe (the one trainer, torchrun),
   export every variant and measure it: `zoo build` with `init_from` pointing at the converted weights
   (zoo.build.import_entry).
"""

from __future__ import annotations

import io
import json
import tempfile
from pathlib import Path

import importlib

import numpy as np
import torch
from huggingface_hub import constants, snapshot_download
from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError
from safetensors.torch import load_file

from zoo.config import zoo_home
from zoo.data import load_dataset
from zoo.errors import ZooError
from zoo.logs import NOISY_IMPORTS, quiet
from zoo.evaluate import predict
from zoo.fsutil import atomic_write_bytes
from zoo.export import export_fp32
from zoo.models.bert import BertConfig, BertModel

with quiet(*NOISY_IMPORTS):  # transformers imports torchao, which warns while imported
    from transformers import BertModel as UpstreamBert

PARITY_ATOL = 1e-4


def read_checkpoint(folder: Path) -> tuple[dict, dict[str, torch.Tensor]]:
    config_path, weights_path = folder / "config.json", folder / "model.safetensors"
    for path in (config_path, weights_path):
        if not path.exists():
            raise ZooError(f"{folder} is not a BERT checkpoint folder: {path.name} is missing "
                           "(expected config.json + model.safetensors, as Hugging Face saves them)")
    config = json.loads(config_path.read_text())
    if config.get("model_type") != "bert":
        raise ZooError(f"{config_path}: model_type is {config.get('model_type')!r}; zoo import handles 'bert' checkpoints")

    state = load_file(str(weights_path))
    # BertForX checkpoints prefix the encoder with "bert."; BertModel ones don't.
    state = {k.removeprefix("bert."): v for k, v in state.items() if not k.startswith(("cls.", "classifier."))}
    state.pop("embeddings.position_ids", None)  # a buffer in older transformers, not a weight
    return config, state


def convert(folder: Path, name: str) -> tuple[Path, dict, dict]:
    """Converted classifier-ready weights (bert.* keys) under $ZOO_HOME/imports/<name>/, plus the config."""
    config, state = read_checkpoint(folder)
    model = BertModel(BertConfig.from_hf(config))
    result = model.load_state_dict(state, strict=False)
    if result.unexpected_keys or [k for k in result.missing_keys if not k.startswith("pooler.")]:
        raise ZooError(f"{folder}: weights do not match BertModel: missing {result.missing_keys[:5]}, "
                       f"unexpected {result.unexpected_keys[:5]}")
    parity = check_parity(folder, model)
    out = zoo_home() / "imports" / name / "weights.pt"
    # Saved through a buffer: torch names the archive's folder after the file it writes to, and a temporary name
    # would make each conversion's bytes (and the recipe digest that counts them, Recipe.digest) differ.
    buffer = io.BytesIO()
    torch.save({f"bert.{k}": v for k, v in model.state_dict().items()}, buffer)
    atomic_write_bytes(out, buffer.getvalue())
    return out, config, parity


def check_parity(folder: Path, model: torch.nn.Module) -> dict:
    """Max |difference| of last hidden states vs transformers' BertModel, in torch and via our ONNX export."""

    upstream = UpstreamBert.from_pretrained(str(folder), local_files_only=True).eval()
    model.eval()
    ids = load_dataset("langid").test.x[:32]  # the upstream (English-uncased) vocabulary
    with torch.no_grad():
        reference = upstream(input_ids=ids, attention_mask=(ids != 0).long()).last_hidden_state
        ours = model(ids)
    keep = (ids != 0)[:, :, None]  # padded positions are not outputs anyone reads
    torch_diff = float(((ours - reference).abs() * keep).max())
    with tempfile.TemporaryDirectory() as tmp:
        onnx_path = export_fp32(model, ids[:2], Path(tmp) / "encoder.onnx", 17, output_name="last_hidden_state")
        onnx_out = predict(onnx_path, ids.numpy())
    onnx_diff = float((np.abs(onnx_out - reference.numpy()) * keep.numpy()).max())
    if max(torch_diff, onnx_diff) > PARITY_ATOL:
        raise ZooError(f"{folder}: outputs differ from transformers' BertModel by {max(torch_diff, onnx_diff):.2e} "
                       f"(> {PARITY_ATOL}); the checkpoint does not map onto the zoo's BERT")
    return {"parity_torch_max_abs_diff": torch_diff, "parity_onnx_max_abs_diff": onnx_diff}


def resolve_source(spec: str) -> Path:
    """The checkpoint folder a spec names: `hf:<repo id>` (a model in the local Hugging Face hub cache, read offline),
    `python-package:<module>/<folder>` (an installed package's folder, as cards record it), else a folder path."""
    kind, _, where = spec.partition(":")
    if kind == "hf":
        return _hub_snapshot(where)
    if kind != "python-package":
        return Path(spec)
    if "/" not in where:
        raise ZooError(f"import_source {spec!r}: expected python-package:<module>/<folder>")
    module, folder = where.split("/", 1)

    try:
        package = importlib.import_module(module)
    except ImportError:
        raise ZooError(f"import_source {spec!r}: the package providing '{module}' is not installed "
                       "(make setup installs it)") from None
    return Path(package.__file__).parent / folder


def _hub_snapshot(repo_id: str) -> Path:
    """The newest snapshot of `repo_id` in the local Hugging Face hub cache ($HF_HUB_CACHE / $HF_HOME), no network."""
    if not repo_id:
        raise ZooError("--from hf:<repo id>: name a model, e.g. hf:bert-base-uncased")
    try:
        return Path(snapshot_download(repo_id, local_files_only=True))
    except (LocalEntryNotFoundError, HFValidationError) as exc:
        raise ZooError(f"hf:{repo_id} is not in the local Hugging Face cache ({constants.HF_HUB_CACHE}): download it "
                       f"where there is internet (`huggingface-cli download {repo_id}`) and copy the cache, or pass the "
                       f"checkpoint folder ({type(exc).__name__})") from None
