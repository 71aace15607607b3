"""A resolve reason with markup, on its way to Grafana's dashboards, stays text.

Grafana's annotation tooltip renders an annotation's ``text`` as sanitized HTML (grafana
``public/app/plugins/panel/timeseries/plugins/annotations2/AnnotationTooltipBody.tsx``:
``dangerouslySetInnerHTML`` of ``textUtil.sanitize(text)``): a sanitizer keeps links and
images, so ``<``, ``>`` and ``&`` must arrive escaped. The entry is the timeline line
``lifecycle.resolve`` writes for a reason typed on the page or the API.
"""

from __future__ import annotations

from detector.notify.grafana.annotations import MAX_TEXT_CHARS, body

INC = {"namespace": "llm", "workload": "vllm-llama", "key": "llm/vllm-llama@1741943017"}
REASON = ('<a href="https://phish.example/login">re-authenticate</a>'
          '<img src="https://track.example/p.gif"> &amp; \x1b[2J done')  # fmt: skip


def entry(message: str) -> dict[str, str]:
    return {"time": "2026-12-08T01:00:00Z", "message": message}


def test_markup_in_a_reason_is_escaped_not_rendered() -> None:
    message = f"stage -> resolved: resolved by alice via web: {REASON}"
    text = body(entry(message), INC, "stage:resolved", tags=["gpu-oom-cascade"])["text"]
    assert "<" not in text and ">" not in text
    assert "&lt;a href=" in text and "&amp;amp;" in text and "-&gt; resolved" in text
    assert "\x1b" not in text and "\\x1b[2J" in text


def test_a_long_reason_is_cut_before_escaping_no_entity_is_split() -> None:
    text = body(entry("<" * (MAX_TEXT_CHARS + 50)), INC, "stage:resolved", tags=[])["text"]
    assert text == "&lt;" * MAX_TEXT_CHARS
