"""Every relative link and image of the repository's markdown names a file that is there: docs/bench and
docs/conformance keep the latest run of each benchmark, and the older runs live in git history, not behind a
dead link."""
from __future__ import annotations

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent
SKIP = {".git", ".venv", "build", "dist", "node_modules", ".pytest_cache", ".hypothesis"}
# [text](target) and ![alt](target); inline code spans are dropped first (they name files, they do not link)
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
CODE = re.compile(r"```.*?```|`[^`\n]*`", re.S)


def markdown_files(root: pathlib.Path = ROOT):
    return sorted(p for p in root.rglob("*.md") if not SKIP & set(p.relative_to(root).parts))


def dead_links(path: pathlib.Path) -> list[str]:
    text = CODE.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), path.read_text())   # lines kept
    bad = []
    for m in LINK.finditer(text):
        target = m.group(1)
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I) or target.startswith("#"):
            continue   # a URL, mailto:, or an anchor of the same page
        file = target.split("#", 1)[0]
        if file and not (path.parent / file).exists():
            line = text.count("\n", 0, m.start()) + 1
            bad.append(f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}: {target} (near line {line})")
    return bad


def test_markdown_links_resolve():
    files = markdown_files()
    assert len(files) > 10, [str(f) for f in files]
    bad = [b for f in files for b in dead_links(f)]
    assert not bad, "links to files that are not there:\n" + "\n".join(bad)


def test_checker_sees_a_dead_link(tmp_path):
    """The check itself can fail: a dead image and a dead link are seen; a URL, an anchor, a live file and a path
    in a code span are not."""
    (tmp_path / "there.png").write_bytes(b"")
    f = tmp_path / "page.md"
    f.write_text("![plot](there.png) ![old](gone.png)\n[log](bench/gone.json#top) [web](https://x.y/z.png)\n"
                 "[up](#anchor) `[code](not-a-link.md)`\n")
    assert [b.split(": ", 1)[1].split(" ")[0] for b in dead_links(f)] == ["gone.png", "bench/gone.json#top"]
