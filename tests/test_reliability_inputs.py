"""Issue 13, inputs and configs: every backbone refuses a bad input at its boundary, accepts the
unusual-but-valid ones with the ordinary result, and every registered class refuses an argument
outside its meaning with an error that names the argument and the value.

Table-driven: each case asserts the exception type AND the argument name / value in the message.
"""
import math

import pytest
import torch

from mmvitswin.core.backbones.hybrid_vit import HybridViT
from mmvitswin.core.backbones.swin import SwinTransformer
from mmvitswin.core.backbones.swin3d import SwinTransformer3D
from mmvitswin.core.backbones.vit import SimpleFeaturePyramid, ViTAdapter

from zoo import ZOO, create_model, list_models, params

# ------------------------------------------------------------ tiny configs (bad-config cases)
SWIN = dict(embed_dims=16, depths=(1, 1, 1, 1), num_heads=(1, 1, 1, 1), window_size=4)
VIT = dict(arch='tiny', embed_dims=32, num_layers=2, num_heads=2, mlp_ratio=2., img_size=64)
HYBRID = dict(arch='tiny', embed_dims=32, num_layers=1, num_heads=1, mlp_ratio=2., img_size=64,
              cnn_depths=(1, 1, 1), cnn_channels=(256, 256, 256), stem_channels=64)
SWIN3D = dict(arch=dict(embed_dims=16, depths=(1, 1), num_heads=(1, 1)), patch_size=(1, 4, 4),
              window_size=(2, 4, 4), out_indices=(0, 1))

# the input cases run on every backbone of the zoo (tests/zoo.py)
_CACHE = {}


def backbone(name):
    if name not in _CACHE:
        _CACHE[name] = create_model(name).eval()
    return _CACHE[name]


def image(name, b=1, c=3, hw=(20, 28), dtype=torch.float32):
    size = (b, c, 2) + hw if ZOO[name].video else (b, c) + hw
    return torch.randn(size, dtype=dtype)


def as_tuple(out):
    return out if isinstance(out, (tuple, list)) else (out, )


# ----------------------------------------------------------------------------- bad inputs
def _bad_inputs(name):
    five = ZOO[name].video
    rank = '5-D' if five else '4-D'
    wrong_rank = torch.randn(1, 3, 2, 20, 28)[0] if five else torch.randn(3, 20, 28)
    empty_spatial = torch.randn(1, 3, 2, 0, 28) if five else torch.randn(1, 3, 0, 28)
    return [
        ('list', [[1.0, 2.0]], TypeError, ['torch.Tensor', 'list']),
        ('ndarray', image(name).numpy(), TypeError, ['torch.Tensor', 'ndarray']),
        ('rank', wrong_rank, ValueError, [rank, str(tuple(wrong_rank.shape))]),
        ('channels', image(name, c=4), ValueError, ['in_channels=3', '4']),
        ('uint8', (image(name) * 50).to(torch.uint8), TypeError,
         ['floating-point', 'torch.uint8']),
        ('float64', image(name, dtype=torch.float64), TypeError,
         ['torch.float64', 'torch.float32']),
        ('float16', image(name, dtype=torch.float16), TypeError,
         ['torch.float16', 'torch.float32']),
        ('empty_batch', image(name, b=0), ValueError, ['non-empty', '(0, 3']),
        ('empty_spatial', empty_spatial, ValueError,
         ['non-empty', str(tuple(empty_spatial.shape))]),
    ]


BAD_INPUT_CASES = [(name, case) for name in list_models(contract='inputs') for case in range(9)]


@pytest.mark.parametrize('name,case', BAD_INPUT_CASES,
                         ids=[f'{n}-{c}' for n, c in BAD_INPUT_CASES])
def test_bad_input_is_refused_at_the_boundary(name, case):
    label, x, exc, words = _bad_inputs(name)[case]
    model = backbone(name)
    with pytest.raises(exc) as info:
        model(x)
    for word in words:
        assert word in str(info.value), (label, str(info.value))


# ---------------------------------------------------------------- valid but unusual inputs
@pytest.mark.parametrize('name', params('inputs'))
def test_unusual_valid_inputs_equal_the_ordinary_case(name):
    model = backbone(name)
    x = image(name, b=2)
    with torch.no_grad():
        ref = as_tuple(model(x))
        # a strided view (every other column of a wider tensor) and channels-last memory
        wide = torch.zeros(x.shape[:-1] + (2 * x.shape[-1], ))
        wide[..., ::2] = x
        view = wide[..., ::2]
        assert not view.is_contiguous()
        fmt = torch.channels_last_3d if x.dim() == 5 else torch.channels_last
        for other in (view, x.contiguous(memory_format=fmt)):
            out = as_tuple(model(other))
            assert len(out) == len(ref)
            for a, b in zip(out, ref):
                torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
        # 1 x 1 pixel: every level is 1 x 1 (ceil), finite
        tiny = as_tuple(model(image(name, hw=(1, 1))))
        for t in tiny:
            assert t.shape[-2:] == (1, 1) and torch.isfinite(t).all()
        # a NaN pixel propagates instead of crashing
        bad = x.clone()
        bad[0, :, ..., 3, 5] = math.nan
        out = as_tuple(model(bad))
        assert any(torch.isnan(t).any() for t in out)
        assert all(t.shape == r.shape for t, r in zip(out, ref))


