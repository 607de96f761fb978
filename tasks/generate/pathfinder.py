"""Pathfinder stimulus generator (Linsley et al. 2018, as used by the Long Range Arena); numpy + Pillow only.

Why our own: the public generator (``snakes2.py``) is unseeded, needs the long-gone ``scipy.misc`` and is
slow, and the LRA release archive may be unobtainable. This module re-implements the published algorithm
(``snakes2.py``/``snakes.py`` of drewlinsley/pathfinder@7b538865) so Pathfinder and Path-X data can be
regenerated offline and reproducibly, in the official ``lra_release`` layout::

    OUT/pathfinder{res}/{difficulty_dir}/imgs/<k>/sample_<i>.png     8-bit grayscale (mode L), res x res
    OUT/pathfinder{res}/{difficulty_dir}/metadata/<k>.npy            one row per image, 11 fields
    OUT/pathfinder{res}/{difficulty_dir}/masks/<k>/sample_<i>.png    only with --write-masks

``difficulty_dir`` is ``curv_baseline`` (contour length 6), ``curv_contour_length_9`` or
``curv_contour_length_14``. Global image ``g`` goes to folder ``k = g // images_per_folder`` as
``sample_<g % images_per_folder>.png``. A metadata row is ``imgs/<k> sample_<i>.png <i> <label>
<continuity> <contour_length> <distractor_length> <paddle_length> <paddle_thickness> <paddle_margin>
<n_paddle_contrasts>``; the file is plain text with a trailing newline despite its ``.npy`` suffix (as the
released files are), or with ``metadata_format="npy"`` a binary ``np.save`` of a 2-D ``<U`` string array of
shape ``(n, 11)``, like the original generator's list of rows (``read_metadata`` reads both).

Algorithm: our reading of the original; the deliberate differences are tagged [ours].

* Geometry lives on an integer pixel grid at the output resolution. A snake is a chain of paddles; paddle
  ``k`` has an integer *pivot* ``p_k`` and a direction ``u_k``; its ink is the segment from ``p_k + m u_k``
  (tail) to ``p_k + (L + m) u_k`` (head), ``L`` = paddle length, ``m`` = paddle margin, and the next pivot is
  ``p_{k+1} = round(p_k + (L + 2m) u_k)``. Consecutive paddles are thus separated by a gap of ``2m`` around
  each pivot, as in ``snakes2.extend_snake``: the contour is dashed and is traced by good continuation.
* [ours] Directions are quantised to ``D`` evenly spaced angles, about one pixel of arc at the head radius
  ``L + m`` (the original takes the unique integer points on that circle: a similar but uneven set).
* Turning: a direction that turns by ``d`` from the previous one has weight
  ``cos(min(|d| * continuity, pi/2))**2`` (as the original), so the largest turn is ``90 deg / continuity``
  (90 deg at 32 px, 50 deg at 64-256 px) and small turns dominate: curvy yet smooth contours.
* Occupancy: every placed piece (paddle plus the gap after it) is dilated by a disk of radius ``2m - 0.5``
  (the original dilates each paddle by ``m`` and forbids overlapping footprints) and new pieces must avoid
  these zones. A snake's newest piece stays "pending": its own snake may touch it, nobody else may, so a
  paddle abuts only its predecessor. The ``padding`` border is blocked. [ours] All candidate directions are
  tested against the full footprint of the new piece and the turn is drawn among the feasible ones; the
  original tests only the head pixel and retries ``max_paddle_retrial`` times.
* Two target snakes of ``contour_length`` paddles are seeded ``seed_distance`` apart (the first pivot uniform
  in the central square ``2 * seed_distance`` from each border, the second at a uniform angle) and grown in
  turn. [ours] A stuck round is undone together with 0-2 earlier rounds (occupancy snapshots), a bounded
  number of times; then the pair is redrawn (``max_target_contour_retrial``), then the sample restarts, and
  after ``_MAX_SAMPLE_RESTARTS`` a ``RuntimeError`` is raised: generation never hangs. Whole-pair rejection
  alone (the original) is tens to hundreds of times slower for 14 long paddles at 64-128 px.
* ``num_distractor_snakes`` distractors of ``distractor_length = contour_length // 3`` paddles are seeded on
  free space (the first of a batch of random pivots that fits) and grown the same way; a stuck distractor is
  kept incomplete, as the original allows.
* Markers: filled circles of ``marker_radius`` on the origin tip (tail of the first paddle) of a random
  target snake and on the terminal tip (head of the last paddle) of the same snake (label 1) or of the other
  target snake (label 0). The origin tips are only ``seed_distance`` apart: the label needs contour tracing.
* Rendering: paddles are drawn with ``ImageDraw.line`` at ``antialias_scale`` x resolution (width
  ``round(thickness * aa)``) and downsampled with LANCZOS, [ours] once per image rather than per paddle (the
  same result, since paddles never overlap). Ink is scaled by ``snake_contrast * paddle_contrast``, combined
  with the markers by ``max`` and byte-scaled min->0, max->255 as ``scipy.misc.imsave`` did.
* [ours] Labels are exactly balanced per pair of images: image ``g`` has label ``(g % 2) xor b(g // 2)``
  with ``b`` a seeded random bit, so any even count is 50/50 with no fixed alternation to exploit.
* Seeds: image ``g`` uses ``numpy.random.default_rng([seed, 0, g])``, so the output depends only on
  ``seed`` and ``g``, never on ``workers``, the chunking or ``images_per_folder``.
* The same on every machine: every float is made by IEEE basic operations and square roots (rounded alike
  everywhere) or by ``_sin_cos`` (decimal arithmetic, rounded once), never by libm's ``sin``/``cos``/``hypot``,
  whose last bit depends on the CPU (glibc runs an FMA or an SSE2 build of them).

Masks (``--write-masks``, and the third value of ``make_sample``): uint8 at the output resolution;
0 = background, 1 / 2 = the *path* of target snake 1 / 2 (the rasterised centre line through its paddles
*and* the gaps between them, 8-connected by construction, since the ink itself is dashed on purpose), plus 4
on the pixel of each marker centre (values 5 or 6). Flood-filling ``mask > 0`` from one marker centre
reaches the other iff the label is 1: different snakes are never 8-adjacent (they stay >= 2 px apart).

The metadata field ``distractor_length`` is written as an int at 32 px and as a float elsewhere, matching
the two released rows we know (``... 1.0 6 2 2 0.5 1 1`` at 32 px, ``... 1.8 6 2.0 5 1.5 2 1`` at 128 px).
"""

