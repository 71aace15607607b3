"""The postmortem's plots: valid, deterministic SVG from the incident's series frame (pure)."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from datetime import UTC, datetime, timedelta

import matplotlib
import pandas as pd
import pytest
from matplotlib.font_manager import FontProperties, findfont
from matplotlib.ft2font import FT2Font

from detector.correlate.series import GPU_MEMORY, KV_CACHE, SERIES_BUCKET_S, SeriesBook
from detector.postmortem.plots import (
    PRESSURE_TITLE,
    TRAFFIC_TITLE,
    describe,
    pressure_plot,
    traffic_plot,
)

T0 = 1_732_890_000.0  # a multiple of the bucket
START = datetime.fromtimestamp(T0, UTC)
PODS = ["vllm-llama-7d9f8b6c5d-x2k4p", "a$b$c"]
COLUMNS = ["time", "metric", "label", "value", "detail"]
MARKERS = [
    (START + timedelta(seconds=12), "stage", "cascading"),
    (START + timedelta(seconds=17), "death", "victim #1"),
    (START + timedelta(seconds=22), "step", "step 1 applied"),
]
SVG = "{http://www.w3.org/2000/svg}svg"


def frame(pods: list[str] = PODS, buckets: int = 4) -> pd.DataFrame:
    """Return the frame ``load_series`` rows make, built by the correlator's own SeriesBook."""
    book: SeriesBook[str] = SeriesBook()
    for n in range(buckets):
        t = T0 + n * SERIES_BUCKET_S
        book.add_responses("w", t, 200, 100 + 10 * n)
        book.add_responses("w", t + 1, 503, 5 * n)
        book.add_responses("w", t + 2, 429, n)
        book.add_pressure("w", t, pods[0], KV_CACHE, 0.70 + 0.1 * n, 0.95)
        for pod in pods[1:]:
            book.add_pressure("w", t, pod, GPU_MEMORY, 0.5 + 0.05 * n, 0.9)
    rows = [
        (datetime.fromtimestamp(p.time, UTC), p.metric, p.label, p.value, p.detail)
        for p in book.points("w", T0)
    ]
    out = pd.DataFrame(rows, columns=COLUMNS)
    out["time"] = pd.to_datetime(out["time"], utc=True)
    return out


def parse(svg: str) -> ET.Element:
    """Parse SVG text and check it is an SVG document."""
    root = ET.fromstring(svg)
    assert root.tag == SVG
    return root


def glyph_ids(char: str) -> set[str]:
    """Return the ids matplotlib may give ``char``'s DejaVu Sans glyph in SVG.

    The glyph index in hex (matplotlib 3.11), or the character code in hex (before).
    """
    font = FT2Font(findfont(FontProperties(family="DejaVu Sans"), fallback_to_default=False))
    return {f'id="DejaVuSans-{n:x}"' for n in (font.get_char_index(ord(char)), ord(char))}


def test_traffic_plot_is_svg_with_title_axes_and_legend() -> None:
    svg = traffic_plot(frame(), MARKERS)
    parse(svg)
    for text in (TRAFFIC_TITLE, "UTC", "per second", "requests/s", "5xx/s", "shed 429/413 /s"):
        assert f"<!-- {text} -->" in svg
    for text in ("death", "stage change", "step applied/lifted", "victim #1", "step 1 applied"):
        assert f"<!-- {text} -->" in svg
    assert "dc:date" not in svg.lower()


def test_pressure_plot_draws_each_pod_the_ceilings_and_the_deaths() -> None:
    svg = pressure_plot(frame(), MARKERS)
    parse(svg)
    assert f"<!-- {PRESSURE_TITLE} -->" in svg
    assert "<!-- vllm-llama-7d9f8b6c5d-x2k4p (KV cache) -->" in svg
    assert "<!-- a$b$c (GPU memory) -->" in svg
    assert "<!-- ceiling 90% -->" in svg and "<!-- ceiling 95% -->" in svg
    assert "<!-- victim #1 -->" in svg
    assert "step 1 applied" not in svg and "cascading" not in svg  # deaths only


@pytest.mark.parametrize("plot", [traffic_plot, pressure_plot])
def test_same_input_same_bytes(plot) -> None:
    first = plot(frame(), MARKERS)
    assert plot(frame(), MARKERS) == first
    shuffled = frame().sample(frac=1.0, random_state=7).reset_index(drop=True)
    assert plot(shuffled, list(reversed(MARKERS))) == first


