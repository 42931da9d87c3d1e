"""Where the language-ID texts come from: Debian's fortunes, LibreOffice help and GNOME user guide packages, unpacked by
`make setup` under $ZOO_TEXT_DIR, read into cleaned texts per language, and split by each text's sha256 (the dataset,
zoo.data.langid, picks and balances them)."""

from __future__ import annotations

import gettext
import hashlib
import os
import re
import sys
import xml.etree.ElementTree as ET
from functools import cache
from html.parser import HTMLParser
from pathlib import Path

from zoo.errors import ZooError

LABELS = ["cs", "de", "en", "es", "it", "pl", "pt", "ru"]
FORTUNES = {"en": "fortunes", "de": "fortunes-de", "es": "fortunes-es", "it": "fortunes-it", "pl": "fortunes-pl",
            "ru": "fortunes-ru", "cs": "fortunes-cs", "pt": "fortunes-br"}
# LibreOffice help: package and the folder under usr/share/libreoffice/help/.
LIBREOFFICE = {"en": ("libreoffice-help-en-us", "en-US"), "de": ("libreoffice-help-de", "de"),
               "es": ("libreoffice-help-es", "es"), "it": ("libreoffice-help-it", "it"),
               "pl": ("libreoffice-help-pl", "pl"), "ru": ("libreoffice-help-ru", "ru"),
               "cs": ("libreoffice-help-cs", "cs"), "pt": ("libreoffice-help-pt-br", "pt-BR")}
GNOME = "gnome-user-docs"
GNOME_DIRS = {"en": "C", "de": "de", "es": "es", "it": "it", "pl": "pl", "ru": "ru", "cs": "cs", "pt": "pt_BR"}
PACKAGES = sorted({*FORTUNES.values(), *(p for p, _ in LIBREOFFICE.values()), GNOME})
# Software messages (the third held-out domain, never trained on): each package's gettext catalogs (package -> text
# domain), read from usr/share/locale/<locale>/LC_MESSAGES/<domain>.mo; English is their source strings (msgid).
MESSAGES = {"coreutils": "coreutils", "libc-l10n": "libc", "tar": "tar"}
MESSAGE_LOCALES = {"cs": "cs", "de": "de", "es": "es", "it": "it", "pl": "pl", "pt": "pt_BR", "ru": "ru"}
MIN_CHARS, MAX_CHARS = 40, 600  # fortunes entries (as in the first builds: the test split stays the same)
MIN_PARAGRAPH = 20  # help paragraphs: shorter ones are mostly menu names and labels


def corpus_dir() -> Path:
    return Path(os.environ.get("ZOO_TEXT_DIR", Path(sys.prefix) / "share" / "zoo-data" / "text"))


def _package(name: str) -> Path:
    root = corpus_dir() / name
    if not root.is_dir():
        raise ZooError(f"the langid dataset needs Debian's {name} unpacked under {corpus_dir()}: run `make setup` "
                       f"(it runs apt-get download + dpkg -x), or set ZOO_TEXT_DIR")
    return root


def package_versions(packages=PACKAGES) -> dict[str, str]:
    """{package: Debian version} of the unpacked text packages (make setup writes VERSION beside each)."""
    return {p: ((_package(p) / "VERSION").read_text().strip() if (_package(p) / "VERSION").exists() else "unknown")
            for p in packages}


def _clean(text: str) -> str:
    return " ".join(text.split())


