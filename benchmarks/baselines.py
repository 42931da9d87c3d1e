"""The catalog's entries next to the classic tool for each task, measured side by side on the same examples.

- Language identification: langid.py 1.1.6 and lingua-language-detector, both restricted to the eight languages,
  against every ONNX variant of every language-ID entry, on the fortunes test set, on two held-out domains never
  trained on (the GNOME user guide; program messages of coreutils, the GNU C library and tar, read from their
  gettext catalogs) and on robustness copies of the fortunes test texts (first three words only,
  upper case, punctuation removed, a number / address / code token mixed in). Accuracy overall, by language and by
  text length; speed in ms per text, one text at a time on one thread (for the entries: tokenizing plus one
  onnxruntime run at batch 1).
- Handwritten digits: scikit-learn's SVC (RBF kernel, C=10, on the raw 64 pixels, trained on the entry's training
  split) against every variant of digits-cnn on its test split; ms per image, one at a time.

Writes benchmarks/results/baselines.{json,md}; each model page shows its rows (zoo/docs/). The results are a list
of runs, each measured side by side on one machine: the classic tools and the entries it was given. Naming entries
measures them again (with the classic tools, in a new run) and takes them out of the earlier runs, so an entry
rebuilt on its own is re-measured without rebuilding the catalog; no names measures everything in one run.

    python benchmarks/baselines.py [--speed-texts 300] [NAME ...]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from zoo import catalog  # noqa: E402
from zoo.data import langid, load_dataset  # noqa: E402
from zoo.docs import report_runs  # noqa: E402
from zoo.errors import ZooError  # noqa: E402
from zoo.evaluate import predict, session  # noqa: E402
from zoo.fsutil import atomic_write_text  # noqa: E402
from zoo.metadata import TOKENIZER_KEY, read_metadata  # noqa: E402
from zoo.provenance import cpu_info  # noqa: E402
from zoo.store.fetch import fetch  # noqa: E402
from zoo.pointer import sha256_file  # noqa: E402
from zoo.kinds import kind_of  # noqa: E402

LENGTHS = [(0, 50), (50, 100), (100, 200), (200, 10_000)]  # characters
PUNCT = re.compile(r"[^\w\s]", re.UNICODE)
MIXED = ["2024", "https://example.org/x", "user@example.com", "v2.1", "12:30", "#42"]
RESULTS = ROOT / "benchmarks" / "results"
# The test sets of whole texts: the fortunes test split, then the two domains never trained on (GNOME user guide,
# program messages); the by-language and by-length tables cover each of them.
DOMAINS = ("fortunes", "second-domain", "software messages")


def robustness_sets(texts: list[str], labels: list[int]) -> dict[str, tuple[list[str], list[int]]]:
    """What users type, made from the fortunes test texts (same labels)."""
    return {
        "short (first 3 words)": ([" ".join(t.split()[:3]) for t in texts], labels),
        "UPPER CASE": ([t.upper() for t in texts], labels),
        "no punctuation": ([" ".join(PUNCT.sub(" ", t).split()) for t in texts], labels),
        "mixed content": ([f"{MIXED[i % len(MIXED)]} {t} {MIXED[(i + 3) % len(MIXED)]}" for i, t in enumerate(texts)],
                          labels),
    }


def breakdown(predicted: list[int], texts: list[str], labels: list[int]) -> dict:
    predicted, labels = np.asarray(predicted), np.asarray(labels)
    right = predicted == labels
    lengths = np.array([len(t) for t in texts])
    return {
        "accuracy": float(right.mean()),
        "by_language": {lang: float(right[labels == i].mean()) for i, lang in enumerate(langid.LABELS)},
        "by_length": {f"{lo}-{hi if hi < 10_000 else ''}": float(right[(lengths >= lo) & (lengths < hi)].mean())
                      for lo, hi in LENGTHS if ((lengths >= lo) & (lengths < hi)).any()},
    }


class LangidPy:
    name = "langid.py"

    def __init__(self):
        from importlib.metadata import version

        from langid.langid import LanguageIdentifier, model

        self.version = version("langid")
        self.identifier = LanguageIdentifier.from_modelstring(model, norm_probs=False)
        self.identifier.set_languages(langid.LABELS)

    def __call__(self, text: str) -> int:
        return langid.LABELS.index(self.identifier.classify(text)[0])


class Lingua:
    name = "lingua"

    def __init__(self):
        from importlib.metadata import version

        from lingua import Language, LanguageDetectorBuilder

        self.version = version("lingua-language-detector")
        codes = {"cs": Language.CZECH, "de": Language.GERMAN, "en": Language.ENGLISH, "es": Language.SPANISH,
                 "it": Language.ITALIAN, "pl": Language.POLISH, "pt": Language.PORTUGUESE, "ru": Language.RUSSIAN}
        self.back = {v: langid.LABELS.index(k) for k, v in codes.items()}
        self.detector = LanguageDetectorBuilder.from_languages(*codes.values()).with_preloaded_language_models().build()

    def __call__(self, text: str) -> int:
        found = self.detector.detect_language_of(text)
        return self.back[found] if found is not None else -1  # no answer counts as wrong


def per_text_ms(classify, texts: list[str]) -> float:
    started = time.perf_counter()
    for t in texts:
        classify(t)
    return 1000 * (time.perf_counter() - started) / len(texts)


def entry_files(name: str) -> tuple[dict[str, Path], list[dict]]:
    """The entry's inference files on its own test data (variants retrained by another recipe, on other data, are
    measured on that data by their card), and the files that cannot be fetched here, why included, so the results
    say which of the catalog's files they leave out."""
    card = catalog.get_card(name)
    out, not_measured = {}, []
    for key, variant in card.variants.items():
        if variant.built and kind_of(key, variant).inference and variant.format == "onnx" and variant.recipe is None:
            try:
                out[key] = fetch(name, key, show_progress=False).path
            except ZooError as exc:
                print(f"skip {name} {key}: {exc}", file=sys.stderr)
                not_measured.append({"tool": name, "variant": key, "sha256": variant.sha256,
                                     "reason": str(exc).splitlines()[0].removesuffix(" Tried:")})
    return out, not_measured


