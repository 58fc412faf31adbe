"""Drop-in constructor arguments: ours accept and refuse what the installed references do.

The oracles are the classes themselves: mmdet 3.3's and mmseg 1.2's ``SwinTransformer`` and
mmaction2 1.2's ``SwinTransformer3D`` (loaded from its file: ``import mmaction.models`` fails
with the 1.2.0 wheel). Each row of a table is ``Row(kwargs, ref, ours, why)``:

- ``ref``: what the reference does with ``kwargs`` (asserted here, so the table cannot drift
  from the installed code): ``'ok'`` (builds, ``train()``/``eval()``, runs a forward),
  ``'later'`` (builds, then fails in ``train()`` or its forward), or the name of the exception
  its constructor raises. A dict when mmdet and mmseg differ.
- ``ours``: ``'ok'``, or the argument our error must name.
- ``why``: required where ours and a reference disagree on acceptance (ours stricter: the
  reference accepts a value without meaning; ours wider: a documented addition).

Both accept -> same public attributes, the same ``requires_grad``/``training`` after
``train()``, and the same outputs at shared random weights (the reference's state dict loaded
strictly into ours). The reference refuses -> ours refuses in its constructor with an
``ArgumentError`` (an ``AssertionError``) that is a ``ValueError`` or ``TypeError``, names the
argument, and is an instance of the reference's own exception where that comes from the
reference's checks (``AssertionError``, ``TypeError``, ``ValueError``, ``IndexError``; not the
``RuntimeError``/``ZeroDivisionError``/``KeyError`` of a crash deep inside torch or a registry).
"""
import importlib.util
import os
import warnings
from typing import NamedTuple, Optional, Union

import pytest
import torch

from mmvitswin.core.backbones.swin import SwinTransformer
from mmvitswin.core.backbones.swin3d import SwinTransformer3D
from mmvitswin.core.validate import (ArgumentError, ArgumentIndexError, ArgumentTypeError,
                                     ArgumentValueError)

# the reference's own checks; a reference error of another class is a crash, not a check
CHECKED = (AssertionError, TypeError, ValueError, IndexError)


class Row(NamedTuple):
    kwargs: dict
    ref: Union[str, dict]
    ours: str = 'ok'
    why: str = ''
    hw: Optional[tuple] = None  # input size when the default (36, 52) does not fit
    ref_crashes: bool = False  # the reference's exception is a crash, not one of its checks


# --------------------------------------------------------------------------- references
@pytest.fixture(scope='module')
def refs_2d():
    from mmdet.models.backbones.swin import SwinTransformer as MMDetSwin
    from mmseg.models.backbones.swin import SwinTransformer as MMSegSwin
    return {'mmdet': MMDetSwin, 'mmseg': MMSegSwin}


@pytest.fixture(scope='module')
def ref_3d():
    import mmaction
    import mmaction.registry
    path = os.path.join(os.path.dirname(mmaction.__file__), 'models', 'backbones', 'swin.py')
    spec = importlib.util.spec_from_file_location('_mmaction_swin3d_args_reference', path)
    module = importlib.util.module_from_spec(spec)
    registry = mmaction.registry.MODELS.module_dict
    ours = registry.pop('SwinTransformer3D', None)  # its decorator must not meet ours
    try:
        spec.loader.exec_module(module)
    finally:
        registry.pop('SwinTransformer3D', None)
        if ours is not None:
            registry['SwinTransformer3D'] = ours
    return module.SwinTransformer3D


def _build(cls, kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')  # pretrained= deprecation, 'no pre-trained weights'
        return cls(**kwargs)


def _reference_outcome(cls, kwargs, x):
    """``(outcome, exception, model)``: outcome ``'ok'``, ``'later'`` or the name of the
    constructor's exception; the model when it built (seeded: reused for the comparison)."""
    torch.manual_seed(1)
    try:
        model = _build(cls, kwargs)
    except Exception as e:  # noqa: BLE001  (the oracle's answer, whatever it is)
        return type(e).__name__, e, None
    try:
        model.train()
        model.eval()  # mmdet's/mmaction2's train() returns None
        with torch.no_grad():
            model(x)
    except Exception:  # noqa: BLE001
        return 'later', None, model
    return 'ok', None, model


def _channels(kwargs) -> int:
    """Input channels for a row (3 where ``in_channels`` is not a usable count)."""
    value = kwargs.get('in_channels', 3)
    return value if isinstance(value, int) and value >= 1 else 3


def _perturb(model: torch.nn.Module) -> None:
    """Move every parameter off its init (unit norms, zero biases), so all of them matter."""
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)


def _as_tuple(out):
    """One map -> (map, ); mmdet/mmseg return a list of maps, ours a tuple."""
    return tuple(out) if isinstance(out, (list, tuple)) else (out, )


def _tuple(value):
    return tuple(value) if isinstance(value, (list, tuple)) else value


def _same_training_state(ref, ours) -> None:
    ref.train()
    ours.train()
    ref_grad = {k: p.requires_grad for k, p in ref.named_parameters()}
    assert ref_grad == {k: p.requires_grad for k, p in ours.named_parameters()}
    ours_modes = dict(ours.named_modules())
    shared = [k for k in dict(ref.named_modules()) if k in ours_modes]
    assert len(shared) > 10
    for name in shared:
        assert ref.get_submodule(name).training == ours_modes[name].training, name


def _same_outputs(ref, ours, x) -> None:
    ref.eval()
    ours.eval()
    with torch.no_grad():
        expected, got = ref(x), ours(x)
    assert isinstance(got, torch.Tensor) == isinstance(expected, torch.Tensor)
    expected, got = _as_tuple(expected), _as_tuple(got)
    assert len(got) == len(expected)
    for e, g in zip(expected, got):
        assert g.shape == e.shape
        torch.testing.assert_close(g, e, atol=2e-5, rtol=1e-4)


def _check_refusal(build_ours, row, ref_errors) -> None:
    with pytest.raises((ValueError, TypeError)) as info:
        build_ours()
    err = info.value
    assert row.ours in str(err), str(err)
    for name, ref_err in ref_errors.items():
        if isinstance(ref_err, CHECKED) and not row.ref_crashes:
            assert isinstance(err, type(ref_err)), (name, type(ref_err), type(err))
            # where a reference asserts, ours is one of our argument errors
            assert isinstance(err, ArgumentError), type(err)


