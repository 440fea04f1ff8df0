"""Cleaning functions of the training corpus (`tools/corpus.py`): markup to plain text,
normalisation, a cheap German/English language check, paragraph de-duplication.

Every function takes and returns `str` (UTF-8 text, never bytes) unless it says otherwise;
lengths are in characters, sizes in bytes of the UTF-8 encoding.
"""

from __future__ import annotations

import hashlib
import itertools
import re
import subprocess
import unicodedata
from html.parser import HTMLParser

# ---- named constants ----------------------------------------------------------------------
MIN_DOC_CHARS = 200          # shorter documents carry no usable context
LANG_MIN_HITS = 8            # stopword hits needed before a language is called
LANG_MARGIN = 1.5            # the winning language needs this many times the other's hits
DEDUPE_MIN_PARA_CHARS = 40   # repeated paragraphs at least this long are dropped
MAX_CODE_LINE_CHARS = 400    # a Python file with a longer line is data, not code
MAX_CODE_FILE_BYTES = 200_000
MAN_LINE_LENGTH = "3000n"    # groff line length: one paragraph per line, no hyphenation

_DE_WORDS = frozenset(
    "der die das und ist nicht ein eine einer eines mit von zu auf für sich dem den des im "
    "werden wird wenn auch oder sie es kann können bei aus nach wie über dass sind zum zur "
    "diese dieser dieses wurde nur noch einem einen durch man hat haben unter alle".split())
_EN_WORDS = frozenset(
    "the and is not a an of to in for with on that this are be by or from as it can if "
    "which will was have has when you your all use used may must should these their into "
    "only more other such than then there also but".split())

_BLOCK_TAGS = frozenset(
    "p div br li ul ol dl dt dd h1 h2 h3 h4 h5 h6 tr table pre blockquote section article "
    "title item note steps terms screen listing figure caption td th hr tbody thead "
    "variablelist para".split())
_SKIP_TAGS = frozenset("script style head nav noscript svg math info".split())
_WORD_RE = re.compile(r"[a-zäöüß]+")
_CTRL_RE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f\u200b\ufeff]")


def normalize_text(text: str, max_blank_lines: int = 1) -> str:
    """NFC, LF line ends, no control characters, no trailing blanks, at most
    `max_blank_lines` empty lines in a row (code keeps 2), tabs kept; leading/trailing empty
    lines removed."""
    text = unicodedata.normalize("NFC", text.replace("\r\n", "\n").replace("\r", "\n"))
    text = _CTRL_RE.sub("", text.replace("\xa0", " "))
    lines = [line.rstrip() for line in text.split("\n")]
    text = "\n".join(lines)
    n = max_blank_lines + 1
    return re.sub("\n{%d,}" % (n + 1), "\n" * n, text).strip("\n")


def guess_language(text: str) -> str | None:
    """'de', 'en' or None (too few stopwords, or no clear winner), from stopword counts of
    the first 20,000 characters."""
    words = _WORD_RE.findall(text[:20_000].lower())
    de = sum(w in _DE_WORDS for w in words)
    en = sum(w in _EN_WORDS for w in words)
    if max(de, en) < LANG_MIN_HITS:
        return None
    if de >= LANG_MARGIN * en:
        return "de"
    if en >= LANG_MARGIN * de:
        return "en"
    return None


