"""Make input text safe to print on a terminal: control and bidi characters become visible.

A pod name, a log message or a reason comes from outside; printed raw, ``\\x1b[2J`` clears the
screen, ``\\x1b]0;...\\x07`` sets the window title and U+202E reverses what follows (Trojan
Source, https://trojansource.codes/). ``printable`` shows each such character as a visible
escape instead; ``printable_json`` does the same for JSON text written with
``ensure_ascii=False``. Pure; imports nothing from the detector, so every layer may use it.
"""

from __future__ import annotations

# C0 controls, DEL and C1 controls (https://www.unicode.org/charts/PDF/U0000.pdf, U0080.pdf).
_CONTROLS = [*range(0x00, 0x20), *range(0x7F, 0xA0)]
# Bidirectional embeddings, overrides and isolates (https://www.unicode.org/reports/tr9/):
# LRE RLE PDF LRO RLO, LRI RLI FSI PDI.
BIDI_CONTROLS = frozenset([*range(0x202A, 0x202F), *range(0x2066, 0x206A)])

_KEPT = {ord("\n"), ord("\t")}
_TEXT = {c: f"\\x{c:02x}" for c in _CONTROLS if c not in _KEPT} | {
    c: f"\\u{c:04x}" for c in BIDI_CONTROLS
}
_LINE = _TEXT | {ord("\n"): "\\n", ord("\t"): "\\t"}
# json.dumps escapes C0 itself; with ensure_ascii=False it leaves DEL, C1 and bidi raw.
_JSON = {c: f"\\u{c:04x}" for c in [*range(0x7F, 0xA0), *BIDI_CONTROLS]}


def printable(text: str, *, one_line: bool = False) -> str:
    """Return ``text`` with control characters shown as escapes (``\\x1b``, ``\\u202e``).

    Escaped: C0 controls (U+0000-U+001F) but newline and tab, DEL (U+007F), C1 controls
    (U+0080-U+009F) and the bidi controls U+202A-U+202E, U+2066-U+2069. ``one_line=True``
    escapes newline and tab too (``\\n``, ``\\t``), for a value printed inside one line.
    Everything else is unchanged; a backslash already in ``text`` stays as it is.
    """
    return text.translate(_LINE if one_line else _TEXT)


def printable_json(json_text: str) -> str:
    """Return JSON text with DEL, C1 and bidi controls written as ``\\uXXXX`` escapes.

    For the output of ``json.dumps(..., ensure_ascii=False)``, which escapes only U+0000-U+001F:
    those characters can only stand inside JSON strings, so the result is the same JSON value.
    """
    return json_text.translate(_JSON)