from __future__ import annotations

import argparse
import bisect
import collections
import contextlib
import functools
import inspect
import math
import multiprocessing as mp
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from decimal import Decimal, localcontext
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw
from rich import progress as rp

__all__ = [
    "DIFFICULTY_DIRS",
    "PathfinderParams",
    "difficulty_dir",
    "generate",
    "label_for_index",
    "main",
    "make_sample",
    "read_metadata",
]

DIFFICULTY_DIRS = {6: "curv_baseline", 9: "curv_contour_length_9", 14: "curv_contour_length_14"}

_MAX_SAMPLE_RESTARTS = 25  # x (max_target_contour_retrial + 1) pair attempts before giving up on a sample
_SEED_BATCH = 16  # random pivots tried at once when seeding a distractor
_STEP = 0.5  # rasterisation step along a centre line (<= 0.5 px keeps it 8-connected)
_COMMITTED = 128  # occupancy bit: blocked for every snake
_DISTRACTOR_BIT = 4  # occupancy bit of the distractor being grown (targets use 1 and 2)
_MARKER_FLAG = 4  # mask value added on marker centres
_CHUNK = 100  # images per work unit (does not affect the output)
_BACKTRACKS_PER_PADDLE = 4  # budget of undone rounds per target pair, per paddle of contour length

# Piece variants: the first piece of a snake starts at its tail tip, the last one ends at its head tip.
_MIDDLE, _FIRST, _LAST, _ONLY = 0, 1, 2, 3

# Per-resolution generator arguments (LRA `data/pathfinder.py` docstrings; defaults of snakes2 in brackets).
_FIELDS = (
    "padding",
    "paddle_margin_list",
    "seed_distance",
    "marker_radius",
    "paddle_length",
    "paddle_thickness",
    "continuity",
    "distractor_budget",
    "snake_contrast_list",
    "paddle_contrast_list",
)
# fmt: off
_ROWS: dict[int, tuple] = {  # one row per resolution, in the order of _FIELDS
    32:  (1,  (1,),   7,  1.5, 2, 0.5, 1.0, 20, (2.0,), (0.75,)),
    64:  (1,  (1,),   12, 2.5, 5, 1,   1.8, 22, (0.8,), (1.0,)),
    128: (1,  (2, 3), 20, 3,   5, 1.5, 1.8, 35, (0.9,), (1.0,)),
    256: (22, (3,),   27, 5,   5, 2,   1.8, 30, (1.0,), (1.0,)),
}
# fmt: on
_TABLE: dict[int, dict] = {size: dict(zip(_FIELDS, row, strict=True)) for size, row in _ROWS.items()}


def difficulty_dir(contour_length: int) -> str:
    """Official directory name of a difficulty (``curv_baseline`` is contour length 6)."""
    return DIFFICULTY_DIRS.get(contour_length, f"curv_contour_length_{contour_length}")