def _decode(raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw.decode("latin-1")


def fortunes(language: str) -> list[str]:
    """Every fortunes entry of 40-600 characters (offensive 'off' sections excluded), deduplicated, sorted."""
    texts = set()
    for path in sorted((_package(FORTUNES[language]) / "usr" / "share" / "games" / "fortunes").rglob("*")):
        if not path.is_file() or path.is_symlink() or path.suffix in (".dat", ".u8") or "off" in path.parts:
            continue
        for entry in re.split(r"\n%\n", _decode(path.read_bytes())):
            entry = _clean(entry)
            if MIN_CHARS <= len(entry) <= MAX_CHARS:
                texts.add(entry)
    return sorted(texts)


class _Paragraphs(HTMLParser):
    """The text of every <p>, <h1>-<h6> and <li> of an HTML page (nested inline tags included)."""

    BLOCKS = {"p", "h1", "h2", "h3", "h4", "h5", "h6", "li"}
    # Every other tag (attributes included: quoted values may hold '>') changes nothing the parser keeps; dropped
    # before parsing, it leaves the same paragraphs for half the CPU (parse_starttag's attribute parsing is most of
    # HTMLParser's time: the LibreOffice help of the eight languages, 226 MB, 43 -> 22 CPU-seconds, every paragraph
    # set equal). Comments and the <script> and <style> elements (raw text to HTMLParser) are kept whole.
    INERT_TAGS = re.compile(r"""(?P<keep><!--.*?-->|<(script|style)\b.*?</\2\s*>)"""
                            r"""|<(?!/?(?:%s)\b)[a-z/][^>"']*(?:(?:"[^"]*"|'[^']*')[^>"']*)*>"""
                            % "|".join(sorted(BLOCKS, reverse=True)), re.IGNORECASE | re.DOTALL)

    @classmethod
    def of(cls, html: str) -> list[str]:
        parser = cls()
        parser.feed(cls.INERT_TAGS.sub(r"\g<keep>", html))
        return parser.out

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.depth, self.current, self.out = 0, [], []

    def handle_starttag(self, tag, attrs):
        if tag in self.BLOCKS:
            if self.depth and self.current:
                self.out.append("".join(self.current))
                self.current = []
            self.depth += 1

    def handle_endtag(self, tag):
        if tag in self.BLOCKS and self.depth:
            self.depth -= 1
            self.out.append("".join(self.current))
            self.current = []

    def handle_data(self, data):
        if self.depth:
            self.current.append(data)


def _keep_paragraphs(texts: set[str]) -> set[str]:
    return {t for t in texts if MIN_PARAGRAPH <= len(t) <= MAX_CHARS and sum(c.isalpha() for c in t) >= len(t) / 2}


def _translated(raw, language: str) -> list[str]:
    """`raw(language)`'s texts, sorted, without those a translation left in English (equal to one of `raw("en")`)."""
    texts = raw(language)
    return sorted(texts if language == "en" else texts - raw("en"))


@cache
def _libreoffice_raw(language: str) -> frozenset[str]:
    package, folder = LIBREOFFICE[language]
    texts = set()
    for path in sorted((_package(package) / "usr" / "share" / "libreoffice" / "help" / folder).rglob("*.html")):
        texts.update(_clean(t) for t in _Paragraphs.of(_decode(path.read_bytes())))
    return frozenset(_keep_paragraphs(texts))


def libreoffice_help(language: str) -> list[str]:
    """LibreOffice help paragraphs in `language`, those left in English by the translation dropped."""
    return _translated(_libreoffice_raw, language)


@cache
def _gnome_raw(language: str) -> frozenset[str]:
    texts = set()
    for path in sorted((_package(GNOME) / "usr" / "share" / "help" / GNOME_DIRS[language]).rglob("*.page")):
        try:
            root = ET.fromstring(path.read_bytes())
        except ET.ParseError:
            continue
        texts.update(_clean("".join(p.itertext())) for p in root.iter() if p.tag.rsplit("}", 1)[-1] in ("p", "title"))
    return frozenset(_keep_paragraphs(texts))


def gnome_help(language: str) -> list[str]:
    """GNOME user-guide paragraphs in `language`, those left in English by the translation dropped."""
    return _translated(_gnome_raw, language)


@cache
def _messages_raw(language: str) -> frozenset[str]:
    """The messages of every MESSAGES catalog in `language` (English: the source strings of the German catalogs,
    which translate them all), option lists and one-word labels dropped by the help paragraphs' rule."""
    texts = set()
    for package, domain in MESSAGES.items():
        locale = MESSAGE_LOCALES.get(language, "de")
        path = _package(package) / "usr" / "share" / "locale" / locale / "LC_MESSAGES" / f"{domain}.mo"
        with path.open("rb") as f:
            catalog = gettext.GNUTranslations(f)._catalog
        for source, translated in catalog.items():
            if isinstance(source, str) and source and isinstance(translated, str):
                texts.add(_clean(source if language == "en" else translated))
    return frozenset(_keep_paragraphs(texts))


def software_messages(language: str) -> list[str]:
    """Program messages (coreutils, the GNU C library, tar) in `language`, those left in English dropped."""
    return _translated(_messages_raw, language)


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def split_of(text: str) -> str:
    bucket = int(digest(text)[:8], 16) % 20
    return "test" if bucket < 3 else "val" if bucket < 5 else "train"
