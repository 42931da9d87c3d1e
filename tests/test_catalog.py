"""Cards, catalog, manifest and the CLI's error messages."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from tests.helpers import REPO, card_dict, write_entry, zoo_cli
from zoo import catalog
from zoo.cards import load_card
from zoo.errors import CardError, PointerFileError
from zoo.catalog import require_content
from zoo.pointer import pointer_for


def _edit_card(folder, change) -> None:
    data = yaml.safe_load((folder / "card.yaml").read_text())
    change(data)
    (folder / "card.yaml").write_text(yaml.safe_dump(data, sort_keys=False))


def test_unknown_field_names_file_and_field(zoo_env):
    folder = write_entry(zoo_env["entries"], "tiny")
    _edit_card(folder, lambda d: d["variants"]["fp32"].update(acuracy=0.5))
    with pytest.raises(CardError) as exc:
        load_card(folder / "card.yaml")
    assert str(folder / "card.yaml") in str(exc.value)
    assert "variants.fp32.acuracy: unknown field" in str(exc.value)
    # It breaks only its own entry: `zoo list` marks it with the error, `zoo card` on it fails with that line.
    listed = zoo_cli("list", env={"ZOO_ENTRIES": str(zoo_env["entries"])})
    assert listed.returncode == 0 and "variants.fp32.acuracy: unknown field" in "".join(listed.stdout.split("\n"))
    shown = zoo_cli("card", "tiny", env={"ZOO_ENTRIES": str(zoo_env["entries"])})
    assert shown.returncode == 1 and "variants.fp32.acuracy: unknown field" in shown.stderr


def test_missing_required_field(zoo_env):
    folder = write_entry(zoo_env["entries"], "tiny")
    _edit_card(folder, lambda d: d["dataset"].pop("license"))
    with pytest.raises(CardError, match=r"card.yaml: dataset.license: missing required field"):
        load_card(folder / "card.yaml")


def test_bad_sha_and_half_built_variant(zoo_env):
    folder = write_entry(zoo_env["entries"], "tiny")
    _edit_card(folder, lambda d: d["variants"]["fp32"].update(sha256="xyz"))
    with pytest.raises(CardError, match=r"variants.fp32.sha256"):
        load_card(folder / "card.yaml")
    _edit_card(folder, lambda d: d["variants"]["fp32"].pop("sha256"))
    with pytest.raises(CardError, match=r"sha256 and size are set together"):
        load_card(folder / "card.yaml")


def test_derived_variant_fields_are_checked(zoo_env):
    folder = write_entry(zoo_env["entries"], "tiny")
    artifacts = {"file": "model.ort-training.zip", "precision": "int8", "opset": 17, "format": "ort-training"}
    _edit_card(folder, lambda d: d["variants"].update({"ort-training": artifacts}))
    with pytest.raises(CardError, match=r"ort-training variants are made from the fp32 file as it is"):
        load_card(folder / "card.yaml")
    _edit_card(folder, lambda d: d["variants"]["ort-training"].update(precision="fp32", format="tflite"))
    with pytest.raises(CardError, match=r"variants.ort-training.format"):
        load_card(folder / "card.yaml")
    _edit_card(folder, lambda d: (d["variants"]["ort-training"].update(format="ort-training"), d.update(trainable=[])))
    with pytest.raises(CardError, match=r"trainable"):
        load_card(folder / "card.yaml")


@pytest.mark.parametrize("bad", ["../../outside.onnx", "/etc/passwd", "sub/../../x.onnx"])
def test_path_traversal_refused(zoo_env, bad):
    folder = write_entry(zoo_env["entries"], "tiny")
    _edit_card(folder, lambda d: d["variants"]["fp32"].update(file=bad))
    with pytest.raises(CardError, match="escapes its entry folder"):
        load_card(folder / "card.yaml")
    result = zoo_cli("fetch", "tiny", env={"ZOO_ENTRIES": str(zoo_env["entries"]), "ZOO_HOME": str(zoo_env["home"])})
    assert result.returncode == 1 and "escapes its entry folder" in result.stderr
    assert not (zoo_env["home"] / "objects").exists()


def test_unknown_model_suggests(zoo_env):
    folder = zoo_env["entries"] / "bert-base"
    folder.mkdir()
    (folder / "card.yaml").write_text(yaml.safe_dump(card_dict("bert-base", {
        "fp32": {"file": "model.onnx", "precision": "fp32", "opset": 17}})))
    result = zoo_cli("card", "bert-bse", env={"ZOO_ENTRIES": str(zoo_env["entries"])})
    assert result.returncode == 1
    assert result.stderr.strip() == "error: unknown model 'bert-bse'; did you mean: bert-base?"
    unbuilt = zoo_cli("fetch", "bert-base", env={"ZOO_ENTRIES": str(zoo_env["entries"])})
    assert unbuilt.returncode == 1 and "has not been built or published yet" in unbuilt.stderr


def test_pointer_instead_of_content(zoo_env):
    folder = write_entry(zoo_env["entries"], "tiny")
    model = folder / "model.onnx"
    assert require_content(model) == model.resolve()
    model.write_text(pointer_for(model).text())
    with pytest.raises(PointerFileError) as exc:
        require_content(model)
    message = str(exc.value)
    assert "is a Git LFS pointer" in message and "`zoo fetch tiny --variant fp32`" in message
    assert "lfs pull --include" in message


def test_cli_list_card_info(zoo_env):
    write_entry(zoo_env["entries"], "tiny", accuracy=0.875)
    env = {"ZOO_ENTRIES": str(zoo_env["entries"])}
    listed = json.loads(zoo_cli("list", "--json", env=env, check=True).stdout)
    assert [c["name"] for c in listed] == ["tiny"]
    assert [c["name"] for c in json.loads(zoo_cli("list", "--task", "classification", "--json", env=env,
                                                  check=True).stdout)] == ["tiny"]
    assert zoo_cli("list", "--task", "detection", "--json", env=env).returncode == 1  # not an empty success
    assert "0.8750" in zoo_cli("card", "tiny", env=env, check=True).stdout
    info = json.loads(zoo_cli("info", "tiny", "--json", env=env, check=True).stdout)
    assert info["variants"]["fp32"]["metrics"]["accuracy"] == 0.875


def test_manifest_drift_detected(zoo_env):
    folder = write_entry(zoo_env["entries"], "tiny")
    env = {"ZOO_ENTRIES": str(zoo_env["entries"])}
    zoo_cli("manifest", env=env, check=True)
    assert zoo_cli("manifest", "--check", env=env).returncode == 0
    _edit_card(folder, lambda d: d["variants"]["fp32"]["metrics"].update(accuracy=0.99))
    drift = zoo_cli("manifest", "--check", env=env)
    assert drift.returncode == 1 and "out of date" in drift.stderr


def test_committed_manifest_matches_cards(monkeypatch):
    monkeypatch.delenv("ZOO_ENTRIES", raising=False)
    catalog.reload()
    path = catalog.manifest_path()
    assert path.exists(), "run `zoo manifest` and commit entries/MANIFEST.json"
    assert path.read_text() == catalog.manifest_text(), "MANIFEST.json drifted from the cards: run `zoo manifest`"


def _timed(kind: str, precision: str, quantization: str, accuracy: float, b1: float, b32: float) -> dict:
    timing = {b: {"median_ms": ms, "p90_ms": ms * 1.1, "vs_fp32": ref / ms} for b, ms, ref in (("batch_1", b1, 2.0),
                                                                                             ("batch_32", b32, 40.0))}
    return {"file": f"model.{kind}.onnx", "precision": precision, "quantization": quantization, "opset": 17,
            "sha256": "0" * 64, "size": 10, "metrics": {"accuracy": accuracy}, "tolerance": 0.01,
            "speed": {"threads": 1, "runs": 30, **timing}}


def test_fastest_is_the_quickest_variant_that_keeps_fp32_accuracy():
    from zoo.cards import parse_card
    from zoo.errors import ZooError

    variants = {"fp32": _timed("fp32", "fp32", "none", 0.95, 2.0, 40.0),
                "int8-qat": _timed("int8-qat", "int8", "qat", 0.90, 0.5, 10.0),  # fastest, but 5 points worse
                "int8-ptq": _timed("int8-ptq", "int8", "ptq", 0.945, 0.9, 25.0),
                "int8-dynamic": _timed("int8-dynamic", "int8", "dynamic", 0.95, 1.0, 20.0),
                "fp16": _timed("fp16", "fp16", "none", 0.95, 3.0, 80.0),
                # quickest and as accurate, but retrained (other weights): never "the fastest file of this model"
                "federated": {**_timed("federated", "fp32", "none", 0.95, 0.1, 1.0), "recipe": "federated-digits"}}
    card = parse_card(card_dict("timed", variants), "card.yaml")
    assert (card.fastest(1), card.fastest(32)) == ("int8-ptq", "int8-dynamic")
    variants["int8-ptq"]["metrics"]["accuracy"] = 0.9  # out of tolerance: the next quickest
    variants["int8-dynamic"]["metrics"]["accuracy"] = 0.9
    assert parse_card(card_dict("timed", variants), "card.yaml").fastest(1) == "fp32"
    with pytest.raises(ZooError, match="no latency measurements"):
        parse_card(card_dict("timed", {"fp32": {k: v for k, v in variants["fp32"].items() if k != "speed"}}),
                   "card.yaml").fastest(1)
    with pytest.raises(CardError, match="vs_fp32"):  # the schema refuses a non-positive ratio
        variants["fp16"]["speed"]["batch_1"]["vs_fp32"] = 0
        parse_card(card_dict("timed", variants), "card.yaml")


def test_a_retraining_elsewhere_is_held_to_the_retraining_band():
    """The card's bytes are held to the variant's tolerance; a rebuild with other bytes on another CPU or libraries
    is another training run: a few standard errors of the card's accuracy, so a perfect digits-cnn (360 test images)
    may lose two images there but not three, and never less than the card's own tolerance."""
    from zoo.cards import parse_card

    variant = {"file": "model.onnx", "precision": "fp32", "opset": 17, "sha256": "0" * 64, "size": 10,
               "metrics": {"accuracy": 1.0}, "tolerance": 0.001}
    card = parse_card(card_dict("band", {"fp32": variant}), "card.yaml")
    assert card.accuracy_band("fp32", 360) == 0.001  # same bytes: the card's tolerance, however few the examples
    band = card.accuracy_band("fp32", 360, retrained=True)
    assert 1.0 - 2 / 360 >= 1.0 - band > 1.0 - 3 / 360
    variant["metrics"]["accuracy"] = 0.929  # mnist1d-cnn: 1,000 test examples
    card = parse_card(card_dict("band", {"fp32": variant}), "card.yaml")
    assert 0.02 < card.accuracy_band("fp32", 1000, retrained=True) < 0.03
    assert card.accuracy_band("fp32", 10**7, retrained=True) == 0.001  # never tighter than the card's tolerance


