"""Deterministic synthetic "shapes" data in COCO-instance and ADE20K-style semantic formats.

Every scene is a textured background (smooth noise, a linear gradient or stripes) with 1..N
coloured squares, discs, triangles and stars of widely varying size. Shapes are painted in order,
so a later shape occludes earlier ones; the annotations describe the *visible* part of each
shape, so the visible masks of one image never overlap. A shape is only placed if it leaves every
shape under it at least ``MIN_VISIBLE_FRACTION`` of its area, so no annotated object is a sliver.
Colour does not depend on the class: a model has to look at the outline.

Written files (``make_shapes(out_dir, ...)``)::

    out_dir/coco/annotations/instances_{train,val}.json   COCO instances, RLE masks (pycocotools)
    out_dir/coco/{train,val}/000000.jpg ...
    out_dir/ade/images/{training,validation}/000000.jpg   the same scenes
    out_dir/ade/annotations/{training,validation}/000000.png   uint8 labels: 0 background, 1..4

The label PNGs follow ADE20K's layout (0 is "not an object"). Unlike ADE20K, whose 0 means
"unlabelled" and is dropped with ``reduce_zero_label=True``, here 0 is a real class that a model
must predict, so :class:`ShapesSegDataset` keeps it (5 classes, ``reduce_zero_label=False``).
With ``reduce_zero_label=True`` it switches to ADE20K semantics: 0 -> 255 (ignored), k -> k-1,
4 classes (the shapes only).
"""
import json
import math
import os
import os.path as osp
from typing import Dict, List, Optional, Sequence, Tuple

import cv2
import numpy as np
from mmseg.datasets import BaseSegDataset
from pycocotools import mask as mask_utils

from ..registry import DATASETS
from ...core.validate import (check_bool, check_int, check_int_sequence, check_non_negative_int,
                        check_optional_dict, check_positive_int)

SHAPE_CLASSES: Tuple[str, ...] = ('square', 'disc', 'triangle', 'star')
# The demos' data (tools/make_shapes.py's defaults). 500 val images: on 100, the box mAP of one
# trained model moved by 0.03 (std) from one 100-image draw to the next.
DEFAULT_NUM_TRAIN, DEFAULT_NUM_VAL, DEFAULT_IMAGE_SIZE, DEFAULT_SEED = 1000, 500, (128, 128), 0
SEG_CLASSES: Tuple[str, ...] = ('background', ) + SHAPE_CLASSES
# RGB; background dark grey, shapes in colours that do not collide with the fill colours' mean.
SEG_PALETTE: List[List[int]] = [[40, 40, 40], [230, 25, 75], [60, 180, 75], [0, 130, 200],
                                [255, 225, 25]]
# Fill colours (RGB), chosen independently of the class.
FILL_COLOURS = np.array([[220, 40, 40], [40, 180, 60], [40, 90, 230], [240, 220, 40],
                         [200, 60, 200], [40, 210, 210], [250, 140, 30], [245, 245, 245]],
                        dtype=np.float32)
MIN_VISIBLE_FRACTION = 0.4
MIN_VISIBLE_PIXELS = 24


# ----------------------------------------------------------------------------- geometry
def shape_polygon(kind: str, center: Tuple[float, float], radius: float,
                  angle: float) -> np.ndarray:
    """Vertices ``(K, 2)`` as (x, y) of a shape inscribed in a circle of ``radius``."""
    if kind == 'square':
        k, radii = 4, np.full(4, radius)
    elif kind == 'triangle':
        k, radii = 3, np.full(3, radius)
    elif kind == 'star':
        k = 10
        radii = np.where(np.arange(k) % 2 == 0, radius, radius * 0.45)
    elif kind == 'disc':
        k, radii = 64, np.full(64, radius)
    else:
        raise ValueError(f'kind must be one of {SHAPE_CLASSES}, got {kind!r}')
    theta = angle + 2 * math.pi * np.arange(k) / k
    return np.stack([center[0] + radii * np.cos(theta), center[1] + radii * np.sin(theta)], 1)