@dataclass(frozen=True)
class PathfinderParams:
    """Generator arguments of one (resolution, contour length) set; names follow ``snakes2.py``."""

    window_size: int
    contour_length: int
    padding: int
    antialias_scale: int
    paddle_margin_list: tuple[int, ...]
    seed_distance: int
    marker_radius: float
    paddle_length: int
    paddle_thickness: float
    continuity: float
    distractor_length: int
    num_distractor_snakes: int
    snake_contrast_list: tuple[float, ...]
    paddle_contrast_list: tuple[float, ...]
    max_paddle_retrial: int = 2
    max_target_contour_retrial: int = 4
    max_distractor_contour_retrial: int = 4

    @classmethod
    def for_resolution(cls, resolution: int, contour_length: int = 14) -> PathfinderParams:
        """The published parameters for ``resolution`` in {32, 64, 128, 256} (data.md §5 table)."""
        if resolution not in _TABLE:
            raise ValueError(f"resolution must be one of {sorted(_TABLE)}, got {resolution}")
        if contour_length < 3:
            raise ValueError(f"contour_length must be >= 3 (distractors are // 3 long), got {contour_length}")
        row = dict(_TABLE[resolution])
        budget = row.pop("distractor_budget")
        distractor_length = contour_length // 3
        return cls(
            window_size=resolution,
            contour_length=contour_length,
            antialias_scale=2,
            distractor_length=distractor_length,
            num_distractor_snakes=budget // distractor_length,
            **row,
        )

    @property
    def resolution(self) -> int:
        return self.window_size

    @property
    def difficulty_dir(self) -> str:
        return difficulty_dir(self.contour_length)

    def metadata_tail(self, paddle_margin: int) -> list[str]:
        """Fields 5..11 of a metadata row (after path, file name, index and label)."""
        dl = str(self.distractor_length) if self.window_size == 32 else str(float(self.distractor_length))
        return [
            str(float(self.continuity)),
            str(self.contour_length),
            dl,
            str(self.paddle_length),
            str(self.paddle_thickness),
            str(paddle_margin),
            str(len(self.paddle_contrast_list)),
        ]


# ------------------------------------------------------------------------------------- geometry tables


@dataclass(frozen=True)
class _Geometry:
    """Everything about pieces that depends only on (params, margin), precomputed as flat-index offsets.

    The occupancy grid is flat, ``width`` x ``width``, with a blocked ``border`` around the image so that
    no lookup ever needs a bounds check. The growth loop touches a few dozen pixels per paddle, where plain
    Python on a ``bytearray`` with tuples of offsets is several times faster than numpy's per-call overhead.
    """

    width: int
    border: int
    n_dirs: int
    tail_vec: np.ndarray  # (D, 2) float (dy, dx) from pivot to paddle tail
    head_vec: np.ndarray  # (D, 2) float (dy, dx) from pivot to paddle head
    step_off: tuple[int, ...]  # [dir] flat offset pivot -> next pivot
    tail_pix: tuple[int, ...]  # [dir] flat offset of the tail tip pixel
    head_pix: tuple[int, ...]  # [dir] flat offset of the head tip pixel
    path: tuple[tuple[np.ndarray, ...], ...]  # [variant][dir] flat path offsets (for the mask)
    path_t: tuple[tuple[tuple[int, ...], ...], ...]  # the same as tuples (for fit checks)
    dilated: tuple[tuple[tuple[int, ...], ...], ...]  # [variant][dir] flat offsets of the blocked zone
    cand: tuple[tuple[tuple[tuple[int, float, tuple[int, ...]], ...], ...], ...]
    # cand[variant][prev dir] = ((dir, turn weight, path offsets), ...) for every turn of non-zero weight
    template: bytes  # flat occupancy of an empty image
    interior: tuple[int, int]  # [lo, hi) grid coordinates of free pixels
    seed_box: tuple[int, int]  # [lo, hi) grid coordinates for the first target pivot


_PI = Decimal("3.14159265358979323846264338327950288419716939937510582097494459230781640628620899863")
_TRIG_DIGITS = 60  # working precision of `_sin_cos`: far past the 17 digits a float keeps


@functools.lru_cache(maxsize=1 << 14)
def _sin_cos(x: float) -> tuple[float, float]:
    """``(sin x, cos x)`` the same to the last bit on every machine: Taylor series in decimal arithmetic (exactly
    specified, so machine-independent) at ``_TRIG_DIGITS`` digits, rounded once to a float. libm's ``sin`` is not
    (glibc picks an FMA or an SSE2 build by the CPU, and on this generator's angles their floats differ), and the
    geometry tables and seed pivots round these values to pixels."""
    with localcontext() as ctx:
        ctx.prec = _TRIG_DIGITS
        turn = 2 * _PI
        v = Decimal(x)
        v -= turn * (v / turn).to_integral_value()  # into [-pi, pi]: the series converges fast
        v2, k = v * v, 0
        sin_term, cos_term = v, Decimal(1)
        sin_sum, cos_sum = sin_term, cos_term
        tiny = Decimal(10) ** -_TRIG_DIGITS
        while abs(sin_term) > tiny or abs(cos_term) > tiny:
            k += 2
            cos_term = -cos_term * v2 / ((k - 1) * k)
            sin_term = -sin_term * v2 / (k * (k + 1))
            sin_sum, cos_sum = sin_sum + sin_term, cos_sum + cos_term
        return float(sin_sum), float(cos_sum)