def test_a_file_carrying_another_tokenizer_than_its_dataset_fails_validation(tmp_path):
    """A text entry's file measured on the dataset's ids must carry the dataset's tokenizer: a file trained on other
    ids (a vocabulary retrained since) fails by name, not as a puzzling accuracy drop."""
    import onnx
    from onnx import TensorProto, helper

    from zoo.cards import parse_card
    from zoo.variants.checks import EntryChecks, _dataset_metadata_rows

    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    variant = {"file": "model.onnx", "precision": "fp32", "opset": 17, "sha256": "0" * 64, "size": 10,
               "metrics": {"accuracy": 1.0}}
    card = parse_card(card_dict("text", {"fp32": variant}), "card.yaml")
    rows = {}
    for tokenizer in ("the dataset's", "an older one"):
        model = helper.make_model(graph)
        helper.set_model_props(model, {"zoo.tokenizer": tokenizer})
        onnx.save(model, tmp_path / "model.onnx")
        checks = EntryChecks(card, card, tmp_path, tmp_path, None, None, [],
                             dataset_metadata={"zoo.tokenizer": "the dataset's"})
        [rows[tokenizer]] = _dataset_metadata_rows(checks, "fp32", tmp_path / "model.onnx")
    assert rows["the dataset's"].ok and rows["the dataset's"].check == "zoo.tokenizer"
    assert not rows["an older one"].ok and "rebuild the entry" in rows["an older one"].detail
    no_text = EntryChecks(card, card, tmp_path, tmp_path, None, None, [])
    assert _dataset_metadata_rows(no_text, "fp32", tmp_path / "model.onnx") == []