def rasterize(polygon: np.ndarray, hw: Tuple[int, int]) -> np.ndarray:
    """Binary mask ``(H, W)`` bool of a polygon ``(K, 2)`` given in COCO's continuous (x, y).

    A pixel is inside when its centre ``(i + 0.5, j + 0.5)`` is (even-odd rule), so a
    square spanning [10, 30) covers exactly 20 x 20 pixels; cv2.fillPoly would also paint the
    boundary row and column and make masks one pixel larger than their polygon.
    """
    h, w = hw
    mask = np.zeros(hw, dtype=bool)
    x0, x1 = max(0, int(np.floor(polygon[:, 0].min()))), min(w, int(np.ceil(polygon[:, 0].max())))
    y0, y1 = max(0, int(np.floor(polygon[:, 1].min()))), min(h, int(np.ceil(polygon[:, 1].max())))
    if x0 >= x1 or y0 >= y1:
        return mask
    px = np.arange(x0, x1, dtype=np.float64)[None, :] + 0.5
    py = np.arange(y0, y1, dtype=np.float64)[:, None] + 0.5
    inside = np.zeros((y1 - y0, x1 - x0), dtype=bool)
    for (xa, ya), (xb, yb) in zip(polygon, np.roll(polygon, -1, axis=0)):
        if ya == yb:  # a horizontal edge never crosses the horizontal ray
            continue
        crosses = (ya > py) != (yb > py)
        x_at = xa + (xb - xa) * (py - ya) / (yb - ya)
        inside ^= crosses & (px < x_at)
    mask[y0:y1, x0:x1] = inside
    return mask


# ----------------------------------------------------------------------------- textures
def _smooth_noise(rng: np.random.Generator, hw: Tuple[int, int], cells: int) -> np.ndarray:
    """Low-frequency noise ``(H, W, 3)`` in [0, 1]: a coarse random grid upsampled bicubically."""
    coarse = rng.random((cells, cells, 3)).astype(np.float32)
    return np.clip(cv2.resize(coarse, (hw[1], hw[0]), interpolation=cv2.INTER_CUBIC), 0, 1)


def _muted_colour(rng: np.random.Generator) -> np.ndarray:
    """A low-saturation colour, so saturated shape fills stand out from most backgrounds."""
    grey = rng.uniform(50, 200)
    return np.clip(grey + rng.normal(0, 25, 3), 0, 255).astype(np.float32)


def background(rng: np.random.Generator, hw: Tuple[int, int]) -> np.ndarray:
    """A textured background ``(H, W, 3)`` float32 RGB in [0, 255]."""
    h, w = hw
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    kind = rng.integers(3)
    c0, c1 = _muted_colour(rng), _muted_colour(rng)
    if kind == 0:  # smooth noise between two colours
        t = _smooth_noise(rng, hw, int(rng.integers(3, 9)))[..., :1]
    elif kind == 1:  # linear gradient in a random direction
        a = rng.uniform(0, 2 * math.pi)
        proj = xx * math.cos(a) + yy * math.sin(a)
        t = ((proj - proj.min()) / max(float(np.ptp(proj)), 1e-6))[..., None]
    else:  # stripes of a random period and angle
        a = rng.uniform(0, math.pi)
        period = rng.uniform(6, 40)
        proj = xx * math.cos(a) + yy * math.sin(a)
        t = (0.5 + 0.5 * np.sin(2 * math.pi * proj / period))[..., None]
    img = c0 * (1 - t) + c1 * t
    return img + rng.normal(0, 6, img.shape).astype(np.float32)


def shape_fill(rng: np.random.Generator, hw: Tuple[int, int]) -> np.ndarray:
    """The paint for one shape ``(H, W, 3)``: a palette colour with jitter and linear shading."""
    h, w = hw
    colour = FILL_COLOURS[rng.integers(len(FILL_COLOURS))] + rng.normal(0, 12, 3)
    a = rng.uniform(0, 2 * math.pi)
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    ramp = (xx * math.cos(a) + yy * math.sin(a)) / max(h, w)
    shade = 0.85 + 0.3 * (ramp - ramp.min())[..., None]
    return (colour * shade).astype(np.float32)