def _hypot(dy: float, dx: float) -> float:
    """The length of ``(dy, dx)`` correctly rounded, as ``_sin_cos`` machine-independent: a paddle is exactly
    ``L`` long, so its sample count ``ceil(length / _STEP)`` turns on the last bit of its length."""
    with localcontext() as ctx:
        ctx.prec = _TRIG_DIGITS
        return float((Decimal(dy) * Decimal(dy) + Decimal(dx) * Decimal(dx)).sqrt())


def _polyline_pixels(vertices: np.ndarray) -> np.ndarray:
    """Integer pixels (dy, dx) along a polyline, sampled every <= 0.5 px so the result is 8-connected."""
    pts = [vertices[:1]]
    for a, b in zip(vertices[:-1], vertices[1:]):
        n = max(1, math.ceil(_hypot(*(b - a).tolist()) / _STEP))
        t = np.arange(1, n)[:, None] / n
        pts.append(a + t * (b - a))
        pts.append(b[None])  # exact vertex, so tip pixels round exactly like the marker centres
    return np.unique(np.rint(np.concatenate(pts)).astype(np.int64), axis=0)


def _disk(radius: float) -> np.ndarray:
    """Integer offsets (dy, dx) with dy^2 + dx^2 <= radius^2."""
    r = math.ceil(radius)
    yy, xx = np.mgrid[-r : r + 1, -r : r + 1]
    keep = yy**2 + xx**2 <= radius * radius
    return np.stack([yy[keep], xx[keep]], axis=1)


@functools.lru_cache(maxsize=16)
def _geometry(params: PathfinderParams, margin: int) -> _Geometry:
    """Build the direction set, piece rasterisations, blocked zones and turn weights for one margin."""
    length = params.paddle_length
    head_r, step_r = length + margin, length + 2 * margin
    n_dirs = max(16, 4 * round(math.pi * head_r / 2))
    theta = 2 * math.pi * np.arange(n_dirs) / n_dirs
    unit = np.array([_sin_cos(t) for t in theta.tolist()])  # (sin, cos) per direction
    tail_vec, head_vec, step_vec = margin * unit, head_r * unit, np.rint(step_r * unit)

    sep = 2 * margin - 0.5
    disk = _disk(sep)
    border = step_r + 2 + math.ceil(sep)
    width = params.window_size + 2 * border

    def flat(v: np.ndarray) -> np.ndarray:
        return (v[..., 0] * width + v[..., 1]).astype(np.int64)

    path, dilated = [], []
    for variant in (_MIDDLE, _FIRST, _LAST, _ONLY):
        p_list, d_list = [], []
        for j in range(n_dirs):
            verts = [tail_vec[j] if variant & _FIRST else np.zeros(2), tail_vec[j], head_vec[j]]
            if not variant & _LAST:
                verts.append(step_vec[j])
            pix = _polyline_pixels(np.array(verts))
            p_list.append(np.unique(flat(pix)))
            d_list.append(tuple(np.unique(flat(pix[:, None, :] + disk[None, :, :])).tolist()))
        path.append(tuple(p_list))
        dilated.append(tuple(d_list))
    path_t = tuple(tuple(tuple(p.tolist()) for p in p_list) for p_list in path)

    turn = np.abs((theta[None, :] - theta[:, None] + math.pi) % (2 * math.pi) - math.pi)
    angle = np.minimum(turn * params.continuity, math.pi / 2)
    cosine = np.maximum(np.array([[_sin_cos(a)[1] for a in row] for row in angle.tolist()]), 0.0)
    weight = cosine * cosine
    allowed = [np.flatnonzero(row > 1e-9).tolist() for row in weight]
    cand = tuple(
        tuple(tuple((j, float(weight[i, j]), path_t[v][j]) for j in allowed[i]) for i in range(n_dirs))
        for v in range(4)
    )

    res, pad = params.window_size, params.padding
    interior = (border + pad, border + res - pad)
    template = np.full((width, width), _COMMITTED, dtype=np.uint8)
    template[interior[0] : interior[1], interior[0] : interior[1]] = 0
    lo, hi = border + 2 * params.seed_distance, border + res - 2 * params.seed_distance
    return _Geometry(
        width=width,
        border=border,
        n_dirs=n_dirs,
        tail_vec=tail_vec,
        head_vec=head_vec,
        step_off=tuple(flat(step_vec).tolist()),
        tail_pix=tuple(flat(np.rint(tail_vec)).tolist()),
        head_pix=tuple(flat(np.rint(head_vec)).tolist()),
        path=tuple(path),
        path_t=path_t,
        dilated=tuple(dilated),
        cand=cand,
        template=template.tobytes(),
        interior=interior,
        seed_box=(lo, hi) if hi > lo else interior,
    )


