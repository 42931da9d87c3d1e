"""The classic tools the entries are compared with are installed (development dependencies) and measured the way
benchmarks/baselines.py reports them."""

from __future__ import annotations

import importlib.util

from tests.helpers import REPO
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
