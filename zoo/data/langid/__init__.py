"""Language identification in eight languages (cs, de, en, es, it, pl, pt, ru) from three Debian text sources.

- **fortunes** (fortunes, fortunes-de, -es, -it, -pl, -ru, -cs, -br): sayings, quotes and jokes, entries separated by
  lines holding only `%`. Split by sha256(text) into train / val / test; the test split (300 per language) is the same
  2,400 texts as the first catalog builds, so results stay comparable.
- **libreoffice-help** (libreoffice-help-en-us, -de, -es, -it, -pl, -ru, -cs, -pt-br): the paragraphs of LibreOffice's
  help pages. Training only.
- **gnome-help** (gnome-user-docs: the GNOME desktop user guide in every translation): never trained on; the
  second-domain test set (300 paragraphs per language).

Translations leave untranslated strings in English: a paragraph of a translated manual equal to one of the English
manual is dropped. `make setup` unpacks the packages (apt-get download + dpkg -x, never installed) into
$ZOO_TEXT_DIR (default: <venv>/share/zoo-data/text/<package>/, each with its VERSION). Licences vary per package (see
each package's /usr/share/doc/<package>/copyright); the text is used for training and measurement and not redistributed: the zoo
ships models, not the text.

Two tokenizations, two datasets: `langid-16k` (a 16,000-token WordPiece vocabulary trained on a balanced sample of
the training split, 16,000 texts per language, with the `tokenizers` library: lowercased, accents kept; for entries
trained from scratch; the size is measured by benchmarks/tokenization.py) and `langid` (the English-uncased BERT
vocabulary that imported checkpoints such as all-MiniLM-L6-v2 were pretrained with; the name the first builds used,
whose test inputs are unchanged). The tokenizer travels inside every ONNX file (metadata `zoo.tokenizer`), so a file
is all a user needs.

The trained vocabulary is committed (zoo/data/vocab/langid-16k.json), not retrained on each machine: `tokenizers`'
WordPiece trainer is not deterministic (huggingface/tokenizers#1794: hash-map order decides ties, so two trainings on
the same texts give a different token set and other ids), and a token id that moves silently breaks every entry
trained on the old ids. `zoo vocabulary` trains it anew (a deliberate change: every entry on
`langid-16k` is then rebuilt); the dataset cache is keyed by the vocabulary's sha256.

This module assembles the dataset (splits, training copies, cached arrays, the card's description); `sources` reads
the Debian packages, `augmentation` makes the training copies and `tokenization` holds the two tokenizers.
"""

from __future__ import annotations

import hashlib
import json
from functools import cache
from pathlib import Path

import numpy as np

from zoo.config import data_dir
from zoo.data.base import Dataset, Split, cached_arrays, made_once, register_dataset
from zoo.data.langid.augmentation import augment
from zoo.data.langid.sources import (LABELS, MESSAGES, digest, fortunes, gnome_help, libreoffice_help, package_versions,
                                     software_messages, split_of)
from zoo.data.langid.tokenization import (MAX_TOKENS, PADDING_ID, TRAINED, VOCAB_SIZE, VOCABULARY, encode, tokenizer,
                                          tokenizer_json, train_tokenizer)
from zoo.fsutil import atomic_write_text
from zoo.metadata import TOKENIZER_KEY

# Per language: the fortunes val/test caps (as in the first builds), the second-domain test size and the training
# texts per language (all of fortunes' training split, then help paragraphs up to this number: the most every language
# has, Polish with 30,045; Portuguese, with the fewest fortunes, is filled most from help). The vocabulary is trained on
# a balanced sample of them: the first VOCABULARY_SAMPLE texts of each language in the same order (the v3 training
# split, from which the second-domain set excluded its texts: the second-domain set stays the same).
CAPS = {"val": 150, "test": 300}
SECOND_DOMAIN_TEST = 300
SOFTWARE_MESSAGES_TEST = 300
TRAIN_PER_LANGUAGE = 30000
VOCABULARY_SAMPLE = 16000
TEXTS_VERSION = "v4"


def _take(texts: list[str], n: int) -> list[str]:
    """The first `n` texts in sha256 order: a deterministic sample independent of file order."""
    return sorted(texts, key=digest)[:n]


@cache
def texts() -> dict:
    """{split: (texts, labels)} for train / val / test (fortunes) and `second-domain` (gnome-help), plus counts by
    source; cached as JSON in the data cache (zoo.config.data_dir). Each language's training texts start with the
    vocabulary's sample (vocabulary_texts)."""
    path = data_dir() / f"langid-texts-{TEXTS_VERSION}.json"
    assembled = {}

    def write() -> None:
        assembled.update(_assembled())
        atomic_write_text(path, json.dumps(assembled, ensure_ascii=False))

    # Processes that want the texts at once (the two tokenizations prepared side by side) read them once: the others
    # wait for the first (zoo.data.base.made_once), then read its file.
    if not made_once(path, write):
        return json.loads(path.read_text())
    _write_sources(assembled)
    return assembled


