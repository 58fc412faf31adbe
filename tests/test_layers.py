"""Shared layers: the oneDNN linear path and the single-gather window partition."""
import pytest
import torch
import torch.nn.functional as F

from mmvitswin.models.layers import (linear, pad_to_multiple, set_onednn_linear,
                                     window_gather_index, window_partition, window_reverse)


@pytest.mark.parametrize('activation', [None, 'gelu'])
def test_linear_equals_f_linear_forward_and_backward(activation):
    torch.manual_seed(0)
    x = torch.randn(3, 17, 24, requires_grad=True)
    w = torch.randn(40, 24, requires_grad=True)
    b = torch.randn(40, requires_grad=True)
    g = torch.randn(3, 17, 40)
    want = F.linear(x, w, b)
    if activation:
        want = F.gelu(want)
    grads_want = torch.autograd.grad((want * g).sum(), (x, w, b))
    got = linear(x, w, b, activation)
    grads_got = torch.autograd.grad((got * g).sum(), (x, w, b))
    assert torch.allclose(got, want, atol=1e-5)
    for a, e in zip(grads_got, grads_want):
        assert torch.allclose(a, e, atol=1e-4)
    with torch.no_grad():
        assert torch.allclose(linear(x, w, b, activation), want, atol=1e-5)


def test_linear_switch_and_autocast_fallback():
    x, w = torch.randn(4, 8), torch.randn(6, 8)
    previous = set_onednn_linear(False)
    try:
        assert torch.equal(linear(x, w), F.linear(x, w))
    finally:
        set_onednn_linear(previous)
    with torch.autocast('cpu', dtype=torch.bfloat16):
        assert linear(x, w).dtype == torch.bfloat16  # autocast still decides the dtype
    with pytest.raises(ValueError, match="activation must be None or 'gelu'"):
        linear(x, w, activation='relu')


@pytest.mark.parametrize('spatial, window, shift', [((9, 13), (7, 7), (3, 3)),
                                                    ((14, 14), (7, 7), (0, 0)),
                                                    ((3, 10, 11), (2, 7, 7), (1, 3, 3))])
def test_gather_index_equals_pad_roll_partition(spatial, window, shift):
    x = torch.randn(2, *spatial, 5)
    padded_x, padded = pad_to_multiple(x, window)
    rolled = torch.roll(padded_x, tuple(-s for s in shift), tuple(range(1, len(window) + 1)))
    want = window_partition(rolled, window)
    gather, pad, scatter = window_gather_index(spatial, window, shift, x.device)
    got = x.reshape(2, -1, 5).index_select(1, gather)
    if pad is not None:
        got = got.index_fill(1, pad, 0.)
    assert torch.equal(got.view_as(want), want)
    back = got.index_select(1, scatter).view_as(x)
    assert torch.equal(back, x)
    # and the reference inverse (reverse, roll back, crop) agrees
    rev = window_reverse(want, window, padded)
    rev = torch.roll(rev, shift, tuple(range(1, len(window) + 1)))
    assert torch.equal(rev[(slice(None), ) + tuple(slice(0, s) for s in spatial)], x)


@pytest.mark.parametrize('patch', [2, 8, 16])
def test_conv_stem_grid_is_ceil_of_size_over_patch_and_gradients_flow(patch):
    from mmvitswin.models.layers import ConvStem
    stem = ConvStem(3, 64, patch)
    x = torch.randn(2, 3, 37, 50, requires_grad=True)
    tokens, grid = stem(x)
    assert grid == (-(-37 // patch), -(-50 // patch))
    assert tokens.shape == (2, *grid, 64)
    tokens.sum().backward()
    assert x.grad.abs().sum() > 0 and stem.proj.weight.grad.abs().sum() > 0


def test_conv_stem_rejects_bad_sizes():
    from mmvitswin.models.layers import ConvStem
    with pytest.raises(ValueError, match='power of two'):
        ConvStem(3, 64, 12)
    with pytest.raises(ValueError, match='embed_dims divisible by 16'):
        ConvStem(3, 72, 16)