def _check_row_consistency(row, outcomes) -> None:
    """A row where ours and a reference disagree on acceptance must say why."""
    accepted = [o == 'ok' for o in outcomes.values()]
    if row.ours == 'ok' and not any(accepted):
        assert row.why, 'ours accepts what no reference accepts: say why'
    if row.ours != 'ok' and any(accepted):
        assert row.why, 'ours refuses what a reference accepts: say why'


# ------------------------------------------------------------------ 2-D Swin (mmdet/mmseg)
SMALL_2D = dict(embed_dims=32, depths=(1, 1, 1, 1), num_heads=(1, 2, 4, 8))
SAME_PATCH = 'the same square patch spelt as an int and as a pair (the references compare with ==)'
UNUSED = 'the reference accepts it only because it never reads it'
TRUTHY = 'a switch must be True or False (the references take any truthy value: None, 0, "no")'

ROWS_2D = [
    Row(dict(), 'ok'),
    # pretrain_img_size: int | 1- or 2-tuple (mmdet/mmseg expand a 1-tuple)
    Row(dict(pretrain_img_size=(32, )), 'ok'),
    Row(dict(pretrain_img_size=(32, ), use_abs_pos_embed=True), 'ok', hw=(32, 32)),
    Row(dict(pretrain_img_size=[36, 52], use_abs_pos_embed=True), 'ok'),
    Row(dict(pretrain_img_size=(36, 52), use_abs_pos_embed=True), 'ok'),
    Row(dict(pretrain_img_size=(224, 224, 224)), 'AssertionError', 'pretrain_img_size'),
    Row(dict(pretrain_img_size=()), 'AssertionError', 'pretrain_img_size'),
    Row(dict(pretrain_img_size=[32], use_abs_pos_embed=True), 'IndexError', 'pretrain_img_size'),
    Row(dict(pretrain_img_size=32., use_abs_pos_embed=True), 'TypeError', 'pretrain_img_size'),
    Row(dict(pretrain_img_size=None), 'ok', 'pretrain_img_size', UNUSED),
    Row(dict(pretrain_img_size=0, use_abs_pos_embed=True), 'later', 'pretrain_img_size'),
    Row(dict(pretrain_img_size=2, use_abs_pos_embed=True), 'later', 'pretrain_img_size'),
    # use_abs_pos_embed: the references add it unresized (input size == pretraining size);
    # ours resizes it to the input
    Row(dict(use_abs_pos_embed=True), 'later', why='ours resizes the embedding to the input'),
    Row(dict(use_abs_pos_embed=1), 'later', 'use_abs_pos_embed'),
    # in_channels
    Row(dict(in_channels=1), 'ok'),
    Row(dict(in_channels=0), 'later', 'in_channels'),
    Row(dict(in_channels=-1), 'RuntimeError', 'in_channels'),
    Row(dict(in_channels=3.), 'TypeError', 'in_channels'),
    Row(dict(in_channels=True), 'ok', 'in_channels', 'True is not a channel count'),
    # embed_dims
    Row(dict(embed_dims=40, num_heads=(2, 4, 8, 16)), 'ok'),
    Row(dict(embed_dims=0), 'ZeroDivisionError', 'embed_dims'),
    Row(dict(embed_dims=32.), 'TypeError', 'embed_dims'),
    # patch_size / strides
    Row(dict(patch_size=2, strides=(2, 2, 2, 2)), 'ok'),
    Row(dict(patch_size=4, strides=(2, 2, 2, 2)), 'AssertionError', 'strides'),
    # patch_size / strides[0]: an int or 2 ints (rows, columns), equal (non-overlapping)
    Row(dict(patch_size=(4, 4), strides=((4, 4), 2, 2, 2)), 'ok'),
    Row(dict(patch_size=[4, 4], strides=([4, 4], 2, 2, 2)), 'ok'),
    Row(dict(patch_size=(4, 2), strides=((4, 2), 2, 2, 2)), 'ok'),  # a non-square patch
    Row(dict(patch_size=(2, 4), strides=((2, 4), 2, 2, 2), window_size=3), 'ok', hw=(17, 30)),
    Row(dict(patch_size=(4, 4)), 'AssertionError', why=SAME_PATCH),
    Row(dict(patch_size=4, strides=((4, 4), 2, 2, 2)), 'AssertionError', why=SAME_PATCH),
    Row(dict(patch_size=(4, 4), strides=[[4, 4], 2, 2, 2]), 'AssertionError', why=SAME_PATCH),
    Row(dict(patch_size=(4, 2), strides=((4, 2), 2, 2, 2), use_abs_pos_embed=True,
             pretrain_img_size=(36, 52)), 'TypeError',
        why='ours divides the pretraining size by the patch per axis (the references divide '
        'by the tuple)'),
    Row(dict(patch_size=(4, 4, 4), strides=((4, 4, 4), 2, 2, 2)), 'later', 'patch_size'),
    Row(dict(patch_size=(4, ), strides=((4, ), 2, 2, 2)), 'later', 'patch_size'),
    Row(dict(patch_size=(4, 4.), strides=((4, 4.), 2, 2, 2)), 'TypeError', 'patch_size'),
    Row(dict(patch_size=0, strides=(0, 2, 2, 2)), 'later', 'patch_size'),
    Row(dict(strides=[4, 2, 2, 2]), 'ok'),
    Row(dict(strides=(4, 2, 2, 2, 2)), 'ok'),  # entries past the last stage are ignored
    Row(dict(strides=(4, 2, 2)), 'IndexError', 'strides'),
    # strides[i > 0]: the step of the 2x2 patch merging (an int or 2 ints), any >= 1:
    # ceil(size / stride) per axis, corner zero padding
    Row(dict(strides=(4, 1, 2, 2)), 'ok'),  # overlapping 2x2 windows: the size is kept
    Row(dict(strides=(4, 3, 2, 2)), 'ok'),  # every third row/column pair
    Row(dict(strides=(4, 4, 4, 4)), 'ok'),  # down to 1x1 (padded to the 2x2 kernel)
    Row(dict(strides=(4, 1, 1, 1), window_size=3, depths=(1, 2, 1, 1)), 'ok', hw=(17, 23)),
    Row(dict(strides=(4, (2, 1), 2, [1, 3])), 'ok'),
    Row(dict(strides=(4, (2, 2), 2, 2)), 'ok'),
    Row(dict(strides=(4, 0, 2, 2)), 'ok', 'strides',
        '0 is not a stride (the references read a falsy stride as "unset": 2)'),
    Row(dict(strides=(4, -1, 2, 2)), 'later', 'strides'),
    Row(dict(strides=(4, 2., 2, 2)), 'later', 'strides'),
    Row(dict(strides=(4, (2, 2, 2), 2, 2)), 'later', 'strides'),
    # window_size: one int (square windows)
    Row(dict(window_size=4), 'ok'),
    Row(dict(window_size=1, depths=(2, 2, 2, 2)), 'ok'),
    Row(dict(window_size=5, depths=(2, 2, 2, 2)), 'ok'),
    Row(dict(window_size=0), 'AssertionError', 'window_size'),
    Row(dict(window_size=-1), 'AssertionError', 'window_size'),
    Row(dict(window_size=(7, 7)), 'TypeError', 'window_size'),
    Row(dict(window_size=7.), 'TypeError', 'window_size'),
    # mlp_ratio: mmdet multiplies without int() (a float fails), mmseg takes int(ratio * C)
    Row(dict(mlp_ratio=2), 'ok'),
    Row(dict(mlp_ratio=2.5), {'mmdet': 'TypeError', 'mmseg': 'ok'}),
    Row(dict(mlp_ratio=4.), {'mmdet': 'TypeError', 'mmseg': 'ok'}),
    Row(dict(mlp_ratio=0), 'ok', 'mlp_ratio', 'an FFN without hidden units outputs its bias'),
    Row(dict(mlp_ratio=-1), 'RuntimeError', 'mlp_ratio'),
    # depths / num_heads
    Row(dict(depths=[1, 1, 1, 1], num_heads=[1, 2, 4, 8]), 'ok'),
    Row(dict(depths=(2, 0, 1, 3)), 'ok'),
    Row(dict(depths=(1, 1, 1, 1, 1), num_heads=(1, 2, 4, 8, 16), strides=(4, 2, 2, 2, 2)), 'ok',
        hw=(64, 64)),
    Row(dict(depths=(1, 2, 1), num_heads=(1, 2, 4), out_indices=(0, 1, 2)), 'ok'),
    Row(dict(depths=(1, ), num_heads=(2, ), strides=(4, ), out_indices=(0, )), 'ok'),
    # extra num_heads are ignored by the references
    Row(dict(depths=(1, 1, 1), out_indices=(0, 2)), 'ok'),
    # ... but with outputs past the last stage the two lengths were meant to match
    Row(dict(depths=(1, 1, 1)), 'IndexError', 'depths (3 stages: (1, 1, 1)) and num_heads'),
    Row(dict(depths=(1, -1, 1, 1)), 'AssertionError', 'depths'),
    Row(dict(depths=(1., 1, 1, 1)), 'TypeError', 'depths'),
    Row(dict(depths=()), 'IndexError', 'depths'),
    Row(dict(num_heads=(1, 2, 4)), 'IndexError', 'num_heads'),
    Row(dict(num_heads=(0, 2, 4, 8)), 'ZeroDivisionError', 'num_heads'),
    Row(dict(num_heads=(3, 6, 12, 24)), 'later', 'num_heads'),  # 32 channels, 3 heads
    # out_indices: a list or tuple of stage indices (may be empty: no outputs)
    Row(dict(out_indices=(3, )), 'ok'),
    Row(dict(out_indices=(3, 0)), 'ok'),
    Row(dict(out_indices=[0, 2]), 'ok'),
    Row(dict(out_indices=(1, 1)), 'ok'),
    Row(dict(out_indices=()), 'ok'),
    Row(dict(out_indices=(4, )), 'IndexError', 'out_indices'),
    Row(dict(out_indices=3), 'TypeError', 'out_indices'),
    Row(dict(out_indices=(0., )), 'TypeError', 'out_indices'),
    Row(dict(out_indices=(-1, )), 'ok', 'out_indices',
        'the reference builds norm-1 and then returns no output for it'),
    # qkv_bias / qk_scale
    Row(dict(qkv_bias=False), 'ok'),
    Row(dict(qkv_bias=None), 'ok', 'qkv_bias', TRUTHY),
    Row(dict(qk_scale=0.1), 'ok'),
    Row(dict(qk_scale=0), 'ok', 'qk_scale',
        'the reference reads 0 as "no override" (`qk_scale or default`); say None'),
    Row(dict(qk_scale='a'), 'later', 'qk_scale'),
    # patch_norm / with_cp / convert_weights
    Row(dict(patch_norm=False), 'ok'),  # no norm in the patch embedding nor the mergings
    Row(dict(patch_norm=0), 'ok', 'patch_norm', TRUTHY),
    Row(dict(with_cp=True), 'ok'),
    Row(dict(with_cp='yes'), 'ok', 'with_cp', TRUTHY),
    Row(dict(convert_weights=True), {'mmdet': 'ok', 'mmseg': 'TypeError'}),
    # dropout rates: nn.Dropout takes [0, 1]; stochastic depth is not checked by the references
    Row(dict(drop_rate=0.3, attn_drop_rate=0.2, drop_path_rate=0.5), 'ok'),
    Row(dict(drop_rate=1.5), 'ValueError', 'drop_rate'),
    Row(dict(drop_rate=-0.1), 'ValueError', 'drop_rate'),
    Row(dict(attn_drop_rate=1.5), 'ValueError', 'attn_drop_rate'),
    Row(dict(drop_rate=1.), 'ok', 'drop_rate', 'p=1 drops every activation in training'),
    Row(dict(drop_path_rate=1.5), 'ok', 'drop_path_rate',
        'a drop-path rate outside [0, 1) gives NaN or negative keep rates in training'),
    # act_cfg / norm_cfg: dicts (the references build the layers from them)
    Row(dict(act_cfg=dict(type='ReLU')), 'ok'),
    Row(dict(act_cfg=dict(type='GELU', approximate='tanh')), 'ok'),
    Row(dict(act_cfg=dict(type='SiLU')), 'ok'),
    Row(dict(act_cfg=None), 'TypeError', 'act_cfg'),
    Row(dict(act_cfg=dict(type='Nope')), 'KeyError', 'act_cfg'),
    # mmcv's activation registry, with its keyword arguments
    Row(dict(act_cfg=dict(type='ReLU', inplace=True)), 'ok'),
    Row(dict(act_cfg=dict(type='LeakyReLU', negative_slope=0.2)), 'ok'),
    Row(dict(act_cfg=dict(type='PReLU', init=0.1)), 'ok'),  # its weight: ffn.layers.0.1.weight
    Row(dict(act_cfg=dict(type='RReLU', lower=0.1, upper=0.2)), 'ok'),
    Row(dict(act_cfg=dict(type='ReLU6')), 'ok'),
    Row(dict(act_cfg=dict(type='ELU', alpha=0.5)), 'ok'),
    Row(dict(act_cfg=dict(type='Sigmoid')), 'ok'),
    Row(dict(act_cfg=dict(type='Tanh')), 'ok'),
    Row(dict(act_cfg=dict(type='HSwish')), 'ok'),
    Row(dict(act_cfg=dict(type='HSigmoid', bias=1., divisor=2.)), 'ok'),
    Row(dict(act_cfg=dict(type='Swish')), 'ok'),
    Row(dict(act_cfg=dict(type='SiLU', inplace=True)), 'ok'),
    Row(dict(act_cfg=dict(type='Clamp', min=-0.5, max=0.5)), 'ok'),
    Row(dict(act_cfg=dict(type='Clip')), 'ok'),
    Row(dict(act_cfg=dict(type=torch.nn.GELU)), 'ok'),  # a class as type
    Row(dict(act_cfg=dict(type='Swish', inplace=True)), 'TypeError', 'act_cfg'),
    Row(dict(act_cfg=dict(type='ReLU', slope=1)), 'TypeError', 'act_cfg'),
    Row(dict(act_cfg=dict(type='HSigmoid', divisor=0)), 'AssertionError', 'act_cfg'),
    Row(dict(act_cfg=dict(type='GELU', approximate='erf')), 'later', 'act_cfg'),
    Row(dict(act_cfg=dict(type='PReLU', num_parameters=32)), 'later', 'act_cfg'),
    Row(dict(act_cfg=dict()), 'KeyError', 'act_cfg'),
    Row(dict(act_cfg=dict(type='Dropout')), 'ok', 'act_cfg',
        "not an activation (the reference builds any no-argument module of mmcv's registry)"),
    Row(dict(norm_cfg=dict(type='LN', eps=0.1)), 'ok'),  # every norm, the patch embedding's too
    Row(dict(norm_cfg=dict(type='LN', requires_grad=False)), 'ok'),
    Row(dict(norm_cfg=None), 'TypeError', 'norm_cfg'),
    Row(dict(norm_cfg='LN'), 'TypeError', 'norm_cfg'),
    Row(dict(norm_cfg=dict(type='BN')), 'later', 'norm_cfg'),
    Row(dict(norm_cfg=dict(type='GN', num_groups=1)), 'later', 'norm_cfg'),
    # nn.LayerNorm's keywords, as mmcv's build_norm_layer passes them
    Row(dict(norm_cfg=dict(type='LN', elementwise_affine=False)), 'ok'),
    Row(dict(norm_cfg=dict(type='LN', bias=False, eps=1e-6)), 'ok'),
    Row(dict(norm_cfg=dict(type=torch.nn.LayerNorm)), 'ok'),
    Row(dict(norm_cfg=dict(type='LN', affine=False)), 'TypeError', 'norm_cfg'),
    Row(dict(norm_cfg=dict(eps=1e-6)), 'KeyError', 'norm_cfg'),
    Row(dict(norm_cfg=dict(type='LayerNorm')), 'KeyError',
        why="an alias of ours ('LN' in mmcv's registry)"),
    # pretrained (deprecated) / init_cfg
    Row(dict(pretrained='weights.pth'), 'ok'),
    Row(dict(pretrained=123), 'TypeError', 'pretrained'),
    Row(dict(pretrained='a.pth', init_cfg=dict(type='Pretrained', checkpoint='b.pth')),
        'AssertionError', 'pretrained'),
    Row(dict(init_cfg=dict(type='Pretrained', checkpoint='b.pth')), 'ok'),
    Row(dict(init_cfg='weights.pth'), 'ok', 'init_cfg',
        'the reference fails only in init_weights (no "checkpoint" in a str)'),
    # frozen_stages: any negative freezes nothing; up to the number of stages
    Row(dict(frozen_stages=0), 'ok'),
    Row(dict(frozen_stages=2, out_indices=(0, 2)), 'ok'),
    Row(dict(frozen_stages=4, use_abs_pos_embed=True, pretrain_img_size=(36, 52)), 'ok'),
    Row(dict(frozen_stages=-2), 'ok'),
    Row(dict(frozen_stages=5), 'later', 'frozen_stages'),
    Row(dict(frozen_stages=1.), 'later', 'frozen_stages'),
    # ours only
    Row(dict(arch='tiny'), 'TypeError', why='an added keyword: the preset'),
]