# ----------------------------------------------------------------------------- scenes
def make_scene(rng: np.random.Generator, hw: Tuple[int, int], max_objects: int = 5,
               size_range: Tuple[float, float] = (0.05, 0.3)) -> Tuple[np.ndarray, List[dict]]:
    """One image ``(H, W, 3)`` uint8 RGB and its instances, bottom to top.

    Each instance is ``dict(category_id=1..4, mask=(H, W) bool visible mask, full_area=pixels
    of the whole shape inside the image)``. Radii are
    log-uniform in ``size_range`` times ``min(H, W)`` (at least 4 px).
    """
    h, w = hw
    img = background(rng, hw)
    visible: List[np.ndarray] = []
    full_area: List[int] = []
    labels: List[int] = []
    lo = math.log(max(4.0, size_range[0] * min(h, w)))
    hi = math.log(max(4.5, size_range[1] * min(h, w)))
    for _ in range(int(rng.integers(1, max_objects + 1))):
        for _attempt in range(10):
            label = int(rng.integers(len(SHAPE_CLASSES)))
            radius = math.exp(rng.uniform(lo, hi))
            # The centre may sit near the border, so some shapes are cut by the image edge.
            center = (rng.uniform(0.15 * radius, w - 0.15 * radius),
                      rng.uniform(0.15 * radius, h - 0.15 * radius))
            mask = rasterize(
                shape_polygon(SHAPE_CLASSES[label], center, radius, rng.uniform(0, 2 * math.pi)),
                hw)
            area = int(mask.sum())
            if area < MIN_VISIBLE_PIXELS:
                continue
            # Accept only if every shape underneath keeps enough of itself.
            if all((v & ~mask).sum() >= max(MIN_VISIBLE_FRACTION * a, MIN_VISIBLE_PIXELS)
                   for v, a in zip(visible, full_area)):
                break
        else:
            continue
        visible = [v & ~mask for v in visible]
        visible.append(mask)
        full_area.append(area)
        labels.append(label + 1)
        img[mask] = shape_fill(rng, hw)[mask] + rng.normal(0, 4, (area, 3))
    img = np.clip(img, 0, 255).astype(np.uint8)
    return img, [dict(category_id=c, mask=m, full_area=a)
                 for c, m, a in zip(labels, visible, full_area)]


def coco_annotation(mask: np.ndarray, ann_id: int, image_id: int, category_id: int) -> dict:
    """A COCO instance annotation with a compressed RLE of ``mask`` (bbox xywh from the RLE)."""
    rle = mask_utils.encode(np.asfortranarray(mask.astype(np.uint8)))
    bbox = [float(v) for v in mask_utils.toBbox(rle)]
    rle['counts'] = rle['counts'].decode('ascii')
    return dict(id=ann_id, image_id=image_id, category_id=category_id, segmentation=rle,
                area=float(mask_utils.area(rle)), bbox=bbox, iscrowd=0)


def semantic_label(instances: Sequence[dict], hw: Tuple[int, int]) -> np.ndarray:
    """Label map ``(H, W)`` uint8: 0 background, ``category_id`` where a shape is visible."""
    label = np.zeros(hw, dtype=np.uint8)
    for inst in instances:
        label[inst['mask']] = inst['category_id']
    return label


def _check_args(num_train, num_val, image_size, seed, max_objects) -> Tuple[int, int]:
    for name, value in (('num_train', num_train), ('num_val', num_val)):
        check_non_negative_int(name, value)
    hw = check_int_sequence('image_size', image_size, length=2, low=32)
    check_int('seed', seed, low=0)
    check_positive_int('max_objects', max_objects)
    return hw[0], hw[1]


def make_shapes(out_dir: str, num_train: int = DEFAULT_NUM_TRAIN,
                num_val: int = DEFAULT_NUM_VAL,
                image_size: Tuple[int, int] = DEFAULT_IMAGE_SIZE, seed: int = DEFAULT_SEED,
                max_objects: int = 5) -> Dict[str, object]:
    """Generate the shapes data set under ``out_dir`` (layout in the module docstring).

    The output depends only on the arguments: the same call writes byte-identical JSON and
    identical images. Train and val scenes come from independent streams of ``seed``.
    Returns a summary: the paths written and the image/instance counts per split.
    """
    hw = _check_args(num_train, num_val, image_size, seed, max_objects)
    coco_dir, ade_dir = osp.join(out_dir, 'coco'), osp.join(out_dir, 'ade')
    categories = [dict(id=i + 1, name=n, supercategory='shape')
                  for i, n in enumerate(SHAPE_CLASSES)]
    summary: Dict[str, object] = dict(out_dir=out_dir, coco_dir=coco_dir, ade_dir=ade_dir,
                                      image_size=hw, classes=SHAPE_CLASSES)
    jpeg = [int(cv2.IMWRITE_JPEG_QUALITY), 95]
    for split, ade_split, count, stream in (('train', 'training', num_train, 0),
                                            ('val', 'validation', num_val, 1)):
        rng = np.random.default_rng([seed, stream])
        dirs = dict(coco=osp.join(coco_dir, split),
                    ade_img=osp.join(ade_dir, 'images', ade_split),
                    ade_ann=osp.join(ade_dir, 'annotations', ade_split))
        for d in list(dirs.values()) + [osp.join(coco_dir, 'annotations')]:
            os.makedirs(d, exist_ok=True)
        images, annotations = [], []
        for idx in range(count):
            img, instances = make_scene(rng, hw, max_objects=max_objects)
            name = f'{idx:06d}'
            bgr = np.ascontiguousarray(img[..., ::-1])
            cv2.imwrite(osp.join(dirs['coco'], name + '.jpg'), bgr, jpeg)
            cv2.imwrite(osp.join(dirs['ade_img'], name + '.jpg'), bgr, jpeg)
            cv2.imwrite(osp.join(dirs['ade_ann'], name + '.png'), semantic_label(instances, hw))
            images.append(dict(id=idx + 1, file_name=name + '.jpg', height=hw[0], width=hw[1]))
            for inst in instances:
                annotations.append(coco_annotation(inst['mask'], len(annotations) + 1, idx + 1,
                                                   inst['category_id']))
        ann_file = osp.join(coco_dir, 'annotations', f'instances_{split}.json')
        with open(ann_file, 'w') as f:
            json.dump(dict(info=dict(description='mmvitswin synthetic shapes', seed=seed),
                           images=images, annotations=annotations, categories=categories), f)
        summary[split] = dict(ann_file=ann_file, images=count, instances=len(annotations))
    return summary


