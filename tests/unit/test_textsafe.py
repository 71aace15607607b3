"""Input text made safe for a terminal: every control and bidi character shown as an escape."""

from __future__ import annotations

import json

import pytest

from detector.textsafe import BIDI_CONTROLS, printable, printable_json

HOSTILE = "pod\x1b[2J\x1b]0;pwned\x07-\x9b31m\x7f\u202eevil\u2066x\u2069\r\x00\x08"


def unsafe(text: str, *, newlines: bool = True) -> list[str]:
    """Return the characters of ``text`` that a terminal would act on."""
    kept = {"\n", "\t"} if newlines else set()
    bidi = BIDI_CONTROLS
    return [
        ch
        for ch in text
        if (ord(ch) < 0x20 and ch not in kept) or 0x7F <= ord(ch) <= 0x9F or ord(ch) in bidi
    ]


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("vllm-llama-0", "vllm-llama-0"),
        ("\x1b[2J", "\\x1b[2J"),
        ("\x1b]0;title\x07", "\\x1b]0;title\\x07"),
        ("csi\x9b1m", "csi\\x9b1m"),
        ("del\x7f", "del\\x7f"),
        ("a\u202eb\u2066c\u2069", "a\\u202eb\\u2066c\\u2069"),
        ("cr\rlf\n\ttab", "cr\\x0dlf\n\ttab"),
        ("nul\x00", "nul\\x00"),
        ("ünïcode ✓ 日本", "ünïcode ✓ 日本"),
        ("back\\slash", "back\\slash"),
    ],
)
def test_printable_escapes_controls_and_keeps_the_rest(raw: str, shown: str) -> None:
    assert printable(raw) == shown


def test_every_control_character_is_escaped() -> None:
    every = "".join(map(chr, range(0x00, 0x2100)))
    assert unsafe(printable(every)) == []
    assert unsafe(printable(every, one_line=True), newlines=False) == []
    assert printable("a\nb\tc", one_line=True) == "a\\nb\\tc"


def test_printable_json_keeps_the_value_and_escapes_what_json_dumps_leaves() -> None:
    value = {"pod": HOSTILE, "text": "日本\u202e"}
    text = printable_json(json.dumps(value, ensure_ascii=False))
    assert unsafe(text) == []
    assert "日本" in text
    assert json.loads(text) == value