def _row_id(row: Row) -> str:
    return '-'.join(f'{k}={v}' for k, v in row.kwargs.items()) or 'defaults'


def _attributes_2d(model, num_layers: int) -> dict:
    return dict(out_indices=_tuple(model.out_indices), frozen_stages=model.frozen_stages,
                use_abs_pos_embed=model.use_abs_pos_embed, num_features=model.num_features,
                num_stages=len(model.stages),
                norms=[hasattr(model, f'norm{i}') for i in range(num_layers)],
                with_cp=[b.with_cp for s in model.stages for b in s.blocks])


@pytest.mark.parametrize('row', ROWS_2D, ids=[_row_id(r) for r in ROWS_2D])
def test_swin_arguments_match_mmdet_and_mmseg(refs_2d, row):
    kwargs = dict(SMALL_2D, **row.kwargs)
    x = torch.randn(1, _channels(kwargs), *(row.hw or (36, 52)))
    outcomes, errors, models = {}, {}, {}
    for name, cls in refs_2d.items():
        outcomes[name], errors[name], models[name] = _reference_outcome(cls, kwargs, x)
    expected = row.ref if isinstance(row.ref, dict) else dict.fromkeys(refs_2d, row.ref)
    assert outcomes == expected, (outcomes, [str(e) for e in errors.values()])
    _check_row_consistency(row, outcomes)

    if row.ours != 'ok':
        _check_refusal(lambda: _build(SwinTransformer, kwargs), row,
                       {k: e for k, e in errors.items() if e is not None})
        return
    ours = _build(SwinTransformer, kwargs)
    for name, ref in models.items():
        if outcomes[name] != 'ok':
            continue
        _perturb(ref)
        ours.load_state_dict(ref.state_dict(), strict=True)  # our Swin uses mmdet's keys
        num_layers = len(kwargs['depths'])
        assert ours.num_layers == num_layers
        assert _attributes_2d(ours, num_layers) == _attributes_2d(ref, num_layers)
        if name == 'mmdet':
            assert ours.convert_weights == ref.convert_weights
        else:  # mmdet 3.3 loses pretrained= (its BaseModule resets init_cfg); mmseg keeps it
            assert ours.init_cfg == ref.init_cfg
        _same_training_state(ref, ours)
        _same_outputs(ref, ours, x)