# ---------------------------------------------------------------------------------------- snake growth

# A placed piece: (pivot flat index, direction, variant).
_Piece = tuple[int, int, int]
_Snapshot = tuple[bytes, dict[int, tuple[int, int, int]]]


class _Canvas:
    """Occupancy grid (``bytearray``) with one pending (not yet committed) piece per snake bit.

    A pixel blocks snake ``bit`` when ``occ & ~bit`` is non-zero: committed zones (``_COMMITTED``) block
    everybody, a pending zone blocks every snake but its own. Committing only sets ``_COMMITTED``; the stale
    snake bit left beside it changes nothing.
    """

    def __init__(self, geo: _Geometry) -> None:
        self.geo = geo
        self.occ = bytearray(geo.template)
        self.pending: dict[int, _Piece] = {}

    def reset(self) -> None:
        self.occ[:] = self.geo.template
        self.pending.clear()

    def snapshot(self) -> _Snapshot:
        return bytes(self.occ), dict(self.pending)

    def restore(self, snap: _Snapshot) -> None:
        self.occ[:] = snap[0]
        self.pending = dict(snap[1])

    def fits(self, piece: _Piece, bit: int) -> bool:
        """Whether a piece avoids every blocked zone except its own snake's pending piece."""
        pivot, direction, variant = piece
        occ, mask = self.occ, 255 ^ bit
        return not any(occ[pivot + o] & mask for o in self.geo.path_t[variant][direction])

    def place(self, bit: int, piece: _Piece) -> None:
        """Commit the snake's previous piece and make this one its pending piece."""
        self.finish(bit)
        occ = self.occ
        pivot, direction, variant = piece
        for o in self.geo.dilated[variant][direction]:
            occ[pivot + o] |= bit
        self.pending[bit] = piece

    def finish(self, bit: int) -> None:
        """Commit the snake's pending piece: from now on it blocks the snake itself too."""
        piece = self.pending.pop(bit, None)
        if piece is not None:
            occ = self.occ
            pivot, direction, variant = piece
            for o in self.geo.dilated[variant][direction]:
                occ[pivot + o] |= _COMMITTED


def _extend(canvas: _Canvas, rng: np.random.Generator, snake: list[_Piece], bit: int, last: bool) -> bool:
    """Add one paddle to ``snake``, choosing the turn among the feasible ones by the continuity weight."""
    geo, occ, mask = canvas.geo, canvas.occ, 255 ^ bit
    prev_pivot, prev_dir, _ = snake[-1]
    pivot = prev_pivot + geo.step_off[prev_dir]
    variant = _LAST if last else _MIDDLE
    total, cum, dirs = 0.0, [], []
    for direction, weight, offsets in geo.cand[variant][prev_dir]:
        for o in offsets:
            if occ[pivot + o] & mask:
                break
        else:
            total += weight
            cum.append(total)
            dirs.append(direction)
    if not dirs:
        return False
    choice = bisect.bisect_right(cum, rng.random() * total)
    piece = (pivot, dirs[min(choice, len(dirs) - 1)], variant)
    canvas.place(bit, piece)
    snake.append(piece)
    return True


def _seed_targets(canvas: _Canvas, rng: np.random.Generator, params: PathfinderParams) -> list[list[_Piece]] | None:
    """Place the first paddles of the two target snakes, ``seed_distance`` apart."""
    geo = canvas.geo
    lo, hi = geo.seed_box
    ilo, ihi = geo.interior
    for _ in range(params.max_paddle_retrial + 1):
        y1, x1 = rng.integers(lo, hi, size=2).tolist()
        sin_phi, cos_phi = _sin_cos(rng.random() * 2 * math.pi)
        y2 = round(y1 + params.seed_distance * sin_phi)
        x2 = round(x1 + params.seed_distance * cos_phi)
        d1, d2 = rng.integers(geo.n_dirs, size=2).tolist()
        if not (ilo <= y2 < ihi and ilo <= x2 < ihi):
            continue
        first = (y1 * geo.width + x1, d1, _FIRST)
        second = (y2 * geo.width + x2, d2, _FIRST)
        if not canvas.fits(first, 1):
            continue
        canvas.place(1, first)
        if canvas.fits(second, 2):
            canvas.place(2, second)
            return [[first], [second]]
        canvas.reset()
    return None


