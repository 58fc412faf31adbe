"""Mixed precision through the tools: CPUAmpOptimWrapper, --amp in tools/train.py and
tools/test.py, and bf16 inference of our backbones."""
import glob
import os
import os.path as osp
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn as nn

import mmvitswin  # noqa: F401
from mmvitswin.openmmlab.engine.amp import (AmpTestLoop, CPUAmpOptimWrapper, apply_amp,
                                            cpu_bf16_support, keep_mmcv_ops_fp32,
                                            resolve_amp_dtype, samples_to_fp32)

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
DEMO = osp.join(ROOT, 'configs', 'demo', 'mask_rcnn_swin_nano_shapes.py')
TINY_SWIN = dict(type='SwinTransformer', embed_dims=32, depths=[1, 1, 1, 1],
                 num_heads=[1, 2, 4, 8], window_size=4, init_cfg=None)


def _swin():
    from mmvitswin.openmmlab.registry import MODELS
    return MODELS.build(dict(TINY_SWIN))


# ------------------------------------------------------------------------ the optim wrapper
def test_wrapper_autocasts_forward_only_and_steps_in_fp32():
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4))
    before = [p.detach().clone() for p in model.parameters()]
    wrapper = CPUAmpOptimWrapper(optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    x = torch.randn(5, 8)
    with wrapper.optim_context(model):
        out = model(x)
        assert out.dtype == torch.bfloat16  # autocast is on inside the context
        loss = out.float().square().mean()
    assert model(x).dtype == torch.float32  # and off after it
    wrapper.backward(loss)
    for p in model.parameters():
        assert p.dtype == torch.float32 and p.grad.dtype == torch.float32
        assert torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0
    wrapper.step()
    assert all(not torch.equal(a, p) for a, p in zip(before, model.parameters()))
    assert 'loss_scaler' not in wrapper.state_dict()  # no loss scaling for bf16


def test_wrapper_trains_our_swin_in_bf16():
    model = _swin()
    model.train()
    wrapper = CPUAmpOptimWrapper(optimizer=torch.optim.AdamW(model.parameters(), lr=1e-3))
    x = torch.randn(2, 3, 64, 96)
    with wrapper.optim_context(model):
        outs = model(x)
        assert all(o.dtype == torch.bfloat16 for o in outs)
        loss = sum(o.float().square().mean() for o in outs)
    wrapper.backward(loss)
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert all(g is not None and g.dtype == torch.float32 and torch.isfinite(g).all()
               for g in grads)
    wrapper.step()


def test_wrapper_refuses_fp16_and_builds_from_every_scope():
    with pytest.raises(ValueError, match='bf16 only'):
        CPUAmpOptimWrapper(optimizer=torch.optim.SGD([nn.Parameter(torch.ones(1))], lr=1),
                           dtype='float16')
    from mmengine.registry import OPTIM_WRAPPERS, DefaultScope
    opt = torch.optim.SGD([nn.Parameter(torch.ones(1))], lr=1)
    for scope, name in (('mmdet', 'CPUAmpOptimWrapper'), ('mmseg', 'CPUAmpOptimWrapper'),
                        ('mmengine', 'mmvitswin.CPUAmpOptimWrapper')):
        with DefaultScope.overwrite_default_scope(scope):
            wrapper = OPTIM_WRAPPERS.build(dict(type=name, optimizer=opt))
        assert type(wrapper) is CPUAmpOptimWrapper, scope


def test_apply_amp_picks_the_wrapper_for_the_device():
    cfg = dict(type='OptimWrapper', loss_scale='dynamic')
    note = apply_amp(cfg, cuda=False)
    assert cfg == dict(type='mmvitswin.CPUAmpOptimWrapper', dtype='bfloat16') and 'bf16' in note
    cfg = dict(type='OptimWrapper')
    assert 'fp16' in apply_amp(cfg, cuda=True)
    assert cfg == dict(type='AmpOptimWrapper', dtype='float16', loss_scale='dynamic')
    cfg = dict(type='AmpOptimWrapper')
    apply_amp(cfg, cuda=True, dtype='bf16')
    assert cfg == dict(type='AmpOptimWrapper', dtype='bfloat16', loss_scale=1.0)
    with pytest.raises(ValueError, match='CUDA'):
        resolve_amp_dtype('fp16', cuda=False)
    with pytest.raises(ValueError, match='optim_wrapper type'):
        apply_amp(dict(type='ApexOptimWrapper'), cuda=False)
    supported, found = cpu_bf16_support()
    assert isinstance(supported, bool) and found


def test_prepare_config_amp_on_cpu():
    from mmengine.config import Config
    from mmvitswin.openmmlab.engine.launch import ToolError, prepare_config
    cfg = Config.fromfile(DEMO)
    notes = prepare_config(cfg, DEMO, amp=True, cuda=False)
    assert cfg.optim_wrapper.type == 'mmvitswin.CPUAmpOptimWrapper'
    assert any('precision: bf16' in n for n in notes)
    with pytest.raises(ToolError, match='CUDA'):
        prepare_config(Config.fromfile(DEMO), DEMO, amp=True, cuda=False, amp_dtype='fp16')


def test_bf16_on_cuda_with_mmcv_roi_align_is_refused_at_the_command_line():
    """mmcv 2.1's CUDA RoIAlign has no bf16 kernel (seen on an H200: NotImplementedError
    "roi_align_forward_cuda_kernel" not implemented for 'BFloat16', at the first iteration):
    the tool says so before training, naming the layers; fp16 and our RoIAlign pass."""
    from mmengine.config import Config
    from mmvitswin.openmmlab.engine.launch import ToolError, prepare_config
    config = osp.join(ROOT, 'configs', 'mask_rcnn_swin_t_coco.py')
    with pytest.raises(ToolError, match=r'--amp-dtype bf16 on CUDA.*'
                       r'model\.roi_head\.bbox_roi_extractor\.roi_layer, '
                       r'model\.roi_head\.mask_roi_extractor\.roi_layer'):
        prepare_config(Config.fromfile(config), config, amp=True, cuda=True, amp_dtype='bf16')
    notes = prepare_config(Config.fromfile(config), config, amp=True, cuda=True)
    assert any('fp16 mixed precision on CUDA' in n for n in notes)
    # the demo config's roi layers are ours: bf16 goes through
    cfg = Config.fromfile(DEMO)
    notes = prepare_config(cfg, DEMO, amp=True, cuda=True, amp_dtype='bf16')
    assert cfg.optim_wrapper.dtype == 'bfloat16'
    # UPerNet has no RoI layers
    config = osp.join(ROOT, 'configs', 'upernet_swin_t_ade20k.py')
    prepare_config(Config.fromfile(config), config, amp=True, cuda=True, amp_dtype='bf16')


def test_fp16_on_a_dinov3_config_is_refused_at_the_command_line():
    """DINOv3 is not supported in fp16 (the default of --amp on CUDA): refused before training,
    saying to use bf16; DINOv2 (no RoPE) goes through."""
    from mmengine.config import Config
    from mmvitswin.openmmlab.engine.launch import ToolError, prepare_config
    config = osp.join(ROOT, 'configs', 'upernet_vit_adapter_dinov3_b_ade20k.py')
    with pytest.raises(ToolError, match=r'fp16.*DINOv3.*bfloat16.*--amp-dtype bf16'):
        prepare_config(Config.fromfile(config), config, amp=True, cuda=True)
    notes = prepare_config(Config.fromfile(config), config, amp=True, cuda=True,
                           amp_dtype='bf16')
    assert any('bf16 mixed precision on CUDA' in n for n in notes)
    config = osp.join(ROOT, 'configs', 'upernet_vit_adapter_dinov2_b_ade20k.py')
    prepare_config(Config.fromfile(config), config, amp=True, cuda=True)


@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs CUDA')
@pytest.mark.parametrize('dtype', ['fp16', 'bf16'])
def test_amp_on_cuda_uses_mmengine_wrapper(dtype):
    from mmengine.optim import AmpOptimWrapper
    from mmvitswin.openmmlab.registry import OPTIM_WRAPPERS
    model = _swin().cuda()
    model.train()
    cfg = dict(type='OptimWrapper')
    apply_amp(cfg, cuda=True, dtype=dtype)
    wrapper = OPTIM_WRAPPERS.build(dict(cfg, optimizer=torch.optim.AdamW(model.parameters())))
    assert type(wrapper) is AmpOptimWrapper
    low = torch.float16 if dtype == 'fp16' else torch.bfloat16
    linear = next(m for m in model.modules() if isinstance(m, torch.nn.Linear))
    seen = []
    linear.register_forward_hook(lambda mod, args, out: seen.append(out.dtype))
    with wrapper.optim_context(model):
        outs = model(torch.randn(2, 3, 64, 96, device='cuda'))
        # the products run in the low precision; the maps leave through the stages' LayerNorms,
        # which CUDA's autocast runs in fp32 (mmdet's Swin returns fp32 there too)
        assert seen and set(seen) == {low}
        assert all(o.dtype in (low, torch.float32) for o in outs)
        loss = sum(o.float().square().mean() for o in outs)
    wrapper.update_params(loss)
    assert all(torch.isfinite(p).all() for p in model.parameters())


# ------------------------------------------------------------------------ bf16 inference
def test_inference_in_bf16_autocast_and_cast_model():
    model = _swin()
    model.eval()
    x = torch.randn(1, 3, 70, 90)
    with torch.no_grad():
        ref = model(x)
        with torch.autocast('cpu', dtype=torch.bfloat16):
            auto = model(x)
        cast = model.to(torch.bfloat16)(x.bfloat16())
    for r, a, c in zip(ref, auto, cast):
        assert a.shape == c.shape == r.shape and c.dtype == torch.bfloat16
        scale = r.abs().max()
        assert (a.float() - r).abs().max() < 0.1 * scale
        assert (c.float() - r).abs().max() < 0.1 * scale


class _RoIPool(nn.Module):
    """Features -> mmcv RoIAlign -> a linear layer: a model whose mmcv op sees bf16."""

    def __init__(self):
        super().__init__()
        from mmcv.ops import RoIAlign
        torch.manual_seed(0)
        self.conv = nn.Conv2d(4, 4, 1)
        self.roi = RoIAlign((3, 3), 1.0, 2)
        self.fc = nn.Linear(36, 2)

    def forward(self, feats, rois):
        x = self.conv(feats)
        pooled = x.new_zeros((rois.shape[0], 4, 3, 3))  # mmdet's RoI extractor does this
        pooled[:] = self.roi(x, rois.to(x.dtype))
        return self.fc(pooled.flatten(1))


def test_mmcv_op_modules_take_bf16_through_the_wrapper():
    model = _RoIPool()
    feats = torch.randn(1, 4, 16, 16)
    rois = torch.tensor([[0., 1., 1., 9., 9.], [0., 4., 2., 15., 12.]])
    ref = model(feats, rois)
    with torch.autocast('cpu', dtype=torch.bfloat16):
        with pytest.raises(RuntimeError, match='BFloat16'):  # mmcv's CPU kernel has no bf16
            model(feats, rois)
    wrapper = CPUAmpOptimWrapper(optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    with wrapper.optim_context(model):  # guards the model it trains, then autocasts
        out = model(feats, rois)
    assert out.dtype == torch.bfloat16 and (out.float() - ref).abs().max() < 0.05 * ref.abs().max()
    out.float().sum().backward()
    assert model.conv.weight.grad.dtype == torch.float32
    assert torch.isfinite(model.conv.weight.grad).all() and model.conv.weight.grad.abs().sum() > 0
    assert keep_mmcv_ops_fp32(model) == 0  # idempotent
    from mmcv.ops import RoIAlign
    other = RoIAlign((3, 3), 1.0, 2)  # a module the wrapper never saw is left as it is
    with torch.autocast('cpu', dtype=torch.bfloat16):
        with pytest.raises(RuntimeError, match='BFloat16'):
            other(feats.bfloat16(), rois.bfloat16())


def _rpn_head():
    from mmdet.registry import MODELS as DET_MODELS
    from mmengine.config import ConfigDict
    from mmengine.registry import DefaultScope
    with DefaultScope.overwrite_default_scope('mmdet'):
        return DET_MODELS.build(dict(
            type='RPNHead', in_channels=8, feat_channels=8,
            anchor_generator=dict(type='AnchorGenerator', scales=[4], ratios=[1.0],
                                  strides=[4]),
            bbox_coder=dict(type='DeltaXYWHBBoxCoder', target_means=[0.] * 4,
                            target_stds=[1.] * 4),
            test_cfg=ConfigDict(nms_pre=50, max_per_img=10, min_bbox_size=0,
                                nms=dict(type='nms', iou_threshold=0.7))))


def test_mmdet_heads_hand_fp32_to_mmcv_nms():
    """RPN proposals under CPU bf16 autocast: mmcv's nms needs fp32 boxes and scores."""
    from mmdet.structures import DetDataSample
    torch.manual_seed(0)
    head = _rpn_head().eval()
    feats = (torch.randn(1, 8, 8, 8), )
    samples = [DetDataSample(metainfo=dict(img_shape=(32, 32), scale_factor=(1., 1.)))]
    with torch.no_grad():
        ref = head.predict(feats, samples)[0]
        with torch.autocast('cpu', dtype=torch.bfloat16):
            with pytest.raises(RuntimeError, match='BFloat16'):
                head.predict(feats, samples)
            assert keep_mmcv_ops_fp32(head) == 1
            low = head.predict(feats, samples)[0]
    assert low.bboxes.dtype == torch.float32 and len(low) > 0
    assert (low.bboxes[:3] - ref.bboxes[:3]).abs().max() < 1.0  # the same top proposals


def test_samples_to_fp32_restores_fp32_and_keeps_integers():
    from mmengine.structures import InstanceData
    from mmdet.structures import DetDataSample
    sample = DetDataSample(metainfo=dict(img_shape=(4, 4)))
    sample.pred_instances = InstanceData(bboxes=torch.ones(2, 4, dtype=torch.bfloat16),
                                         labels=torch.tensor([1, 2]))
    out = samples_to_fp32([sample])[0]
    assert out.pred_instances.bboxes.dtype == torch.float32
    assert out.pred_instances.labels.dtype == torch.int64
    assert out.metainfo['img_shape'] == (4, 4)
    assert AmpTestLoop.__name__ == 'AmpTestLoop'


# ------------------------------------------------------------------------ the tools, end to end
@pytest.fixture(scope='module')
def amp_run(tmp_path_factory):
    """tools/train.py --amp on the Mask R-CNN demo config (tiny data, 2 iterations)."""
    from mmvitswin.openmmlab.datasets.shapes import make_shapes
    root = tmp_path_factory.mktemp('amp')
    make_shapes(str(root / 'shapes'), num_train=4, num_val=2, image_size=(64, 64))
    data = str(root / 'shapes' / 'coco') + '/'
    config = root / 'demo_amp.py'
    config.write_text(textwrap.dedent(f'''\
        _base_ = {DEMO!r}
        _loader = dict(num_workers=0, persistent_workers=False, batch_size=2,
                       dataset=dict(data_root={data!r}))
        train_dataloader = _loader
        val_dataloader = _loader
        test_dataloader = _loader
        val_evaluator = dict(ann_file={data + 'annotations/instances_val.json'!r})
        test_evaluator = val_evaluator
        default_hooks = dict(logger=dict(interval=1), visualization=dict(draw=False))
        '''))
    work = root / 'work'
    # the CPU path, also on a machine with a GPU
    env = dict(os.environ, OMP_NUM_THREADS='2', PYTHONPATH=ROOT, CUDA_VISIBLE_DEVICES='')
    proc = subprocess.run(
        [sys.executable, osp.join(ROOT, 'tools', 'train.py'), str(config), '--amp',
         '--work-dir', str(work), '--cfg-options', 'train_cfg.max_iters=2',
         'train_cfg.val_interval=2'],
        cwd=str(root), env=env, capture_output=True, text=True, timeout=600)
    return root, config, work, env, proc


@pytest.mark.slow(reason='tools/train.py in a subprocess')
@pytest.mark.timeout(1200)
def test_train_amp_on_cpu_runs_bf16_through_the_runner(amp_run):
    _, _, work, _, proc = amp_run
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    log = open(glob.glob(str(work / '*' / '*.log'))[0]).read()
    assert 'precision: bf16 mixed precision on CPU' in log
    assert 'CPUAmpOptimWrapper: precision bf16' in log  # the wrapper the Runner built
    assert "type='mmvitswin.CPUAmpOptimWrapper'" in open(work / 'demo_amp.py').read()
    assert 'Iter(train) [2/2]' in log and 'loss: nan' not in log
    assert osp.isfile(work / 'iter_2.pth')


@pytest.mark.slow(reason='tools/test.py in a subprocess')
@pytest.mark.timeout(1200)
def test_test_amp_evaluates_in_bf16(amp_run):
    root, config, work, env, proc = amp_run
    assert proc.returncode == 0
    out = subprocess.run(
        [sys.executable, osp.join(ROOT, 'tools', 'test.py'), str(config),
         str(work / 'iter_2.pth'), '--amp', '--work-dir', str(root / 'test_work')],
        cwd=str(root), env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    text = out.stdout + out.stderr
    assert 'AmpTestLoop: precision bf16' in text
    assert 'precision: bf16 mixed-precision inference' in text
    assert 'coco/bbox_mAP' in text
