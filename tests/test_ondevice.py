"""On-device training from the ONNX file alone: trainable metadata, onnxruntime-training artifacts, `zoo finetune`."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from tests.helpers import quick_digits_entry, train_onnx, zoo_cli
from zoo.data import load_dataset
from zoo.evaluate import accuracy, predict
from zoo.export import read_metadata
from zoo.ondevice import OnnxTrainer, TRAINABLE_KEY, finetune, float_weights, training_artifacts

TINY_BERT = ["--model", "bert", "model_args.num_hidden_layers=2", "model_args.hidden_size=32",
             "model_args.num_attention_heads=2", "model_args.intermediate_size=64"]


@pytest.fixture(scope="module")
def digits_onnx(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("digits")
    return train_onnx(tmp, "out", "--recipe", "fp32", "--model", "digits-cnn", "steps=60")


def initializers(path: Path) -> dict[str, np.ndarray]:
    return {i.name: numpy_helper.to_array(i) for i in onnx.load(str(path)).graph.initializer}


def test_fp32_export_records_every_weight_as_trainable_by_default(digits_onnx):
    meta = read_metadata(digits_onnx)
    assert json.loads(meta[TRAINABLE_KEY]) == float_weights(onnx.load(str(digits_onnx)))
    assert json.loads(meta["zoo.trainable.globs"]) == ["*"]


def test_bert_trainable_split_finds_renamed_weights_and_trains(tmp_path):
    # Linear layers on 3-D activations export as MatMul with transposed, renamed initializers (onnx::MatMul_N).
    path = train_onnx(tmp_path, "bert", "--recipe", "bert-tiny", *TINY_BERT, "steps=2",
                      "export.trainable=[bert.encoder.layer.1.*, classifier.*]")
    names = json.loads(read_metadata(path)[TRAINABLE_KEY])
    assert len(names) == 16 + 2  # one encoder layer's 16 tensors and the classifier's weight and bias
    assert any(n.startswith("onnx::MatMul") for n in names)
    assert not any("layer.0" in n or "embeddings" in n for n in names)
    data = load_dataset("langid")
    finetuned = tmp_path / "bert.finetuned.onnx"
    finetune(path, (data.train.x.numpy()[:256], data.train.y.numpy()[:256]),
             (data.val.x.numpy()[:64], data.val.y.numpy()[:64]), finetuned, steps=3, batch=8, show_progress=False)
    before, after = initializers(path), initializers(finetuned)
    changed = {n for n in before if not np.array_equal(before[n], after[n])}
    assert changed and changed <= set(names)  # the frozen part is byte-identical


def test_artifacts_train_lower_the_loss_and_export_an_equivalent_model(tmp_path, digits_onnx):
    files = training_artifacts(digits_onnx, tmp_path / "artifacts")
    assert all(p.exists() for p in files.values())
    for name in ("training_model.onnx", "eval_model.onnx", "optimizer_model.onnx"):
        assert onnx.load(str(files[name])).ir_version <= 10  # what onnxruntime 1.19 runs
    data = load_dataset("digits")
    x, y = data.train.x.numpy(), data.train.y.numpy()
    trainer = OnnxTrainer(tmp_path / "artifacts", lr=1e-3)
    untouched = trainer.export(tmp_path / "untouched.onnx")
    x_test = data.test.x.numpy()
    np.testing.assert_allclose(predict(untouched, x_test), predict(digits_onnx, x_test), atol=1e-5)
    first = trainer.eval_loss(x[:256], y[:256])
    trainer.train(x, y, steps=40, batch=32)
    assert trainer.eval_loss(x[:256], y[:256]) < first


def test_finetune_on_a_shifted_distribution_raises_accuracy(tmp_path):
    env = quick_digits_entry(tmp_path)
    out = tmp_path / "rot90.onnx"
    result = zoo_cli("finetune", "quick-digits", "--onnx", "--shift", "rot90", "--steps", "300", "--lr", "0.003",
                     "--output", str(out), "--json", env=env, check=True, timeout=600)
    report = json.loads(result.stdout)
    # digits rotated by 90 degrees: the fetched model is lost on them, fine-tuning on the rotated train split fixes it
    assert report["accuracy_before"] < 0.5
    assert report["accuracy_after"] > report["accuracy_before"] + 0.3
    assert report["final_loss"] < report["first_loss"]
    meta = read_metadata(out)
    assert meta["zoo.finetuned_from_sha256"] == report["source_sha256"] and meta["zoo.variant"] == "fp32"
    assert accuracy(out, *[a.numpy() for a in _rot90_test()]) == pytest.approx(report["accuracy_after"])


def _rot90_test():
    import torch

    test = load_dataset("digits").test
    return torch.from_numpy(np.ascontiguousarray(np.rot90(test.x.numpy(), 1, axes=(-2, -1)))), test.y


@pytest.mark.parametrize("args,message", [
    (["--shift", "rot90"], "pass --onnx"),
    (["--onnx"], "give exactly one of --data FILE.npz and --shift NAME"),
    (["--onnx", "--shift", "spin"], "unknown shift 'spin'"),
    (["--onnx", "--data", "missing.npz"], "missing.npz: not a readable .npz file"),
])
def test_finetune_bad_input_is_one_clear_line(tmp_path, args, message):
    result = zoo_cli("finetune", "digits-cnn", *args, "--output", str(tmp_path / "x.onnx"),
                     env={"ZOO_HOME": str(tmp_path / "home")})
    assert result.returncode != 0 and message in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "x.onnx").exists()