# ----------------------------------------------------------------- video Swin (mmaction2)
SMALL_3D = dict(embed_dims=32, depths=(1, 1, 1, 1), num_heads=(1, 2, 4, 8))
DEEP_3D = dict(embed_dims=32, depths=(2, 2, 2, 2), num_heads=(1, 2, 4, 8))

ROWS_3D = [
    Row(dict(), 'ok'),
    Row(dict(arch='huge'), 'AssertionError', 'arch'),
    Row(dict(arch=3), 'AssertionError', 'arch'),
    Row(dict(arch=None), 'AssertionError', 'arch'),
    Row(dict(arch=dict(SMALL_3D, extra=1)), 'AssertionError', 'arch'),
    Row(dict(arch=dict(embed_dims=32, depths=(1, 1, 1, 1))), 'AssertionError', 'arch'),
    # 1 to 4 stages
    Row(dict(arch=dict(embed_dims=32, depths=(1, 1, 1, 1, 1), num_heads=(1, 2, 4, 8, 16))),
        'AssertionError', 'depths'),
    Row(dict(arch=dict(embed_dims=32, depths=(), num_heads=())), 'AssertionError', 'depths'),
    Row(dict(arch=dict(embed_dims=32, depths=(1, 2, 1), num_heads=(1, 2, 4)),
             out_indices=(0, 2)), 'ok'),
    Row(dict(arch=dict(embed_dims=16, depths=(2, ), num_heads=(2, )), out_indices=(0, )), 'ok'),
    Row(dict(arch=dict(embed_dims=32, depths=[1, 0, 1, 1], num_heads=[1, 2, 4, 8])), 'ok'),
    Row(dict(arch=dict(SMALL_3D, num_heads=(1, 2, 4))), 'AssertionError', 'num_heads'),
    Row(dict(arch=dict(SMALL_3D, depths=(1, -1, 1, 1))), 'IndexError', 'depths',
        ref_crashes=True),  # an IndexError from its drop-path list, not a check
    Row(dict(arch=dict(SMALL_3D, num_heads=(3, 6, 12, 24))), 'later', 'num_heads'),
    Row(dict(arch=dict(SMALL_3D, embed_dims=0)), 'ZeroDivisionError', 'embed_dims'),
    Row(dict(arch=dict(SMALL_3D, embed_dims=32.)), 'TypeError', 'embed_dims'),
    # pretrained / pretrained2d / init_cfg
    Row(dict(pretrained='weights.pth'), 'ok'),
    Row(dict(pretrained='a.pth', init_cfg=dict(type='Pretrained', checkpoint='b.pth')), 'ok'),
    Row(dict(pretrained=123), 'ok', 'pretrained',
        'the reference fails only in init_weights, when it opens the "path"'),
    Row(dict(pretrained2d=False), 'ok'),
    Row(dict(pretrained2d=0), 'ok', 'pretrained2d', TRUTHY),
    Row(dict(init_cfg='weights.pth'), 'ok', 'init_cfg', 'the reference fails in init_weights'),
    # patch_size: an int (documented by mmaction2, which then fails in its forward) or 3 ints
    Row(dict(patch_size=(1, 4, 4)), 'ok'),
    Row(dict(patch_size=[2, 4, 4]), 'ok'),
    Row(dict(patch_size=2), 'later', why='mmaction2 documents an int patch size: (p, p, p)'),
    Row(dict(patch_size=(4, 4)), 'later', 'patch_size'),
    Row(dict(patch_size=(0, 4, 4)), 'later', 'patch_size'),
    # window_size: a sequence of 3 ints
    Row(dict(window_size=(2, 3, 3), arch=DEEP_3D), 'ok'),
    Row(dict(window_size=[1, 1, 1], arch=DEEP_3D), 'ok'),
    Row(dict(window_size=7), 'TypeError', 'window_size'),
    Row(dict(window_size=(7, 7)), 'IndexError', 'window_size'),
    Row(dict(window_size=(0, 3, 3)), 'AssertionError', 'window_size'),
    Row(dict(window_size=(2, 3, 3, 3)), 'later', 'window_size'),
    # in_channels
    Row(dict(in_channels=1), 'ok'),
    Row(dict(in_channels=0), 'later', 'in_channels'),
    Row(dict(in_channels=3.), 'TypeError', 'in_channels'),
    # block arguments
    Row(dict(mlp_ratio=2.5, qkv_bias=False, qk_scale=0.1, arch=DEEP_3D), 'ok'),
    Row(dict(mlp_ratio=0), 'ok', 'mlp_ratio', 'an FFN without hidden units outputs its bias'),
    Row(dict(drop_rate=0.3, attn_drop_rate=0.2, drop_path_rate=0.5), 'ok'),
    Row(dict(drop_rate=1.5), 'ValueError', 'drop_rate'),
    Row(dict(attn_drop_rate=-1.), 'ValueError', 'attn_drop_rate'),
    Row(dict(drop_path_rate=1.5), 'ok', 'drop_path_rate',
        'a drop-path rate outside [0, 1) gives NaN or negative keep rates in training'),
    Row(dict(act_cfg=dict(type='ReLU')), 'ok'),
    Row(dict(act_cfg=dict(type='PReLU', init=0.1)), 'ok'),  # its weight: mlp.act.weight
    Row(dict(act_cfg=dict(type='HSwish')), 'ok'),
    Row(dict(act_cfg=dict(type='LeakyReLU', negative_slope=0.2, inplace=True)), 'ok'),
    Row(dict(act_cfg=dict(type='Swish', inplace=True)), 'TypeError', 'act_cfg'),
    Row(dict(act_cfg=dict(type='Nope')), 'KeyError', 'act_cfg'),
    Row(dict(act_cfg=None), 'TypeError', 'act_cfg'),
    Row(dict(norm_cfg=dict(type='LN', eps=0.1)), 'ok'),
    Row(dict(norm_cfg=dict(type='LN', elementwise_affine=False)), 'ok'),
    Row(dict(norm_cfg=dict(type='LN', foo=1)), 'TypeError', 'norm_cfg'),
    Row(dict(norm_cfg=dict(type='LN', requires_grad=False), patch_norm=False), 'ok'),
    Row(dict(norm_cfg=None, patch_norm=False), 'TypeError', 'norm_cfg'),
    Row(dict(norm_cfg=dict(type='BN')), 'later', 'norm_cfg'),
    Row(dict(patch_norm=False), 'ok'),
    Row(dict(with_cp=True), 'ok'),
    Row(dict(with_cp=1), 'ok', 'with_cp', TRUTHY),
    # frozen_stages: 0 the patch embedding, k also the first k stages; negative: none
    Row(dict(frozen_stages=0), 'ok'),
    Row(dict(frozen_stages=2, out_indices=(1, 3)), 'ok'),
    Row(dict(frozen_stages=4), 'ok'),
    Row(dict(frozen_stages=-3), 'ok'),
    Row(dict(frozen_stages=5), 'IndexError', 'frozen_stages'),
    # out_indices: a non-empty list or tuple of stage indices; one stage -> a tensor
    Row(dict(out_indices=(0, 1, 2, 3)), 'ok'),
    Row(dict(out_indices=[2, 0]), 'ok'),
    Row(dict(out_indices=(1, 1)), 'ok'),
    Row(dict(out_indices=()), 'ValueError', 'out_indices'),
    Row(dict(out_indices=(4, )), 'AssertionError', 'out_indices'),
    Row(dict(out_indices=3), 'TypeError', 'out_indices'),
    Row(dict(out_indices=(-1, )), 'ok', 'out_indices',
        'the reference builds norm-1 and then returns no output for it'),
    Row(dict(out_after_downsample=True, out_indices=(0, 1, 2, 3)), 'ok'),
    Row(dict(out_after_downsample=1), 'ok', 'out_after_downsample', TRUTHY),
]


