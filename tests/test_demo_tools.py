"""tools/demo.py (2-iteration smoke runs of both demo configs), tools/visualize.py and
tools/make_shapes.py on tiny generated data."""
import json
import os.path as osp
import subprocess
import sys

import cv2
import numpy as np
import pytest
import torch
from mmengine.config import Config

pytestmark = [
    pytest.mark.slow(reason='runs tools/demo.py, visualize.py, make_shapes.py'),
    pytest.mark.timeout(1200),
]

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
DET_CONFIG = osp.join(ROOT, 'configs', 'demo', 'mask_rcnn_swin_nano_shapes.py')
SEG_CONFIG = osp.join(ROOT, 'configs', 'demo', 'upernet_swin_nano_shapes.py')
sys.path.insert(0, osp.join(ROOT, 'tools'))

import demo  # noqa: E402
import visualize  # noqa: E402


@pytest.fixture(scope='module')
def tiny_shapes(tmp_path_factory):
    from mmvitswin.openmmlab.datasets import make_shapes
    root = tmp_path_factory.mktemp('demo_data') / 'shapes'
    # the demo size: mmseg's class-weighted loss cannot take padded (255) pixels
    make_shapes(str(root), num_train=4, num_val=2, image_size=(128, 128), seed=1)
    return str(root)


def _run(args, timeout=600):
    proc = subprocess.run([sys.executable] + args, cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)
    if proc.returncode != 0:
        pytest.fail(f'{args} exited {proc.returncode}\n{proc.stdout[-3000:]}\n'
                    f'{proc.stderr[-3000:]}')
    return proc.stdout


def test_rebase_data_root_reaches_datasets_and_evaluator():
    cfg = Config.fromfile(DET_CONFIG)
    changed = demo.rebase_data_root(cfg, '/elsewhere/shapes')
    # train/val/test dataset roots + val/test evaluator ann_file
    assert changed == 5
    assert cfg.train_dataloader.dataset.data_root == '/elsewhere/shapes/coco/'
    assert cfg.val_dataloader.dataset.data_root == '/elsewhere/shapes/coco/'
    assert cfg.val_evaluator.ann_file == '/elsewhere/shapes/coco/annotations/instances_val.json'
    assert cfg.train_dataloader.dataset.ann_file == 'annotations/instances_train.json'
    seg = Config.fromfile(SEG_CONFIG)
    demo.rebase_data_root(seg, 'x/y')
    assert seg.val_dataloader.dataset.data_root == 'x/y/ade/'
    with pytest.raises(ValueError, match='data_root'):
        demo.rebase_data_root(Config(dict(model=dict())), 'z')


def test_feature_panels_normalise_and_reject_bad_shapes():
    feat = torch.arange(2 * 4 * 6, dtype=torch.float32).reshape(2, 4, 6)
    panel = visualize.feature_panel(feat, height=8)
    assert panel.shape == (8, 12, 3) and panel.dtype == np.uint8
    # mean over channels is a ramp: the panel's first and last pixel are the colour-map ends
    lut = cv2.applyColorMap(np.array([[0, 255]], np.uint8), cv2.COLORMAP_VIRIDIS)[0]
    np.testing.assert_array_equal(panel[0, 0], lut[0])
    np.testing.assert_array_equal(panel[-1, -1], lut[1])
    flat = visualize.feature_panel(torch.ones(3, 2, 2), height=4)  # constant map -> no NaN
    assert (flat == flat[0, 0]).all()
    with pytest.raises(ValueError, match=r'\(C, H, W\)'):
        visualize.feature_panel(torch.zeros(1, 2, 3, 4))
    grid = visualize.feature_grid([torch.rand(8, 16, 16), torch.rand(16, 8, 8)], (64, 64),
                                  height=32)
    assert grid.shape[0] == 32 + 20 and grid.shape[1] >= 2 * 150


def test_upscale_sample_scales_boxes_masks_and_label_maps():
    from mmdet.structures import DetDataSample
    from mmengine.structures import InstanceData, PixelData
    from mmseg.structures import SegDataSample
    det = DetDataSample()
    masks = torch.zeros(1, 4, 4, dtype=torch.bool)
    masks[0, 1:3, 0:2] = True
    det.pred_instances = InstanceData(bboxes=torch.tensor([[0., 1., 2., 3.]]), masks=masks,
                                      scores=torch.ones(1), labels=torch.zeros(1).long())
    big = visualize.upscale_sample(det, 3)
    assert big.pred_instances.bboxes.tolist() == [[0., 3., 6., 9.]]
    assert big.pred_instances.masks.shape == (1, 12, 12)
    assert big.pred_instances.masks[0].sum() == 9 * masks.sum()
    assert det.pred_instances.bboxes.tolist() == [[0., 1., 2., 3.]]  # input left untouched
    seg = SegDataSample()
    seg.pred_sem_seg = PixelData(data=torch.tensor([[[0, 1], [2, 3]]]))
    big = visualize.upscale_sample(seg, 2)
    assert big.pred_sem_seg.data.tolist() == [[[0, 0, 1, 1], [0, 0, 1, 1], [2, 2, 3, 3],
                                               [2, 2, 3, 3]]]


