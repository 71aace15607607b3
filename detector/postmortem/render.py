"""Write a postmortem (``analysis.analyse``'s content) as Markdown, HTML or JSON (pure).

Every text from the input is escaped for its format, by the template environment rather than
by each template: HTML is autoescaped (control and bidi characters first shown as escapes,
``detector.textsafe.printable``); in Markdown every value printed is one line with ``\\``,
``|``, ``<``, ``>``, backticks, ``*``, ``[`` and ``]`` escaped, so it cannot open markup, a
link, code or a table cell; diffs go in a fence longer than any backtick run they hold.
Markdown follows GitHub Flavored Markdown (https://github.github.com/gfm/): plain pipe tables,
no HTML. The output is a pure function of the content: no clock, fixed number formats.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from jinja2 import Environment, FileSystemLoader, StrictUndefined, select_autoescape
from markupsafe import Markup

from detector.postmortem.plots import PRESSURE_FILE, PRESSURE_TITLE, TRAFFIC_FILE, TRAFFIC_TITLE
from detector.textsafe import printable, printable_json

TEMPLATES: Final = Path(__file__).parent / "templates"
FORMATS: Final = ("md", "html", "json")
MEDIA_TYPES: Final = {
    "md": "text/markdown; charset=utf-8",
    "html": "text/html; charset=utf-8",
    "json": "application/json",
}
_PLOT_TITLES: Final = {TRAFFIC_FILE: TRAFFIC_TITLE, PRESSURE_FILE: PRESSURE_TITLE}
_MD_ESCAPES: Final = str.maketrans({c: "\\" + c for c in "\\|`*[]"} | {"<": "&lt;", ">": "&gt;"})


class Raw(str):
    """Markdown the renderer made itself (a fence, a link to a plot file): printed as is."""


def md_text(value: Any) -> str:
    """Return ``value`` as one line of Markdown text that opens no markup (module docstring)."""
    if isinstance(value, Raw):
        return str(value)
    if value is None:
        return ""
    return printable(str(value), one_line=True).translate(_MD_ESCAPES)


def md_fence(text: str, info: str = "") -> Raw:
    """Return ``text`` in a fenced code block longer than any backtick run inside it."""
    body = printable(text).rstrip("\n")
    runs = [len(r) for r in re.findall(r"`+", body)]
    fence = "`" * max(3, max(runs, default=0) + 1)
    return Raw(f"{fence}{info}\n{body}\n{fence}")


def _finalize_html(value: Any) -> Any:
    if isinstance(value, Markup):
        return value
    return printable(value) if isinstance(value, str) else value


def _hms(value: str | None) -> str:
    if not value:
        return "-"
    return datetime.fromisoformat(value).astimezone(UTC).strftime("%H:%M:%S")


def _utc(value: str | None) -> str:
    if not value:
        return "-"
    return datetime.fromisoformat(value).astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _secs(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} s"


def _env(html: bool) -> Environment:
    env = Environment(
        loader=FileSystemLoader(TEMPLATES),
        autoescape=select_autoescape(["html.j2"]) if html else False,
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        finalize=_finalize_html if html else md_text,
    )
    env.filters |= {"hms": _hms, "utc": _utc, "secs": _secs, "fence": md_fence}
    return env


_MD_ENV: Final = _env(html=False)
_HTML_ENV: Final = _env(html=True)


def svg_inline(svg: str) -> Markup:
    """Return SVG file text as an inline ``<svg>`` element (the XML prolog dropped)."""
    start = svg.find("<svg")
    return Markup(svg[start:] if start >= 0 else "")


def render(
    content: Mapping[str, Any],
    fmt: str,
    *,
    svgs: Sequence[tuple[str, str]] = (),
    plots: Sequence[Mapping[str, Any]] = (),
) -> str:
    """Return ``content`` in ``fmt`` (md, html, json).

    ``svgs``: (file name, SVG text) of the plots, inline in HTML and linked by name from
    Markdown; ``plots``: their description for JSON. A verdict (``content["kind"] ==
    "verdict"``) has its own short templates.
    """
    if fmt == "json":
        doc = dict(content) | ({"plots": list(plots)} if content.get("kind") == "incident" else {})
        text = json.dumps(doc, indent=2, ensure_ascii=False)
        return printable_json(text) + "\n"
    kind = "verdict" if content.get("kind") == "verdict" else "postmortem"
    if fmt == "md":
        links = [Raw(f"![{md_text(_PLOT_TITLES.get(name, name))}]({name})") for name, _ in svgs]
        return _MD_ENV.get_template(f"{kind}.md.j2").render(pm=content, plots=links)
    if fmt == "html":
        inline = [(name, svg_inline(svg)) for name, svg in svgs]
        return _HTML_ENV.get_template(f"{kind}.html.j2").render(pm=content, plots=inline)
    raise ValueError(f"unknown format {fmt!r}: one of {', '.join(FORMATS)}")