def _attributes_3d(model) -> dict:
    arch = {k: _tuple(v) for k, v in model.arch_settings.items()}
    patch = model.patch_size
    return dict(arch_settings=arch, embed_dims=model.embed_dims, depths=_tuple(model.depths),
                num_heads=_tuple(model.num_heads), num_layers=model.num_layers,
                out_indices=_tuple(model.out_indices),
                out_after_downsample=model.out_after_downsample,
                frozen_stages=model.frozen_stages, window_size=_tuple(model.window_size),
                patch_size=(patch, ) * 3 if isinstance(patch, int) else _tuple(patch),
                num_features=model.num_features, pretrained=model.pretrained,
                pretrained2d=model.pretrained2d,
                norms=[hasattr(model, f'norm{i}') for i in range(model.num_layers)],
                with_cp=[b.with_cp for s in model.layers for b in s.blocks])


@pytest.mark.parametrize('row', ROWS_3D, ids=[_row_id(r) for r in ROWS_3D])
def test_swin3d_arguments_match_mmaction2(ref_3d, row):
    kwargs = dict(row.kwargs)
    kwargs.setdefault('arch', SMALL_3D)
    x = torch.randn(1, _channels(kwargs), *(row.hw or (4, 36, 52)))
    outcome, error, ref = _reference_outcome(ref_3d, kwargs, x)
    assert outcome == row.ref, (outcome, str(error))
    _check_row_consistency(row, {'mmaction2': outcome})

    if row.ours != 'ok':
        _check_refusal(lambda: _build(SwinTransformer3D, kwargs), row,
                       {'mmaction2': error} if error is not None else {})
        return
    ours = _build(SwinTransformer3D, kwargs)
    if outcome != 'ok':
        return  # an addition of ours (the row says which); its behaviour is tested elsewhere
    _perturb(ref)
    ours.load_state_dict(ref.state_dict(), strict=True)  # identical keys
    assert _attributes_3d(ours) == _attributes_3d(ref)
    _same_training_state(ref, ours)
    _same_outputs(ref, ours, x)


