"""The datasets behind the entries: language-ID text sources, test sets, tokenizers and training augmentations."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from zoo.data import langid, load_dataset
from zoo.data.langid import augmentation, sources, tokenization
from zoo.data.shifts import augmented
from zoo.errors import ZooError

# sha256 of the fortunes test texts joined by newlines: the 2,400 texts the first catalog builds were measured on
# (computed with that commit's zoo/data/langid.py), so accuracies stay comparable across builds.
FIRST_BUILDS_TEST = "e9fdf1ddbef1d7038c773e9a3b936d671130ecd2c4d935d13dd9b48d22ae7752"
# ...and of the second-domain texts and of the vocabulary's training sample (the v3 training split the committed
# vocabulary was trained on): more training text leaves both where they were.
SECOND_DOMAIN_V3 = "fea4ac40f5f4934e97cf5d483c234b0f7a0335a1c0a7400c0951a121f5796bcb"
VOCABULARY_SAMPLE_V3 = "63f301a24227e33f86787d9672cd3933cceaeafd4a86eca96276adb989e948d3"


def _digest(texts: list[str]) -> str:
    return hashlib.sha256("\n".join(texts).encode()).hexdigest()


def test_langid_splits_sources_and_the_unchanged_test_set():
    info = langid.texts()
    splits = info["splits"]
    assert _digest(splits["test"][0]) == FIRST_BUILDS_TEST and _digest(splits["second-domain"][0]) == SECOND_DOMAIN_V3
    assert _digest(langid.vocabulary_texts()) == VOCABULARY_SAMPLE_V3
    per_language = {split: torch.bincount(torch.tensor(labels)).tolist() for split, (_, labels) in splits.items()}
    assert per_language["test"] == [300] * 8 and per_language["second-domain"] == [300] * 8
    assert per_language["train"] == [langid.TRAIN_PER_LANGUAGE] * 8  # tens of thousands of texts per language exist
    train = set(splits["train"][0])
    held_out = set(splits["test"][0]) | set(splits["val"][0]) | set(splits["second-domain"][0])
    assert not train & held_out
    for language, counts in info["sources"].items():  # more than one source for every language
        assert counts["fortunes"] > 1500 and counts["libreoffice-help"] > 15000, (language, counts)
    # Translations keep untranslated paragraphs in English: none of them is labelled as another language.
    english_help = set(sources.libreoffice_help("en")) | set(sources.gnome_help("en"))
    en = sources.LABELS.index("en")
    assert not {t for t, y in zip(*splits["train"]) if y != en} & english_help
    assert not {t for t, y in zip(*splits["second-domain"]) if y != en} & english_help
    assert set(info["packages"]) == set(sources.PACKAGES) and "unknown" not in info["packages"].values()


def test_help_pages_keep_every_paragraph_with_the_inert_tags_dropped_before_parsing():
    """sources._Paragraphs drops the tags that change nothing it keeps before HTMLParser reads a page (half its CPU):
    the same paragraphs as the whole page gives, whatever the markup."""
    page = """<!DOCTYPE html><HTML><head><title>T</title><script>if (a<b && "<p>") {}</script>
    <style>p > a {color: red}</style><link rel="x" href="a>b"></head><body>
    <header><a href="?q='>'"><P Class='x'>Help for LibreOffice</P></a></header>
    <div id="c"><h1>Title <span class="t">with &amp; <b>bold</b></span>&#33;</h1>
    <!-- <p>commented out</p> <a href=">"> -->
    <ul><li>one <em>item</em><p>nested paragraph</p> tail</li><LI>two<br/>lines</LI></ul>
    <p>script inside: <script>var s = "<i>not a tag</i>";</SCRIPT> after</p>
    <h7>not a block</h7><pre>pre text</pre><p>x &lt;y&gt; <img src="a.png" alt="<p>">z</p><p>unclosed"""
    whole = sources._Paragraphs()
    whole.feed(page)
    assert sources._Paragraphs.of(page) == whole.out
    assert {"Help for LibreOffice", "nested paragraph", "Title with & bold!", 'x <y> z'} <= set(whole.out)
    assert 'script inside: var s = "<i>not a tag</i>"; after' in whole.out


def test_software_messages_are_a_third_domain_never_trained_on():
    """Program messages (coreutils, glibc, tar gettext catalogs; make setup unpacks them): 300 per language, none of
    them a text of any split, none of the translated ones left in English, each package's version recorded."""
    held_out = langid.software_messages_test()
    texts, labels = held_out["texts"], held_out["labels"]
    assert torch.bincount(torch.tensor(labels)).tolist() == [langid.SOFTWARE_MESSAGES_TEST] * 8
    assert not set(texts) & {t for split, _ in langid.texts()["splits"].values() for t in split}
    english = set(sources.software_messages("en"))
    assert len(english) > 1500 and not {t for t, y in zip(texts, labels) if y != sources.LABELS.index("en")} & english
    assert set(held_out["packages"]) == set(sources.MESSAGES) and "unknown" not in held_out["packages"].values()
    assert texts == langid.software_messages_test()["texts"]  # the same set on every run


