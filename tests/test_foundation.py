"""The stack this project stands on: compiled mmcv ops, mmdet, mmseg, and our package."""
import subprocess
import sys

import pytest
import torch


def test_mmcv_ops_are_compiled():
    from mmcv.ops import RoIAlign, nms
    boxes = torch.tensor([[0., 0., 10., 10.], [1., 1., 11., 11.], [20., 20., 30., 30.]])
    scores = torch.tensor([0.9, 0.8, 0.7])
    dets, keep = nms(boxes, scores, iou_threshold=0.5)
    assert keep.tolist() == [0, 2]
    assert torch.allclose(dets[:, 4], torch.tensor([0.9, 0.7]))
    feats = torch.arange(16.).view(1, 1, 4, 4)
    out = RoIAlign((1, 1), spatial_scale=1.0, sampling_ratio=1, aligned=False)(
        feats, torch.tensor([[0., 0., 0., 2., 2.]]))
    # one bilinear sample at the roi centre (1, 1) -> feats[1, 1] == 5
    assert out.flatten().tolist() == [5.0]


@pytest.mark.slow(reason='tools/check_mmcv_ops.py in a subprocess')
def test_check_script_passes():
    out = subprocess.run([sys.executable, 'tools/check_mmcv_ops.py'], capture_output=True,
                         text=True)
    assert out.returncode == 0, out.stderr
    assert 'ops OK' in out.stdout


def test_hosts_import():
    import mmdet
    import mmseg
    assert mmdet.__version__.startswith('3.3')
    assert mmseg.__version__.startswith('1.2')


def test_package_exposes_version_and_registry():
    import mmvitswin
    assert mmvitswin.__version__ == '0.1.0'
    assert mmvitswin.MODELS.scope == 'mmvitswin'
    assert 'SwinTransformer' in mmvitswin.MODELS.module_dict


@pytest.mark.slow(reason='tools/check_mmcv_ops.py in a subprocess')
def test_check_script_fails_loudly_without_compiled_ops(tmp_path):
    # An mmcv whose compiled extension is missing (what an isolated build produces): the
    # install check must fail with a message that says so.
    fake = tmp_path / 'mmcv'
    (fake / 'ops').mkdir(parents=True)
    (fake / '__init__.py').write_text("__version__ = '2.1.0'\n")
    (fake / 'ops' / '__init__.py').write_text(
        "raise ModuleNotFoundError(\"No module named 'mmcv._ext'\")\n")
    env = dict(__import__('os').environ, PYTHONPATH=str(tmp_path))
    out = subprocess.run([sys.executable, 'tools/check_mmcv_ops.py'], capture_output=True,
                         text=True, env=env)
    assert out.returncode == 1
    assert 'WITHOUT its compiled ops' in out.stderr and 'mmcv._ext' in out.stderr