class _TextExtractor(HTMLParser):
    """HTML / Mallard XML to text: block tags become line breaks, <pre> keeps its layout,
    script/style/head/nav/info content is dropped."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.skip = 0
        self.pre = 0

    def handle_starttag(self, tag, attrs):
        if tag in _SKIP_TAGS:
            self.skip += 1
        elif tag in ("pre", "screen", "programlisting"):
            self.pre += 1
            self.parts.append("\n")
        elif tag in _BLOCK_TAGS:
            self.parts.append("\n")

    def handle_endtag(self, tag):
        if tag in _SKIP_TAGS:
            self.skip = max(0, self.skip - 1)
        elif tag in ("pre", "screen", "programlisting"):
            self.pre = max(0, self.pre - 1)
            self.parts.append("\n")
        elif tag in _BLOCK_TAGS:
            self.parts.append("\n")

    def handle_startendtag(self, tag, attrs):
        if tag in ("br", "hr"):
            self.parts.append("\n")

    def handle_data(self, data):
        if self.skip:
            return
        self.parts.append(data if self.pre else re.sub(r"[ \t\n]+", " ", data))


def html_to_text(html: str) -> str:
    """Visible text of an HTML (or Mallard / DocBook XML) document, one block per line."""
    parser = _TextExtractor()
    parser.feed(html)
    parser.close()
    lines = [line.strip() if not line.startswith("  ") else line for line in
             "".join(parser.parts).split("\n")]
    return normalize_text("\n".join(lines))


def man_to_text(roff: bytes) -> str:
    """Render a man page (roff source, any encoding groff's preconv detects) with groff as
    plain UTF-8 text: one paragraph per line, no hyphenation, no bold/underline, header and
    footer lines and the 7-space body indent removed. "" for a `.so` redirect or on error."""
    if roff.lstrip().startswith(b".so "):
        return ""
    try:
        pre = subprocess.run(["preconv"], input=roff, capture_output=True, timeout=60).stdout
        out = subprocess.run(
            ["groff", "-mandoc", "-Tutf8", f"-rLL={MAN_LINE_LENGTH}", "-rHY=0", "-dAD=l",
             "-P-cbou"], input=pre, capture_output=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return clean_man_render(out.decode("utf-8", errors="replace"))


def clean_man_render(text: str) -> str:
    """Drop groff's header and footer (the first and last non-empty lines, when unindented
    with a wide gap) and the 7-space body indent; squeeze runs of 20+ spaces. Linear time."""
    kept = text.split("\n")
    filled = [i for i, ln in enumerate(kept) if ln.strip()]
    for i in filled[:1] + filled[-1:]:          # groff's header and footer lines
        if not kept[i].startswith(" ") and " " * 10 in kept[i]:
            kept[i] = ""
    kept = [ln[7:] if ln.startswith("       ") else ln for ln in kept]
    return normalize_text("\n".join(re.sub(r" {20,}", "  ", ln) for ln in kept))


def lyx_to_text(src: str) -> str:
    """Text of a LyX document: non-command lines of each layout joined, one per paragraph;
    insets (formulas, graphics, notes, ERT) and the header are dropped."""
    out, para, depth = [], [], 0
    in_body = False
    for line in src.split("\n"):
        if line.startswith("\\begin_body"):
            in_body = True
        if not in_body:
            continue
        if line.startswith("\\begin_inset"):
            depth += 1
        elif line.startswith("\\end_inset"):
            depth = max(0, depth - 1)
        elif line.startswith("\\end_layout") and depth == 0:
            out.append("".join(para).strip())
            para = []
        elif not line.startswith("\\") and depth == 0:
            para.append(line)
    return normalize_text("\n\n".join(p for p in out if p))


_RST_DROP = re.compile(r"^\.\. (index|_[^:]+|highlight|moduleauthor|sectionauthor|"
                       r"versionadded|versionchanged|testsetup|testcleanup|toctree)\b.*")


def rst_to_text(src: str) -> str:
    """reStructuredText, nearly as written (it reads as text); index entries, labels and
    bookkeeping directives are dropped."""
    return normalize_text("\n".join(ln for ln in src.split("\n") if not _RST_DROP.match(ln)))


def python_source_ok(src: str) -> bool:
    """True for hand-written Python: not empty, no data-blob lines, not huge, not generated."""
    if not src.strip() or len(src.encode("utf-8")) > MAX_CODE_FILE_BYTES:
        return False
    if any(len(ln) > MAX_CODE_LINE_CHARS for ln in src.split("\n")):
        return False
    head = src[:2000].lower()
    return "generated by" not in head and "do not edit" not in head


def decode_bytes(data: bytes) -> str:
    """UTF-8, else Latin-1 (old man pages and HTML); never raises."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return data.decode("latin-1")


def paragraph_key(para: str) -> bytes:
    """Hash of a paragraph with its whitespace collapsed and case folded (16 bytes)."""
    return hashlib.blake2b(" ".join(para.split()).casefold().encode("utf-8"),
                           digest_size=16).digest()


def dedupe_paragraphs(text: str, seen: set[bytes]) -> str:
    """Remove from `text` every paragraph (block between empty lines, or line of a one-line-
    per-block text) of at least DEDUPE_MIN_PARA_CHARS characters already in `seen`; adds the
    kept ones to `seen`. Shorter lines (headings, "Syntax") are always kept."""
    out = []
    for line in text.split("\n"):
        if len(line.strip()) >= DEDUPE_MIN_PARA_CHARS:
            key = paragraph_key(line)
            if key in seen:
                continue
            seen.add(key)
        out.append(line)
    return normalize_text("\n".join(out))


SHINGLE_WORDS = 13      # contamination unit: 13-word windows (as GPT-3's overlap check)


def word_shingles(text: str, n: int = SHINGLE_WORDS) -> set[int]:
    """Hashes of the n-word windows of `text` (lower-cased words of letters and digits) in
    which most words hold a letter: "1 2 3 4 5 ..." runs are not evidence of overlap."""
    words = re.findall(r"\w+", text.lower())
    acc = [0, *itertools.accumulate(not w.isdigit() for w in words)]  # words with a letter
    return {hash(" ".join(words[i:i + n])) for i in range(max(0, len(words) - n + 1))
            if 2 * (acc[i + n] - acc[i]) > n}
