"""Small inline SVG charts: a topic's jobs per second in and out over the monitor's history.

Drawn on the server as two polylines, so a page needs no charting library; the template
places them (``templates/_chart.html``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ._monitor import Reading

WIDTH = 160
HEIGHT = 32


@dataclass(frozen=True, slots=True)
class Chart:
    """Polyline points (``"x,y x,y ..."``) for rates in and out, and the highest rate drawn."""

    points_in: str
    points_out: str
    peak: float
    seconds: float

    @property
    def empty(self) -> bool:
        return not self.points_in


def _points(times: Sequence[int], values: Sequence[float], peak: float) -> str:
    start, span = times[0], max(1, times[-1] - times[0])
    return " ".join(
        f"{(t - start) / span * WIDTH:.1f},{HEIGHT - 1 - v / peak * (HEIGHT - 2):.1f}"
        for t, v in zip(times, values, strict=True)
    )


def rate_chart(history: Sequence[Reading], topic: str) -> Chart:
    """The chart of ``topic`` (a priority's, a retry tier's...) over ``history``."""
    measured = [(r.at, r.rates[topic]) for r in history if topic in r.rates]
    if len(measured) < 2:
        return Chart("", "", 0.0, 0.0)
    times = [at for at, _ in measured]
    ins = [rate.rate_in for _, rate in measured]
    outs = [rate.rate_out for _, rate in measured]
    peak = max(1.0, *ins, *outs)
    return Chart(
        _points(times, ins, peak), _points(times, outs, peak), peak, (times[-1] - times[0]) / 1000
    )
