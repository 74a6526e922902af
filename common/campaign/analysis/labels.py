"""Point labels that do not collide, for figures with tens of submissions on them.

`place(ax, xs, ys, labels)` puts each label beside its point at the first of a ring of offsets (growing in
radius) where its box overlaps no label placed before it, no point and nothing outside the axes; a label that
finds no free place goes at the farthest free ring position it can, with a thin line to its point, and if none is
free at all, in a list below the axes ("1: NVIDIA dgxa100_n128"), with its number placed the same way at the point.
Placement works in display coordinates, so it holds for log axes and for any figure size.
"""
from __future__ import annotations

import math

DIRECTIONS = [(1, 1), (1, -1), (-1, 1), (-1, -1), (1, 0), (-1, 0), (0, 1), (0, -1)]
RADII_POINTS = (5, 11, 18, 27, 38)  # offsets tried, in typographic points
POINT_HALF_PX = 4  # a marker's half size in pixels, kept free of labels


def place(ax, xs, ys, labels, fontsize: float = 7) -> list:
    """Annotate each (x, y) with its label without overlaps; returns the annotations (numbers for the labels
    that went to the list below the axes, whose text is then the figure's caption list)."""
    fig = ax.figure
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    area = ax.get_window_extent(renderer)
    points = [ax.transData.transform((x, y)) for x, y in zip(xs, ys)]
    taken = [_box(px - POINT_HALF_PX, py - POINT_HALF_PX, px + POINT_HALF_PX, py + POINT_HALF_PX) for px, py in points]
    placed, unplaced = [], []
    for (x, y), label in zip(zip(xs, ys), labels):
        note = _first_free(ax, renderer, area, taken, (x, y), label, fontsize)
        if note is None:
            unplaced.append(((x, y), label))
        else:
            placed.append(note)
    for number, ((x, y), label) in enumerate(unplaced, 1):
        note = _first_free(ax, renderer, area, taken, (x, y), str(number), fontsize)
        placed.append(note or ax.annotate(str(number), (x, y), xytext=(3, 3), textcoords="offset points",
                                          fontsize=fontsize))  # nowhere free even for its number
    if unplaced:
        listing = "; ".join(f"{n}: {label}" for n, (_, label) in enumerate(unplaced, 1))
        ax.text(0, -0.22, listing, transform=ax.transAxes, fontsize=fontsize, va="top", wrap=True)
    return placed


def _first_free(ax, renderer, area, taken: list, xy, label: str, fontsize: float):
    """The annotation of `label` at the first free ring offset (kept, its box added to `taken`), or None."""
    for radius in RADII_POINTS:
        for dx, dy in DIRECTIONS:
            scale = radius / math.hypot(dx, dy)
            offset = (dx * scale, dy * scale)
            note = ax.annotate(label, xy, xytext=offset, textcoords="offset points", fontsize=fontsize,
                               ha="left" if dx > 0 else "right" if dx < 0 else "center",
                               va="bottom" if dy > 0 else "top" if dy < 0 else "center",
                               arrowprops={"arrowstyle": "-", "lw": 0.4, "color": "grey"}
                               if radius > RADII_POINTS[1] else None)
            box = note.get_window_extent(renderer)
            bounds = _box(box.x0 - 1, box.y0 - 1, box.x1 + 1, box.y1 + 1)
            if _inside(bounds, area) and not any(_overlap(bounds, other) for other in taken):
                taken.append(bounds)
                return note
            note.remove()
    return None


def _box(x0: float, y0: float, x1: float, y1: float) -> tuple[float, float, float, float]:
    return x0, y0, x1, y1


def _inside(box, area) -> bool:
    return box[0] >= area.x0 and box[1] >= area.y0 and box[2] <= area.x1 and box[3] <= area.y1


def _overlap(a, b) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def boxes(notes: list, renderer) -> list[tuple[float, float, float, float]]:
    """The display boxes of `notes` (for checks: no two of a placement's labels overlap)."""
    return [tuple(n.get_window_extent(renderer).extents) for n in notes]
