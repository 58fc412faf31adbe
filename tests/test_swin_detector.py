"""A whole mmdet Mask R-CNN with mmdet's Swin-T and with ours: same state dict, same predictions."""
import copy

import pytest
import torch

pytestmark = [
    pytest.mark.slow(reason='whole Mask R-CNN against mmdet'),
    pytest.mark.timeout(900),
]


def _mask_rcnn_cfg(backbone_type):
    from mmengine.config import Config
    import os
    import mmdet
    path = os.path.join(os.path.dirname(mmdet.__file__), '.mim', 'configs', 'swin',
                        'mask-rcnn_swin-t-p4-w7_fpn_1x_coco.py')
    cfg = Config.fromfile(path)
    model = copy.deepcopy(cfg.model)
    model.backbone.type = backbone_type
    model.backbone.init_cfg = None
    model.backbone.convert_weights = False
    model.backbone.drop_path_rate = 0.
    return model


def test_mask_rcnn_predictions_identical():
    import mmvitswin  # noqa: F401
    from mmdet.models.backbones.swin import SwinTransformer as MMDetSwin
    from mmdet.registry import MODELS
    from mmdet.structures import DetDataSample
    from mmengine.registry import DefaultScope
    from mmengine.structures import InstanceData
    from mmvitswin.openmmlab.models import SwinTransformer

    with DefaultScope.overwrite_default_scope('mmdet'):
        ref_cfg = _mask_rcnn_cfg('SwinTransformer')
        ours = MODELS.build(ref_cfg)
        # build the reference detector, then swap in mmdet's own backbone class
        ref = MODELS.build(ref_cfg)
        kwargs = {k: v for k, v in ref_cfg.backbone.items() if k != 'type'}
        ref.backbone = MMDetSwin(**kwargs)
    assert type(ours.backbone) is SwinTransformer
    torch.manual_seed(0)
    ref.init_weights()
    ref.eval()
    state = ref.state_dict()
    result = ours.load_state_dict(state, strict=True)
    assert not result.missing_keys and not result.unexpected_keys
    ours.eval()

    torch.manual_seed(1)
    img = torch.rand(1, 3, 320, 416) * 255
    meta = dict(img_shape=(320, 416), ori_shape=(320, 416), scale_factor=(1., 1.),
                pad_shape=(320, 416), batch_input_shape=(320, 416))
    outs = []
    for model in (ref, ours):
        sample = DetDataSample(metainfo=meta)
        data = model.data_preprocessor(dict(inputs=[img[0]], data_samples=[sample]), False)
        with torch.no_grad():
            # lower the score threshold so a randomly initialised head still predicts boxes
            model.test_cfg.rcnn.score_thr = 0.0
            outs.append(model.predict(data['inputs'], data['data_samples'])[0].pred_instances)
    a, b = outs
    assert len(a) > 0 and len(a) == len(b)
    assert torch.allclose(a.bboxes, b.bboxes, atol=1e-3)
    assert torch.allclose(a.scores, b.scores, atol=1e-5)
    assert torch.equal(a.labels, b.labels)
    assert (a.masks != b.masks).float().mean() < 1e-3