def _grow_targets(canvas: _Canvas, rng: np.random.Generator, params: PathfinderParams) -> list[list[_Piece]] | None:
    """Two complete target snakes grown in turn, or None when every retrial got stuck.

    A round that gets stuck is retried after undoing it and 0-2 earlier rounds (occupancy snapshots), up to
    ``_BACKTRACKS_PER_PADDLE * contour_length`` times per pair; without this, snakes of 14 long paddles
    run into the border so often that whole-pair rejection alone is tens to hundreds of times slower.
    """
    n = params.contour_length
    for _ in range(params.max_target_contour_retrial + 1):
        canvas.reset()
        snakes = _seed_targets(canvas, rng, params)
        if snakes is None:
            continue
        snaps: dict[int, _Snapshot] = {}
        budget, k = _BACKTRACKS_PER_PADDLE * n, 1
        while 0 < k < n:
            snaps[k] = canvas.snapshot()
            last = k == n - 1
            if _extend(canvas, rng, snakes[0], 1, last) and _extend(canvas, rng, snakes[1], 2, last):
                k += 1
            elif budget == 0:
                k = 0
            else:
                budget -= 1
                k = max(1, k - 1 - int(rng.integers(3)))
                canvas.restore(snaps[k])
                snakes = [snake[:k] for snake in snakes]
        if k == n:
            canvas.finish(1)
            canvas.finish(2)
            return snakes
    return None


def _seed_distractor(canvas: _Canvas, rng: np.random.Generator, variant: int) -> _Piece | None:
    """First paddle of a distractor: the first of a batch of uniform random pivots whose piece fits."""
    geo = canvas.geo
    lo, hi = geo.interior
    ys, xs = rng.integers(lo, hi, size=(2, _SEED_BATCH)).tolist()
    dirs = rng.integers(geo.n_dirs, size=_SEED_BATCH).tolist()
    for y, x, direction in zip(ys, xs, dirs):
        piece = (y * geo.width + x, direction, variant)
        if canvas.fits(piece, _DISTRACTOR_BIT):
            return piece
    return None


def _grow_distractors(canvas: _Canvas, rng: np.random.Generator, params: PathfinderParams) -> list[list[_Piece]]:
    """Distractor snakes of ``distractor_length`` paddles; stuck ones are kept incomplete."""
    n = params.distractor_length
    snakes = []
    for _ in range(params.num_distractor_snakes):
        first = None
        for _ in range(params.max_distractor_contour_retrial + 1):
            first = _seed_distractor(canvas, rng, _ONLY if n == 1 else _FIRST)
            if first is not None:
                break
        if first is None:
            continue
        canvas.place(_DISTRACTOR_BIT, first)
        snake = [first]
        for k in range(1, n):
            if not _extend(canvas, rng, snake, _DISTRACTOR_BIT, k == n - 1):
                break
        canvas.finish(_DISTRACTOR_BIT)
        snakes.append(snake)
    return snakes


# ------------------------------------------------------------------------------------------- rendering


def _grid_yx(geo: _Geometry, pivot: int) -> np.ndarray:
    """Image coordinates (y, x) of a grid pivot."""
    y, x = divmod(pivot, geo.width)
    return np.array([y - geo.border, x - geo.border], dtype=np.float64)


def _downsample(img: Image.Image, res: int) -> np.ndarray:
    return np.asarray(img.resize((res, res), Image.Resampling.LANCZOS), dtype=np.float32) / 255.0


def _render(
    params: PathfinderParams,
    geo: _Geometry,
    snakes: Sequence[list[_Piece]],
    markers: Sequence[np.ndarray],
    contrast: float,
) -> np.ndarray:
    """Draw paddles and markers at the antialias scale, downsample, combine by max and byte-scale."""
    aa, res = params.antialias_scale, params.window_size
    size = res * aa
    width = max(1, round(params.paddle_thickness * aa))
    pieces = np.array([piece[:2] for snake in snakes for piece in snake], dtype=np.int64).reshape(-1, 2)
    y, x = np.divmod(pieces[:, 0], geo.width)
    base = (np.stack([y, x], axis=1) - geo.border + 0.5) * aa - 0.5
    tails = (base + geo.tail_vec[pieces[:, 1]] * aa)[:, ::-1].tolist()  # (x, y) for Pillow
    heads = (base + geo.head_vec[pieces[:, 1]] * aa)[:, ::-1].tolist()
    ink = Image.new("L", (size, size), 0)
    draw = ImageDraw.Draw(ink)
    for tail, head in zip(tails, heads):
        draw.line([tuple(tail), tuple(head)], fill=255, width=width)
    dots = Image.new("L", (size, size), 0)
    draw = ImageDraw.Draw(dots)
    r = params.marker_radius * aa
    for y, x in markers:
        cy, cx = (y + 0.5) * aa - 0.5, (x + 0.5) * aa - 0.5
        draw.ellipse([cx - r, cy - r, cx + r, cy + r], fill=255)
    img = np.maximum(_downsample(ink, res) * contrast, _downsample(dots, res))
    lo, hi = float(img.min()), float(img.max())
    if hi <= lo:
        return np.zeros((res, res), dtype=np.uint8)
    return (np.clip((img - lo) * (255.0 / (hi - lo)), 0, 255) + 0.5).astype(np.uint8)


