"""Drawing the toy scenes: shapes, backgrounds, occlusion rules, masks to COCO polygons.

numpy + OpenCV only.  :mod:`.toy_data` writes what these functions draw into the COCO /
ADE20K folder layouts; this module knows nothing of files.
"""
from typing import List, Optional, Sequence, Tuple

import cv2
import numpy as np

__all__ = ['MIN_VISIBLE_AREA', 'render_scene', 'clean_mask', 'mask_to_polygons']

# Object extent as a fraction of the shorter image side.
_SIZE_RANGE = (0.12, 0.45)
# Unoccluded shapes smaller than this fraction of the image are enlarged, so
# that thin classes (triangles, stars) are not dropped more often than others.
_MIN_FULL_AREA = 0.015
# Visible-area threshold below which a detection annotation is dropped.
MIN_VISIBLE_AREA = 0.01
# Fraction of every image left as background.
_MIN_BACKGROUND = 0.1
# A later shape may hide at most 60% of an earlier one.
_MIN_VISIBLE_FRACTION = 0.4
# Connected pieces of a visible mask smaller than this many pixels (slivers
# left next to an occluder) are not annotated.
_MIN_PIECE_PIXELS = 8
# Polygons are traced on the mask upsampled by this factor, so that they run
# just inside the pixel outline and rasterise back to (almost) the same pixels.
_POLY_UPSAMPLE = 4
# Douglas-Peucker tolerance of the polygons, in original pixels.
_POLY_EPSILON = 0.4
# Minimum RGB distance between an object colour and what it covers.
_MIN_CONTRAST = 110.0


def _shape_vertices(rng: np.random.Generator, name: str, extent: float) -> np.ndarray:
    """Vertices (N, 2) in pixels of one shape centred on the origin.

    ``extent`` is the shape's nominal size (diameter / long side).  Circles
    and ellipses are polygons with many vertices, so every class is drawn by
    the same sub-pixel ``cv2.fillPoly`` call.
    """
    angle = rng.uniform(0.0, np.pi)
    if name == 'circle':
        t = np.linspace(0.0, 2 * np.pi, 96, endpoint=False)
        return 0.5 * extent * np.stack([np.cos(t), np.sin(t)], 1)  # rotation does not matter
    if name == 'ellipse':
        # Clearly elongated, so ellipses are not confused with circles.
        t = np.linspace(0.0, 2 * np.pi, 96, endpoint=False)
        minor = rng.uniform(0.35, 0.6)
        pts = 0.5 * extent * np.stack([np.cos(t), minor * np.sin(t)], 1)
    elif name == 'rectangle':
        aspect = rng.uniform(0.45, 1.0)
        hx, hy = 0.5 * extent, 0.5 * extent * aspect
        pts = np.array([[-hx, -hy], [hx, -hy], [hx, hy], [-hx, hy]])
    elif name == 'triangle':
        # Jittered equilateral triangle: irregular but never degenerate.
        t = np.array([0.0, 2 * np.pi / 3, 4 * np.pi / 3]) + rng.uniform(-0.2, 0.2, 3)
        pts = 0.58 * extent * np.stack([np.cos(t), np.sin(t)], 1)
    elif name == 'star':
        t = np.arange(10) * np.pi / 5
        radius = np.where(np.arange(10) % 2 == 0, 0.55, 0.55 * rng.uniform(0.45, 0.55))
        pts = extent * radius[:, None] * np.stack([np.cos(t), np.sin(t)], 1)
    else:  # pragma: no cover - guarded by the class tuples
        raise ValueError(f'unknown shape {name!r}')
    rot = np.array([[np.cos(angle), -np.sin(angle)], [np.sin(angle), np.cos(angle)]])
    return pts @ rot.T


def _fill(h: int, w: int, pts: np.ndarray) -> np.ndarray:
    """Rasterise a polygon into a boolean (h, w) mask (1/16 px precision)."""
    mask = np.zeros((h, w), np.uint8)
    cv2.fillPoly(mask, [np.round(pts * 16).astype(np.int32)], 1, cv2.LINE_8, 4)
    return mask.astype(bool)


def _has_hole(mask: np.ndarray) -> bool:
    """Whether a boolean mask has a hole (COCO polygons cannot express one)."""
    _, hierarchy = cv2.findContours(mask.astype(np.uint8), cv2.RETR_CCOMP,
                                    cv2.CHAIN_APPROX_SIMPLE)
    # With RETR_CCOMP, inner (hole) contours are the ones with a parent.
    return hierarchy is not None and bool((hierarchy[0, :, 3] >= 0).any())


