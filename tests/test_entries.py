"""The committed catalog: every card passes the schema, matches the manifest and its files' pointers."""

from __future__ import annotations

import json

import pytest

from tests.helpers import REPO, quick_digits_entry, zoo_cli
from zoo import catalog
from zoo.cards import load_card
from zoo.store.pointer import pointer_for, read_pointer

ENTRIES = sorted(p.parent.name for p in (REPO / "zoo" / "entries").glob("*/card.yaml"))


def test_catalog_is_not_empty():
    assert "digits-cnn" in ENTRIES


@pytest.mark.parametrize("name", ENTRIES)
def test_card_schema_manifest_and_pointers(name):
    card = load_card(REPO / "zoo" / "entries" / name / "card.yaml")
    manifest = {m["name"]: m for m in catalog.build_manifest(REPO / "zoo" / "entries")}
    assert manifest[name]["num_params"] == card.num_params
    for key, variant in card.variants.items():
        if not variant.built:
            continue
        path = REPO / "zoo" / "entries" / name / variant.file
        pointer = read_pointer(path) or pointer_for(path)  # a committed pointer, or a local build
        assert (pointer.oid, pointer.size) == (variant.sha256, variant.size), f"{name} {key}: file differs from card"
        int8_drop = card.metric("fp32") - card.metric(key)
        assert variant.precision != "int8" or int8_drop <= 0.005 or "loss" in card.description, \
            f"{name} {key} loses {int8_drop:.3f} accuracy; the card must explain it"
    if any(v.built for v in card.variants.values()):
        assert (REPO / "zoo" / "entries" / name / "test_data_set_0" / "input_0.pb").exists()


def test_build_writes_measured_card_and_is_deterministic(tmp_path):
    env = quick_digits_entry(tmp_path)
    entries = tmp_path / "entries"
    card = load_card(entries / "quick-digits" / "card.yaml")
    assert set(card.variants) == {"fp32", "int8-qat", "int8-ptq", "fp16"}
    assert card.num_params == 38282 and card.dataset.splits == {"train": 1257, "val": 180, "test": 360}
    assert card.training.build_time_s > 0 and card.training.library_versions["torch"].startswith("2.13.0")
    first = {k: v.sha256 for k, v in card.variants.items()}
    for row in json.loads(zoo_cli("evaluate", "quick-digits", "--json", env=env, check=True).stdout):
        assert row["delta"] == 0.0, row  # the card's numbers are what the files measure
    assert zoo_cli("manifest", "--check", env=env).returncode == 0
    zoo_cli("build", "quick-digits", env=env, check=True, timeout=600)
    again = load_card(entries / "quick-digits" / "card.yaml")
    assert {k: v.sha256 for k, v in again.variants.items()} == first, "same seed and threads: same bytes"