def _assembled() -> dict:
    """texts() read anew from the Debian packages (about half a CPU-minute, most of it parsing the help pages)."""
    out = {s: ([], []) for s in ("train", "val", "test", "second-domain")}
    sources: dict[str, dict[str, int]] = {}
    candidates, held_out = {}, set()
    for language in LABELS:
        by_split = {"train": [], "val": [], "test": []}
        for t in fortunes(language):
            by_split[split_of(t)].append(t)
        chosen = {s: _take(by_split[s], CAPS[s]) for s in CAPS}
        held_out.update(chosen["val"], chosen["test"])
        # Training candidates in order: fortunes' training split, then help paragraphs (each in sha256 order).
        help_texts = libreoffice_help(language)
        candidates[language] = (chosen, _take(by_split["train"], TRAIN_PER_LANGUAGE),
                                _take(help_texts, len(help_texts)))
    # The second-domain set never holds a text of the vocabulary's sample (a few short headings occur in both
    # manuals)...
    sample = {t for _, f, h in candidates.values() for t in (f + h)[:VOCABULARY_SAMPLE]}
    second = {language: _take([t for t in gnome_help(language) if t not in sample], SECOND_DOMAIN_TEST)
              for language in LABELS}
    held_out.update(*second.values())
    for label, language in enumerate(LABELS):
        chosen, train_fortunes, help_texts = candidates[language]
        # ...nor does training (nor the fortunes val/test texts): dropping them leaves the sample first.
        help_texts = [t for t in help_texts if t not in held_out][:max(0, TRAIN_PER_LANGUAGE - len(train_fortunes))]
        chosen["train"] = train_fortunes + help_texts
        chosen["second-domain"] = second[language]
        sources[language] = {"fortunes": len(train_fortunes), "libreoffice-help": len(help_texts),
                             "gnome-help": len(second[language])}
        for split, picked in chosen.items():
            out[split][0].extend(picked)
            out[split][1].extend([label] * len(picked))
    return {"splits": out, "sources": sources, "packages": package_versions()}


def _sources_path() -> Path:
    return data_dir() / f"langid-texts-{TEXTS_VERSION}.sources.json"


def _write_sources(data: dict) -> dict:
    small = {"sources": data["sources"], "packages": data["packages"]}
    atomic_write_text(_sources_path(), json.dumps(small, ensure_ascii=False))
    return small


@cache
def text_sources() -> dict:
    """texts()'s counts by source and package versions, read from a small file beside the texts: a process that
    trains or measures on the cached arrays needs only these for the dataset's description, not the 30 MB of texts
    (0.35 s and ~350 MB of Python strings a process)."""
    path = _sources_path()
    return json.loads(path.read_text()) if path.exists() else _write_sources(texts())


def software_messages_test() -> dict:
    """The third held-out domain, program messages (zoo.data.langid.sources.MESSAGES), never trained on and apart from
    the dataset (its arrays and cards stay as they are): SOFTWARE_MESSAGES_TEST per language, the first by sha256,
    none of them a text of any split. {"texts", "labels", "packages"}."""
    used = {t for split, _ in texts()["splits"].values() for t in split}
    out, labels = [], []
    for label, language in enumerate(LABELS):
        picked = _take([t for t in software_messages(language) if t not in used], SOFTWARE_MESSAGES_TEST)
        out += picked
        labels += [label] * len(picked)
    return {"texts": out, "labels": labels, "packages": package_versions(list(MESSAGES))}


def vocabulary_texts() -> list[str]:
    """The vocabulary's training sample: the first VOCABULARY_SAMPLE training texts of each language."""
    base, labels = texts()["splits"]["train"]
    seen: dict[int, int] = {}
    out = []
    for text, label in zip(base, labels):
        seen[label] = seen.get(label, 0) + 1
        if seen[label] <= VOCABULARY_SAMPLE:
            out.append(text)
    return out


def train_texts() -> tuple[list[str], list[int]]:
    """The training split with its augmented copies (augment), labels alongside."""
    base, labels = texts()["splits"]["train"]
    out, out_labels = [], []
    for text, label in zip(base, labels):
        copies = augment(text)
        out += copies
        out_labels += [label] * len(copies)
    return out, out_labels


def write_vocabulary(path: Path = VOCABULARY) -> Path:
    """Train TRAINED's vocabulary anew on the balanced sample and write it (pretty JSON, so a change reads as a diff)."""
    atomic_write_text(path, train_tokenizer(vocabulary_texts(), VOCAB_SIZE).to_str(pretty=True) + "\n")
    return path


def _version(name: str) -> str:
    """The arrays' cache key: the texts' version, the input length and the tokenizer's sha256."""
    return f"{TEXTS_VERSION}-{MAX_TOKENS}-{hashlib.sha256(tokenizer_json(name).encode()).hexdigest()[:12]}"