def test_cli_reads_as_a_user_expects():
    assert zoo_cli("--version", check=True).stdout.strip().startswith("zoo ")
    unknown = zoo_cli("list", "--task", "nosuch")
    assert unknown.returncode == 1 and unknown.stderr.strip().splitlines() == [
        "error: no model in the catalog has task 'nosuch'; its tasks are: "
        + ", ".join(sorted({catalog.get_card(n).task for n in catalog.list_models()}))]
    failed = zoo_cli("fetch", "nosuch", "--json")  # a JSON caller gets JSON on failure too
    assert failed.returncode == 1 and json.loads(failed.stdout)["kind"] == "UnknownModelError"
    shown = zoo_cli("card", "bert-tiny", check=True).stdout
    assert "int64 [batch, 64]" in shown and "MiB" in shown and " MB" not in shown  # no markup swallowed, real units
    info = zoo_cli("info", "bert-tiny", check=True).stdout
    assert info.startswith("bert-tiny: language-identification") and "zoo info bert-tiny --json" in info
    assert json.loads(zoo_cli("info", "bert-tiny", "--json", check=True).stdout)["name"] == "bert-tiny"
    # An entry nobody has built: one line naming both routes, the build with what it would cost and on what.
    unbuilt = zoo_cli("fetch", "bert-base")
    lines = unbuilt.stderr.strip().splitlines()
    assert unbuilt.returncode == 1 and len(lines) == 1 and lines[0].startswith("error: model 'bert-base'"), lines
    assert "`zoo build bert-base` (training compute about" in lines[0] and " hours on " in lines[0]
    assert "`zoo import bert-base --from <checkpoint dir>`" in lines[0] and "(s)" not in lines[0]


