"""Inline SVG charts for the report: crisp at any zoom, no scripts, and a ``<title>`` on every mark, so that
hovering a point names the plan it is.

A ``Chart`` has two ``Axis`` (linear or log, with tick labels in the axis's own format: latencies in
ns/us/ms, counts as "8.1 M") and takes marks in data coordinates: points, lines, step lines, bars and text.
``Chart.svg()`` gives the ``<svg>`` element, whose ``<title>`` and ``<desc>`` are its accessible name and
description (what the plot shows, not just what it is).
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from html import escape
from typing import Callable, Sequence

# colours with at least 4.5:1 contrast on white, so that marks and their labels stay readable
BLUE, ORANGE, GREEN, RED, GREY, PURPLE, INK = "#1f5fa8", "#a14a00", "#1a7f37", "#c62828", "#595959", "#6f42c1", "#222"


def _e(s: object) -> str:
    return escape(str(s), quote=True)


def _nice(step: float) -> float:
    mag = 10 ** math.floor(math.log10(step))
    return next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= step)


@dataclass
class Axis:
    """``lo..hi`` drawn over ``log`` or linear scale; ``fmt`` writes a tick value; ``label`` names the quantity
    with its unit. ``ticks`` overrides the tick values (categorical axes)."""

    lo: float
    hi: float
    log: bool = False
    fmt: Callable[[float], str] = lambda v: f"{v:g}"
    label: str = ""
    ticks: Sequence[float] | None = None

    def __post_init__(self):
        if self.log:
            self.lo, self.hi = max(self.lo, 1e-300), max(self.hi, 1e-300)
        if self.hi <= self.lo:  # one value: a span around it
            self.lo, self.hi = (self.lo / 2, self.hi * 2) if self.log else (self.lo - 1, self.hi + 1)

    @classmethod
    def over(cls, values: Sequence[float], log: bool = False, pad: float = 0.06, **kw) -> "Axis":
        """An axis spanning ``values`` with a margin of ``pad`` of the span (in log space for a log axis)."""
        vals = [v for v in values if v is not None and math.isfinite(v) and (v > 0 or not log)]
        lo, hi = (min(vals), max(vals)) if vals else (1.0, 10.0)
        if log:
            a, b = math.log10(lo), math.log10(hi)
            d = max(b - a, 0.3) * pad
            return cls(10 ** (a - d), 10 ** (b + d), True, **kw)
        d = (hi - lo or abs(hi) or 1.0) * pad
        return cls(lo - d, hi + d, False, **kw)

    def frac(self, v: float) -> float:
        if self.log:
            v = max(v, 1e-300)
            return (math.log10(v) - math.log10(self.lo)) / (math.log10(self.hi) - math.log10(self.lo))
        return (v - self.lo) / (self.hi - self.lo)

    def tick_values(self) -> list[float]:
        if self.ticks is not None:
            return list(self.ticks)
        if self.log:
            a, b = math.floor(math.log10(self.lo)), math.ceil(math.log10(self.hi))
            step = max(1, math.ceil((b - a) / 7))
            out = [10.0 ** e for e in range(a, b + 1, step)]
            if b - a <= 2:  # under three decades: 2 and 5 between the powers of ten
                out = sorted(m * v for v in out for m in (1, 2, 5))
            return [v for v in out if self.lo <= v <= self.hi]
        step = _nice((self.hi - self.lo) / 6)
        first = math.ceil(self.lo / step) * step
        return [first + i * step for i in range(int((self.hi - first) / step) + 1)]


@dataclass
class Chart:
    """One plot: ``width`` x ``height`` user units, ``title`` (its accessible name) and ``desc`` (what it shows)."""

    x: Axis
    y: Axis
    title: str
    desc: str
    width: int = 760
    height: int = 340
    left: int = 78
    right: int = 16
    top: int = 14
    bottom: int = 46
    parts: list[str] = field(default_factory=list)
    overlay: list[str] = field(default_factory=list)  # drawn over the plot, not clipped to it
    legend_items: list[tuple[str, str, str]] = field(default_factory=list)

    def px(self, v: float) -> float:
        return self.left + self.x.frac(v) * (self.width - self.left - self.right)

    def py(self, v: float) -> float:
        return self.height - self.bottom - self.y.frac(v) * (self.height - self.top - self.bottom)

    def point(self, x: float, y: float, title: str, color: str = BLUE, shape: str = "circle", r: float = 3.5,
              hollow: bool = False, opacity: float = 0.85) -> None:
        """A mark at (x, y) whose hover title is ``title``; shapes: circle, diamond, cross, star, square."""
        cx, cy = self.px(x), self.py(y)
        fill = "none" if hollow else color
        style = f'fill="{fill}" stroke="{color}" stroke-width="1.5" opacity="{opacity}"'
        if shape == "diamond":
            d = r * 1.5
            el = f'<path d="M{cx:.1f},{cy - d:.1f}L{cx + d:.1f},{cy:.1f}L{cx:.1f},{cy + d:.1f}L{cx - d:.1f},{cy:.1f}Z" {style}>'
        elif shape == "cross":
            el = (f'<path d="M{cx - r:.1f},{cy - r:.1f}L{cx + r:.1f},{cy + r:.1f}M{cx - r:.1f},{cy + r:.1f}'
                  f'L{cx + r:.1f},{cy - r:.1f}" stroke="{color}" stroke-width="2" fill="none">')
        elif shape == "star":
            pts = " ".join(f"{cx + (r * 2.2 if i % 2 == 0 else r) * math.sin(i * math.pi / 5):.1f},"
                           f"{cy - (r * 2.2 if i % 2 == 0 else r) * math.cos(i * math.pi / 5):.1f}" for i in range(10))
            el = f'<polygon points="{pts}" fill="{color}" stroke="{INK}" stroke-width="0.8">'
        elif shape == "square":
            el = f'<rect x="{cx - r:.1f}" y="{cy - r:.1f}" width="{2 * r:.1f}" height="{2 * r:.1f}" {style}>'
        else:
            el = f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="{r}" {style}>'
        tag = el.split(" ", 1)[0][1:]
        self.parts.append(f"{el}<title>{_e(title)}</title></{tag}>")

    def line(self, xs: Sequence[float], ys: Sequence[float], color: str = INK, width: float = 1.5,
             dash: str | None = None, step: bool = False, title: str | None = None) -> None:
        """A polyline through the points (``step``: horizontal, then vertical, as a best-so-far curve)."""
        pts: list[tuple[float, float]] = []
        for i, (a, b) in enumerate(zip(xs, ys)):
            if step and pts:
                pts.append((self.px(a), pts[-1][1]))
            pts.append((self.px(a), self.py(b)))
        if len(pts) < 2:
            return
        d = " ".join(f"{a:.1f},{b:.1f}" for a, b in pts)
        extra = f' stroke-dasharray="{dash}"' if dash else ""
        t = f"<title>{_e(title)}</title>" if title else ""
        self.parts.append(f'<polyline points="{d}" fill="none" stroke="{color}" stroke-width="{width}"{extra}>{t}</polyline>')

    def hbar(self, y: float, x0: float, x1: float, title: str, color: str = GREEN, thick: float = 14) -> None:
        """A horizontal bar from ``x0`` to ``x1`` centred on ``y``."""
        a, b = self.px(x0), self.px(x1)
        self.parts.append(f'<rect x="{min(a, b):.1f}" y="{self.py(y) - thick / 2:.1f}" width="{abs(b - a):.1f}" '
                          f'height="{thick}" fill="{color}"><title>{_e(title)}</title></rect>')

    def text(self, x: float, y: float, s: str, anchor: str = "start", size: int = 12, color: str = INK,
             dx: float = 0, dy: float = 0, clip: bool = True) -> None:
        """Text at (x, y) offset by (dx, dy) pixels; ``clip=False`` lets it stand outside the plot area."""
        (self.parts if clip else self.overlay).append(f'<text x="{self.px(x) + dx:.1f}" y="{self.py(y) + dy:.1f}" font-size="{size}" '
                          f'text-anchor="{anchor}" fill="{color}">{_e(s)}</text>')

    def legend(self, label: str, color: str, shape: str = "circle") -> None:
        self.legend_items.append((label, color, shape))

    def _axes(self) -> list[str]:
        w, h, left, bottom = self.width, self.height, self.left, self.bottom
        out = [f'<rect x="{left}" y="{self.top}" width="{w - left - self.right}" height="{h - self.top - bottom}" '
               f'fill="#fff" stroke="#8a8a8a"/>']
        for v in self.x.tick_values():
            px = self.px(v)
            out.append(f'<line x1="{px:.1f}" y1="{self.top}" x2="{px:.1f}" y2="{h - bottom}" stroke="#e4e4e4"/>')
            out.append(f'<text x="{px:.1f}" y="{h - bottom + 16}" font-size="12" text-anchor="middle" '
                       f'fill="{INK}">{_e(self.x.fmt(v))}</text>')
        for v in self.y.tick_values():
            py = self.py(v)
            out.append(f'<line x1="{left}" y1="{py:.1f}" x2="{w - self.right}" y2="{py:.1f}" stroke="#e4e4e4"/>')
            out.append(f'<text x="{left - 6}" y="{py + 4:.1f}" font-size="12" text-anchor="end" '
                       f'fill="{INK}">{_e(self.y.fmt(v))}</text>')
        out.append(f'<text x="{(left + w - self.right) / 2:.1f}" y="{h - 8}" font-size="13" text-anchor="middle" '
                   f'fill="{INK}">{_e(self.x.label)}</text>')
        cy = (self.top + h - bottom) / 2
        out.append(f'<text x="14" y="{cy:.1f}" font-size="13" text-anchor="middle" fill="{INK}" '
                   f'transform="rotate(-90 14 {cy:.1f})">{_e(self.y.label)}</text>')
        return out

    def _legend(self) -> tuple[list[str], int]:
        """The legend below the plot, items laid out in rows; and the height it takes."""
        out: list[str] = []
        x, y = self.left, self.height + 12
        for label, color, shape in self.legend_items:
            wide = len(label) * 6.6 + 34
            if x + wide > self.width and x > self.left:
                x, y = self.left, y + 18
            if shape in ("line", "dash"):
                dash = ' stroke-dasharray="5,3"' if shape == "dash" else ""
                out.append(f'<line x1="{x}" y1="{y - 4}" x2="{x + 16}" y2="{y - 4}" stroke="{color}" '
                           f'stroke-width="{1.5 if dash else 2.5}"{dash}/>')
            elif shape == "cross":
                out.append(f'<path d="M{x + 4},{y - 8}L{x + 12},{y}M{x + 4},{y}L{x + 12},{y - 8}" stroke="{color}" '
                           f'stroke-width="2"/>')
            elif shape == "hollow":
                out.append(f'<circle cx="{x + 8}" cy="{y - 4}" r="4" fill="none" stroke="{color}" stroke-width="1.5"/>')
            elif shape == "diamond":
                out.append(f'<path d="M{x + 8},{y - 10}L{x + 14},{y - 4}L{x + 8},{y + 2}L{x + 2},{y - 4}Z" fill="{color}"/>')
            else:
                out.append(f'<circle cx="{x + 8}" cy="{y - 4}" r="4" fill="{color}"/>')
            out.append(f'<text x="{x + 22}" y="{y}" font-size="12" fill="{INK}">{_e(label)}</text>')
            x += wide
        return out, (y - self.height + 10 if out else 0)

    def svg(self) -> str:
        legend, extra = self._legend()
        marks = "".join(self.parts)
        # marks are clipped to the plot area (a roof drawn past the axes); the id is the content's, so that two
        # plots on one page never share one and the same data renders the same bytes
        cid = "clip" + hashlib.sha1(f"{self.title}{marks}".encode()).hexdigest()[:12]
        w, h = self.width - self.left - self.right, self.height - self.top - self.bottom
        clip = (f'<clipPath id="{cid}"><rect x="{self.left - 8}" y="{self.top - 8}" width="{w + 16}" '
                f'height="{h + 16}"/></clipPath>')
        body = "".join(self._axes()) + clip + f'<g clip-path="url(#{cid})">{marks}</g>' + "".join(self.overlay + legend)
        return (f'<svg viewBox="0 0 {self.width} {self.height + extra}" role="img" '
                f'width="100%" style="max-width:{self.width}px" font-family="system-ui, sans-serif">'
                f"<title>{_e(self.title)}</title><desc>{_e(self.desc)}</desc>{body}</svg>")