def test_swin3d_arch_names_are_mmaction2s(ref_3d):
    """Every preset name and alias mmaction2 knows, in any case, gives its settings (compared
    as data: building each preset would take seconds); other names are refused."""
    from mmvitswin.core.backbones.swin import ARCH_ALIASES, ARCH_ZOO, SWIN_ARCH_KEYS
    from mmvitswin.core.layers import resolve_arch
    for name, settings in ref_3d.arch_zoo.items():
        for spelt in (name, name.upper(), name.capitalize()):
            ours = resolve_arch(spelt, ARCH_ZOO, ARCH_ALIASES, SWIN_ARCH_KEYS, exact=True)
            assert {k: _tuple(v) for k, v in ours.items()} == \
                {k: _tuple(v) for k, v in settings.items()}
    assert set(ARCH_ZOO) | set(ARCH_ALIASES) == set(ref_3d.arch_zoo)


# ------------------------------------------------------------------ signatures, positions
def _parameters(cls):
    import inspect
    return [p for p in inspect.signature(cls.__init__).parameters.values() if p.name != 'self']


@pytest.mark.parametrize('which', ['mmdet', 'mmseg', 'mmaction2'])
def test_same_arguments_positions_and_defaults(refs_2d, ref_3d, which):
    """Positional calls mean the same (mmseg lacks mmdet's ``convert_weights``: its positions
    agree up to ``pretrained``); defaults are equal, except our ``None`` for the Swin sizes
    (the keyword-only ``arch`` preset: Swin-T, mmdet's numbers), mmaction2's ``init_cfg``
    (its truncated-normal/constant list; ours, None, runs the same init) and its required
    ``arch`` (ours: 'tiny')."""
    ref_cls, ours_cls = ((ref_3d, SwinTransformer3D) if which == 'mmaction2' else
                         (refs_2d[which], SwinTransformer))
    ref, ours = _parameters(ref_cls), _parameters(ours_cls)
    positional = [p.name for p in ours if p.kind == p.POSITIONAL_OR_KEYWORD]
    names = [p.name for p in ref]
    if which == 'mmseg':
        cut = names.index('pretrained') + 1
        assert positional[:cut] == names[:cut]
        assert set(names) <= set(positional)
    else:
        assert positional == names
    ours_defaults = {p.name: p.default for p in ours}
    for p in ref:
        if p.default is p.empty or (p.name == 'init_cfg' and which == 'mmaction2'):
            continue  # mmaction2's arch is required; ours defaults to 'tiny'
        if p.name in ('embed_dims', 'depths', 'num_heads'):
            assert ours_defaults[p.name] is None
            continue
        assert ours_defaults[p.name] == p.default, p.name
    if which == 'mmdet':  # a positional call, as mmdet's tests write them
        args = (36, 3, 32, 4, 5, 2, (1, 2, 1, 1), (1, 2, 4, 8))
        torch.manual_seed(1)
        ref_model = _build(ref_cls, dict(zip(names, args)))
        _perturb(ref_model)
        ours_model = SwinTransformer(*args).eval()
        ours_model.load_state_dict(ref_model.state_dict(), strict=True)
        _same_outputs(ref_model, ours_model, torch.randn(1, 3, 36, 52))


