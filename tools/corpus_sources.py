"""The sources of the training corpus (`tools/corpus.py`), as data, and its SOURCES.md.

Each `Source` is a Debian package (`package`, downloaded with `apt-get download`, Debian
bookworm main) or a folder of this machine (`root`), globs inside it, how to clean its files
(`kind`: html | man | rst | lyx | python | text), the language it is expected to hold ("code"
for Python; prose is checked per document), its licence as the package's copyright file states
it, and a cap in MB of cleaned text. Licences were read from each package's
`/usr/share/doc/<package>/copyright`.
"""

from __future__ import annotations

import sys
import sysconfig
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

PER_DIST_CAP_MB = 1.5   # one venv distribution's share of the code
PERMISSIVE = ("MIT", "BSD", "Apache", "PSF", "Python Software Foundation", "ISC", "MPL",
              "Mozilla Public License", "Unlicense", "Zlib", "HPND")
SKIP_DISTS = ("kolibri-trt", "pip", "setuptools", "nvidia-", "triton")  # ours / huge / generated


@dataclass(frozen=True)
class Source:
    name: str
    lang: str
    kind: str
    globs: tuple[str, ...]
    licence: str
    max_mb: float
    package: str | None = None
    root: str | None = None
    exclude: tuple[str, ...] = ()
    cut_at: str | None = None   # drop a document's text from this marker on (page footers)


def _deb(name, lang, kind, globs, licence, max_mb, package=None, exclude=(), cut_at=None):
    return Source(name, lang, kind, tuple(globs), licence, max_mb, package or name,
                  None, tuple(exclude), cut_at)


LO_FOOTER = "Help content debug info:"   # LibreOffice help pages end with page ids


GFDL = "GFDL-NIV-1.2+ (GNU Free Documentation License, no invariant sections)"
HANDBOOK = "GPL-2+ or CC-BY-SA-3.0"
FAQ = "Debian FAQ notice (verbatim and modified copies permitted, SPI)"
_PY = f"usr/lib/python{sys.version_info.major}.{sys.version_info.minor}"

