"""GroupedOptimWrapperConstructor against mmengine's DefaultOptimWrapperConstructor (the
oracle): the same settings for every parameter in fewer param groups, the same training
steps, the fused kernel where torch has one, and the errors a config can still hit."""
import copy

import pytest
import torch
import torch.nn as nn
from mmengine.optim import build_optim_wrapper

import mmvitswin  # noqa: F401  (registers and bridges the constructor)
from mmvitswin.openmmlab.engine.grouped import merge_param_groups
from mmvitswin.core.backbones.swin import SwinTransformer

PARAMWISE = dict(norm_decay_mult=0., bias_decay_mult=0.5,
                 custom_keys={'relative_position_bias_table': dict(decay_mult=0.),
                              'head': dict(lr_mult=2.)})


class Detector(nn.Module):
    def __init__(self):
        super().__init__()
        self.backbone = SwinTransformer(embed_dims=16, depths=(2, 2), num_heads=(1, 2),
                                        strides=(4, 2), window_size=4, out_indices=(0, 1),
                                        drop_path_rate=0.)
        self.neck = nn.Conv2d(32, 8, 1)
        self.head = nn.Linear(8, 3)

    def loss(self, x):
        feat = self.neck(self.backbone(x)[1]).mean((2, 3))
        return self.head(feat).logsumexp(1).sum()


def build(model, constructor=None, paramwise=PARAMWISE, **optimizer):
    cfg = dict(type='OptimWrapper', optimizer=dict(
        dict(type='AdamW', lr=1e-3, weight_decay=0.05), **optimizer))
    if paramwise is not None:
        cfg['paramwise_cfg'] = copy.deepcopy(paramwise)
    if constructor:
        cfg['constructor'] = constructor
    return build_optim_wrapper(model, cfg).optimizer


SETTINGS = ('lr', 'weight_decay', 'betas', 'eps', 'amsgrad')


def settings_by_param(optimizer, model):
    names = {id(p): n for n, p in model.named_parameters()}
    return {names[id(p)]: tuple(g[k] for k in SETTINGS)
            for g in optimizer.param_groups for p in g['params']}


def test_every_parameter_gets_mmengines_settings_in_one_group_per_setting():
    model = Detector()
    ref = build(model)
    ours = build(model, 'mmvitswin.GroupedOptimWrapperConstructor')
    assert len(ref.param_groups) == len(list(model.parameters()))  # mmengine: one per param
    expected = settings_by_param(ref, model)
    assert settings_by_param(ours, model) == expected
    # groups merge when every entry is equal, mmengine's lr_mult / decay_mult records included
    distinct = {tuple(sorted((k, repr(v)) for k, v in g.items() if k != 'params'))
                for g in ref.param_groups}
    assert len(ours.param_groups) == len(distinct) == 5
    order = [p for g in ours.param_groups for p in g['params']]
    assert len(order) == len({id(p) for p in order}) == len(expected)


def test_merge_param_groups_reads_missing_settings_from_the_defaults():
    a, b, c, d = (nn.Parameter(torch.zeros(1)) for _ in range(4))
    groups = [dict(params=[a]), dict(params=[b], lr=0.1), dict(params=[c], lr=0.2),
              dict(params=[d], weight_decay=0.)]
    merged = merge_param_groups(groups, dict(lr=0.1, weight_decay=0.05))
    assert [[id(p) for p in g['params']] for g in merged] == [[id(a), id(b)], [id(c)], [id(d)]]
    assert [g.get('lr') for g in merged] == [None, 0.2, None]


def _train(model, optimizer, steps=4):
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    for _ in range(steps):
        optimizer.zero_grad()
        model.loss(torch.randn(2, 3, 32, 32, generator=g)).backward()
        optimizer.step()
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def fused_adamw_on_cpu() -> bool:
    """Whether this torch has a fused AdamW kernel for CPU tensors (torch >= 2.4)."""
    try:
        torch.optim.AdamW([nn.Parameter(torch.zeros(2))], fused=True)
    except RuntimeError:
        return False
    return True


def test_training_steps_equal_mmengines_and_fused_where_supported():
    torch.manual_seed(0)
    start = Detector()
    runs = {}
    for key, constructor, extra in (('ref', None, {}),
                                    ('grouped', 'mmvitswin.GroupedOptimWrapperConstructor', {}),
                                    ('fused', 'mmvitswin.GroupedOptimWrapperConstructor',
                                     dict(fused='auto'))):
        model = copy.deepcopy(start)
        optimizer = build(model, constructor, **extra)
        runs[key] = _train(model, optimizer)
        if key == 'fused':
            assert bool(optimizer.defaults.get('fused')) == fused_adamw_on_cpu()
    moved = max((runs['ref'][n] - p).abs().max() for n, p in start.named_parameters())
    assert moved > 1e-3  # the steps changed the weights
    for name, ref in runs['ref'].items():
        # the same per-tensor arithmetic, bit for bit
        torch.testing.assert_close(runs['grouped'][name], ref, atol=0, rtol=0, msg=name)
        # the fused kernel: the same update up to float rounding (up to 4e-6 here, on the
        # key biases, whose gradients are rounding noise that Adam's normalisation amplifies)
        torch.testing.assert_close(runs['fused'][name], ref, atol=1e-5, rtol=1e-5, msg=name)


def test_fused_auto_falls_back_for_an_optimizer_without_a_fused_kernel():
    optimizer = build(Detector(), 'mmvitswin.GroupedOptimWrapperConstructor', type='Adamax',
                      fused='auto')
    assert isinstance(optimizer, torch.optim.Adamax) and 'fused' not in optimizer.defaults
    assert len(optimizer.param_groups) == 5


def test_fused_auto_still_reports_a_bad_setting():
    with pytest.raises(ValueError, match='learning rate'):
        build(Detector(), 'mmvitswin.GroupedOptimWrapperConstructor', lr=-1.0, fused='auto')


def test_without_paramwise_cfg_one_group_and_fused():
    optimizer = build(Detector(), 'mmvitswin.GroupedOptimWrapperConstructor', paramwise=None,
                      fused='auto')
    assert len(optimizer.param_groups) == 1
    assert bool(optimizer.defaults.get('fused')) == fused_adamw_on_cpu()


def test_state_dict_resumes_with_the_same_constructor_not_across():
    torch.manual_seed(1)
    model = Detector()
    optimizer = build(model, 'mmvitswin.GroupedOptimWrapperConstructor', fused='auto')
    _train(model, optimizer, steps=2)
    state = copy.deepcopy(optimizer.state_dict())
    again = build(model, 'mmvitswin.GroupedOptimWrapperConstructor', fused='auto')
    again.load_state_dict(state)
    assert len(optimizer.state) > 0 and again.state.keys() == optimizer.state.keys()
    for p, state in optimizer.state.items():
        torch.testing.assert_close(again.state[p]['exp_avg'], state['exp_avg'])
    with pytest.raises(ValueError, match='different number of parameter groups'):
        build(model).load_state_dict(copy.deepcopy(optimizer.state_dict()))


def test_usable_from_mmdet_scope():
    from mmdet.registry import OPTIM_WRAPPER_CONSTRUCTORS
    assert OPTIM_WRAPPER_CONSTRUCTORS.get('GroupedOptimWrapperConstructor').__module__ == \
        'mmvitswin.openmmlab.engine.grouped'