def test_langid_augmented_copies_are_deterministic():
    text = "Der frühe Vogel fängt den Wurm, sagt man in Deutschland seit vielen Jahren."
    copies = augmentation.augment(text)
    assert copies == augmentation.augment(text) and copies[0] == text and len(copies) == 3
    snippet = copies[1].split()
    assert 1 <= len(snippet) <= 6 and " ".join(snippet) in text
    noisy = copies[2].lower()
    assert noisy != text.lower() and any(token.lower() in noisy for token in augmentation._INSERTS)


def test_trained_vocabulary_rides_in_the_dataset_and_fits_the_model():
    data = load_dataset(tokenization.TRAINED)
    vocab = json.loads(data.onnx_metadata["zoo.tokenizer"])["model"]["vocab"]
    assert data.model_args == {"vocab_size": len(vocab)} and len(vocab) == tokenization.VOCAB_SIZE
    assert vocab["[PAD]"] == 0 and int(data.train.x.max()) < len(vocab)
    assert len(data.train) == 3 * 8 * langid.TRAIN_PER_LANGUAGE  # originals, snippets, noisy copies
    tokenizer = tokenization.tokenizer(tokenization.TRAINED)
    # Accents stay (the uncased vocabulary strips them), Cyrillic and Polish words stay whole-ish.
    assert "ż" in tokenizer.normalizer.normalize_str("Żółw") and sum(1 for i in tokenizer.encode("Привет").ids if i) <= 4
    uncased = load_dataset("langid")
    assert uncased.model_args == {"vocab_size": 30522}
    assert torch.equal(uncased.test_sets["second-domain"].y, data.test_sets["second-domain"].y)


def test_a_prepared_dataset_loads_without_its_texts_or_a_copy_of_its_arrays():
    """A process that trains or measures on the prepared arrays (every rank) maps them and reads the texts' small
    sources file for the description: the 30 MB of texts stay unread, and the description is the same."""
    data = load_dataset(tokenization.TRAINED)  # prepared here if this is the run's first use
    probe = textwrap.dedent(f"""
        import json
        from zoo.data import langid, load_dataset
        data = load_dataset({tokenization.TRAINED!r})
        assert langid.texts.cache_info().currsize == 0, "the texts were loaded"
        assert "/train_x.npy" in open("/proc/self/maps").read(), "the training array was read, not mapped"
        print(json.dumps([data.source, data.preprocessing]))
    """)
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads(result.stdout) == [data.source, data.preprocessing]


def test_the_trained_vocabulary_is_committed_and_fits_the_training_split():
    # The dataset's ids come from the committed vocabulary, never from a training on this machine (not deterministic)
    committed = json.loads(tokenization.VOCABULARY.read_text())["model"]["vocab"]
    assert json.loads(tokenization.tokenizer_json(tokenization.TRAINED))["model"]["vocab"] == committed
    # the cache key follows the vocabulary: arrays encoded with another vocabulary are never reused
    assert hashlib.sha256(tokenization.tokenizer_json(tokenization.TRAINED).encode()).hexdigest()[:12] in \
        langid._version(tokenization.TRAINED)
    # ...and that vocabulary is what training on today's vocabulary sample gives, up to the trainer's tie-breaking: a
    # change to the texts that moves the vocabulary fails here until `zoo vocabulary` retrains it.
    fresh = json.loads(tokenization.train_tokenizer(langid.vocabulary_texts()).to_str())["model"]["vocab"]
    assert len(set(fresh) & set(committed)) >= 0.99 * len(committed)


_BUILD_AT_ONCE = textwrap.dedent("""
    import os, sys, time
    import numpy as np
    from zoo.data.base import cached_arrays

    def build():
        with open(sys.argv[1], "a") as log:
            log.write(f"{os.getpid()}\\n")
        time.sleep(2)
        return {"x": np.random.default_rng().integers(0, 1 << 30, size=64)}  # another draw in every process

    x = cached_arrays("probe", "v1", build)["x"]
    assert isinstance(x, np.memmap), type(x)  # read memory-mapped, never copied in
    np.save(sys.argv[2], x)
""")