SOURCES: list[Source] = [
    # ---- German ------------------------------------------------------------------------
    _deb("manpages-de", "de", "man", ["usr/share/man/de/man*/*.gz"],
         "GPL-3+ (translations; originals under their own free licences)", 12),
    _deb("manpages-de-dev", "de", "man", ["usr/share/man/de/man*/*.gz"],
         "GPL-3+ (translations; originals under their own free licences)", 4),
    _deb("libreoffice-help-de", "de", "html", ["usr/share/libreoffice/help/de/text/**/*.html"],
         "MPL-2.0", 9, cut_at=LO_FOOTER),
    _deb("gimp-help-de", "de", "html", ["usr/share/gimp/2.0/help/de/*.html"], GFDL, 7),
    _deb("debian-handbook-de", "de", "html", ["usr/share/doc/debian-handbook/html/de-DE/*.html"],
         HANDBOOK, 4, package="debian-handbook"),
    _deb("debian-reference-de", "de", "html", ["usr/share/debian-reference/*.de.html"],
         "GPL-2+", 3),
    _deb("debian-faq-de", "de", "html", ["usr/share/doc/debian/FAQ/de/*.html"], FAQ, 1),
    _deb("developers-reference-de", "de", "html", ["usr/share/developers-reference/de/*.html"],
         "GPL-2", 2),
    _deb("maint-guide-de", "de", "html", ["usr/share/doc/maint-guide-de/html/*.html"],
         "GPL-2+ or MIT", 1),
    _deb("debian-edu-doc-de", "de", "html",
         ["usr/share/doc/debian-edu-doc-de/debian-edu-bookworm-manual.html"], "GPL-2+", 2),
    _deb("installation-guide-de", "de", "html",
         ["usr/share/doc/installation-guide-amd64/de/*.html"], "GPL-2", 1,
         package="installation-guide-amd64"),
    _deb("gnome-user-docs-de", "de", "html", ["usr/share/help/de/**/*.page"], "CC-BY-SA-3.0",
         3, package="gnome-user-docs"),
    _deb("lyx-doc-de", "de", "lyx", ["usr/share/lyx/doc/de/*.lyx"], "GPL-2+", 3,
         package="lyx-common"),
    _deb("kicad-doc-de", "de", "html", ["usr/share/doc/kicad/help/de/*.html"],
         "GPL-3+", 3),
    _deb("lilypond-doc-html-de", "de", "html",
         ["usr/share/doc/lilypond/html/Documentation/**/*.de.html"], "GFDL-1.3+", 4),
    _deb("udo-doc-de", "de", "html", ["usr/share/doc/udo-doc-de/html/*.html"], "GPL-2+", 2),
    _deb("fortunes-de", "de", "text", ["usr/share/games/fortunes/de/*.u8"],
         "GPL-2+ (as the package states; quotations, poems, recipes, anecdotes)", 3),
    Source("local German man pages", "de", "man", ("de/man*/*.gz",),
           "free licences of the installed Debian packages (each package's copyright file)",
           4, root="/usr/share/man"),
    # ---- English -----------------------------------------------------------------------
    _deb("python3.11-doc", "en", "rst", ["usr/share/doc/python3.11/html/_sources/**/*.txt"],
         "PSF-2.0", 11),
    _deb("manpages", "en", "man", ["usr/share/man/man*/*.gz"],
         "Linux-man-pages-copyleft, GPL-2+ and others (per page)", 2),
    _deb("manpages-dev", "en", "man", ["usr/share/man/man*/*.gz"],
         "Linux-man-pages-copyleft, GPL-2+ and others (per page)", 4),
    Source("local man pages", "en", "man", ("man1/*.gz", "man5/*.gz", "man7/*.gz", "man8/*.gz"),
           "free licences of the installed Debian packages (each package's copyright file)",
           5, root="/usr/share/man", exclude=("/gcloud",)),  # Google Cloud CLI: not Debian
    _deb("libreoffice-help-en-us", "en", "html",
         ["usr/share/libreoffice/help/en-US/text/**/*.html"], "MPL-2.0", 5, cut_at=LO_FOOTER),
    _deb("gimp-help-en", "en", "html", ["usr/share/gimp/2.0/help/en/*.html"], GFDL, 4),
    _deb("debian-handbook-en", "en", "html", ["usr/share/doc/debian-handbook/html/en-US/*.html"],
         HANDBOOK, 3, package="debian-handbook"),
    _deb("debian-reference-en", "en", "html", ["usr/share/debian-reference/*.en.html"],
         "GPL-2+", 2),
    _deb("debian-faq", "en", "html", ["usr/share/doc/debian/FAQ/*.en.html"], FAQ, 1),
    _deb("developers-reference", "en", "html", ["usr/share/developers-reference/*.html"],
         "GPL-2", 2),
    _deb("maint-guide", "en", "html", ["usr/share/doc/maint-guide/html/*.html"],
         "GPL-2+ or MIT", 1),
    _deb("debian-edu-doc-en", "en", "html",
         ["usr/share/doc/debian-edu-doc-en/debian-edu-bookworm-manual.html"], "GPL-2+", 2),
    _deb("debian-policy", "en", "html", ["usr/share/doc/debian-policy/*.html"],
         "GPL-2+ (policy), FHS licence, BSD-3-clause (parts)", 2),
    _deb("gnu-standards", "en", "text", ["usr/share/doc/gnu-standards/*.text.gz"],
         "GFDL-1.3+ (no invariant sections)", 1),
    _deb("installation-guide-en", "en", "html",
         ["usr/share/doc/installation-guide-amd64/en/*.html"], "GPL-2", 1,
         package="installation-guide-amd64"),
    _deb("gnome-user-docs-en", "en", "html", ["usr/share/help/C/**/*.page"], "CC-BY-SA-3.0", 3,
         package="gnome-user-docs"),
    _deb("lyx-doc-en", "en", "lyx", ["usr/share/lyx/doc/*.lyx"], "GPL-2+", 3,
         package="lyx-common"),
    # ---- code --------------------------------------------------------------------------
    Source("python3.11 standard library", "code", "python", ("**/*.py",), "PSF-2.0", 13,
           root=f"/{_PY}", exclude=("site-packages", "dist-packages", "lib2to3/tests/data",
                                    "test/bad", "test/badsyntax", "test/tokenizedata")),
]