# ----------------------------------------------------------------------- our additions
def test_additions_behave_as_documented():
    """The rows where ours accepts what a reference refuses, checked for their meaning."""
    # mmaction2's documented int patch size is (p, p, p)
    torch.manual_seed(0)
    a = SwinTransformer3D(arch=SMALL_3D, patch_size=2).eval()
    b = SwinTransformer3D(arch=SMALL_3D, patch_size=(2, 2, 2)).eval()
    b.load_state_dict(a.state_dict())
    x = torch.randn(1, 3, 4, 16, 24)
    with torch.no_grad():
        torch.testing.assert_close(a(x), b(x), atol=0, rtol=0)
    # the position embedding at the pretraining size is added as it is (mmdet's numbers)
    model = SwinTransformer(**SMALL_2D, use_abs_pos_embed=True, pretrain_img_size=(32, 48))
    assert model.absolute_pos_embed.shape == (1, 8 * 12, 32)


def test_error_classes_are_both_kinds():
    """Every argument error of ours is an AssertionError (what the references assert) and a
    ValueError/TypeError (what Python code expects); index/count errors are IndexErrors."""
    assert issubclass(ArgumentTypeError, TypeError) and issubclass(ArgumentTypeError,
                                                                   AssertionError)
    assert issubclass(ArgumentValueError, ValueError) and issubclass(ArgumentValueError,
                                                                     AssertionError)
    assert issubclass(ArgumentIndexError, ValueError) and issubclass(ArgumentIndexError,
                                                                     IndexError)
    assert not issubclass(ArgumentTypeError, ValueError)
    with pytest.raises(ArgumentIndexError, match=r'pretrain_img_size .* 3 entries'):
        SwinTransformer(pretrain_img_size=(224, 224, 224))
    with pytest.raises(ArgumentValueError, match=r'strides\[0\] \(2\) must equal patch_size'):
        SwinTransformer(strides=(2, 2, 2, 2))
    with pytest.raises(ArgumentValueError, match='1 to 4 stages'):
        SwinTransformer3D(arch=dict(embed_dims=8, depths=[1] * 5, num_heads=[1] * 5))


# ------------------------------------------------------------------ the references' tests
MMSEG_SWIN_TESTS = os.path.join('tests', 'test_models', 'test_backbones', 'test_swin.py')