def _target_mask(
    params: PathfinderParams, geo: _Geometry, targets: Sequence[list[_Piece]], marker_pix: Sequence[int]
) -> np.ndarray:
    """Mask of the target paths (1, 2) with ``_MARKER_FLAG`` added on the marker centres."""
    flat = np.zeros(geo.width * geo.width, dtype=np.uint8)
    for value, snake in enumerate(targets, start=1):
        for pivot, direction, variant in snake:
            flat[pivot + geo.path[variant][direction]] = value
    for pix in marker_pix:
        flat[pix] |= _MARKER_FLAG
    b, res = geo.border, params.window_size
    return flat.reshape(geo.width, geo.width)[b : b + res, b : b + res].copy()


def make_sample(
    rng: np.random.Generator, params: PathfinderParams, label: int, paddle_margin: int | None = None
) -> tuple[np.ndarray, int, np.ndarray]:
    """One stimulus: ``(uint8 image res x res, label, target mask)``; see the module docstring for the mask.

    ``paddle_margin`` defaults to a draw from ``params.paddle_margin_list``. Raises ``RuntimeError`` when the
    targets cannot be placed after a bounded number of attempts (never with the published parameters).
    """
    if label not in (0, 1):
        raise ValueError(f"label must be 0 or 1, got {label}")
    margin = int(rng.choice(params.paddle_margin_list)) if paddle_margin is None else int(paddle_margin)
    geo = _geometry(params, margin)
    contrast = float(rng.choice(params.snake_contrast_list)) * float(rng.choice(params.paddle_contrast_list))
    canvas = _Canvas(geo)
    for _ in range(_MAX_SAMPLE_RESTARTS):
        targets = _grow_targets(canvas, rng, params)
        if targets is not None:
            break
    else:
        raise RuntimeError(f"could not place two target snakes with {params}")
    distractors = _grow_distractors(canvas, rng, params)

    origin = int(rng.integers(2))
    start = targets[origin][0]
    end = targets[origin if label == 1 else 1 - origin][-1]
    marker_pix = [start[0] + geo.tail_pix[start[1]], end[0] + geo.head_pix[end[1]]]
    markers = [_grid_yx(geo, start[0]) + geo.tail_vec[start[1]], _grid_yx(geo, end[0]) + geo.head_vec[end[1]]]
    image = _render(params, geo, [*targets, *distractors], markers, contrast)
    return image, label, _target_mask(params, geo, targets, marker_pix)


# ----------------------------------------------------------------------------------------- dataset I/O


