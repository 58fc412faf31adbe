"""Files a model was not built for, in the families beside the 2-D Swins: the video Swin, the
ViT trunk (ViTAdapter, HybridViT) and SAM's. A file that lacks a part the model has, or has a
part the model lacks, is refused with the setting that fits, where loading it would change the
features; the cases that are deliberate uses (a final norm or a CLS token a model leaves out)
load and say which keys went unused. The parametrized refusals also check that the same
file, in a model built to fit, gives the source model's features (the refusal guards a real
difference, not a file that cannot load at all).
"""
import warnings
from collections import OrderedDict

import pytest
import torch

from mmvitswin.core.backbones.swin3d import SwinTransformer3D
from mmvitswin.core.backbones.vit import ViTAdapter
from mmvitswin.core.checkpoint import CheckpointError, load_pretrained
from conftest import max_rel_err
from zoo import perturb_like_trained

VIDEO = dict(arch=dict(embed_dims=32, depths=[1, 1, 2, 1], num_heads=[1, 2, 4, 8]),
             window_size=(2, 3, 3), drop_path_rate=0.)
VIT = dict(arch=dict(embed_dims=64, num_layers=2, num_heads=4, feedforward_channels=128),
           img_size=64, patch_size=16, drop_path_rate=0.)


def _source(cls, **kwargs):
    torch.manual_seed(0)
    return perturb_like_trained(cls(**kwargs)).eval()


def _loads(model, path):
    """``path`` loaded into ``model`` (warnings allowed: unused or missing output keys)."""
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        load_pretrained(model, str(path))
    return model.eval()


def _same_features(a, b, x, tol=1e-6):
    with torch.no_grad():
        for i, (p, q) in enumerate(zip(a(x), b(x))):
            assert max_rel_err(q, p) < tol, f'output {i}: {max_rel_err(q, p):.2e}'


# ------------------------------------------------------------------------------ video Swin
def test_original_video_swin_release_final_norm_is_the_last_stages(tmp_path):
    """The Video-Swin release (and mmaction2 0.x) names the norm after the last stage ``norm``;
    mmaction2 1.x and we ``norm3``. A whole recognizer in that layout loads with it there."""
    src = _source(SwinTransformer3D, **VIDEO)
    sd = OrderedDict(('backbone.' + k.replace('norm3.', 'norm.'), v)
                     for k, v in src.state_dict().items())
    assert 'backbone.norm.weight' in sd
    sd['cls_head.fc_cls.weight'] = torch.randn(400, 256)
    torch.save({'state_dict': sd, 'meta': {}}, tmp_path / 'release.pth')
    model = SwinTransformer3D(**VIDEO)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        load_pretrained(model, str(tmp_path / 'release.pth'))
    assert not any('norm3' in str(w.message) for w in caught)
    _same_features(src, model.eval(), torch.randn(1, 3, 4, 48, 40))


@pytest.mark.parametrize('file_kwargs, model_kwargs, match', [
    (dict(patch_norm=False), dict(), 'patch_norm=False, but this model has patch_norm=True'),
    (dict(), dict(patch_norm=False), 'patch_norm=True, but this model has patch_norm=False'),
    (dict(), dict(qkv_bias=False), 'build it with qkv_bias=True'),
])
def test_video_swin_refuses_a_file_of_other_parts(tmp_path, file_kwargs, model_kwargs, match):
    src = _source(SwinTransformer3D, **VIDEO, **file_kwargs)
    torch.save(src.state_dict(), tmp_path / 'video.pth')
    with pytest.raises(CheckpointError, match=match):
        load_pretrained(SwinTransformer3D(**VIDEO, **model_kwargs), str(tmp_path / 'video.pth'))
    fitting = _loads(SwinTransformer3D(**VIDEO, **file_kwargs), tmp_path / 'video.pth')
    _same_features(src, fitting, torch.randn(1, 3, 4, 48, 40))