@pytest.mark.parametrize("plot", [traffic_plot, pressure_plot])
def test_naive_times_are_utc(plot) -> None:
    naive = frame()
    naive["time"] = naive["time"].dt.tz_localize(None)
    markers = [(t.replace(tzinfo=None), kind, label) for t, kind, label in MARKERS]
    assert plot(naive, markers) == plot(frame(), MARKERS)


@pytest.mark.parametrize("plot", [traffic_plot, pressure_plot])
def test_empty_frame_says_no_data(plot) -> None:
    empty = pd.DataFrame(columns=COLUMNS)
    svg = plot(empty, [])
    parse(svg)
    assert "<!-- no data recorded -->" in svg
    assert len(svg) < 40_000
    assert plot(empty, MARKERS) == svg


def test_a_frame_without_pressure_gives_no_pressure_plot() -> None:
    lb_only = frame()[lambda f: f["label"] == ""]
    assert "<!-- no data recorded -->" in pressure_plot(lb_only, MARKERS)
    assert "<!-- no data recorded -->" not in traffic_plot(lb_only, MARKERS)


def test_dollar_in_a_pod_name_is_drawn_literally() -> None:
    svg = pressure_plot(frame(), MARKERS)
    assert any(i in svg for i in glyph_ids("$"))  # the dollar glyph is drawn ...
    assert "Oblique" not in svg and "cmmi" not in svg  # ... and no mathtext italics


def test_control_characters_in_labels_are_shown_as_escapes() -> None:
    svg = pressure_plot(frame(["pod-0", "evil\x1b[2J\u202e"]), [(START, "death", "x\ny")])
    parse(svg)
    assert "<!-- evil\\x1b[2J\\u202e (GPU memory) -->" in svg
    assert "<!-- x\\ny -->" in svg


def test_rc_params_are_left_as_they_were() -> None:
    before = dict(matplotlib.rcParams)
    traffic_plot(frame(), MARKERS)
    pressure_plot(frame(), MARKERS)
    assert dict(matplotlib.rcParams) == before


def test_describe_counts_what_is_drawn() -> None:
    traffic, pressure = describe(frame(), MARKERS)
    assert traffic["title"] == TRAFFIC_TITLE and traffic["file"] == "traffic.svg"
    assert traffic["markers"] == 3
    assert [(s["metric"], s["points"], s["min"], s["max"]) for s in traffic["series"]] == [
        ("requests", 4, 20.0, 29.6),  # (100 + 10 n + 5 n + n) / 5 s, n = 0..3
        ("errors_5xx", 4, 0.0, 3.0),
        ("shed_429", 4, 0.0, 0.6),
    ]
    assert pressure["title"] == PRESSURE_TITLE and pressure["file"] == "pressure.svg"
    assert pressure["markers"] == 1
    assert pressure["ceilings"] == [90.0, 95.0]
    drawn = [(s["label"], s["detail"], s["points"], s["min"], s["max"]) for s in pressure["series"]]
    assert drawn == [
        ("a$b$c", "GPU memory", 4, 50.0, 65.0),
        ("vllm-llama-7d9f8b6c5d-x2k4p", "KV cache", 4, 70.0, 100.0),
    ]


def test_describe_an_empty_frame() -> None:
    traffic, pressure = describe(pd.DataFrame(columns=COLUMNS), MARKERS)
    assert traffic["series"] == [] and traffic["markers"] == 0
    assert pressure["series"] == [] and pressure["ceilings"] == [] and pressure["markers"] == 0


def test_a_character_the_font_lacks_draws_without_a_warning() -> None:
    svg = pressure_plot(frame(["pod-0", "推理-0"]), MARKERS)  # pytest turns warnings into errors
    assert "<!-- 推理-0 (GPU memory) -->" in svg


# -- pressure lines: one per pod and measure, broken over a death and a gap in the readings ----

POD = "pod-a"
POD_COLOUR = "#1f77b4"  # the first pod's
DEATH_COLOUR = "#d62728"
DATA_PATH = re.compile(r'<path d="([^"]*)"[^>]*clip-path="[^"]*" style="([^"]*)"')


def at(s: float) -> datetime:
    return START + timedelta(seconds=s)


def readings(times: list[float], value: float, detail: str = KV_CACHE) -> list[tuple]:
    """Return pressure rows of ``POD``, buckets starting ``times`` s after START."""
    return [(at(s), "pressure", POD, value, detail) for s in times]