def label_for_index(seed: int, index: int) -> int:
    """Label of global image ``index``: exactly balanced within each pair, random order inside the pair."""
    bit = int(np.random.SeedSequence([seed, 1, index // 2]).generate_state(1)[0]) & 1
    return (index % 2) ^ bit


@dataclass(frozen=True)
class _Chunk:
    """A work unit: images ``start .. start + count - 1`` of folder ``folder``."""

    root: str
    params: PathfinderParams
    seed: int
    folder: int
    start: int
    count: int
    images_per_folder: int
    write_masks: bool


def _save_png(array: np.ndarray, path: Path) -> None:
    Image.fromarray(array).save(path, format="PNG")  # 2-D uint8 -> mode L


def _run_chunk(chunk: _Chunk) -> tuple[int, int, list[list[str]]]:
    """Generate and write the images of one chunk; return its metadata rows."""
    root, params = Path(chunk.root), chunk.params
    img_dir = root / "imgs" / str(chunk.folder)
    mask_dir = root / "masks" / str(chunk.folder)
    img_dir.mkdir(parents=True, exist_ok=True)
    if chunk.write_masks:
        mask_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    for i in range(chunk.start, chunk.start + chunk.count):
        g = chunk.folder * chunk.images_per_folder + i
        rng = np.random.default_rng([chunk.seed, 0, g])
        margin = int(rng.choice(params.paddle_margin_list))
        image, label, mask = make_sample(rng, params, label_for_index(chunk.seed, g), paddle_margin=margin)
        name = f"sample_{i}.png"
        _save_png(image, img_dir / name)
        if chunk.write_masks:
            _save_png(mask, mask_dir / name)
        rows.append([f"imgs/{chunk.folder}", name, str(i), str(label), *params.metadata_tail(margin)])
    return chunk.folder, chunk.start, rows


def _write_metadata(path: Path, rows: list[list[str]], metadata_format: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if metadata_format == "npy":
        with open(path, "wb") as fh:
            np.save(fh, np.array(rows, dtype=str))
    else:
        path.write_text("".join(" ".join(row) + "\n" for row in rows))


def read_metadata(path: str | Path) -> list[list[str]]:
    """Rows of a metadata file in either format (binary ``np.save`` sniffed by its magic, else text)."""
    data = Path(path).read_bytes()
    if data.startswith(b"\x93NUMPY"):
        arr = np.load(path, allow_pickle=False)
        return [[str(v) for v in row] if arr.ndim == 2 else str(row).split(" ") for row in arr]
    return [line.split(" ") for line in data.decode().splitlines() if line.strip()]


def _chunks(
    root: Path, params: PathfinderParams, seed: int, num_images: int, images_per_folder: int, write_masks: bool
) -> Iterator[_Chunk]:
    for folder in range(math.ceil(num_images / images_per_folder)):
        n = min(images_per_folder, num_images - folder * images_per_folder)
        for start in range(0, n, _CHUNK):
            yield _Chunk(str(root), params, seed, folder, start, min(_CHUNK, n - start), images_per_folder, write_masks)


def generate(
    out_dir: str | Path,
    resolution: int = 32,
    contour_length: int = 14,
    num_images: int = 1000,
    seed: int = 0,
    workers: int = 1,
    *,
    images_per_folder: int = 1000,
    write_masks: bool = False,
    metadata_format: str = "text",
    progress: bool = False,
) -> Path:
    """Write ``num_images`` stimuli in the official layout and return the difficulty directory.

    ``out_dir/pathfinder{resolution}/{difficulty_dir}`` gets ``imgs/``, ``metadata/`` (and ``masks/``); a
    folder's metadata file is written as soon as all its images are, so a killed run leaves usable folders.
    The output depends only on ``seed`` and ``contour_length``/``resolution``, never on ``workers``.
    """
    if metadata_format not in ("text", "npy"):
        raise ValueError(f"metadata_format must be 'text' or 'npy', got {metadata_format!r}")
    if num_images < 1 or images_per_folder < 1 or workers < 1 or seed < 0:
        raise ValueError("num_images, images_per_folder and workers must be >= 1, seed >= 0")
    params = PathfinderParams.for_resolution(resolution, contour_length)
    root = Path(out_dir) / f"pathfinder{resolution}" / params.difficulty_dir
    chunks = list(_chunks(root, params, seed, num_images, images_per_folder, write_masks))
    left = collections.Counter(chunk.folder for chunk in chunks)
    parts: dict[int, dict[int, list[list[str]]]] = {}
    with _progress_bar(progress, num_images, f"pathfinder{resolution}/{params.difficulty_dir}") as advance:
        for folder, start, chunk_rows in _map(chunks, workers):
            parts.setdefault(folder, {})[start] = chunk_rows
            advance(len(chunk_rows))
            left[folder] -= 1
            if left[folder] == 0:
                done = parts.pop(folder)
                rows = [row for start in sorted(done) for row in done[start]]
                _write_metadata(root / "metadata" / f"{folder}.npy", rows, metadata_format)
    return root


def _map(chunks: list[_Chunk], workers: int) -> Iterator[tuple[int, int, list[list[str]]]]:
    """Run the chunks inline (one worker) or on a process pool, yielding results as they finish."""
    if workers == 1 or len(chunks) == 1:
        yield from map(_run_chunk, chunks)
        return
    with mp.get_context().Pool(min(workers, len(chunks))) as pool:
        yield from pool.imap_unordered(_run_chunk, chunks)


@contextlib.contextmanager
def _progress_bar(enabled: bool, total: int, description: str) -> Iterator[Callable[[int], None]]:
    """A ``rich`` progress bar when enabled, else a no-op; yields an ``advance(n)`` callable."""
    if not enabled:
        yield lambda n: None
        return

    columns = (
        rp.TextColumn("{task.description}"),
        rp.BarColumn(),
        rp.MofNCompleteColumn(),
        rp.TimeElapsedColumn(),
        rp.TimeRemainingColumn(),
    )
    with rp.Progress(*columns) as bar:
        task = bar.add_task(description, total=total)
        yield lambda n: bar.advance(task, n)


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point (``python -m tasks.generate.pathfinder``)."""
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    default = {name: param.default for name, param in inspect.signature(generate).parameters.items()}
    parser.add_argument("--out", dest="out_dir", metavar="OUT", required=True, type=Path, help="output root")
    parser.add_argument("--resolution", type=int, default=default["resolution"], choices=sorted(_TABLE))
    parser.add_argument(
        "--contour-length", type=int, default=default["contour_length"], help="6 (curv_baseline), 9 or 14"
    )
    parser.add_argument("--num-images", type=int, required=True)
    parser.add_argument("--seed", type=int, default=default["seed"])
    parser.add_argument("--workers", type=int, default=default["workers"])
    parser.add_argument("--images-per-folder", type=int, default=default["images_per_folder"])
    parser.add_argument("--write-masks", action="store_true", help="also write masks/<k>/sample_<i>.png")
    parser.add_argument("--metadata-format", choices=("text", "npy"), default=default["metadata_format"])
    root = generate(**vars(parser.parse_args(argv)), progress=True)  # the options are generate's parameters
    print(root)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
