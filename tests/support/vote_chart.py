"""The vote chart's bars as a person's tools read them: the page's markup parsed as XML."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET


def bar_label(label: str) -> dict[str, str]:
    """A bar's `aria-label` ("answer: 42; votes: 3; vote: majority") as its fields."""
    return dict(part.split(": ", 1) for part in label.split("; "))


def drawn_bars(chart: str) -> list[dict[str, object]]:
    """The bars the chart markup draws, left to right, as their labels read them (answer, votes,
    vote), with each bar's fill, left edge, top and bottom."""
    svg = ET.fromstring(chart).find("svg")
    assert svg is not None, chart
    bars = []
    for path in svg.iter("path"):
        assert path.get("aria-roledescription") == "bar"
        label = bar_label(path.get("aria-label", ""))
        x, top, _width, height = (float(n) for n in re.findall(r"-?[\d.]+", path.get("d", ""))[:4])
        bars.append(
            {
                "answer": label["answer"],
                "votes": int(label["votes"]),
                "vote": label["vote"],
                "x": x,
                "top": top,
                "bottom": top + height,
                "fill": path.get("fill"),
            }
        )
    assert [bar["x"] for bar in bars] == sorted(bar["x"] for bar in bars)  # drawn left to right
    return bars
