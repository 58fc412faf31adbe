"""Every backbone (tests/zoo.py) hands its pyramid to mmdet/mmseg heads as dense NCHW tensors
(video: NCTHW).

mmcv's RoIAlign on the CPU reads its input as contiguous NCHW memory, so a channels-last or
cropped view gives wrong RoI features silently (Mask R-CNN then cannot learn its RoI heads).
"""
import pytest
import torch
from mmcv.ops import RoIAlign

from zoo import ZOO, create_model, params


@pytest.mark.parametrize('size', [(64, 96), (61, 83)])
@pytest.mark.parametrize('name', params('layout'))
def test_outputs_are_dense_nchw_and_roi_align_reads_them_right(name, size):
    model = create_model(name).train()
    video = ZOO[name].video
    outs = model(torch.randn(2, 3, *((3, ) + size if video else size)))
    roi_align = RoIAlign((7, 7), spatial_scale=1.0, sampling_ratio=0)
    rois = torch.tensor([[0., 1., 1., 6., 5.], [1., 0.5, 2., 3.5, 4.]])
    for i, out in enumerate(outs):
        assert out.is_contiguous(), f'{name} output {i} has strides {out.stride()}'
        if video:  # dense NCTHW is the contract (video heads do not pool RoIs)
            continue
        # RoIAlign is position-exact: it must see the same values as on a dense copy
        dense = out.detach().clone(memory_format=torch.contiguous_format)
        assert torch.equal(roi_align(out.detach(), rois), roi_align(dense, rois))