@pytest.mark.parametrize('name', params('inputs'))
def test_mixed_dtypes_allowed_under_autocast_and_in_a_cast_model(name):
    model = backbone(name)
    x = image(name)
    with torch.no_grad():
        ref = as_tuple(model(x))
        with torch.autocast('cpu', dtype=torch.bfloat16):  # fp32 input into an fp32 model
            out = as_tuple(model(x))
            out16 = as_tuple(model(x.half()))  # autocast casts fp16 too, per op
            with pytest.raises(TypeError, match='torch.float64.*torch.float32'):
                model(x.double())  # ... but never float64
        for a, b in zip(out, ref):
            assert a.shape == b.shape and torch.isfinite(a.float()).all()
            torch.testing.assert_close(a.float(), b, rtol=0.1, atol=0.1)
        assert all(a.shape == b.shape for a, b in zip(out16, ref))
        bf16 = create_model(name).eval().to(torch.bfloat16)  # a model cast as a whole takes its dtype
        out = as_tuple(bf16(x.to(torch.bfloat16)))
        assert all(t.dtype == torch.bfloat16 and t.shape == r.shape for t, r in zip(out, ref))
        with pytest.raises(TypeError, match='torch.float32.*torch.bfloat16'):
            bf16(x)


# ---------------------------------------------------------------------------- bad configs
def _interaction(**kw):
    from mmvitswin.core.backbones.vit_adapter_modules import InteractionAdapter
    cfg = dict(embed_dims=24, num_heads=2, interaction_indexes=[(0, 1), (1, 2)], conv_inplane=8,
               n_points=2)
    cfg.update(kw)
    return InteractionAdapter(**cfg)


def _layer_decay(**paramwise):
    from mmvitswin.openmmlab.engine.layer_decay import LayerDecayOptimWrapperConstructor
    return LayerDecayOptimWrapperConstructor(
        dict(type='OptimWrapper', optimizer=dict(type='AdamW', lr=1e-4, weight_decay=0.05)),
        paramwise)


def _make_shapes(tmp, **kw):
    from mmvitswin.openmmlab.datasets.shapes import make_shapes
    return make_shapes(str(tmp), **dict(dict(num_train=0, num_val=0), **kw))


def _seg_dataset(**kw):
    from mmvitswin.openmmlab.datasets.shapes import ShapesSegDataset
    return ShapesSegDataset(data_root='/nonexistent', lazy_init=True, **kw)


def _swin(**kw):
    return SwinTransformer(**dict(SWIN, **kw))


def _vit(**kw):
    return ViTAdapter(**dict(VIT, **kw))


def _hybrid(**kw):
    return HybridViT(**dict(HYBRID, **kw))


def _swin3d(**kw):
    return SwinTransformer3D(**dict(SWIN3D, **kw))


