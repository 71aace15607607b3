"""Text from input as data in Slack mrkdwn: escaped, never a mention, a link or markup.

Slack reads ``<...>`` as a mention (``<!channel>``, ``<@U123>``, ``<!subteam^S1>``) or a link
(``<http://x|y>``) and ``&`` as the start of an entity; its formatting guide says to escape
exactly ``&``, ``<`` and ``>`` as ``&amp;``, ``&lt;``, ``&gt;``
(https://api.slack.com/reference/surfaces/formatting#escaping). Escaped, a mention is literal
text. Slack has no escape for its formatting marks, so in text from input ``*``, ``~`` and
`````` are shown as look-alikes (U+2217, U+223C, U+02CB) and an ``_`` at the edge of a word
(where it could start or end italics) as U+FF3F; an ``_`` inside a word (``max_num_seqs``)
formats nothing and stays. Control and bidi characters are shown as escapes
(``detector.textsafe``). Inside a code span or block Slack applies no formatting and makes
no links; only the backtick, which would end it, is replaced there. Pure.
"""

from __future__ import annotations

import re

from detector.textsafe import printable

_ESCAPES = str.maketrans({"&": "&amp;", "<": "&lt;", ">": "&gt;"})
_BACKTICK = str.maketrans({"`": "\u02cb"})
_MARKS = str.maketrans({"*": "\u2217", "~": "\u223c", "`": "\u02cb"})
_EDGE_UNDERSCORE = re.compile(r"(?<![0-9A-Za-z])_|_(?![0-9A-Za-z])")
_PARTIAL_ENTITY = re.compile(r"&[a-z]{0,3}$")
ELLIPSIS = "…"


def cut(text: str, limit: int) -> str:
    """Return ``text`` cut to at most ``limit`` characters, ending in an ellipsis when cut."""
    return text if len(text) <= limit else text[: max(limit - 1, 0)] + ELLIPSIS


def text(value: str, limit: int = 500) -> str:
    """Return input text as literal mrkdwn on one line, at most ``limit`` characters once
    escaped: controls shown, ``&<>`` escaped, formatting marks defused (see the module doc)."""
    shown = printable(value, one_line=True).translate(_MARKS)
    escaped = _EDGE_UNDERSCORE.sub("\uff3f", shown).translate(_ESCAPES)
    if len(escaped) <= limit:
        return escaped
    return _PARTIAL_ENTITY.sub("", escaped[: max(limit - 1, 0)]) + ELLIPSIS


def code(value: str, limit: int = 120) -> str:
    """Return input text as an inline code span (a name, a pod, a figure)."""
    shown = cut(printable(value, one_line=True), limit).translate(_BACKTICK)
    return f"`{shown.translate(_ESCAPES)}`"


def code_block(value: str, *, line_limit: int = 300, lines: int = 6) -> str:
    """Return input text (e.g. a log line) as a code block: each line cut to ``line_limit``
    characters, at most ``lines`` lines (a last line says how many more there were)."""
    rows = printable(value).splitlines() or [""]
    shown = [cut(r, line_limit) for r in rows[:lines]]
    if len(rows) > lines:
        shown.append(f"{ELLIPSIS} {len(rows) - lines} more lines")
    body = "\n".join(shown).translate(_ESCAPES).translate(_BACKTICK)
    return f"```{body}```"
