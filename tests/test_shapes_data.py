"""The generated "shapes" data: determinism, valid COCO instances, and the standard mmdet/mmseg
datasets and pipelines reading it."""
import filecmp
import json
import os.path as osp

import cv2
import numpy as np
import pytest
from pycocotools import mask as mask_utils
from pycocotools.coco import COCO

import mmvitswin  # noqa: F401  (registers ShapesSegDataset, bridges it into mmseg)
from mmvitswin.openmmlab.datasets.shapes import (SEG_CLASSES, SHAPE_CLASSES, make_scene, make_shapes,
                                       rasterize, shape_polygon, shapes_exist)

SIZE = (64, 80)


@pytest.fixture(scope='module')
def shapes_root(tmp_path_factory):
    root = tmp_path_factory.mktemp('shapes')
    summary = make_shapes(str(root / 'a'), num_train=12, num_val=6, image_size=SIZE, seed=3)
    return root, summary


def _coco(root, split='train'):
    return COCO(str(root / 'a' / 'coco' / 'annotations' / f'instances_{split}.json'))


def test_layout_and_summary(shapes_root):
    root, summary = shapes_root
    base = root / 'a'
    assert shapes_exist(str(base))
    assert summary['train']['images'] == 12 and summary['val']['images'] == 6
    for split, ade_split, n in (('train', 'training', 12), ('val', 'validation', 6)):
        for i in range(n):
            assert (base / 'coco' / split / f'{i:06d}.jpg').is_file()
            assert (base / 'ade' / 'images' / ade_split / f'{i:06d}.jpg').is_file()
            assert (base / 'ade' / 'annotations' / ade_split / f'{i:06d}.png').is_file()
    with open(summary['train']['ann_file']) as f:
        data = json.load(f)
    assert len(data['annotations']) == summary['train']['instances'] > 12
    assert [c['name'] for c in data['categories']] == list(SHAPE_CLASSES)
    assert [c['id'] for c in data['categories']] == [1, 2, 3, 4]


def test_same_seed_same_bytes_other_seed_differs(shapes_root, tmp_path):
    root, _ = shapes_root
    make_shapes(str(tmp_path / 'b'), num_train=12, num_val=6, image_size=SIZE, seed=3)
    make_shapes(str(tmp_path / 'c'), num_train=12, num_val=6, image_size=SIZE, seed=4)
    for split in ('train', 'val'):
        rel = osp.join('coco', 'annotations', f'instances_{split}.json')
        assert filecmp.cmp(root / 'a' / rel, tmp_path / 'b' / rel, shallow=False)
        assert not filecmp.cmp(root / 'a' / rel, tmp_path / 'c' / rel, shallow=False)
    for rel in ('coco/train/000005.jpg', 'ade/annotations/validation/000003.png'):
        a = cv2.imread(str(root / 'a' / rel), cv2.IMREAD_UNCHANGED)
        b = cv2.imread(str(tmp_path / 'b' / rel), cv2.IMREAD_UNCHANGED)
        np.testing.assert_array_equal(a, b)
    a = cv2.imread(str(root / 'a' / 'coco/train/000000.jpg'))
    c = cv2.imread(str(tmp_path / 'c' / 'coco/train/000000.jpg'))
    assert np.abs(a.astype(int) - c.astype(int)).mean() > 5


def test_coco_masks_boxes_areas_no_overlap(shapes_root):
    coco = _coco(shapes_root[0])
    assert sorted(coco.getCatIds()) == [1, 2, 3, 4]
    for img_id in coco.getImgIds():
        info = coco.loadImgs(img_id)[0]
        assert (info['height'], info['width']) == SIZE
        anns = coco.loadAnns(coco.getAnnIds(imgIds=img_id))
        assert 1 <= len(anns)
        union = np.zeros(SIZE, dtype=np.int32)
        for ann in anns:
            assert ann['iscrowd'] == 0 and ann['category_id'] in (1, 2, 3, 4)
            mask = coco.annToMask(ann)
            assert mask.shape == SIZE and mask.sum() == ann['area'] > 0
            ys, xs = np.nonzero(mask)
            x, y, w, h = ann['bbox']
            extent = (xs.min(), ys.min(), xs.max() + 1 - xs.min(), ys.max() + 1 - ys.min())
            np.testing.assert_allclose([x, y, w, h], extent, atol=1)
            union += mask
        assert union.max() <= 1, 'visible masks of one image overlap'


def test_occlusion_happens_and_leaves_enough_visible():
    rng = np.random.default_rng(1)
    occluded = 0
    for _ in range(40):
        _, instances = make_scene(rng, (96, 96), max_objects=5)
        union = np.zeros((96, 96), np.int32)
        for inst in instances:
            visible = int(inst['mask'].sum())
            assert 0.4 * inst['full_area'] <= visible <= inst['full_area']
            occluded += visible < inst['full_area']
            union += inst['mask']
        assert union.max() <= 1
    assert occluded >= 3


def test_rasterize_square_area_and_bad_kind():
    poly = shape_polygon('square', (20.0, 20.0), 10 * np.sqrt(2), np.pi / 4)
    mask = rasterize(poly, (40, 40))
    assert mask.sum() == 400  # an axis-aligned 20x20 square covers exactly 400 pixels
    ys, xs = np.nonzero(mask)
    assert (xs.min(), xs.max(), ys.min(), ys.max()) == (10, 29, 10, 29)
    with pytest.raises(ValueError, match='kind'):
        shape_polygon('hexagon', (0, 0), 1, 0)


