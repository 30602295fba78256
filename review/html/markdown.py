"""The Markdown the reports write, as HTML: headings, paragraphs, pipe tables, nested bullet
lists, bold, inline code and images.

Why our own: the HTML page must show the paper-style tables exactly as the Markdown report has
them (one source for both), every report module of every rule family writes this same small
subset, and the page may depend on nothing that is not already installed. Everything is escaped
before any markup is added, so text from a record can never inject markup into the page.
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable

ImageHook = Callable[[str, str], str]  # (alt, src) -> HTML

_CODE = re.compile(r"`([^`]+)`")
_BOLD = re.compile(r"\*\*(.+?)\*\*")
_IMAGE = re.compile(r"^!\[([^\]]*)\]\(([^)\s]+)\)$")
_LINK = re.compile(r"\[([^\]]+)\]\(([^)\s]+)\)")
_HEAD = re.compile(r"^(#{1,6})\s+(.*)$")
_ITEM = re.compile(r"^(\s*)[-*]\s+(.*)$")
_RULE = re.compile(r"^\|?\s*:?-{3,}:?\s*(\|\s*:?-{3,}:?\s*)*\|?$")


def inline(text: str) -> str:
    """Escape, then mark up code spans (verbatim), bold and links (relative targets only)."""
    parts = _CODE.split(text)
    out = []
    for i, part in enumerate(parts):
        if i % 2:
            out.append(f"<code>{html.escape(part)}</code>")
            continue
        s = html.escape(part, quote=False)
        s = _BOLD.sub(r"<strong>\1</strong>", s)

        def link(m: re.Match[str]) -> str:
            target = m.group(2)
            if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # no scheme: the page must not lead off-line
                return m.group(0)
            return f'<a href="{html.escape(target, quote=True)}">{m.group(1)}</a>'

        out.append(_LINK.sub(link, s))
    return "".join(out)


def _cells(line: str) -> list[str]:
    s = line.strip()
    if s.startswith("|"):
        s = s[1:]
    if s.endswith("|"):
        s = s[:-1]
    return [c.strip() for c in s.split("|")]


def _table(lines: list[str]) -> str:
    head = _cells(lines[0])
    body = [_cells(x) for x in lines[2:]]
    out = [
        '<div class="scroll"><table class="md">',
        "<thead><tr>" + "".join(f"<th>{inline(c)}</th>" for c in head) + "</tr></thead>",
        "<tbody>",
    ]
    for row in body:
        row = row + [""] * (len(head) - len(row))
        out.append("<tr>" + "".join(f"<td>{inline(c)}</td>" for c in row) + "</tr>")
    out += ["</tbody></table></div>"]
    return "\n".join(out)


def _list(lines: list[str]) -> str:
    """Nested bullet lists from indentation (the reports indent sub-items by two spaces)."""
    items: list[tuple[int, str]] = []
    for line in lines:
        m = _ITEM.match(line)
        if m:
            items.append((len(m.group(1).replace("\t", "  ")), m.group(2)))
        elif items:  # a continuation line of the previous item
            items[-1] = (items[-1][0], items[-1][1] + " " + line.strip())
    out: list[str] = []
    stack: list[int] = []
    for ind, text in items:
        if stack and ind > stack[-1]:
            out[-1] = out[-1][: -len("</li>")]  # the sub-list goes inside the previous item
            out.append("<ul>")
            stack.append(ind)
        while len(stack) > 1 and ind < stack[-1]:
            out.append("</ul></li>")
            stack.pop()
        if not stack:
            out.append("<ul>")
            stack.append(ind)
        out.append(f"<li>{inline(text)}</li>")
    while stack:
        stack.pop()
        out.append("</ul>" + ("</li>" if stack else ""))
    return "\n".join(out)


def render(md: str, image: ImageHook | None = None, heading_offset: int = 0) -> str:
    """The Markdown text as an HTML fragment. `image(alt, src)` renders a block image line (by
    default its alt text); `heading_offset` shifts heading levels to sit inside a page section."""
    lines = md.splitlines()
    out: list[str] = []
    i = 0
    para: list[str] = []

    def flush() -> None:
        if para:
            out.append("<p>" + inline(" ".join(x.strip() for x in para)) + "</p>")
            para.clear()

    while i < len(lines):
        line = lines[i]
        if not line.strip():
            flush()
            i += 1
            continue
        h = _HEAD.match(line)
        if h:
            flush()
            lvl = min(6, len(h.group(1)) + heading_offset)
            out.append(f"<h{lvl}>{inline(h.group(2))}</h{lvl}>")
            i += 1
            continue
        im = _IMAGE.match(line.strip())
        if im:
            flush()
            out.append(image(im.group(1), im.group(2)) if image else f"<p><em>{html.escape(im.group(1))}</em></p>")
            i += 1
            continue
        if line.lstrip().startswith("|") and i + 1 < len(lines) and _RULE.match(lines[i + 1].strip()):
            flush()
            j = i + 2
            while j < len(lines) and lines[j].lstrip().startswith("|"):
                j += 1
            out.append(_table(lines[i:j]))
            i = j
            continue
        if _ITEM.match(line):
            flush()
            j = i + 1
            while j < len(lines) and lines[j].strip() and (_ITEM.match(lines[j]) or lines[j].startswith("  ")):
                j += 1
            out.append(_list(lines[i:j]))
            i = j
            continue
        para.append(line)
        i += 1
    flush()
    return "\n".join(out)