def test_help_lists_flags_without_type_noise():
    shown = zoo_cli("fetch", "--help", check=True).stdout
    assert "--fastest" in shown and "--json" in shown and "<bool>" not in shown


def test_bench_times_the_cards_files_on_this_machine():
    """`zoo bench`: every ONNX variant of the card's files (named by their sha256) timed side by side here."""
    report = json.loads(zoo_cli("bench", "digits-cnn", "--runs", "3", "--batch", "1", "--batch", "8", "--json",
                                check=True).stdout)
    card = catalog.get_card("digits-cnn")
    files = {r["variant"]: r for r in report["files"]}
    assert set(files) == {k for k, v in card.variants.items() if v.built and k != "ort-training"}
    for key, row in files.items():
        assert row["sha256"] == card.variants[key].sha256 and row["accuracy"] == card.metric(key)
        assert all(row["median_ms"][b] > 0 for b in ("1", "8")), row
    assert files["fp32"]["speed"]["1"] == 1.0 and report["threads"] == 1 and report["cpu"]["model"]
    assert report["libraries"]["onnxruntime"] and report["date"]
    shown = zoo_cli("bench", "digits-cnn", "--variant", "int8-qat", "--runs", "2", check=True).stdout
    assert "int8-qat" in shown and card.variants["int8-qat"].sha256[:12] in shown and "1 thread" in shown
    from zoo.provenance import int8_peak  # the CPU's int8 ceiling, with the instructions behind it
    assert report["int8_peak"]["ratio"] == int8_peak()[0] and f"at most {int8_peak()[0]:.2f}x" in " ".join(shown.split())
    # a transformer is also timed as users would run it without the zoo's files: the fp32 weights in PyTorch, eager
    # and after torch.ao's dynamic int8; the weights map onto the module by name, so eager scores fp32's accuracy
    bert = json.loads(zoo_cli("bench", "bert-tiny", "--variant", "int8-qat", "--runs", "2", "--batch", "1", "--json",
                              check=True, timeout=600).stdout)
    rows = {r["variant"]: r for r in bert["files"]}
    assert set(rows) == {"fp32", "fp32-fused", "int8-qat", "torch-eager", "torch-ao-dynamic"}
    assert rows["torch-eager"]["accuracy"] == catalog.get_card("bert-tiny").metric("fp32") and not rows["torch-eager"]["sha256"]
    assert rows["torch-ao-dynamic"]["accuracy"] > 0.9 and all(r["median_ms"]["1"] > 0 for r in rows.values())
    bad = zoo_cli("bench", "digits-cnn", "--variant", "ort-training")
    assert bad.returncode == 1 and "no built ONNX variant ort-training" in bad.stderr and "Traceback" not in bad.stderr


def test_predict_classifies_texts_with_the_published_file_and_no_torch():
    """`zoo predict`: the entry's file fetched from the store and run by onnxruntime, its tokenizer read from the file,
    the labels from the card; PyTorch is never imported. A model that does not take text says so in one line."""
    texts = ["Der Hund schläft im Garten.", "El perro duerme en el jardín.", "Кошка спит на диване."]
    result = zoo_cli("predict", "bert-tiny", *texts, "--variant", "int8-qat", "--json", check=True)
    answers = json.loads(result.stdout)
    assert [a["label"] for a in answers] == ["de", "es", "ru"] and [a["text"] for a in answers] == texts
    assert all(0.5 < a["probability"] <= 1 and len(a["top"]) == 3 for a in answers)
    probe = ("import sys, zoo.predict\n"
             "labels = [a['label'] for a in zoo.predict.classify('bert-tiny', ['The dog sleeps in the garden.'])]\n"
             "assert labels == ['en'], labels\n"
             "assert 'torch' not in sys.modules, 'zoo predict imported torch'\n")
    ran = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, ran.stderr[-2000:]
    image = zoo_cli("predict", "digits-cnn", "hello")
    assert image.returncode == 1 and "not text" in image.stderr and len(image.stderr.strip().splitlines()) == 1
    unknown = zoo_cli("predict", "bert-tiny", "hello", "--variant", "ort-training")
    assert unknown.returncode == 1 and "no built ONNX variant ort-training" in unknown.stderr
