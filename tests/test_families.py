"""Every model family trains a few steps through the launcher, exports, and imports upstream weights (an imported
entry built by `zoo import` and rebuilt by `zoo fetch --build`: tests/test_rebuild.py)."""

from __future__ import annotations

import json
import math

import pytest
import torch

from tests.helpers import entry_of, run_use_it, zoo_cli
from tests.test_training import train
from zoo import catalog
from zoo.data import langid
from zoo.metadata import read_metadata
from zoo.models import build_model


@pytest.mark.beside  # make test: at idle priority beside the other parts (tests/conftest.py)
@pytest.mark.parametrize("model", ["mnist1d-cnn", "mnist1d-gru", "bert-tiny"])
def test_family_trains_exports_and_quantizes(tmp_path, model):
    # Measured on 256 test examples spread over the split (recipe eval_examples): what is exported and quantized is
    # under test here, not the accuracy (every entry's accuracy is measured whole by its build and by validation).
    result = train(tmp_path, model, "--recipe", "qat-int8", "--model", model, "--no-tracking", "steps=20", "optimizer.lr=0.001",
          "quantization.qat_steps=3", "global_batch_size=32", "schedule.warmup_steps=0", "eval_examples=256",
          *(["export.opsets=[13,17]", "group_by_length=true"] if model.startswith("bert") else ["export.opsets=[17]"]))
    summary = json.loads((tmp_path / model / "summary.json").read_text())
    assert set(summary["variants"]) == {"fp32", "int8-qat", "int8-ptq", "int8-dynamic", "fp16"}
    assert summary["eval_split"] == "test" and summary["eval_examples"] == 256
    assert set(summary["torch_accuracy"]) == {"fp32", "int8-qat"}
    # onnxruntime's quantizers' notices to their own developers ("consider pre-processing") stay off the terminal.
    assert "pre-processing" not in result.stderr and "already been marked" not in result.stderr, result.stderr[-2000:]
    assert summary["variants"]["int8-qat"]["int8_kernels"], "int8-qat must run on int8 kernels"
    assert summary["variants"]["int8-dynamic"]["int8_kernels"], "int8-dynamic must run on int8 kernels"
    if model.startswith("bert"):
        # opset 13 re-exported from the fp32 file's weights (initializers keep the torch names): same predictions
        assert summary["variants"]["fp32"]["extra_opsets"]["13"]["agreement_with_primary"] == 1.0
        # embedding tables quantized too: int8 files at most 30% of fp32
        # onnxruntime's transformer optimizer fused each attention block before dynamic quantization
        assert "QAttention" in summary["variants"]["int8-dynamic"]["int8_kernels"], summary["variants"]["int8-dynamic"]
        for key in ("int8-qat", "int8-ptq", "int8-dynamic"):
            ratio = summary["variants"][key]["size"] / summary["variants"]["fp32"]["size"]
            assert ratio <= 0.30, f"{key} is {ratio:.0%} of fp32"
        # The tokenizer the ids come from travels inside every file (the trained vocabulary, not the uncased one).
        for key, result in summary["variants"].items():
            meta = read_metadata(tmp_path / model / result["file"])
            assert meta["zoo.tokenizer"] == langid.tokenizer_json(langid.TRAINED), key
    # The docs' "Use it" block (fetch, the dataset's preprocessing, onnxruntime) runs as written on this model.
    entries = tmp_path / "entries"
    entry_of(entries, model, tmp_path / model / summary["variants"]["fp32"]["file"], summary["dataset"])
    labels = run_use_it(entries, model, tmp_path, {"ZOO_HOME": str(tmp_path / "home"), "ZOO_LFS_URL": "", "ZOO_STORE": ""})
    assert labels and set(labels) <= set(catalog.get_card(model).outputs[0].labels), labels
    losses = summary["phases"]["fp32"]["losses"]
    # A few steps only: the loss stays finite and does not diverge (convergence is what the entries' builds show).
    assert all(math.isfinite(v) for v in losses) and max(losses[-5:]) < 1.5 * math.log(10), losses


def test_bert_layout_matches_hugging_face():
    from transformers import BertConfig, BertModel

    upstream = BertModel(BertConfig(num_hidden_layers=4, hidden_size=256, num_attention_heads=4, intermediate_size=1024))
    ours = build_model("bert-mini", num_classes=8).bert
    theirs = {k: v.shape for k, v in upstream.state_dict().items() if k != "embeddings.position_ids"}
    assert {k: v.shape for k, v in ours.state_dict().items()} == theirs


def _tiny_upstream_checkpoint(folder, seed=0, **config):
    from transformers import BertConfig, BertModel

    torch.manual_seed(seed)
    config = config or dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=2, intermediate_size=128)
    BertModel(BertConfig(**config)).save_pretrained(str(folder), safe_serialization=True)


def _in_hub_cache(cache, repo_id: str, **config) -> None:
    """A checkpoint saved by transformers where the Hugging Face hub cache keeps downloads (refs/main -> snapshot)."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    commit = "0" * 40
    _tiny_upstream_checkpoint(repo / "snapshots" / commit, **config)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)


def test_hf_sources_resolve_from_the_local_hub_cache_offline(tmp_path, monkeypatch):
    """`zoo import bert-base --from hf:bert-base-uncased` reads a bert-base checkpoint from the hub cache, offline."""
    from huggingface_hub import constants

    from zoo.importer import read_checkpoint, resolve_source
    from zoo.models.bert import SIZES, BertConfig

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    _in_hub_cache(tmp_path / "hub", "bert-base-uncased", num_hidden_layers=12, hidden_size=768, num_attention_heads=12,
                  intermediate_size=3072)  # bert-base-shaped, as transformers saves it
    folder = resolve_source("hf:bert-base-uncased")
    config, state = read_checkpoint(folder)
    assert BertConfig.from_hf(config) == SIZES["bert-base"] and len(state) > 190
    missing = zoo_cli("import", "bert-base", "--from", "hf:nobody/nothing", ranks=False,
                      env={"HF_HUB_CACHE": str(tmp_path / "hub"), "ZOO_HOME": str(tmp_path / "h")})
    assert missing.returncode == 1 and missing.stderr.strip().splitlines() == [
        f"error: hf:nobody/nothing is not in the local Hugging Face cache ({tmp_path / 'hub'}): download it where "
        "there is internet (`huggingface-cli download nobody/nothing`) and copy the cache, or pass the checkpoint "
        "folder (LocalEntryNotFoundError)"]


def test_import_refuses_non_bert_folder(tmp_path):
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    (tmp_path / "ckpt" / "model.safetensors").write_bytes(b"")
    result = zoo_cli("import", "digits-cnn", "--from", str(tmp_path / "ckpt"), env={"ZOO_HOME": str(tmp_path / "h")},
                     ranks=False)
    assert result.returncode == 1 and "model_type is 'gpt2'" in result.stderr