# (builder, kwargs, exception, words the message must contain)
CONFIG_CASES = [
    # SwinTransformer
    (_swin, dict(embed_dims=0), ValueError, ['embed_dims', '0']),
    (_swin, dict(embed_dims=16.5), TypeError, ['embed_dims', '16.5']),
    (_swin, dict(in_channels=0), ValueError, ['in_channels', '0']),
    (_swin, dict(patch_size=0), ValueError, ['patch_size', '0']),
    (_swin, dict(window_size=0), ValueError, ['window_size', '0']),
    (_swin, dict(mlp_ratio=0), ValueError, ['mlp_ratio', '0']),
    (_swin, dict(mlp_ratio=-2.), ValueError, ['mlp_ratio', '-2.0']),
    (_swin, dict(mlp_ratio='4'), TypeError, ['mlp_ratio', "'4'"]),
    (_swin, dict(drop_path_rate=1.0), ValueError, ['drop_path_rate', '[0, 1)', '1.0']),
    (_swin, dict(drop_path_rate=-0.1), ValueError, ['drop_path_rate', '-0.1']),
    (_swin, dict(drop_rate=1.5), ValueError, ['drop_rate', '1.5']),
    (_swin, dict(attn_drop_rate=float('nan')), ValueError, ['attn_drop_rate', 'nan']),
    (_swin, dict(depths=(1, -1, 1, 1)), ValueError, ['depths', '-1']),
    (_swin, dict(depths=3), TypeError, ['depths', '3']),
    (_swin, dict(num_heads=(0, 1, 1, 1)), ValueError, ['num_heads', '0']),
    (_swin, dict(qk_scale=0.), ValueError, ['qk_scale', '0.0']),
    (_swin, dict(with_cp='yes'), TypeError, ['with_cp', "'yes'"]),
    (_swin, dict(patch_norm=1), TypeError, ['patch_norm', '1']),
    (_swin, dict(frozen_stages=5), ValueError, ['frozen_stages', '5', '[-1, 4]']),
    (_swin, dict(frozen_stages=2.), TypeError, ['frozen_stages', '2.0']),
    (_swin, dict(out_indices=(4, )), ValueError, ['out_indices', '(4,)']),
    (_swin, dict(out_indices=3), TypeError, ['out_indices', '3']),
    (_swin, dict(act_cfg=dict(type='Mish')), ValueError, ['act_cfg', "'Mish'"]),
    (_swin, dict(norm_cfg=dict(type='LN', eps=0)), ValueError, ['norm_cfg.eps', '0']),
    (_swin, dict(init_cfg='weights.pth'), TypeError, ['init_cfg', 'weights.pth']),
    (_swin, dict(arch='huge', embed_dims=None), ValueError, ['arch', "'huge'"]),
    # ViTAdapter / ViT trunk
    (_vit, dict(num_layers=0), ValueError, ['num_layers', '0']),
    (_vit, dict(num_heads=5), ValueError, ['num_heads', '5', 'embed_dims (32)']),
    (_vit, dict(mlp_ratio=0.), ValueError, ['mlp_ratio', '0.0']),
    (_vit, dict(drop_path_rate=1.), ValueError, ['drop_path_rate', '1.0']),
    (_vit, dict(attn_drop_rate=-1), ValueError, ['attn_drop_rate', '-1']),
    (_vit, dict(window_size=-1), ValueError, ['window_size', '-1']),
    (_vit, dict(interpolate_mode='nearest'), ValueError, ['interpolate_mode', "'nearest'"]),
    (_vit, dict(stem='resnet'), ValueError, ['stem', "'resnet'"]),
    (_vit, dict(adapter='fpn'), ValueError, ['adapter', "'fpn'"]),
    (_vit, dict(adapter_cfg=[1]), TypeError, ['adapter_cfg', 'list']),
    (_vit, dict(adapter='simple', out_indices=(5, )), ValueError, ['out_indices', '(5,)']),
    (_vit, dict(adapter='simple', patch_size=0), ValueError, ['patch_size', '0']),
    (_vit, dict(window_size=4, global_attn_indexes=(9, )), ValueError,
     ['global_attn_indexes', '(9,)']),
    (_vit, dict(frozen_stages=3), ValueError, ['frozen_stages', '3']),
    (_vit, dict(use_rel_pos='no'), TypeError, ['use_rel_pos', "'no'"]),
    (_vit, dict(out_indices=(2, )), ValueError, ['out_indices', '(2,)']),
    (_vit, dict(img_size=(0, 64)), ValueError, ['img_size', '(0, 64)']),
    # HybridViT
    (_hybrid, dict(stem_channels=48), ValueError, ['stem_channels', '48']),
    (_hybrid, dict(ws_eps=0.), ValueError, ['ws_eps', '0.0']),
    (_hybrid, dict(cnn_drop_path_rate=1.0), ValueError, ['cnn_drop_path_rate', '1.0']),
    (_hybrid, dict(cnn_depths=(1, 1)), ValueError, ['cnn_depths', '(1, 1)']),
    (_hybrid, dict(cnn_depths=(1, 0, 1)), ValueError, ['cnn_depths', '(1, 0, 1)']),
    (_hybrid, dict(cnn_channels=(100, 256, 256)), ValueError, ['cnn_channels', '100']),
    (_hybrid, dict(out_indices=(4, )), ValueError, ['out_indices', '(4,)']),
    (_hybrid, dict(out_norm=1), TypeError, ['out_norm', '1']),
    (_hybrid, dict(frozen_stages=9), ValueError, ['frozen_stages', '9']),
    # SwinTransformer3D
    (_swin3d, dict(mlp_ratio=0), ValueError, ['mlp_ratio', '0']),
    (_swin3d, dict(patch_size=(0, 4, 4)), ValueError, ['patch_size', '(0, 4, 4)']),
    (_swin3d, dict(window_size=(2, 4)), IndexError, ['window_size', '(2, 4)']),
    (_swin3d, dict(drop_path_rate=2.), ValueError, ['drop_path_rate', '2.0']),
    (_swin3d, dict(out_indices=()), ValueError, ['out_indices']),
    (_swin3d, dict(frozen_stages=9), ValueError, ['frozen_stages', '9']),
    (_swin3d, dict(pretrained2d='yes'), TypeError, ['pretrained2d', "'yes'"]),
    (_swin3d, dict(in_channels=-3), ValueError, ['in_channels', '-3']),
    # the ViT-Adapter modules
    (_interaction, dict(n_points=0), ValueError, ['n_points', '0']),
    (_interaction, dict(deform_ratio=0.), ValueError, ['deform_ratio', '0.0']),
    (_interaction, dict(cffn_ratio=-1.), ValueError, ['cffn_ratio', '-1.0']),
    (_interaction, dict(drop_path_rate=1.), ValueError, ['drop_path_rate', '1.0']),
    (_interaction, dict(interaction_indexes=[(0, 2), (3, 4)]), ValueError,
     ['interaction_indexes', '(3, 4)']),
    (_interaction, dict(out_channels=0), ValueError, ['out_channels', '0']),
    (_interaction, dict(with_cffn='no'), TypeError, ['with_cffn', "'no'"]),
    (_interaction, dict(norm_cfg=dict(type='GN')), ValueError, ['norm_cfg', 'GN']),
    (lambda **kw: SimpleFeaturePyramid(32, **kw), dict(in_stride=0), ValueError,
     ['in_stride', '0']),
    (lambda **kw: SimpleFeaturePyramid(32, **kw), dict(out_channels=0), ValueError,
     ['out_channels', '0']),
    # layer-decay optimizer constructor
    (_layer_decay, dict(layer_decay_rate=0), ValueError, ['layer_decay_rate', '0']),
    (_layer_decay, dict(layer_decay_rate=1.5), ValueError, ['layer_decay_rate', '1.5']),
    (_layer_decay, dict(layer_decay_rate='0.9'), TypeError, ['layer_decay_rate', "'0.9'"]),
    (_layer_decay, dict(num_layers=12), ValueError, ['layer_decay_rate']),
    (_layer_decay, dict(layer_decay_rate=0.9, num_layers=0), ValueError, ['num_layers', '0']),
    (_layer_decay, dict(layer_decay_rate=0.9, decay=1), ValueError, ['decay']),
    (_layer_decay, dict(layer_decay_rate=0.9, no_weight_decay_names='pos_embed'), TypeError,
     ['no_weight_decay_names', "'pos_embed'"]),
    # shapes data set
    ('shapes', dict(num_train=-1), ValueError, ['num_train', '-1']),
    ('shapes', dict(image_size=(16, 16)), ValueError, ['image_size', '(16, 16)']),
    ('shapes', dict(image_size=64), TypeError, ['image_size', '64']),
    ('shapes', dict(max_objects=0), ValueError, ['max_objects', '0']),
    ('shapes', dict(seed=-1), ValueError, ['seed', '-1']),
    ('shapes', dict(seed=1.5), TypeError, ['seed', '1.5']),
    (_seg_dataset, dict(reduce_zero_label='yes'), TypeError, ['reduce_zero_label', "'yes'"]),
    (_seg_dataset, dict(img_suffix=3), TypeError, ['img_suffix', '3']),
]