def test_ranks_wanting_one_dataset_at_once_build_it_once_and_agree(tmp_path):
    # As the two ranks of `zoo build` on a cold data cache: the second waits for the first's arrays.
    env = {**os.environ, "ZOO_DATA_DIR": str(tmp_path / "data")}
    log = tmp_path / "builds.log"
    ranks = [subprocess.Popen([sys.executable, "-c", _BUILD_AT_ONCE, str(log), str(tmp_path / f"rank{i}.npy")],
                              env=env) for i in range(2)]
    assert [r.wait(timeout=120) for r in ranks] == [0, 0]
    assert len(log.read_text().split()) == 1, "both ranks built the dataset"
    assert np.array_equal(np.load(tmp_path / "rank0.npy"), np.load(tmp_path / "rank1.npy"))
    assert [p.name for p in (tmp_path / "data").iterdir() if not p.name.endswith(".lock")] == ["probe-v1"]
    assert sorted(p.name for p in (tmp_path / "data" / "probe-v1").iterdir()) == ["x.npy"]  # no temporary folder left


def test_processes_wanting_the_texts_at_once_read_them_once(tmp_path, monkeypatch):
    """The two tokenizations prepared side by side (tests/helpers.py prepared_datasets) both want the language-ID
    texts (half a CPU-minute to read): the second waits for the first's file instead of reading them again."""
    import concurrent.futures
    import threading
    import time

    monkeypatch.setenv("ZOO_DATA_DIR", str(tmp_path))
    reads, started = [], threading.Barrier(2)

    def assembled():
        reads.append(1)
        time.sleep(0.5)  # the other caller arrives while this one reads
        return {"splits": {"test": [["Ahoj"], [0]]}, "sources": {"cs": {"fortunes": 1}}, "packages": {"x": "1"}}

    def wanted():
        started.wait()
        return langid.texts.__wrapped__()  # past the per-process cache: as two processes would

    monkeypatch.setattr(langid, "_assembled", assembled)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        got = [f.result() for f in [pool.submit(wanted), pool.submit(wanted)]]
    assert len(reads) == 1, "both read the texts"
    path = tmp_path / f"langid-texts-{langid.TEXTS_VERSION}.json"
    assert got[0] == got[1] == json.loads(path.read_text())
    # Once written, the file is read without the lock (a prepared cache may be read-only).
    Path(f"{path}.lock").unlink()
    assert langid.texts.__wrapped__() == got[0] and not Path(f"{path}.lock").exists() and len(reads) == 1


def test_a_cache_of_the_old_single_file_format_is_converted_not_rebuilt(tmp_path, monkeypatch):
    from zoo.data.base import cached_arrays

    monkeypatch.setenv("ZOO_DATA_DIR", str(tmp_path))
    np.savez(tmp_path / "probe-v1.npz", x=np.arange(6).reshape(2, 3), y=np.array([1, 0]))

    def build():
        raise AssertionError("rebuilt although the old cache held the arrays")

    arrays = cached_arrays("probe", "v1", build)
    assert sorted(arrays) == ["x", "y"] and arrays["x"].tolist() == [[0, 1, 2], [3, 4, 5]]
    assert torch.from_numpy(arrays["x"]).sum() == 15  # copy-on-write maps: torch takes them as they are
    assert not (tmp_path / "probe-v1.npz").exists() and (tmp_path / "probe-v1" / "y.npy").is_file()
    # once written, the folder is read without the lock (a prepared cache may be read-only)
    (tmp_path / "probe-v1.lock").unlink()
    assert cached_arrays("probe", "v1", build)["y"].tolist() == [1, 0] and not (tmp_path / "probe-v1.lock").exists()
    # arrays that fail to be written half-way leave no folder behind: the next call builds again
    with pytest.raises(ValueError, match="allow_pickle"):
        cached_arrays("other", "v1", lambda: {"a": np.arange(3), "b": np.array([object()])})
    assert not (tmp_path / "other-v1").exists() and not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_pixel_shifts_augment_only_the_training_split():
    data = load_dataset("digits")
    more = augmented(data, ["pixel-shifts"])
    n = len(data.train)
    assert len(more.train) == 9 * n and more.val is data.val and more.test is data.test
    assert torch.equal(more.train.x[:n], data.train.x) and torch.equal(more.train.y, data.train.y.repeat(9))
    # the first copy moves each image one pixel down and right: (r, c) comes from (r - 1, c - 1), zeros entering
    shifted = more.train.x[n:2 * n]
    assert torch.equal(shifted[:, :, 1:, 1:], data.train.x[:, :, :-1, :-1])
    assert not shifted[:, :, 0, :].any() and not shifted[:, :, :, 0].any()
    assert augmented(data, []).train is data.train
    with pytest.raises(ZooError, match="applies to image datasets"):
        augmented(load_dataset("mnist1d"), ["pixel-shifts"])
