"""Text from input as data in Slack mrkdwn: escaped, never a mention, a link or markup.

Slack reads ``<...>`` as a mention (``<!channel>``, ``<@U123>``, ``<!subteam^S1>``) or a link
(``<http://x|y>``) and ``&`` as the start of an entity; its formatting guide says to escape
exactly ``&``, ``<`` and ``>`` as ``&amp;``, ``&lt;``, ``&gt;``
(https://api.slack.com/reference/surfaces/formatting#escaping). Escaped, a mention is literal
text. Control and bidi characters are shown as escapes (``detector.textsafe``). Inside a code
span or block Slack applies no formatting and makes no links; a backtick from input would end
it, so it is shown as U+02CB (a look-alike) there. Pure.
"""

from __future__ import annotations

from detector.textsafe import printable

_ESCAPES = str.maketrans({"&": "&amp;", "<": "&lt;", ">": "&gt;"})
_BACKTICK = str.maketrans({"`": "\u02cb"})
ELLIPSIS = "…"


def cut(text: str, limit: int) -> str:
    """Return ``text`` cut to at most ``limit`` characters, ending in an ellipsis when cut."""
    return text if len(text) <= limit else text[: max(limit - 1, 0)] + ELLIPSIS


def text(value: str, limit: int = 500) -> str:
    """Return input text as literal mrkdwn on one line: controls shown, ``&<>`` escaped."""
    return cut(printable(value, one_line=True), limit).translate(_ESCAPES)


def code(value: str, limit: int = 120) -> str:
    """Return input text as an inline code span (a name, a pod, a figure)."""
    return f"`{text(value, limit).translate(_BACKTICK)}`"


def code_block(value: str, *, line_limit: int = 300, lines: int = 6) -> str:
    """Return input text (e.g. a log line) as a code block: each line cut to ``line_limit``
    characters, at most ``lines`` lines (a last line says how many more there were)."""
    rows = printable(value).splitlines() or [""]
    shown = [cut(r, line_limit) for r in rows[:lines]]
    if len(rows) > lines:
        shown.append(f"{ELLIPSIS} {len(rows) - lines} more lines")
    body = "\n".join(shown).translate(_ESCAPES).translate(_BACKTICK)
    return f"```{body}```"