def test_inflation_refuses_an_image_swin_with_an_absolute_position_embedding(tmp_path):
    from mmvitswin.core.backbones.swin import SwinTransformer
    image = SwinTransformer(embed_dims=32, depths=[1, 1, 2, 1], num_heads=[1, 2, 4, 8],
                            window_size=3, use_abs_pos_embed=True, pretrain_img_size=48)
    torch.save(image.state_dict(), tmp_path / 'image.pth')
    with pytest.raises(CheckpointError, match='absolute position embedding'):
        load_pretrained(SwinTransformer3D(**VIDEO), str(tmp_path / 'image.pth'))


# ------------------------------------------------------------------------------- ViT trunk
@pytest.mark.parametrize('file_kwargs, model_kwargs, field', [
    (dict(patch_norm=True), dict(), 'patch_norm'),
    (dict(), dict(patch_norm=True), 'patch_norm'),
    (dict(patch_bias=False), dict(), 'patch_bias'),
    (dict(), dict(patch_bias=False), 'patch_bias'),
    (dict(pre_norm=True), dict(), 'pre_norm'),
    (dict(), dict(pre_norm=True), 'pre_norm'),
    (dict(final_norm=False), dict(final_norm=True), 'final_norm'),
    (dict(with_cls_token=False), dict(with_cls_token=True), 'with_cls_token'),
])
def test_vit_refuses_a_file_of_other_parts(tmp_path, file_kwargs, model_kwargs, field):
    """Parts around the blocks: a norm after the patch embedding, its bias, a norm before the
    blocks (CLIP's), either way; a final norm or a CLS token the file lacks."""
    src = _source(ViTAdapter, **VIT, **file_kwargs)
    torch.save(src.state_dict(), tmp_path / 'vit.pth')
    with pytest.raises(CheckpointError, match=f'{field}=.*but this model has {field}='):
        load_pretrained(ViTAdapter(**VIT, **model_kwargs), str(tmp_path / 'vit.pth'))
    fitting = _loads(ViTAdapter(**VIT, **file_kwargs), tmp_path / 'vit.pth')
    _same_features(src, fitting, torch.randn(1, 3, 64, 80))


@pytest.mark.parametrize('left_out', [dict(final_norm=False), dict(with_cls_token=False)])
def test_vit_may_leave_out_a_final_norm_or_a_cls_token_the_file_has(tmp_path, left_out):
    """mmseg's final_norm=False recipes and ViTDet's CLS-less trunks on MAE weights: the file's
    keys go unused, reported."""
    src = _source(ViTAdapter, **VIT, final_norm=True, with_cls_token=True)
    torch.save(src.state_dict(), tmp_path / 'vit.pth')
    with pytest.warns(UserWarning, match='unused'):
        load_pretrained(ViTAdapter(**VIT, **left_out), str(tmp_path / 'vit.pth'))


def test_sam_files_are_checked_for_the_vit_trunks_parts_too(tmp_path):
    """A SAM-layout file (rel-pos tables, windows, no CLS token) into a model with LayerScale or
    a CLS token: refused by the fields the SAM family now shares with the ViT trunk's."""
    sam = dict(VIT, with_cls_token=False, use_rel_pos=True, window_size=2,
               global_attn_indexes=(1, ), final_norm=False)
    src = _source(ViTAdapter, **sam)
    sd = {k: v for k, v in src.state_dict().items()}
    sd['pos_embed'] = sd['pos_embed'][:, 1:].reshape(1, 4, 4, -1)  # SAM's (1, H, W, C) grid
    sd = {('image_encoder.' + k): v for k, v in sd.items()}
    torch.save(sd, tmp_path / 'sam.pth')
    with pytest.raises(CheckpointError, match='layer_scale'):
        load_pretrained(ViTAdapter(**sam, layer_scale_init_value=1e-5), str(tmp_path / 'sam.pth'))
    with pytest.raises(CheckpointError, match='with_cls_token'):
        load_pretrained(ViTAdapter(**dict(sam, with_cls_token=True)), str(tmp_path / 'sam.pth'))
