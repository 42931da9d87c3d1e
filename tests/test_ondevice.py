"""On-device training from the ONNX file alone: trainable metadata, onnxruntime-training artifacts, `zoo finetune`."""

from __future__ import annotations

import json
import shutil
import zipfile
from pathlib import Path

import numpy as np
import onnx
import pytest
import yaml
from onnx import numpy_helper

from tests.helpers import ONDEVICE_TRAINABLE as TRAINABLE  # the first conv block frozen
from tests.helpers import copy_of, ondevice_digits_entry, train_onnx, zoo_cli
from zoo.data import load_dataset
from zoo.evaluate import accuracy, predict
from zoo.metadata import read_metadata
from zoo.ondevice.engine import ARTIFACT_FILES, SPLIT_FILE, OnnxTrainer, training_artifacts
from zoo.ondevice.finetune import finetune
from zoo.ondevice.trainable import TRAINABLE_KEY, float_weights
from zoo.pointer import read_pointer, sha256_file

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


def test_bert_trainable_split_keeps_parameter_names_and_trains(tmp_path):
    # Exported without constant folding, initializers keep the torch parameter names (no transposed onnx::MatMul_N).
    path = train_onnx(tmp_path, "bert", "--recipe", "bert-tiny", *TINY_BERT, "steps=2",
                      "export.trainable=[bert.encoder.layer.1.*, classifier.*]")
    names = json.loads(read_metadata(path)[TRAINABLE_KEY])
    assert len(names) == 16 + 2  # one encoder layer's 16 tensors and the classifier's weight and bias
    assert all(n.startswith(("bert.encoder.layer.1.", "classifier.")) for n in names), names
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


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict:
    """A copy of the run's quick digits entry whose card declares a trainable split and both derived variants
    (tests/helpers.py ondevice_digits_entry: `zoo build` made them)."""
    root = tmp_path_factory.mktemp("derived")
    env = copy_of(ondevice_digits_entry(), root)
    return {"env": env, "dir": Path(env["ZOO_ENTRIES"]) / "quick-digits"}


def _card(built) -> dict:
    return yaml.safe_load((built["dir"] / "card.yaml").read_text())


def test_build_makes_training_artifacts_from_the_cards_split(built):
    card = _card(built)
    fp32, variant = built["dir"] / "model.onnx", card["variants"]["ort-training"]
    meta = read_metadata(fp32)
    assert json.loads(meta["zoo.trainable.globs"]) == TRAINABLE  # the card's split, recorded in the fp32 file
    archive = built["dir"] / variant["file"]
    assert (sha256_file(archive), archive.stat().st_size) == (variant["sha256"], variant["size"])
    with zipfile.ZipFile(archive) as zf:
        assert sorted(zf.namelist()) == sorted([*ARTIFACT_FILES, SPLIT_FILE])
        split = json.loads(zf.read(SPLIT_FILE))
    assert split["source_sha256"] == card["variants"]["fp32"]["sha256"] and split["globs"] == TRAINABLE
    assert split["trainable"] == json.loads(meta[TRAINABLE_KEY]) and len(split["frozen"]) == 2  # features.0.*
    sizes = {i.name: int(np.prod(i.dims)) for i in onnx.load(str(fp32)).graph.initializer}
    assert variant["metrics"]["trainable_parameters"] == sum(sizes[n] for n in split["trainable"]) == 38282 - 160
    # the untouched checkpoint exports the fp32 model itself
    assert variant["metrics"]["accuracy"] == card["variants"]["fp32"]["metrics"]["accuracy"]
    # `zoo export` remakes it from the fp32 file alone, byte for byte
    zoo_cli("export", "quick-digits", "--variant", "ort-training", env=built["env"], check=True, timeout=300)
    assert sha256_file(archive) == variant["sha256"] and _card(built)["variants"]["ort-training"] == variant


def test_build_makes_the_federated_variant_with_its_metrics(built):
    card = _card(built)
    variant = card["variants"]["federated"]
    path = built["dir"] / variant["file"]
    assert sha256_file(path) == variant["sha256"]
    meta = read_metadata(path)
    assert meta["zoo.finetuned_from_sha256"] == card["variants"]["fp32"]["sha256"]
    assert json.loads(meta["zoo.federated"])["rounds"] == 2 == variant["metrics"]["rounds"]
    metrics = variant["metrics"]
    assert metrics["accuracy"] > metrics["initial_accuracy"]  # on the rotated digits the fleet adapts to
    assert 0 < metrics["central_accuracy"] <= 1