def _background(rng: np.random.Generator, h: int, w: int) -> np.ndarray:
    """Smooth random colour gradient plus blurred noise texture, float32 RGB."""
    # A coarse random colour grid upsampled with cubic interpolation gives
    # smooth, varied gradients.  Mid-range values leave room for contrast.
    gh, gw = rng.integers(2, 5, size=2)
    grid = rng.uniform(40.0, 215.0, size=(gh, gw, 3)).astype(np.float32)
    bg = cv2.resize(grid, (w, h), interpolation=cv2.INTER_CUBIC)
    # Blurred noise at a random scale: texture that is not a shape edge.
    noise = rng.standard_normal((h, w, 3), dtype=np.float32)
    sigma = float(rng.uniform(1.0, 4.0))
    noise = cv2.GaussianBlur(noise, (0, 0), sigma)
    noise *= float(rng.uniform(8.0, 22.0)) / max(float(noise.std()), 1e-6)
    # Mostly luminance noise (shared across channels) with a little chroma.
    lum = noise.mean(axis=2, keepdims=True)
    bg += 0.7 * lum + 0.3 * noise
    return bg


def _pick_colour(rng: np.random.Generator, covered: np.ndarray) -> np.ndarray:
    """A random RGB colour far enough from the mean colour it will cover."""
    candidates = rng.uniform(0.0, 255.0, size=(12, 3))
    dist = np.linalg.norm(candidates - covered[None], axis=1)
    ok = np.flatnonzero(dist >= _MIN_CONTRAST)
    return candidates[ok[0]] if ok.size else candidates[int(dist.argmax())]


def _texture(rng: np.random.Generator, h: int, w: int) -> Optional[np.ndarray]:
    """Brightness offsets (h, w) for one object: stripes, noise or nothing."""
    kind = rng.uniform()
    if kind < 0.45:
        # Straight stripes of random period / direction / strength.
        theta = rng.uniform(0.0, np.pi)
        period = rng.uniform(5.0, 14.0)
        amp = rng.uniform(15.0, 35.0)
        yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
        phase = (xx * np.cos(theta) + yy * np.sin(theta)) * (2 * np.pi / period)
        return (amp * np.sign(np.sin(phase + rng.uniform(0, 2 * np.pi)))).astype(np.float32)
    if kind < 0.75:
        noise = rng.standard_normal((h, w), dtype=np.float32)
        noise = cv2.GaussianBlur(noise, (0, 0), 1.5)
        return noise * (10.0 / max(float(noise.std()), 1e-6))
    return None


def _draw_scene(rng: np.random.Generator, h: int, w: int, classes: Sequence[str]
                  ) -> Tuple[np.ndarray, np.ndarray, List[int]]:
    """Draw one image.

    Returns:
        tuple: ``(image, inst, labels)``: the uint8 RGB image (h, w, 3), the
        int32 instance map (0 background, ``i + 1`` visible pixels of object
        ``i``) and the class index of every object.
    """
    side = min(h, w)
    min_full = _MIN_FULL_AREA * h * w
    min_visible = MIN_VISIBLE_AREA * h * w
    image = _background(rng, h, w)
    inst = np.zeros((h, w), np.int32)
    full_areas: List[int] = []
    centres: List[Tuple[float, float, float]] = []  # (cx, cy, radius)
    labels: List[int] = []

    num_objects = int(rng.integers(1, 5))
    for _ in range(num_objects):
        label = int(rng.integers(len(classes)))
        extent = rng.uniform(*_SIZE_RANGE) * side
        for _grow in range(4):
            pts = _shape_vertices(rng, classes[label], extent)
            # Shoelace area of the polygon: cheap check before rasterising.
            area = 0.5 * abs(np.dot(pts[:, 0], np.roll(pts[:, 1], 1)) -
                             np.dot(pts[:, 1], np.roll(pts[:, 0], 1)))
            if area >= min_full:
                break
            extent *= 1.2
        lo, hi = pts.min(0), pts.max(0)
        radius = float(np.linalg.norm(hi - lo) / 2)
        # Keep the whole shape inside the image (x range, y range).
        x_rng = (-lo[0], w - 1 - hi[0])
        y_rng = (-lo[1], h - 1 - hi[1])
        if x_rng[0] > x_rng[1] or y_rng[0] > y_rng[1]:
            continue
        counts = np.bincount(inst.ravel(), minlength=len(labels) + 1)
        placed = None
        for _try in range(12):
            if centres and rng.uniform() < 0.5:
                # Next to an existing object, so that overlaps are common.
                cx0, cy0, r0 = centres[int(rng.integers(len(centres)))]
                ang = rng.uniform(0, 2 * np.pi)
                dist = (r0 + radius) * rng.uniform(0.45, 0.85)
                cx = float(np.clip(cx0 + dist * np.cos(ang), *x_rng))
                cy = float(np.clip(cy0 + dist * np.sin(ang), *y_rng))
            else:
                cx, cy = rng.uniform(*x_rng), rng.uniform(*y_rng)
            mask = _fill(h, w, pts + np.array([cx, cy]))
            covered = np.bincount(inst[mask], minlength=len(labels) + 1)
            remaining = counts - covered
            hit = np.flatnonzero(covered[1:]) + 1
            # Every earlier object keeps a recognisable, hole-free visible part.
            if any(remaining[i] < max(_MIN_VISIBLE_FRACTION * full_areas[i - 1],
                                      1.5 * min_visible) for i in hit):
                continue
            # Some background stays visible (the semantic set needs it).
            if remaining[0] < _MIN_BACKGROUND * h * w:
                continue
            if any(_has_hole((inst == i) & ~mask) for i in hit):
                continue
            placed = (mask, cx, cy)
            break
        if placed is None:
            continue
        mask, cx, cy = placed
        labels.append(label)
        full_areas.append(int(mask.sum()))
        centres.append((cx, cy, radius))
        inst[mask] = len(labels)

        # Colour contrasting with what the object covers (background and
        # earlier objects), plus an optional texture.
        colour = _pick_colour(rng, image[mask].mean(axis=0))
        tex = _texture(rng, h, w)
        pix = np.broadcast_to(colour.astype(np.float32), (int(mask.sum()), 3))
        if tex is not None:
            pix = pix + tex[mask][:, None]
        image[mask] = pix

    # Mild sensor noise over everything so shapes are not perfectly flat.
    image += 2.0 * rng.standard_normal(image.shape, dtype=np.float32)
    return np.clip(np.rint(image), 0, 255).astype(np.uint8), inst, labels