@pytest.mark.slow(reason="mmseg's own test: Swin-T built six times, run at 256 px")
def test_mmseg_own_swin_test_passes_with_ours(refs_2d):
    """mmseg ships its backbone tests in the wheel (site-packages/tests): its
    ``test_swin_transformer`` (argument errors, shapes, freezing, with_cp) run against our
    registered class, with our block class for its ``isinstance`` check."""
    import mmseg
    from mmvitswin.core.backbones.swin import SwinBlock
    from mmvitswin.openmmlab.models.backbones import SwinTransformer as Registered
    site = os.path.dirname(os.path.dirname(mmseg.__file__))
    path = os.path.join(site, MMSEG_SWIN_TESTS)
    if not os.path.isfile(path):
        pytest.skip(f'mmseg wheel without its tests ({path})')
    spec = importlib.util.spec_from_file_location('_mmseg_shipped_test_swin', path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.SwinTransformer = Registered
    module.SwinBlock = SwinBlock
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        module.test_swin_transformer()


# ------------------------------------------------------------- act_cfg / norm_cfg / merging
_MMCV_ACT_FILES = ('torch.nn.modules.activation', 'mmcv.cnn.bricks.activation',
                   'mmcv.cnn.bricks.hswish', 'mmcv.cnn.bricks.hsigmoid', 'mmcv.cnn.bricks.swish')
ACT_KWARGS = dict(ReLU=dict(inplace=True), LeakyReLU=dict(negative_slope=0.3),
                  PReLU=dict(init=0.2), RReLU=dict(lower=0.1, upper=0.4), ReLU6={},
                  ELU=dict(alpha=0.7), Sigmoid={}, Tanh={}, SiLU={}, Swish={},
                  GELU=dict(approximate='tanh'), HSwish={},
                  HSigmoid=dict(bias=1., divisor=3., min_value=-0.5, max_value=0.8),
                  Clamp=dict(min=-0.3, max=0.6), Clip={})


def test_act_cfg_types_are_mmcvs():
    """Every activation of mmcv's registry (the names whose class comes from torch's or mmcv's
    activation modules) builds in ours as the same module, with the same keyword arguments
    and the same values (eval mode; the inputs span the kinks and the clamps)."""
    from mmcv.cnn import build_activation_layer
    from mmengine.registry import MODELS

    from mmvitswin.core.layers import build_act
    mmcv_acts = {name for name, cls in MODELS.module_dict.items()
                 if getattr(cls, '__module__', '') in _MMCV_ACT_FILES}
    assert mmcv_acts == set(ACT_KWARGS)
    x = torch.linspace(-8, 8, 161).view(7, 23)
    for name, kwargs in ACT_KWARGS.items():
        with warnings.catch_warnings():
            warnings.simplefilter('ignore')  # HSigmoid's note on its v1.4.4 defaults
            ref = build_activation_layer(dict(type=name, **kwargs)).eval()
        ours = build_act(dict(type=name, **kwargs))().eval()
        if ref.__class__.__module__.startswith('torch.'):
            assert type(ours) is type(ref), name
        torch.testing.assert_close(ours(x.clone()), ref(x.clone()), atol=1e-6, rtol=1e-6,
                                   msg=name)
        assert ours.state_dict().keys() == ref.state_dict().keys()
    # a torch class as type, as mmcv's registry builds it
    assert isinstance(build_act(dict(type=torch.nn.Hardswish))(), torch.nn.Hardswish)
    assert build_act(None)().__class__ is torch.nn.GELU


@pytest.mark.parametrize('cfg, error', [
    (dict(type='Nope'), ArgumentValueError),
    (dict(inplace=True), ArgumentValueError),  # no type
    (dict(type='Swish', inplace=True), ArgumentTypeError),  # mmcv's Swish takes none
    (dict(type='ReLU', negative_slope=0.1), ArgumentTypeError),
    (dict(type='PReLU', device='cpu'), ArgumentTypeError),  # factory keywords: use .to()
    (dict(type='PReLU', num_parameters=4), ArgumentValueError),
    (dict(type='HSigmoid', divisor=0.), ArgumentValueError),
    (dict(type='LeakyReLU', negative_slope='a'), ArgumentTypeError),
    (dict(type='ReLU', inplace='yes'), ArgumentTypeError),
    ('GELU', ArgumentTypeError),
])
def test_act_cfg_refused_naming_it(cfg, error):
    from mmvitswin.core.layers import build_act
    with pytest.raises(error, match='act_cfg'):
        build_act(cfg)


@pytest.mark.parametrize('cfg', [
    dict(type='LN'), dict(type='LN', eps=1e-6), dict(type='LN', elementwise_affine=False),
    dict(type='LN', bias=False, requires_grad=False), dict(type=torch.nn.LayerNorm, eps=0.1)])
def test_layer_norm_cfg_is_mmcvs(cfg):
    """``build_layer_norm`` gives the LayerNorm mmcv's ``build_norm_layer`` gives (same eps,
    affine weight/bias, requires_grad, values)."""
    from mmcv.cnn import build_norm_layer

    from mmvitswin.core.layers import build_layer_norm
    ref = build_norm_layer(cfg, 12)[1]
    ours = build_layer_norm(cfg, 12)
    assert type(ours) is type(ref)
    assert (ours.eps, ours.elementwise_affine) == (ref.eps, ref.elementwise_affine)
    assert {k: p.requires_grad for k, p in ours.named_parameters()} == \
        {k: p.requires_grad for k, p in ref.named_parameters()}
    ours.load_state_dict(ref.state_dict(), strict=True)
    x = torch.randn(3, 12)
    torch.testing.assert_close(ours(x), ref(x))


@pytest.mark.parametrize('cfg, error', [
    (dict(type='BN'), ArgumentValueError), (dict(type='LN', affine=False), ArgumentTypeError),
    (dict(type='LN', eps='a'), ArgumentTypeError), (dict(type='LN', bias=0), ArgumentTypeError),
    (dict(eps=1e-6), ArgumentValueError), (['LN'], ArgumentTypeError)])
def test_layer_norm_cfg_refused_naming_it(cfg, error):
    from mmvitswin.core.layers import build_layer_norm
    with pytest.raises(error, match='norm_cfg'):
        build_layer_norm(cfg, 8)


@pytest.mark.parametrize('stride', [1, 2, 3, 4, 5, (2, 1), (1, 3), [3, 2]])
def test_patch_merging_stride_matches_mmdet(stride):
    """Our PatchMerging at any stride (2x2 neighbourhoods every ``stride`` rows/columns, corner
    zero padding, output ceil(size / stride)) against mmdet's ``nn.Unfold`` one: sizes, values
    and gradients at shared weights, odd, even and 1x1 inputs."""
    from mmdet.models.layers import PatchMerging as MMDetPatchMerging

    from mmvitswin.core.layers import PatchMerging
    torch.manual_seed(0)
    ref = MMDetPatchMerging(8, 16, stride=stride)
    _perturb(ref)
    ours = PatchMerging(8, 16, stride=stride)
    ours.load_state_dict(ref.state_dict(), strict=True)
    sh, sw = (stride, stride) if isinstance(stride, int) else stride
    for h, w in [(9, 13), (8, 8), (1, 1), (7, 2)]:
        x = torch.randn(2, h * w, 8, requires_grad=True)
        expected, hw = ref(x, (h, w))
        assert hw == (-(-h // sh), -(-w // sw))
        got = ours(x.view(2, h, w, 8))
        assert got.shape == (2, *hw, 16)
        torch.testing.assert_close(got.flatten(1, 2), expected)
        grad = torch.randn_like(expected)
        names = [k for k, _ in ref.named_parameters()]
        ref_grads = torch.autograd.grad(expected, [x, *ref.parameters()], grad)
        own = dict(ours.named_parameters())
        ours_grads = torch.autograd.grad(got.flatten(1, 2), [x, *(own[k] for k in names)], grad)
        assert len(names) == 3 and len(own) == 3  # norm weight/bias and reduction weight
        for e, g in zip(ref_grads, ours_grads):
            torch.testing.assert_close(g, e)


@pytest.mark.parametrize('norm_after', [False, True])
def test_patch_merging_under_bf16_autocast_matches_the_unfold_order(norm_after):
    """Under bf16 autocast (where the reduction weight is cast before it is reordered) the
    merge gives what mmdet's ``nn.Unfold`` order gives under the same autocast: values and
    fp32 gradients at shared weights; V2's order (``norm_after``) against the same unfold
    features through the reduction, then the norm."""
    from mmdet.models.layers import PatchMerging as MMDetPatchMerging

    from mmvitswin.core.layers import PatchMerging
    torch.manual_seed(0)
    ref = MMDetPatchMerging(8, 16)
    _perturb(ref)
    ours = PatchMerging(8, 16, norm_after=norm_after)
    if norm_after:
        ref.norm = torch.nn.LayerNorm(16)
        _perturb(ref.norm)
    ours.load_state_dict(ref.state_dict(), strict=True)

    def reference(x, hw):
        if not norm_after:
            return ref(x, hw)[0]
        unfolded = ref.sampler(x.transpose(1, 2).reshape(2, 8, *hw)).transpose(1, 2)
        return ref.norm(ref.reduction(unfolded))

    for h, w in [(10, 14), (8, 8)]:
        x = torch.randn(2, h * w, 8, requires_grad=True)
        with torch.autocast('cpu', dtype=torch.bfloat16):
            expected = reference(x, (h, w))
            got = ours(x.view(2, h, w, 8)).flatten(1, 2)
        assert got.dtype == expected.dtype
        torch.testing.assert_close(got.float(), expected.float(), rtol=2e-2, atol=2e-2)
        grad = torch.randn_like(expected)
        names = [k for k, _ in ref.named_parameters()]
        own = dict(ours.named_parameters())
        ref_grads = torch.autograd.grad(expected, [x, *ref.parameters()], grad)
        ours_grads = torch.autograd.grad(got, [x, *(own[k] for k in names)], grad)
        for e, g in zip(ref_grads, ours_grads):
            assert g.dtype == e.dtype == torch.float32
            torch.testing.assert_close(g, e, rtol=2e-2, atol=2e-2 * e.abs().max().item())