def _build(name: str) -> dict:
    tok = tokenizer(name)
    splits = texts()["splits"]
    arrays = {}
    for split in ("train", "val", "test", "second-domain"):
        batch, labels = train_texts() if split == "train" else splits[split]
        arrays[f"{split}_x"] = encode(tok, batch)
        arrays[f"{split}_y"] = np.array(labels, dtype=np.int64)
    return arrays


def _usage(name: str) -> str:
    if name == TRAINED:
        return f'''from tokenizers import Tokenizer
from zoo.metadata import read_metadata

texts = ["Der frühe Vogel fängt den Wurm.", "Quien mucho abarca, poco aprieta."]
# The tokenizer is inside every file of the entry: [CLS] text [SEP], padded to {MAX_TOKENS} (id 0 pads).
tokenizer = Tokenizer.from_str(read_metadata(path)["zoo.tokenizer"])
x = np.array([e.ids for e in tokenizer.encode_batch(texts)], dtype=np.int64)'''
    return f'''from tokenizers import BertWordPieceTokenizer
from zoo.data.langid.tokenization import vocab_file  # the uncased BERT/MiniLM vocab.txt the checkpoint was pretrained with

texts = ["Der frühe Vogel fängt den Wurm.", "Quien mucho abarca, poco aprieta."]
tokenizer = BertWordPieceTokenizer(str(vocab_file()), lowercase=True)  # adds [CLS] ... [SEP]
tokenizer.enable_truncation({MAX_TOKENS})
tokenizer.enable_padding(length={MAX_TOKENS})  # id 0 pads and doubles as the attention mask
x = np.array([e.ids for e in tokenizer.encode_batch(texts)], dtype=np.int64)'''


def _load(name: str) -> Dataset:
    arrays = cached_arrays(name, _version(name), lambda: _build(name))
    split = {s: Split.from_arrays(arrays, s) for s in ("train", "val", "test", "second-domain")}
    info = text_sources()
    vocab = json.loads(tokenizer_json(name))["model"]["vocab"]
    sources = info["sources"]
    packages = ", ".join(f"{p} {v}" for p, v in info["packages"].items())
    tokenization = (f"WordPiece trained on the training split's first {VOCABULARY_SAMPLE:,} texts of each language "
                    f"(tokenizers library, {len(vocab):,} tokens; lowercased, accents kept)" if name == TRAINED else
                    f"WordPiece, English uncased (the BERT/MiniLM vocab.txt, {len(vocab):,} tokens; lowercased, accents "
                    "stripped), as the imported checkpoint was pretrained")
    return Dataset(
        name=name, train=split["train"], val=split["val"], test=split["test"], labels=LABELS,
        test_sets={"second-domain": split["second-domain"]},
        source="Debian packages " + packages + ": fortunes (train/val/test), LibreOffice help (train), GNOME user "
               "guide (second-domain test, never trained on)",
        license="per package (BSD-like, GPL, MPL-2.0, CC-BY-SA and public-domain texts; see each package's "
                "/usr/share/doc/<package>/copyright); text not redistributed",
        preprocessing=[
            "fortunes: entries split on '%' lines, whitespace collapsed, 40-600 characters, offensive ('off') "
            "sections excluded, deduplicated; split by sha256(text): 15% test, 10% val, 75% train; val and test "
            f"capped at {CAPS['val']}/{CAPS['test']} per language (the first builds' test set)",
            "help manuals: paragraphs, headings and list items of 20-600 characters, at least half letters; a "
            "translated paragraph equal to an English one (left untranslated) dropped",
            f"training texts per language: all fortunes of the training split, then LibreOffice help paragraphs up to "
            f"{TRAIN_PER_LANGUAGE:,} (" + ", ".join(f"{k} {v['fortunes']:,}+{v['libreoffice-help']:,}"
                                                     for k, v in sources.items()) + ")",
            "each training text also as a 1-6 word snippet and as a noisy copy (punctuation dropped or a number, "
            "address or code token mixed in; random case), drawn by a generator seeded with the text",
            f"second-domain test: {SECOND_DOMAIN_TEST} GNOME user-guide paragraphs per language (first by sha256), "
            "none of them a training text (help paragraphs equal to one are left out of training)",
            f"{tokenization}, [CLS] text [SEP], truncated/padded to {MAX_TOKENS}",
            f"input: token ids int64 [batch, {MAX_TOKENS}]; padding id 0 doubles as the attention mask",
        ],
        usage=_usage(name),
        onnx_metadata={TOKENIZER_KEY: tokenizer_json(name)},
        padding_id=PADDING_ID,
        model_args={"vocab_size": len(vocab)},
    )


@register_dataset(TRAINED)
@cache
def load() -> Dataset:
    return _load(TRAINED)


@register_dataset("langid")
@cache
def load_uncased() -> Dataset:
    return _load("langid")
