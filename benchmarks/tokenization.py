"""Which tokenization for the language-ID entries: the English-uncased BERT WordPiece against WordPiece vocabularies
trained on the training split's balanced sample (zoo.data.langid.tokenization.train_tokenizer) at several sizes, measured on both
test sets.

Per language: [UNK] tokens per 100 words, pieces per word, words cut into 3 or more pieces (fragments), and texts
cut off by the 64-token input. The vocabulary the `langid-16k` dataset uses (zoo.data.langid.tokenization.VOCAB_SIZE) is chosen
here: the smallest trained size whose pieces per word are within 20% of the largest size's in every language on both
test sets (the embedding table is most of a small model's bytes: each doubling of the vocabulary doubles it).

Writes benchmarks/results/tokenization.{json,md}.

    python benchmarks/tokenization.py [--sizes 8000 16000 32000]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from zoo.data import langid  # noqa: E402
from zoo.data.langid import sources, tokenization  # noqa: E402
from zoo.fsutil import atomic_write_text  # noqa: E402
from zoo.provenance import cpu_info  # noqa: E402

WORD = re.compile(r"\w+", re.UNICODE)


def measure(tokenizer, texts: list[str], labels: list[int]) -> dict[str, dict[str, float]]:
    tokenizer.no_padding()
    tokenizer.no_truncation()
    unk = tokenizer.token_to_id("[UNK]")
    out = {}
    for label, language in enumerate(sources.LABELS):
        mine = [t for t, y in zip(texts, labels) if y == label]
        words = [w for t in mine for w in WORD.findall(t)]
        pieces = [len(e.ids) for e in tokenizer.encode_batch(words, add_special_tokens=False)]
        encoded = tokenizer.encode_batch(mine)
        out[language] = {
            "unk_per_100_words": 100 * sum(e.ids.count(unk) for e in encoded) / max(1, len(words)),
            "pieces_per_word": sum(pieces) / max(1, len(pieces)),
            "fragment_pct": 100 * sum(p >= 3 for p in pieces) / max(1, len(pieces)),
            "truncated_pct": 100 * sum(len(e.ids) > tokenization.MAX_TOKENS for e in encoded) / max(1, len(encoded)),
        }
    return out


def choose(results: dict, sizes: list[int], within: float = 1.2) -> int:
    largest = results[f"trained-{sizes[-1]}"]
    for size in sizes:
        mine = results[f"trained-{size}"]
        if all(mine[s][lang]["pieces_per_word"] <= within * largest[s][lang]["pieces_per_word"]
               for s in mine for lang in sources.LABELS):
            return size
    return sizes[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[8000, 16000, 32000])
    args = parser.parse_args()
    splits = langid.texts()["splits"]
    sets = {"fortunes": splits["test"], "second-domain": splits["second-domain"]}
    candidates = {"bert-uncased-30522": tokenization.uncased_tokenizer}
    sample = langid.vocabulary_texts()
    candidates.update({f"trained-{n}": (lambda n=n: tokenization.train_tokenizer(sample, n)) for n in args.sizes})
    results = {}
    for name, make in candidates.items():
        tokenizer = make()
        results[name] = {s: measure(tokenizer, *sets[s]) for s in sets}
        print(name, "done", file=sys.stderr)
    chosen = choose(results, sorted(args.sizes))
    cpu = cpu_info()
    record = {"cpu": cpu, "chosen_vocab_size": chosen, "dataset_vocab_size": tokenization.VOCAB_SIZE, "results": results}
    out = ROOT / "benchmarks" / "results"
    atomic_write_text(out / "tokenization.json", json.dumps(record, indent=1) + "\n")
    lines = ["# Tokenization for language identification", "",
             "Measured by `python benchmarks/tokenization.py` on both test sets (the texts, no model involved; "
             f"CPU {cpu['model']}). Per language: [UNK] per 100 words, pieces per word, % of words cut into 3+ pieces "
             "(fragments), % of texts longer than the 64-token input.", "",
             "Chosen: the smallest trained vocabulary whose pieces per word are within 20% of the largest trained "
             f"size's in every language on both test sets: **{chosen:,} tokens** (the `{langid.TRAINED}` dataset uses "
             f"{tokenization.VOCAB_SIZE:,}; `langid`, for imported checkpoints, keeps their English-uncased vocabulary).", ""]
    for test_set in sets:
        lines += [f"## {test_set}", "", "| tokenizer | " + " | ".join(sources.LABELS) + " |",
                  "| --- |" + " --- |" * len(sources.LABELS)]
        for name in results:
            r = results[name][test_set]
            lines.append(f"| {name} | " + " | ".join(
                f"{r[lang]['unk_per_100_words']:.1f} unk · {r[lang]['pieces_per_word']:.2f} p/w · "
                f"{r[lang]['fragment_pct']:.0f}% frag · {r[lang]['truncated_pct']:.0f}% cut" for lang in sources.LABELS)
                + " |")
        lines.append("")
    atomic_write_text(out / "tokenization.md", "\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