def langid_benchmark(names: list[str], speed_texts: int) -> dict:
    from tokenizers import Tokenizer

    splits = langid.texts()["splits"]
    messages = langid.software_messages_test()
    sets = dict(zip(DOMAINS, [splits["test"], splits["second-domain"], (messages["texts"], messages["labels"])]))
    sets.update(robustness_sets(*splits["test"]))
    speed_sample = splits["test"][0][::max(1, len(splits["test"][0]) // speed_texts)][:speed_texts]
    rows, not_measured = [], []
    for tool in (LangidPy(), Lingua()):
        print(f"{tool.name} ...", file=sys.stderr)
        rows.append({"tool": tool.name, "version": tool.version, "kind": "baseline",
                     "sets": {s: breakdown([tool(t) for t in tx], tx, y) for s, (tx, y) in sets.items()},
                     "ms_per_text": per_text_ms(tool, speed_sample)})
    for name in names:
        files, missed = entry_files(name)
        not_measured += missed
        for key, path in files.items():
            print(f"{name} {key} ...", file=sys.stderr)
            meta = read_metadata(path)  # files built before the tokenizer travelled inside: the dataset's
            tokenizer = (Tokenizer.from_str(meta[TOKENIZER_KEY]) if TOKENIZER_KEY in meta else
                         langid.tokenizer(catalog.get_card(name).dataset.name))
            result = {}
            for s, (tx, y) in sets.items():
                x = np.array([e.ids for e in tokenizer.encode_batch(tx)], dtype=np.int64)
                result[s] = breakdown(list(predict(path, x).argmax(axis=1)), tx, y)
            sess = session(path, threads=1)
            feed = sess.get_inputs()[0].name

            def classify(text: str, tokenizer=tokenizer, sess=sess, feed=feed) -> int:
                ids = np.array([tokenizer.encode(text).ids], dtype=np.int64)
                return int(sess.run(None, {feed: ids})[0].argmax())

            rows.append({"tool": name, "variant": key, "kind": "entry", "sha256": sha256_file(path), "sets": result,
                         "ms_per_text": per_text_ms(classify, speed_sample)})
    return {"test_sets": {s: len(y) for s, (_, y) in sets.items()}, "labels": langid.LABELS, "rows": rows,
            "not_measured": not_measured, "domains": list(DOMAINS), "message_packages": messages["packages"]}


def digits_benchmark(names: list[str], speed_images: int) -> dict:
    from sklearn.svm import SVC

    data = load_dataset("digits")
    x_train, y_train = data.train.x.numpy().reshape(len(data.train), -1), data.train.y.numpy()
    x_test, y_test = data.test.x.numpy(), data.test.y.numpy()
    svc = SVC(kernel="rbf", C=10).fit(x_train, y_train)
    flat = x_test.reshape(len(x_test), -1)
    rows = [{"tool": "scikit-learn SVC (RBF, C=10, raw pixels)", "kind": "baseline",
             "accuracy": float((svc.predict(flat) == y_test).mean()),
             "ms_per_text": per_text_ms(lambda i: svc.predict(flat[i:i + 1]), list(range(speed_images)))}]
    not_measured: list[dict] = []
    for name in names:
        files, missed = entry_files(name)
        not_measured += missed
        for key, path in files.items():
            sess = session(path, threads=1)
            feed = sess.get_inputs()[0].name
            rows.append({"tool": name, "variant": key, "kind": "entry", "sha256": sha256_file(path),
                         "accuracy": float((predict(path, x_test).argmax(axis=1) == y_test).mean()),
                         "ms_per_text": per_text_ms(lambda i: sess.run(None, {feed: x_test[i:i + 1]}),
                                                    list(range(speed_images)))})
    return {"test_examples": len(y_test), "rows": rows, "not_measured": not_measured}


def markdown(runs: list[dict]) -> str:
    lines = ["# The entries next to the classic tools", ""]
    for record in runs:
        cpu, threads = record["cpu"]["model"], record["threads"]
        lines += [f"## {run_title(record)}", "",
                  f"Measured side by side by `python benchmarks/baselines.py` on {cpu}, {threads} thread, one text "
                  "(image) at a time for speed; the same examples for every row of this run.", ""]
        lines += _run_markdown(record)
    return "\n".join(lines)


def run_title(record: dict) -> str:
    """The entries a run measured (or tried to) and its machine."""
    entries = sorted({r["tool"] for task in record["tasks"].values()
                      for r in [*task["rows"], *task.get("not_measured", [])] if r.get("kind", "entry") == "entry"})
    return f"{', '.join(entries)}: measured on {record['cpu']['model']}"


def _run_markdown(record: dict) -> list[str]:
    lines = []
    for task, result in record["tasks"].items():
        if task == "language-identification":
            sets = list(result["test_sets"])
            lines += ["### Language identification", "",
                      "Accuracy on each test set (" + ", ".join(f"{s}: {n:,} texts" for s, n in result["test_sets"].items())
                      + ") and ms per text.", "",
                      "| tool | " + " | ".join(sets) + " | ms/text |", "| --- |" + " ---: |" * (len(sets) + 1)]
            for row in result["rows"]:
                label = row["tool"] + (f" {row['variant']}" if row.get("variant") else f" {row['version']}")
                lines.append(f"| {label} | " + " | ".join(f"{100 * row['sets'][s]['accuracy']:.1f}" for s in sets)
                             + f" | {row['ms_per_text']:.2f} |")
            for s in result.get("domains", DOMAINS[:2]):
                lines += ["", f"#### {s}: by language and by length (characters)", "",
                          "| tool | " + " | ".join(result["labels"]) + " | " +
                          " | ".join(result["rows"][0]["sets"][s]["by_length"]) + " |",
                          "| --- |" + " ---: |" * (len(result["labels"]) + len(result["rows"][0]["sets"][s]["by_length"]))]
                for row in result["rows"]:
                    if row.get("variant") not in (None, "fp32"):
                        continue
                    b = row["sets"][s]
                    lines.append(f"| {row['tool']} | " + " | ".join(f"{100 * v:.1f}" for v in b["by_language"].values())
                                 + " | " + " | ".join(f"{100 * v:.1f}" for v in b["by_length"].values()) + " |")
        else:
            lines += ["", "### Handwritten digits", "", f"Accuracy on the {result['test_examples']} test images.", "",
                      "| tool | accuracy | ms/image |", "| --- | ---: | ---: |"]
            lines += [f"| {r['tool']}{' ' + r['variant'] if r.get('variant') else ''} | {100 * r['accuracy']:.1f} | "
                      f"{r['ms_per_text']:.3f} |" for r in result["rows"]]
        lines += [f"- not measured: {r['tool']} {r['variant']} ({r['reason']})" for r in result.get("not_measured", [])]
        lines.append("")
    return lines


def merged(earlier: dict, record: dict, names: list[str]) -> dict:
    """The results after `record`, a run of the entries `names`: earlier runs keep the other entries' rows (with the
    classic tools measured next to them); a task left without an entry, and a run left without a task, are dropped."""
    kept = []
    for run in report_runs(earlier):
        tasks = {}
        for task, result in run["tasks"].items():
            rows = [r for r in result["rows"] if r["kind"] != "entry" or r["tool"] not in names]
            missed = [r for r in result.get("not_measured", []) if r["tool"] not in names]
            if missed or any(r["kind"] == "entry" for r in rows):
                tasks[task] = {**result, "rows": rows, "not_measured": missed}
        if tasks:
            kept.append({**run, "tasks": tasks})
    return {"runs": [*kept, record] if record["tasks"] else kept}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="entries (default: every language-ID entry and digits-cnn)")
    parser.add_argument("--speed-texts", type=int, default=300)
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    names = args.names or catalog.list_models()
    cards = {n: catalog.get_card(n) for n in names}
    text = [n for n, c in cards.items() if c.task == "language-identification" and any(v.built for v in c.variants.values())]
    digits = [n for n, c in cards.items() if c.dataset.name == "digits"]
    record = {"cpu": cpu_info(), "threads": 1, "tasks": {}}
    if text:
        record["tasks"]["language-identification"] = langid_benchmark(text, args.speed_texts)
    if digits:
        record["tasks"]["digits"] = digits_benchmark(digits, args.speed_texts)
    path = RESULTS / "baselines.json"
    earlier = json.loads(path.read_text()) if args.names and path.is_file() else {}
    results = merged(earlier, record, [*text, *digits])
    RESULTS.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(results, indent=1) + "\n")
    atomic_write_text(RESULTS / "baselines.md", markdown(results["runs"]))
    print(markdown(results["runs"]))


if __name__ == "__main__":
    main()