def _licence(dist: metadata.Distribution) -> str:
    md = dist.metadata
    lic = md.get("License-Expression") or ""
    if not lic or len(lic) > 60:
        lic = (md.get("License") or "").split("\n")[0]
    if not lic or len(lic) > 60:
        lic = "; ".join(c.split(" :: ")[-1] for c in md.get_all("Classifier") or []
                        if c.startswith("License ::"))
    return lic.strip()


def site_packages_sources() -> list[Source]:
    """One code source per permissively licensed distribution in this interpreter's
    site-packages (its `.py` files, at most PER_DIST_CAP_MB each)."""
    site = Path(sysconfig.get_paths()["purelib"])
    out = []
    for dist in sorted(metadata.distributions(path=[str(site)]),
                       key=lambda d: d.metadata["Name"].lower()):
        name = dist.metadata["Name"]
        lic = _licence(dist)
        if any(name.lower().startswith(s) for s in SKIP_DISTS) or not any(
                p.lower() in lic.lower() for p in PERMISSIVE):
            continue
        files = tuple(str(f) for f in dist.files or () if str(f).endswith(".py")
                      and not str(f).startswith(".."))
        if files:
            out.append(Source(f"{name} {dist.version}", "code", "python", files, lic,
                              PER_DIST_CAP_MB, root=str(site),
                              exclude=("/_vendor/", "/vendored/", "/tests/data/")))
    return out


def sources_markdown(sources, col, train, valid, sizes, args) -> str:
    """SOURCES.md: totals per language and split, then every source's licence and bytes."""
    def mb(n):
        return f"{n / 1e6:.2f}"

    total = sum(col.bytes.values()) or 1
    lines = ["# Training corpus of the mini Kolibri target and drafter", "",
             "Built by `tools/corpus.py` (seed %d). Sizes are MB (10^6 bytes) of cleaned UTF-8 "
             "text; a source's bytes are split by the language each document was detected "
             "in. No evaluation prompt (`shared/data/prompts`) is in it: documents sharing an "
             "13-word window with one were dropped." % args.seed, "",
             "| language | MB | share | train docs | valid docs |", "|---|---|---|---|---|"]
    for lang in ("en", "de", "code"):
        lines.append(f"| {lang} | {mb(col.bytes[lang])} | {col.bytes[lang] / total:.0%} | "
                     f"{sum(d['lang'] == lang for d in train)} | "
                     f"{sum(d['lang'] == lang for d in valid)} |")
    lines += ["", "Files: " + ", ".join(f"`{k}` {v / 2**20:.1f} MiB" for k, v in sizes.items()),
              "", "Dropped documents: " + (", ".join(f"{k} {v}" for k, v in
                                                   sorted(col.dropped.items())) or "none"), "",
              "| source | licence | from | en MB | de MB | code MB |", "|---|---|---|---|---|---|"]
    for s in sources:
        got = col.by_source.get(s.name, {})
        where = f"Debian package `{s.package}`" if s.package else f"`{s.root}`"
        lines.append(f"| {s.name} | {s.licence} | {where} | {mb(got.get('en', 0))} | "
                     f"{mb(got.get('de', 0))} | {mb(got.get('code', 0))} |")
    return "\n".join(lines) + "\n"