def test_validate_and_evaluate_measure_every_derived_variant(built):
    result = zoo_cli("validate", "quick-digits", "--json", env=built["env"], timeout=600)
    report = json.loads(result.stdout)
    assert result.returncode == 0, [r for r in report["rows"] if not r["ok"]]
    checks = {(r["variant"], r["check"]) for r in report["rows"]}
    assert {("ort-training", "archive"), ("ort-training", "ort-training"), ("ort-training", "accuracy"),
            ("ort-training", "test_data_set_0"), ("federated", "retrained from fp32"),
            ("federated", "accuracy")} <= checks
    rows = json.loads(zoo_cli("evaluate", "quick-digits", "--variant", "ort-training", "--variant", "federated",
                              "--json", env=built["env"], check=True).stdout)
    assert [r["delta"] for r in rows] == [0.0, 0.0]


def test_export_refuses_a_split_the_fp32_file_was_not_built_with(built, tmp_path):
    entries = tmp_path / "entries"
    shutil.copytree(built["dir"].parent, entries)
    card = entries / "quick-digits" / "card.yaml"
    data = yaml.safe_load(card.read_text())
    data["trainable"] = ["head.*"]
    card.write_text(yaml.safe_dump(data, sort_keys=False))
    before = (entries / "quick-digits" / "model.ort-training.zip").read_bytes()
    env = {**built["env"], "ZOO_ENTRIES": str(entries)}
    result = zoo_cli("export", "quick-digits", "--variant", "ort-training", env=env)
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert "the card asks for ['head.*']" in result.stderr and "zoo build" in result.stderr
    assert (entries / "quick-digits" / "model.ort-training.zip").read_bytes() == before
    assert yaml.safe_load(card.read_text()) == data  # nothing half-written
    refused = zoo_cli("export", "quick-digits", "--variant", "fp16", env=env)
    assert refused.returncode != 0 and "zoo build quick-digits" in refused.stderr


def test_artifacts_are_published_and_fetched_like_any_variant(built, tmp_path, lfs_server):
    entries = tmp_path / "entries"
    shutil.copytree(built["dir"].parent, entries)
    env = {**built["env"], "ZOO_ENTRIES": str(entries), "ZOO_HOME": str(tmp_path / "publisher")}
    published = zoo_cli("publish", "quick-digits", "--derived", "--to", lfs_server.url, env=env, check=True).stdout
    assert "uploaded quick-digits/model.ort-training.zip" in published
    assert "uploaded quick-digits/model.federated.onnx" in published
    assert read_pointer(entries / "quick-digits" / "model.ort-training.zip") is not None  # .gitattributes: *.zip
    device = {**env, "ZOO_HOME": str(tmp_path / "device"), "ZOO_LFS_URL": lfs_server.url}
    fetched = json.loads(zoo_cli("fetch", "quick-digits", "--variant", "ort-training", "--json", env=device,
                                 check=True).stdout)
    card = _card(built)["variants"]["ort-training"]
    assert fetched["source"] == lfs_server.url and fetched["sha256"] == card["sha256"]
    assert sha256_file(Path(fetched["path"])) == card["sha256"]


def test_finetune_on_a_shifted_distribution_raises_accuracy(tmp_path, built):
    out = tmp_path / "rot90.onnx"
    result = zoo_cli("finetune", "quick-digits", "--onnx", "--shift", "rot90", "--steps", "300", "--lr", "0.003",
                     "--output", str(out), "--json", env=built["env"], check=True, timeout=600)
    report = json.loads(result.stdout)
    assert report["artifacts"] == "published archive model.ort-training.zip"  # what a device downloads
    # digits rotated by 90 degrees: the fetched model is lost on them, fine-tuning on the rotated train split fixes it
    assert report["accuracy_before"] < 0.5
    assert report["accuracy_after"] > report["accuracy_before"] + 0.3
    assert report["final_loss"] < report["first_loss"]
    meta = read_metadata(out)
    assert meta["zoo.finetuned_from_sha256"] == report["source_sha256"] and meta["zoo.variant"] == "fp32"
    assert accuracy(out, *[a.numpy() for a in _rot90_test()]) == pytest.approx(report["accuracy_after"])
    frozen = {n: v for n, v in initializers(built["dir"] / "model.onnx").items() if n.startswith("features.0")}
    assert frozen and all(np.array_equal(v, initializers(out)[n]) for n, v in frozen.items())


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