@pytest.mark.parametrize('kwargs, match', [
    (dict(num_train=-1), 'num_train'),
    (dict(image_size=(16, 16)), 'image_size'),
    (dict(image_size=64), 'image_size'),
    (dict(max_objects=0), 'max_objects'),
])
def test_make_shapes_rejects_bad_arguments(tmp_path, kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):  # TypeError: not a (H, W) pair
        make_shapes(str(tmp_path), **kwargs)


def test_mmdet_coco_dataset_standard_pipeline(shapes_root):
    from mmengine.registry import init_default_scope
    from mmdet.registry import DATASETS
    init_default_scope('mmdet')
    base = shapes_root[0] / 'a' / 'coco'
    dataset = DATASETS.build(dict(
        type='CocoDataset', data_root=str(base) + '/', metainfo=dict(classes=SHAPE_CLASSES),
        ann_file='annotations/instances_train.json', data_prefix=dict(img='train/'),
        pipeline=[dict(type='LoadImageFromFile'),
                  dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
                  dict(type='PackDetInputs')]))
    coco = _coco(shapes_root[0])
    assert len(dataset) == 12
    for idx in (0, 7):
        item = dataset[idx]
        img_id = dataset.get_data_info(idx)['img_id']
        anns = coco.loadAnns(coco.getAnnIds(imgIds=img_id))
        gt = item['data_samples'].gt_instances
        assert tuple(item['inputs'].shape) == (3, ) + SIZE
        assert len(gt) == len(anns)
        # labels are 0-based category order; boxes are xyxy of the COCO xywh boxes
        np.testing.assert_array_equal(gt.labels.numpy(), [a['category_id'] - 1 for a in anns])
        xyxy = [[a['bbox'][0], a['bbox'][1], a['bbox'][0] + a['bbox'][2],
                 a['bbox'][1] + a['bbox'][3]] for a in anns]
        np.testing.assert_allclose(gt.bboxes.tensor.numpy(), xyxy, atol=1e-4)
        masks = gt.masks.to_ndarray()
        for m, a in zip(masks, anns):
            np.testing.assert_array_equal(m, coco.annToMask(a))


def test_mmseg_dataset_label_maps(shapes_root):
    from mmengine.registry import init_default_scope
    from mmseg.registry import DATASETS
    init_default_scope('mmseg')
    base = shapes_root[0] / 'a' / 'ade'
    pipeline = [dict(type='LoadImageFromFile'), dict(type='LoadAnnotations'),
                dict(type='PackSegInputs')]
    dataset = DATASETS.build(dict(
        type='ShapesSegDataset', data_root=str(base),
        data_prefix=dict(img_path='images/validation', seg_map_path='annotations/validation'),
        pipeline=pipeline))
    assert dataset.metainfo['classes'] == SEG_CLASSES and len(dataset) == 6
    coco = _coco(shapes_root[0], 'val')
    seen = set()
    for idx in range(len(dataset)):
        item = dataset[idx]
        label = item['data_samples'].gt_sem_seg.data[0].numpy()
        assert label.shape == SIZE
        assert set(np.unique(label)) <= {0, 1, 2, 3, 4}
        seen |= set(np.unique(label).tolist())
        # the label map is exactly the union of the COCO visible masks of that image
        expected = np.zeros(SIZE, np.int64)
        for ann in coco.loadAnns(coco.getAnnIds(imgIds=idx + 1)):
            expected[coco.annToMask(ann).astype(bool)] = ann['category_id']
        np.testing.assert_array_equal(label, expected)
    assert 0 in seen and len(seen) >= 3

    # ADE20K semantics: 0 ignored (255), shapes become 0..3, four class names
    reduced = DATASETS.build(dict(
        type='ShapesSegDataset', data_root=str(base), reduce_zero_label=True,
        data_prefix=dict(img_path='images/validation', seg_map_path='annotations/validation'),
        pipeline=[dict(type='LoadImageFromFile'), dict(type='LoadAnnotations',
                                                       reduce_zero_label=True),
                  dict(type='PackSegInputs')]))
    assert reduced.metainfo['classes'] == SHAPE_CLASSES
    item0 = dataset[0]['data_samples'].gt_sem_seg.data[0].numpy()
    red0 = reduced[0]['data_samples'].gt_sem_seg.data[0].numpy()
    np.testing.assert_array_equal(red0, np.where(item0 == 0, 255, item0 - 1))
    with pytest.raises(ValueError, match='reduce_zero_label'):
        DATASETS.build(dict(type='ShapesSegDataset', data_root=str(base), reduce_zero_label=True,
                            metainfo=dict(classes=SEG_CLASSES),
                            data_prefix=dict(img_path='images/validation',
                                             seg_map_path='annotations/validation')))


def test_rle_is_compressed_string(shapes_root):
    coco = _coco(shapes_root[0], 'val')
    ann = coco.loadAnns(coco.getAnnIds())[0]
    seg = ann['segmentation']
    assert isinstance(seg['counts'], str) and seg['size'] == list(SIZE)
    rle = dict(size=seg['size'], counts=seg['counts'].encode('ascii'))
    assert mask_utils.area(rle) == ann['area']
    np.testing.assert_array_equal(mask_utils.decode(rle), coco.annToMask(ann))
