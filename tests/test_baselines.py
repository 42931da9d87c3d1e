"""The classic tools the entries are compared with are installed (development dependencies) and measured the way
benchmarks/baselines.py reports them."""

from __future__ import annotations

import importlib.util
import json

from tests.helpers import REPO
from zoo import catalog
from zoo.data import langid

spec = importlib.util.spec_from_file_location("baselines", REPO / "benchmarks" / "baselines.py")
baselines = importlib.util.module_from_spec(spec)
spec.loader.exec_module(baselines)

SAMPLES = {"cs": "Kdo jinému jámu kopá, sám do ní padá.", "de": "Der frühe Vogel fängt den Wurm.",
           "en": "The early bird catches the worm.", "es": "Quien mucho abarca, poco aprieta.",
           "it": "Chi dorme non piglia pesci.", "pl": "Gdzie kucharek sześć, tam nie ma co jeść.",
           "pt": "Quem não arrisca não petisca.", "ru": "Тише едешь — дальше будешь."}


def test_langid_py_and_lingua_answer_among_the_eight_languages():
    texts = list(SAMPLES.values())
    labels = [langid.LABELS.index(k) for k in SAMPLES]
    for tool in (baselines.LangidPy(), baselines.Lingua()):
        predicted = [tool(t) for t in texts]
        assert all(0 <= p < len(langid.LABELS) for p in predicted), tool.name
        result = baselines.breakdown(predicted, texts, labels)
        assert result["accuracy"] >= 0.75, (tool.name, predicted)  # proverbs: short, idiomatic
        assert set(result["by_language"]) == set(langid.LABELS) and list(result["by_length"]) == ["0-50"]
    assert baselines.Lingua().version.startswith("2.") and baselines.LangidPy().version == "1.1.6"


def test_robustness_copies_keep_labels_and_change_text():
    texts, labels = list(SAMPLES.values()), list(range(8))
    sets = baselines.robustness_sets(texts, labels)
    assert set(sets) == {"short (first 3 words)", "UPPER CASE", "no punctuation", "mixed content"}
    for name, (copies, copy_labels) in sets.items():
        assert copy_labels == labels and len(copies) == len(texts) and copies != texts, name
    assert all(len(t.split()) <= 3 for t in sets["short (first 3 words)"][0])
    assert not any(c in t for t in sets["no punctuation"][0] for c in ".,—")


def test_re_measuring_an_entry_replaces_its_rows_and_keeps_the_others_runs():
    """An entry rebuilt on its own is measured again in a new run (with the classic tools, on that machine); the other
    entries keep the run that measured them, classic tools included; a run left without an entry goes."""
    def run(cpu: str, entries: list[str], missed: list[str] = ()) -> dict:
        rows = [{"tool": "langid.py", "kind": "baseline"}] + [{"tool": e, "variant": "fp32", "kind": "entry"}
                                                               for e in entries]
        return {"cpu": {"model": cpu}, "threads": 1, "tasks": {"language-identification": {
            "rows": rows, "not_measured": [{"tool": e, "variant": "fp32", "reason": "in no store"} for e in missed]}}}

    first = run("A", ["bert-tiny", "bert-mini"], missed=["minilm-l6"])  # the one-run layout of earlier results
    results = baselines.merged(first, run("B", ["bert-mini"]), ["bert-mini"])
    assert [r["cpu"]["model"] for r in results["runs"]] == ["A", "B"]
    kept = results["runs"][0]["tasks"]["language-identification"]
    assert [r["tool"] for r in kept["rows"]] == ["langid.py", "bert-tiny"]
    assert [r["tool"] for r in kept["not_measured"]] == ["minilm-l6"]
    results = baselines.merged(results, run("C", ["bert-tiny", "minilm-l6"]), ["bert-tiny", "minilm-l6"])
    assert [r["cpu"]["model"] for r in results["runs"]] == ["B", "C"]  # run A has nothing left of its own
    assert [baselines.run_title(r) for r in results["runs"]] == ["bert-mini: measured on B",
                                                                  "bert-tiny, minilm-l6: measured on C"]


def test_the_committed_measurements_meet_the_bar_the_entries_are_held_to():
    """On benchmarks/results/baselines.json (written by benchmarks/baselines.py, entries and classic tools measured in
    one run on the same examples) and the cards: the best language-ID entry matches langid.py on the fortunes and the
    second-domain sets; every int8 variant is within 0.5 points of its fp32 on both; digits-cnn matches the SVC;
    every built BERT entry reaches 97% on the fortunes test set. A rebuild below the bar fails here once measured."""
    runs = json.loads((REPO / "benchmarks" / "results" / "baselines.json").read_text())["runs"]
    sets = ("fortunes", "second-domain")
    beats_langid_py = {}
    for run in runs:
        for task, measured in run["tasks"].items():
            rows = measured["rows"]
            entries = [r for r in rows if r["kind"] == "entry"]
            fp32 = {r["tool"]: r for r in entries if r["variant"] == "fp32"}
            if task == "digits":
                svc = next(r for r in rows if r["tool"].startswith("scikit-learn SVC"))
                assert fp32["digits-cnn"]["accuracy"] >= svc["accuracy"], (fp32["digits-cnn"], svc)
                continue
            reference = next(r for r in rows if r["tool"] == "langid.py")
            for row in entries:
                if row["variant"].startswith("int8"):
                    for name in sets:
                        drop = fp32[row["tool"]]["sets"][name]["accuracy"] - row["sets"][name]["accuracy"]
                        assert drop <= 0.005 + 1e-9, (row["tool"], row["variant"], name, drop)
            for tool, row in fp32.items():
                beats_langid_py[tool] = all(row["sets"][n]["accuracy"] >= reference["sets"][n]["accuracy"] for n in sets)
    assert any(beats_langid_py.values()), beats_langid_py
    for name in catalog.list_models():
        card = catalog.get_card(name)
        if card.family == "bert" and card.variants["fp32"].built:
            assert card.variants["fp32"].metrics["accuracy"] >= 0.97, name
