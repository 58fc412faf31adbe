"""The contract every core backbone keeps, checked over the whole zoo (tests/zoo.py):

- shapes: any size, odd ones and 1 pixel included, gives the promised maps
  ``(B, C_i, ceil(S / s_i))``, finite, and a sample's maps do not depend on the rest of the batch;
- gradients: a backward pass in training mode reaches the input and every trainable parameter,
  with finite values;
- checkpoint round trip: a state dict saved with ``torch.save`` (bare, or inside a whole
  detector's runner checkpoint) loads back through ``init_cfg=dict(type='Pretrained', ...)``
  + ``init_weights()`` exactly, without a warning, and the outputs are identical;
- attention layouts: the same outputs and gradients when ``F.scaled_dot_product_attention``
  returns its result in the memory layout CUDA's fused kernels use, at batch 1 and 2.

AMP, compile, ONNX and bounded state: tests/test_deploy_paths.py; dense NCHW outputs:
tests/test_output_layout.py; input checks: tests/test_reliability_inputs.py.
"""
import warnings

import pytest
import torch

from conftest import max_rel_err
from zoo import ZOO, as_tuple, create_model, example_input, expected_shapes, params


def _tiny(name: str):
    return (1, 1, 1) if ZOO[name].video else (1, 1)


@pytest.mark.parametrize('name', params('shapes'))
def test_shapes_at_odd_sizes_and_one_pixel_and_batch_independence(name):
    model = create_model(name).eval()
    for size in ZOO[name].sizes + (_tiny(name), ):
        x = example_input(name, size=size)
        with torch.no_grad():
            outs = as_tuple(model(x))
            first = as_tuple(model(x[:1]))
        assert [tuple(o.shape) for o in outs] == expected_shapes(name, x.shape), size
        assert all(o.dtype == x.dtype and torch.isfinite(o).all() for o in outs), size
        # relative to each map's scale: at 1 px a ResNet stem's fp32 rounding differs between
        # batch sizes by ~4e-5 of the map (oneDNN picks its kernels by batch); a sample that
        # sees the rest of its batch is off by orders of magnitude more
        for a, b in zip(outs, first):
            assert a[:1].shape == b.shape and max_rel_err(a[:1], b) < 2e-4, size


@pytest.mark.parametrize('name', params('gradients'))
def test_backward_reaches_the_input_and_every_trainable_parameter(name):
    model = create_model(name).train()
    x = example_input(name, 1).requires_grad_()
    outs = as_tuple(model(x))
    # random weights per output: every element matters, none cancels another
    sum((o * torch.randn_like(o)).sum() for o in outs).backward()
    assert x.grad is not None and x.grad.abs().sum() > 0
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    assert params
    missing = [n for n, p in params if p.grad is None]
    assert not missing, f'no gradient for {missing[:5]}'
    bad = [n for n, p in params if not torch.isfinite(p.grad).all()]
    assert not bad, f'non-finite gradients in {bad[:5]}'


def _cuda_layout_sdpa(sdpa):
    """``sdpa`` returning the same values in the memory layout CUDA's flash and
    memory-efficient kernels give: ``(..., L, heads, D)`` in memory, shown as ``(..., heads, L,
    D)`` (strides ``(L*heads*D, D, heads*D, 1)`` for 4-D), never contiguous. CPU's kernels return
    contiguous outputs, so without this a ``view`` that needs contiguity passes every CPU test
    and fails on a GPU (batch 1: its size-1 dim lets a later view half-succeed)."""
    def wrapped(*args, **kwargs):
        out = sdpa(*args, **kwargs)
        return out.transpose(-3, -2).contiguous().transpose(-3, -2)
    return wrapped


@pytest.mark.parametrize('name', params('shapes'))
def test_attention_output_in_cuda_memory_layout(name, monkeypatch):
    x = example_input(name, 0, batch=2)
    weights = [torch.randn(2, *s[1:]) for s in expected_shapes(name, x.shape)]
    cases = {}
    for layout in ('cpu', 'cuda'):
        model = create_model(name)  # fresh: the training pass moves BatchNorm's statistics
        if layout == 'cuda':
            monkeypatch.setattr(torch.nn.functional, 'scaled_dot_product_attention',
                                _cuda_layout_sdpa(torch.nn.functional.scaled_dot_product_attention))
        with torch.no_grad():
            model.eval()
            inference = [as_tuple(model(x[:n])) for n in (1, 2)]
        model.train()
        model.zero_grad()
        torch.manual_seed(0)  # the same drop-path draws for both layouts
        outs = as_tuple(model(x[:1]))
        sum((o * w[:1]).sum() for o, w in zip(outs, weights)).backward()
        outs = tuple(o.detach() for o in outs)
        grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
        cases[layout] = inference, outs, grads
    (inf_a, train_a, grad_a), (inf_b, train_b, grad_b) = cases['cpu'], cases['cuda']
    # equal on AMD's Zen 4 (0.0); the bounds leave room for a GEMM that reads a strided
    # input in another summation order, far below what a misread layout gives (order 1)
    for outs_a, outs_b in zip(inf_a + [train_a], inf_b + [train_b]):
        assert len(outs_a) == len(outs_b)
        assert all(max_rel_err(b, a) < 1e-5 for a, b in zip(outs_a, outs_b))
    assert len(grad_a) == len(grad_b) and grad_a
    assert all(max_rel_err(b, a) < 1e-4 for a, b in zip(grad_a, grad_b))


def _runner_checkpoint(state_dict):
    """What MMEngine's runner saves for a whole detector: ``backbone.`` keys under
    ``state_dict``, beside a neck key and ``meta``."""
    wrapped = {f'backbone.{k}': v for k, v in state_dict.items()}
    wrapped['neck.lateral_convs.0.conv.weight'] = torch.zeros(1)
    return dict(meta=dict(epoch=1), state_dict=wrapped)


@pytest.mark.parametrize('wrap', ['bare', 'runner'])
@pytest.mark.parametrize('name', params('checkpoint'))
def test_checkpoint_round_trip_through_init_cfg(name, wrap, tmp_path):
    src = create_model(name, seed=0).eval()
    state = src.state_dict()
    path = str(tmp_path / f'{name}.pth')
    torch.save(state if wrap == 'bare' else _runner_checkpoint(state), path)
    init_cfg = dict(type='Pretrained', checkpoint=path)
    if wrap == 'runner':
        init_cfg['prefix'] = 'backbone.'
    dst = create_model(name, seed=1, init_cfg=init_cfg)
    x = example_input(name, 1)
    with torch.no_grad():
        want = as_tuple(src(x))
        # another seed gives other weights: the comparison below could fail
        assert any(not torch.equal(a, b) for a, b in zip(as_tuple(dst.eval()(x)), want))
    with warnings.catch_warnings():
        warnings.simplefilter('error')  # our own layout: nothing left over, nothing missing
        dst.init_weights()
    loaded = dst.state_dict()
    assert sorted(loaded) == sorted(state)
    different = [k for k, v in state.items() if not torch.equal(loaded[k], v)]
    assert not different, different[:5]
    with torch.no_grad():
        got = as_tuple(dst.eval()(x))
    assert all(torch.equal(a, b) for a, b in zip(got, want))
