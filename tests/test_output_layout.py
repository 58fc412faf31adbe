"""Every backbone hands its pyramid to mmdet/mmseg heads as dense NCHW tensors.

mmcv's RoIAlign on the CPU reads its input as contiguous NCHW memory, so a channels-last or
cropped view gives wrong RoI features silently (Mask R-CNN then cannot learn its RoI heads).
"""
import pytest
import torch
from mmcv.ops import RoIAlign

from mmvitswin.core.backbones.hybrid_vit import HybridViT
from mmvitswin.core.backbones.swin import SwinTransformer
from mmvitswin.core.backbones.vit import ViTAdapter

_VIT = dict(arch=dict(embed_dims=64, num_layers=4, num_heads=4, feedforward_channels=128),
            img_size=64, patch_size=16, with_cls_token=False)
BACKBONES = {
    'vit-trunk': lambda: ViTAdapter(**_VIT),
    'vit-simple': lambda: ViTAdapter(**_VIT, adapter='simple', adapter_cfg=dict(out_channels=32)),
    'vit-simple-p8-conv-stem': lambda: ViTAdapter(
        **dict(_VIT, patch_size=8), stem='conv', window_size=4, use_rel_pos=True,
        adapter='simple', adapter_cfg=dict(out_channels=32)),
    'vit-interaction': lambda: ViTAdapter(
        **_VIT, adapter='interaction', adapter_cfg=dict(out_channels=32, num_heads=4)),
    'swin': lambda: SwinTransformer(embed_dims=32, depths=[2, 2, 2, 2], num_heads=[1, 2, 4, 8],
                                    window_size=4),
    'hybrid': lambda: HybridViT(
        arch=dict(embed_dims=64, num_layers=2, num_heads=4, feedforward_channels=128),
        img_size=64, stem_channels=32, cnn_depths=(1, 1, 1), cnn_channels=(128, 128, 128),
        out_indices=(0, 1, 2, 3)),
}


@pytest.mark.parametrize('size', [(64, 96), (61, 83)])
@pytest.mark.parametrize('name', sorted(BACKBONES))
def test_outputs_are_dense_nchw_and_roi_align_reads_them_right(name, size):
    torch.manual_seed(0)
    model = BACKBONES[name]().train()
    outs = model(torch.randn(2, 3, *size))
    roi_align = RoIAlign((7, 7), spatial_scale=1.0, sampling_ratio=0)
    rois = torch.tensor([[0., 1., 1., 6., 5.], [1., 0.5, 2., 3.5, 4.]])
    for i, out in enumerate(outs):
        assert out.is_contiguous(), f'{name} output {i} has strides {out.stride()}'
        # RoIAlign is position-exact: it must see the same values as on a dense copy
        dense = out.detach().clone(memory_format=torch.contiguous_format)
        assert torch.equal(roi_align(out.detach(), rois), roi_align(dense, rois))