@pytest.mark.parametrize('builder,kwargs,exc,words', CONFIG_CASES,
                         ids=[f'{getattr(b, "__name__", b)}-{"-".join(map(str, k))}'
                              for b, k, _, _ in CONFIG_CASES])
def test_bad_config_names_argument_and_value(builder, kwargs, exc, words, tmp_path):
    with pytest.raises(exc) as info:
        if builder == 'shapes':
            _make_shapes(tmp_path / 'data', **kwargs)
        else:
            builder(**kwargs)
    for word in words:
        assert word in str(info.value), str(info.value)


def test_validators_themselves():
    from mmvitswin.core import validate as v
    assert v.check_positive_int('n', 3) == 3 and v.check_probability('p', 0) == 0.
    assert v.check_choice('mode', None, (None, 'a')) is None
    assert v.int_tuple('k', 3, 2) == (3, 3) and v.int_tuple('k', [1, 2], 2) == (1, 2)
    for call, exc in [(lambda: v.check_positive_int('n', True), TypeError),
                      (lambda: v.check_probability('p', 1), ValueError),
                      (lambda: v.check_positive_number('r', math.inf), ValueError),
                      (lambda: v.check_index('i', 3, 3), ValueError),
                      (lambda: v.check_choice('mode', ['a'], ('a', 'b')), ValueError)]:
        with pytest.raises(exc):
            call()
    with pytest.raises(ValueError, match=r'owner: i must be an index in \[-3, 2\], got -4'):
        v.check_index('i', -4, 3, allow_negative=True, owner='owner')