def drawn(svg: str, colour: str) -> list[tuple[list[float], str]]:
    """Return the x of each path drawn inside the axes in ``colour``, with its style."""
    found = []
    for d, style in DATA_PATH.findall(svg):
        if f"stroke: {colour}" in style:
            numbers = [float(n) for n in re.findall(r"-?\d+(?:\.\d+)?", d)]
            found.append((numbers[0::2], style))
    return found


def pressure_of(rows: list[tuple], down: list = ()) -> tuple[str, list[dict]]:
    """Return the pressure plot of ``rows`` with a death marker per span of ``down``, and the
    pressure series ``describe`` gives for the same input."""
    series = pd.DataFrame(rows, columns=COLUMNS)
    marks = [(death, "death", f"victim #{n}") for n, (_, death, _) in enumerate(down, 1)]
    _, described = describe(series, marks, down)
    return pressure_plot(series, marks, down), described["series"]


def test_gpu_memory_and_kv_cache_of_one_pod_are_two_lines_under_their_own_names() -> None:
    # vLLM pre-reserves 90% of VRAM at start (the framebuffer) while its KV cache is 15% used:
    # the series holds both measures of the same pod, in different buckets
    rows = readings([0, 15, 30, 45], 0.9, GPU_MEMORY) + readings([5, 20, 35, 50], 0.15)
    svg, series = pressure_of(rows)
    assert f"<!-- {POD} (GPU memory) -->" in svg and f"<!-- {POD} (KV cache) -->" in svg
    assert [(s["name"], s["points"], s["segments"], s["min"], s["max"]) for s in series] == [
        (f"{POD} (GPU memory)", 4, 1, 90.0, 90.0),
        (f"{POD} (KV cache)", 4, 1, 15.0, 15.0),
    ]
    memory, kv = drawn(svg, POD_COLOUR)  # one colour per pod; GPU memory dashed
    assert len(memory[0]) == 4 and "stroke-dasharray" in memory[1]
    assert len(kv[0]) == 4 and "stroke-dasharray" not in kv[1]


def test_a_pod_that_died_and_came_back_is_not_drawn_across_its_death() -> None:
    # every 10 s; died at 52 s, ready again at 131 s; a stale reading at 80 s (its bucket lies
    # inside the span) is not drawn
    rows = readings([0, 10, 20, 30, 40, 50], 0.5) + readings([80], 0.0)
    rows += readings([130, 140, 150, 160, 170, 180, 190], 0.2)
    svg, series = pressure_of(rows, [(POD, at(52), at(131))])
    assert [(s["points"], s["segments"]) for s in series] == [(13, 2)]
    before, after = (xs for xs, _ in drawn(svg, POD_COLOUR))
    [(death, _)] = drawn(svg, DEATH_COLOUR)
    assert len(before) == 6 and len(after) == 7
    assert max(before) < death[0] < min(after)


def test_with_no_readiness_recorded_the_break_runs_from_the_death_to_the_next_reading() -> None:
    svg, series = pressure_of(readings([0, 10, 20, 30, 40, 50], 0.3), [(POD, at(22), None)])
    assert [len(xs) for xs, _ in drawn(svg, POD_COLOUR)] == [3, 3]
    assert [(s["points"], s["segments"]) for s in series] == [(6, 2)]


def test_readings_further_apart_than_three_intervals_are_not_joined() -> None:
    # every 10 s, then a 30 s step (3 intervals: joined), then a 60 s hole (broken)
    svg, _ = pressure_of(readings([0, 10, 20, 30, 60, 70, 80, 140, 150, 160], 0.4))
    assert [len(xs) for xs, _ in drawn(svg, POD_COLOUR)] == [7, 3]


def test_a_lone_reading_between_gaps_is_drawn_as_a_dot_and_the_line_has_one_legend_entry() -> None:
    svg, series = pressure_of(readings([0, 10, 20, 200, 400, 410, 420], 0.4))
    assert [len(xs) for xs, _ in drawn(svg, POD_COLOUR)] == [3, 1, 3]
    lone = re.findall(rf'<use xlink:href="#m[^>]*style="fill: {POD_COLOUR}', svg)
    assert len(lone) == 1  # the lone reading's dot
    assert svg.count(f"<!-- {POD} (KV cache) -->") == 1
    assert [(s["points"], s["segments"]) for s in series] == [(7, 3)]
