"""MkDocs hooks (mkdocs.yml `hooks:`): the README is the site's home page, and links keep working on both sides.

README.md and docs/*.md are written to be read on the repository (links relative to their own file:
`docs/commands.md` from the README, `../infra/README.md` from a page). The site holds only docs/, so:

- the home page is README.md itself, added as `index.md` at build time (one text, never a copy to keep in step);
- a link into docs/ is rewritten relative to the page's place in the site (`docs/commands.md` -> `commands.md`),
  and a link to the README goes to the home page;
- a link to another file of the repository (`infra/README.md`), which the site does not hold, becomes its path as
  code, and a link to a file that does not exist is a warning, so `mkdocs build --strict` fails on it as on any
  broken link.
"""

from __future__ import annotations

import logging
import posixpath
import re
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mkdocs.structure.files import Files

log = logging.getLogger("mkdocs.plugins.hbpe")

HOME = "index.md"
# [text](target) and ![alt](target "title"); the target has no spaces (ours never do)
_LINK = re.compile(r"(?P<bang>!?)\[(?P<text>[^\]]*)\]\((?P<target>[^)\s]+)(?P<title>\s+\"[^\"]*\")?\)")
_FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)


def _repo(config) -> Path:
    return Path(config.config_file_path).parent


def on_files(files: Files, config) -> Files:
    """Add the README as the home page, unless docs/ has an index.md of its own."""
    from mkdocs.structure.files import File  # here: the link rules below are tested without MkDocs installed

    if files.get_file_from_path(HOME) is None:
        readme = (_repo(config) / "README.md").read_text(encoding="utf-8")
        files.append(File.generated(config, HOME, content=readme))
    return files


def on_page_markdown(markdown: str, page, config, files: Files) -> str:
    """The page's relative links mapped from the repository's layout to the site's."""
    repo = _repo(config)
    docs = Path(config.docs_dir).relative_to(repo).as_posix()
    source = "README.md" if page.file.generated_by else posixpath.join(docs, page.file.src_uri)
    return rewrite_links(markdown, source, docs, repo)


def rewrite_links(markdown: str, source: str, docs: str, repo: Path) -> str:
    """`markdown`, the text of the repository's file `source`, with its relative links pointing where the site has
    them; `docs` is the site's folder in the repository (docs). Code blocks are left as they are."""
    page = HOME if source == "README.md" else source[len(docs) + 1 :]  # where `source` lands in the site
    parts, last = [], 0
    for fence in _FENCE.finditer(markdown):
        parts += [_rewrite(markdown[last : fence.start()], source, page, docs, repo), fence.group(0)]
        last = fence.end()
    return "".join([*parts, _rewrite(markdown[last:], source, page, docs, repo)])


def _rewrite(text: str, source: str, page: str, docs: str, repo: Path) -> str:
    def link(m: re.Match) -> str:
        target = m.group("target")
        if re.match(r"[a-z][a-z0-9+.-]*:|#|/", target):  # a URL, an anchor on this page, a site-absolute path
            return m.group(0)
        path, _, anchor = target.partition("#")
        in_repo = posixpath.normpath(posixpath.join(posixpath.dirname(source), path))
        if in_repo == "README.md":  # the home page
            in_repo = posixpath.join(docs, HOME)
        if in_repo.startswith(docs + "/"):  # a page or image of the site: relative to this page
            in_site = posixpath.relpath(in_repo[len(docs) + 1 :], posixpath.dirname(page) or ".")
            new = in_site + (f"#{anchor}" if anchor else "")
            return f"{m.group('bang')}[{m.group('text')}]({new}{m.group('title') or ''})"
        if not (repo / in_repo).exists():
            log.warning("%s links to %s, which is not in the repository (%s)", source, target, in_repo)
            return m.group(0)
        shown = f"`{in_repo}`"  # a file the site does not hold: its path, which a reader finds in the repository
        text = m.group("text")
        return shown if text.strip("`") in (path, in_repo) else f"{text} ({shown})"

    return _LINK.sub(link, text)