def shapes_exist(out_dir: str) -> bool:
    """Whether ``out_dir`` already holds both COCO annotation files and the ADE folders."""
    needed = [osp.join(out_dir, 'coco', 'annotations', f'instances_{s}.json')
              for s in ('train', 'val')]
    needed += [osp.join(out_dir, 'ade', k, s) for k in ('images', 'annotations')
               for s in ('training', 'validation')]
    return all(osp.exists(p) for p in needed)


def shapes_summary(out_dir: str) -> Optional[Dict[str, object]]:
    """What the shapes data under ``out_dir`` holds, read from its COCO annotation files:
    ``dict(seed, image_size, train, val)`` (image counts; ``image_size`` (H, W) of the first
    train image), or None where :func:`shapes_exist` is False."""
    if not shapes_exist(out_dir):
        return None
    out: Dict[str, object] = {}
    for split in ('train', 'val'):
        with open(osp.join(out_dir, 'coco', 'annotations', f'instances_{split}.json')) as f:
            data = json.load(f)
        out[split] = len(data['images'])
        if split == 'train':
            out['seed'] = data.get('info', {}).get('seed')
            first = data['images'][0] if data['images'] else {}
            out['image_size'] = (first.get('height'), first.get('width'))
    return out


# ----------------------------------------------------------------------------- mmseg dataset
@DATASETS.register_module()
class ShapesSegDataset(BaseSegDataset):
    """The ADE20K-style half of the shapes data for mmseg (images ``.jpg``, labels ``.png``).

    Default: 5 classes with 0 = background (``reduce_zero_label=False``). With
    ``reduce_zero_label=True``: ADE20K semantics, 0 ignored and the 4 shapes as classes 0..3.
    """
    METAINFO = dict(classes=SEG_CLASSES, palette=SEG_PALETTE)

    def __init__(self, img_suffix: str = '.jpg', seg_map_suffix: str = '.png',
                 reduce_zero_label: bool = False, metainfo: Optional[dict] = None, **kwargs):
        for name, value in (('img_suffix', img_suffix), ('seg_map_suffix', seg_map_suffix)):
            if not isinstance(value, str):
                raise TypeError(f'{name} must be a str (file name ending), got {value!r}')
        check_bool('reduce_zero_label', reduce_zero_label)
        check_optional_dict('metainfo', metainfo)
        if reduce_zero_label:
            metainfo = dict(metainfo or {})
            classes = tuple(metainfo.setdefault('classes', SHAPE_CLASSES))
            if classes != SHAPE_CLASSES:
                raise ValueError(f'with reduce_zero_label=True the classes must be '
                                 f'{SHAPE_CLASSES} (labels 1..4 become 0..3), got {classes}')
            metainfo.setdefault('palette', SEG_PALETTE[1:])
        self._drops_background = bool(reduce_zero_label)
        super().__init__(img_suffix=img_suffix, seg_map_suffix=seg_map_suffix,
                         reduce_zero_label=reduce_zero_label, metainfo=metainfo, **kwargs)

    def get_label_map(self, new_classes: Optional[Sequence] = None):
        # The loader already shifts labels by one when reduce_zero_label is on; the name-based
        # remapping of the base class would shift them a second time.
        if self._drops_background:
            return None
        return super().get_label_map(new_classes)