@pytest.mark.parametrize('config, image', [
    (DET_CONFIG, 'coco/val/000000.jpg'),
    (SEG_CONFIG, 'ade/images/validation/000001.jpg'),
])
def test_visualize_cli_writes_pngs_for_random_model(tiny_shapes, tmp_path, config, image):
    out = _run([osp.join('tools', 'visualize.py'), config, osp.join(tiny_shapes, image),
                '--out-dir', str(tmp_path)])
    stem = osp.splitext(osp.basename(image))[0]
    pred = cv2.imread(str(tmp_path / f'{stem}_pred.png'))
    feats = cv2.imread(str(tmp_path / f'{stem}_features.png'))
    assert f'{stem}_pred.png' in out
    # a 128 px image is drawn 3x enlarged (short side >= 384) so the labels do not hide it
    assert pred is not None and pred.shape[:2] == (384, 384) and pred.std() > 0
    # four stages side by side, each panel at least 150 px wide with its caption
    assert feats is not None and feats.shape[1] >= 4 * 150 and feats.std() > 0


def test_visualize_cli_reports_missing_files(tmp_path):
    proc = subprocess.run([sys.executable, osp.join('tools', 'visualize.py'), DET_CONFIG,
                           str(tmp_path / 'none.jpg')], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 2 and 'image not found' in proc.stderr


@pytest.mark.parametrize('seg', [False, True], ids=['mask_rcnn', 'upernet'])
def test_demo_two_iterations(tiny_shapes, tmp_path, seg):
    work = tmp_path / 'work'
    args = [osp.join('tools', 'demo.py'), '--work-dir', str(work), '--data-root', tiny_shapes,
            '--max-iters', '2', '--cfg-options', 'train_dataloader.batch_size=2',
            'train_dataloader.num_workers=0', 'train_dataloader.persistent_workers=False',
            'val_dataloader.num_workers=0', 'val_dataloader.persistent_workers=False']
    out = _run(args + (['--seg'] if seg else []))
    assert (work / 'iter_2.pth').is_file()
    with open(work / 'metrics.json') as f:
        record = json.load(f)
    assert record['max_iters'] == 2
    keys = ('mIoU', ) if seg else ('coco/bbox_mAP', 'coco/segm_mAP')
    for key in keys:
        assert key in record['metrics'] and 0 <= record['metrics'][key] <= 100
    for line in ('work dir:', 'checkpoint:', 'metrics json:', 'predictions:', 'features:'):
        assert line in out
    pred = cv2.imread(str(work / 'vis' / '000000_pred.png'))
    # ground truth on the left, prediction on the right, both enlarged 3x
    assert pred is not None and pred.shape[:2] == (384, 768)
    ckpt = torch.load(work / 'iter_2.pth', map_location='cpu', weights_only=False)
    assert ckpt['meta']['iter'] == 2


def test_make_shapes_cli(tmp_path):
    out = _run([osp.join('tools', 'make_shapes.py'), str(tmp_path / 's'), '--num-train', '2',
                '--num-val', '1', '--size', '48', '64'])
    summary = json.loads(out)
    assert summary['train']['images'] == 2 and summary['image_size'] == [48, 64]
    img = cv2.imread(str(tmp_path / 's' / 'coco' / 'train' / '000001.jpg'))
    assert img.shape == (48, 64, 3)
    proc = subprocess.run([sys.executable, osp.join('tools', 'make_shapes.py'), str(tmp_path),
                           '--size', '8'], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2 and 'image_size' in proc.stderr


def test_ensure_shapes_extends_only_the_demos_own_val_split(tmp_path, monkeypatch):
    """The demo's data set with a shorter val split (the 100 images of older versions) is
    regenerated: same train bytes, same first val images, the rest added; other data sets
    (another seed, another train count) are used as they are."""
    import filecmp

    import mmvitswin.openmmlab.datasets as datasets
    from mmvitswin.openmmlab.datasets import make_shapes, shapes_summary
    monkeypatch.setattr(datasets, 'DEFAULT_NUM_TRAIN', 3)
    monkeypatch.setattr(datasets, 'DEFAULT_NUM_VAL', 4)
    size = (64, 64)
    old, ref = str(tmp_path / 'old'), str(tmp_path / 'ref')
    make_shapes(old, num_train=3, num_val=2, image_size=size, seed=0)
    make_shapes(ref, num_train=3, num_val=4, image_size=size, seed=0)
    logs = []
    assert demo.ensure_shapes(old, size, log=logs.append)
    assert 'has 2 val images' in logs[0]
    assert shapes_summary(old) == dict(seed=0, image_size=size, train=3, val=4)
    for rel in ('coco/annotations/instances_train.json', 'coco/annotations/instances_val.json',
                'coco/train/000002.jpg', 'coco/val/000001.jpg', 'coco/val/000003.jpg',
                'ade/annotations/validation/000003.png'):
        assert filecmp.cmp(osp.join(old, rel), osp.join(ref, rel), shallow=False), rel
    assert not demo.ensure_shapes(old, size, log=logs.append)  # now complete: used as is
    # not the demo's own set: never rewritten
    for name, kwargs in (('seed1', dict(seed=1)), ('train2', dict(num_train=2)),
                         ('size96', dict(image_size=(96, 96)))):
        root = str(tmp_path / name)
        make_shapes(root, **dict(dict(num_train=3, num_val=2, image_size=size, seed=0),
                                 **kwargs))
        logs.clear()
        assert not demo.ensure_shapes(root, size, log=logs.append), name
        assert 'val images)' in logs[0] and shapes_summary(root)['val'] == 2
    assert shapes_summary(str(tmp_path / 'missing')) is None
    assert demo.ensure_shapes(str(tmp_path / 'fresh'), size, log=logs.append)
    assert shapes_summary(str(tmp_path / 'fresh')) == dict(seed=0, image_size=size, train=3,
                                                           val=4)