def render_scene(rng: np.random.Generator, h: int, w: int, classes: Sequence[str]
                 ) -> Tuple[np.ndarray, np.ndarray, List[int]]:
    """:func:`_draw_scene` retried until at least one object is drawn."""
    for _ in range(20):
        image, inst, labels = _draw_scene(rng, h, w, classes)
        visible = np.bincount(inst.ravel(), minlength=len(labels) + 1)[1:]
        if (visible >= MIN_VISIBLE_AREA * h * w).any():
            return image, inst, labels
    raise RuntimeError('could not place any object; image_size is too small')  # pragma: no cover


def clean_mask(mask: np.ndarray) -> np.ndarray:
    """Drop connected pieces smaller than ``_MIN_PIECE_PIXELS`` (slivers)."""
    n, cc, stats, _ = cv2.connectedComponentsWithStats(mask.astype(np.uint8), connectivity=8)
    if n <= 2:
        return mask
    keep = np.zeros(n, bool)
    keep[1:] = stats[1:, cv2.CC_STAT_AREA] >= _MIN_PIECE_PIXELS
    return keep[cc]


def mask_to_polygons(mask: np.ndarray) -> List[List[float]]:
    """Polygons (COCO ``[x1, y1, x2, y2, ...]``) of a hole-free boolean mask.

    The contour is traced on the mask upsampled ``_POLY_UPSAMPLE`` times, so
    it follows the pixel outline (1/8 px inside it) instead of joining the
    centres of the boundary pixels, which would lose half of every boundary
    pixel (up to 20% of a small object).  pycocotools rasterises these
    polygons back to the same pixels, so ``area`` matches ``annToMask``.
    """
    ys, xs = np.nonzero(mask)
    y0, x0 = int(ys.min()), int(xs.min())
    crop = mask[y0:int(ys.max()) + 1, x0:int(xs.max()) + 1].astype(np.uint8)
    k = _POLY_UPSAMPLE
    up = np.pad(np.kron(crop, np.ones((k, k), np.uint8)), 1)
    contours, _ = cv2.findContours(up, cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_SIMPLE)
    polygons = []
    for contour in contours:
        # Straighten the staircase (40% fewer vertices); a 0.4 px tolerance
        # keeps every pixel centre on its side of the outline.
        contour = cv2.approxPolyDP(contour, _POLY_EPSILON * k, True)
        pts = contour.reshape(-1, 2).astype(np.float64)
        if len(pts) < 3:
            continue
        # Upsampled pixel u (after the 1-pixel pad) has its centre at
        # original coordinate (u - 1 + 0.5) / k, pixel i covering [i, i + 1).
        pts = (pts - 0.5) / k + np.array([x0, y0])
        polygons.append([round(float(v), 4) for v in pts.ravel()])
    return polygons
