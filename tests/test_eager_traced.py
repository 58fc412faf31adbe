"""Eager = traced = reference, for every backbone in the zoo (issue 63, build item 3).

One code path: each zoo backbone run eagerly and the same module under
``torch.compile(backend='aot_eager', dynamic=True, fullgraph=True)`` (Dynamo captures the
forward as one graph with symbolic sizes, AOTAutograd traces its forward and backward) give the
same outputs, the same input gradient and the same parameter gradients, at an odd, non-square
size that pads at every stage. ``aot_eager`` runs the traced aten graph with the eager kernels,
so a difference beyond fp32 round-off is a difference of code path: the tolerance is tight
(``TOL`` relative).

Where a reference implementation can be built here with random weights (mmdet's Swin,
HF's Swinv2Backbone, mmaction2's video Swin, mmseg's ViT, HF's SamVisionModel and
DINOv3ViTModel; ``ORACLES``), the compiled model carries the reference's weights and its
outputs must equal the reference's at the same size, with the tolerances of the parity tests
those oracles come from. An entry without one skips the ``reference`` contract in zoo.py and
says why.

A second size (the entry's other one) must run through the same graph, forward and backward,
without a recompilation, and give eager's outputs and input gradient.

The models run in training mode with ``drop_path_rate=0`` (the only random op of the zoo's
training paths: a reference cannot draw the same masks), so the training path is the one
traced and compared. One compile per backbone (forward + backward) serves all the checks:
the AOTAutograd trace of a small zoo model with symbolic sizes takes 7-55 s on one core
(about 6 minutes for the zoo), hence the slow tier.
"""
import warnings
from typing import Callable, Dict, List

import pytest
import torch
import torch._dynamo
import torch.nn.functional as F

from conftest import max_rel_err
from mmvitswin.core.checkpoint import load_pretrained
from mmvitswin.core.compat import COMPILE_DYNAMIC_OK
from zoo import ZOO, CONTRACTS, as_tuple, create_model, example_input, list_models, params
from zoo import perturb_like_trained
from test_swin3d import _reference_pair, mma  # noqa: F401  (mma: mmaction2's module, a fixture)

pytestmark = [
    pytest.mark.slow(reason='torch.compile(aot_eager, dynamic=True) of every zoo backbone, '
                     'forward and backward: 7-55 s of tracing each on one core'),
    pytest.mark.skipif(not COMPILE_DYNAMIC_OK, reason='torch.compile(dynamic=True) of these '
                       'models needs torch >= 2.6 (see mmvitswin.core.compat)'),
]

TOL = 1e-5  # eager against traced, fp32, relative to the largest magnitude
# A parameter gradient below this fraction of the largest one is compared relative to that
# fraction: a gradient that is 0 in exact arithmetic (a bias followed by a norm: the interaction
# adapter's spm.fc1.bias, ~1e-17 of the largest in float64) holds fp32 round-off only, which the
# two runs sum in different orders (measured: differences of 2e-8 of the largest gradient).
GRAD_FLOOR = 1e-2
REF_TOL = 1e-5  # traced against the reference: the parity tests' tolerance

Oracle = Callable[[torch.Tensor], List[torch.Tensor]]


# ---------------------------------------------------------------------------- the oracles
# Each takes the zoo model (built with drop_path_rate=0), loads a reference's random weights
# into it (moved off their init, so that a dropped or swapped key shows) and returns the
# reference's forward: image -> the maps the zoo model must return. The reference is built
# from the zoo entry's own arguments.
def _mmdet_swin(model, request, tmp_path) -> Oracle:
    from test_swin_parity import _reference
    ref = _reference('mmdet', **ZOO['swin'].kwargs)
    perturb_like_trained(ref)
    ref.eval()  # mmdet's train() returns None
    model.load_state_dict(ref.state_dict(), strict=True)
    return lambda x: list(ref(x))


def _hf_swinv2(model, request, tmp_path) -> Oracle:
    """HF's Swinv2Backbone with the entry's windows (4, trained at 2). HF's backbone returns
    the stage maps before any norm, ours after ``norm{i}``: the oracle is our ``norm{i}`` of
    HF's map (tests/test_swin_v2.py compares the maps before the norms as well)."""
    from test_swin_v2 import hf_config, hf_model_layout, perturbed, with_our_norm
    kw = ZOO['swinv2'].kwargs
    window, pretrained = kw['window_size'], kw['pretrained_window_sizes']
    hf = perturbed(pytest.importorskip('transformers').Swinv2Backbone(hf_config(
        embed_dims=kw['embed_dims'], depths=kw['depths'], num_heads=kw['num_heads'],
        window=window, pretrained=[pretrained] * 4)))
    path = str(tmp_path / 'hf_swinv2.pth')
    torch.save(hf_model_layout(hf), path)
    with pytest.warns(UserWarning):  # HF's final layernorm is left over, our norm{i} missing
        load_pretrained(model, path)

    def oracle(x):
        with torch.no_grad():
            maps = hf(x).feature_maps
        return [with_our_norm(model, i, m) for i, m in enumerate(maps)]
    return oracle


def _mmaction2_swin3d(model, request, tmp_path) -> Oracle:
    ref, _ = _reference_pair(request.getfixturevalue('mma'), **ZOO['swin3d'].kwargs)
    model.load_state_dict(ref.state_dict(), strict=True)
    return lambda x: list(as_tuple(ref(x)))


def _mmseg_vit(model, request, tmp_path) -> Oracle:
    """mmseg's VisionTransformer with the entry's arguments (patch conv with bias and LayerNorm
    eps 1e-6, as ours; mmseg's defaults differ), loaded through our mmseg layout conversion."""
    from mmseg.models.backbones.vit import VisionTransformer
    kw = ZOO['vit'].kwargs
    arch = kw['arch']
    torch.manual_seed(0)
    ref = VisionTransformer(img_size=kw['img_size'], patch_size=kw['patch_size'],
                            embed_dims=arch['embed_dims'], num_layers=arch['num_layers'],
                            num_heads=arch['num_heads'],
                            mlp_ratio=arch['feedforward_channels'] // arch['embed_dims'],
                            out_indices=kw['out_indices'], patch_bias=True,
                            norm_cfg=dict(type='LN', eps=1e-6))
    ref.init_weights()
    perturb_like_trained(ref)
    ref.eval()
    path = str(tmp_path / 'mmseg_vit.pth')
    torch.save({'state_dict': ref.state_dict(), 'meta': {}}, path)
    with warnings.catch_warnings():
        warnings.simplefilter('error')  # nothing left over, nothing missing
        load_pretrained(model, path)
    return lambda x: list(ref(x))


def _padded_to(x: torch.Tensor, multiple: int) -> torch.Tensor:
    """``x`` zero-padded at the bottom and right to a multiple of ``multiple``: what our patch
    embedding does with a partial patch, where HF's ViTs drop it (they need whole patches)."""
    h, w = x.shape[-2:]
    return F.pad(x, (0, -w % multiple, 0, -h % multiple))


def _hf_sam(model, request, tmp_path) -> Oracle:
    """HF's SamVisionModel (neck output), at the padded size through tests/test_sam.py's
    ``hf_at_size`` (HF's position grid resized as ViTDet does, its size check moved)."""
    from safetensors.torch import save_file
    from test_sam import SMALL, hf_at_size, randomise
    transformers = pytest.importorskip('transformers')
    kw = ZOO['vit-sam-neck'].kwargs
    arch = kw['arch']
    cfg = transformers.SamVisionConfig(**dict(
        SMALL, hidden_size=arch['embed_dims'], num_hidden_layers=arch['num_layers'],
        num_attention_heads=arch['num_heads'], mlp_dim=arch['feedforward_channels'],
        image_size=kw['img_size'], patch_size=kw['patch_size'], window_size=kw['window_size'],
        global_attn_indexes=list(kw['global_attn_indexes']),
        output_channels=kw['neck_cfg']['out_channels']))
    hf = randomise(transformers.SamVisionModel(cfg))
    snapshot = tmp_path / 'hf-sam-vision'
    snapshot.mkdir()
    hf.config.save_pretrained(str(snapshot))
    save_file({k: v.contiguous() for k, v in hf.state_dict().items()},
              str(snapshot / 'model.safetensors'))
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        load_pretrained(model, str(snapshot))

    def oracle(x):
        x = _padded_to(x, kw['patch_size'])
        with torch.no_grad():
            return [hf_at_size(hf, tuple(x.shape[-2:]))(x).last_hidden_state]
    return oracle


def _hf_dinov3(model, request, tmp_path) -> Oracle:
    """HF's DINOv3ViTModel with the entry's trunk (RoPE, 4 registers, LayerScale, SwiGLU, key
    bias as ours, LayerNorm eps 1e-6 as ours), at the padded size: block 1's patch tokens
    (its hidden state) and block 3's after the final norm (HF's last hidden state)."""
    from safetensors.torch import save_file
    from test_dinov3 import hf_state, randomise
    transformers = pytest.importorskip('transformers')
    kw = ZOO['vit-dinov3'].kwargs
    arch = kw['arch']
    assert kw['out_indices'] == (1, 3) and arch['num_layers'] == 4 and kw['final_norm']
    cfg = transformers.DINOv3ViTConfig(
        hidden_size=arch['embed_dims'], intermediate_size=arch['feedforward_channels'],
        num_hidden_layers=arch['num_layers'], num_attention_heads=arch['num_heads'],
        num_register_tokens=kw['num_register_tokens'], patch_size=kw['patch_size'],
        image_size=kw['img_size'], rope_theta=kw['rope_theta'], use_gated_mlp=True,
        hidden_act='silu', key_bias=True, layer_norm_eps=1e-6, layerscale_value=0.5)
    hf = randomise(transformers.DINOv3ViTModel(cfg))
    snapshot = tmp_path / 'hf-dinov3'
    snapshot.mkdir()
    hf.config.save_pretrained(str(snapshot))
    save_file(hf_state(hf), str(snapshot / 'model.safetensors'))
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        load_pretrained(model, str(snapshot))
    prefix = 1 + kw['num_register_tokens']

    def oracle(x):
        x = _padded_to(x, kw['patch_size'])
        grid = (x.shape[-2] // kw['patch_size'], x.shape[-1] // kw['patch_size'])
        with torch.no_grad():
            out = hf(x, output_hidden_states=True)
        maps = []
        for seq in (out.hidden_states[2], out.last_hidden_state):  # after blocks 1 and 3
            maps.append(seq[:, prefix:].transpose(1, 2).reshape(x.shape[0], -1, *grid))
        return maps
    return oracle


ORACLES: Dict[str, Callable] = {
    'swin': _mmdet_swin,
    'swinv2': _hf_swinv2,
    'swin3d': _mmaction2_swin3d,
    'vit': _mmseg_vit,
    'vit-sam-neck': _hf_sam,
    'vit-dinov3': _hf_dinov3,
}


# ------------------------------------------------------------------------------ the runs
def _run(model: torch.nn.Module, x: torch.Tensor, weights=None, call=None):
    """One training-mode forward and backward of ``sum_i <out_i, weights_i>`` (random fixed
    weights: a plain sum would hide a wrong value of zero-mean gradient, e.g. after a norm)
    through ``call`` (default: ``model`` itself; or its compiled wrapper).
    Returns ``(outputs, input gradient, {name: parameter gradient}, weights)``."""
    x = x.clone().requires_grad_(True)
    model.zero_grad(set_to_none=True)
    outs = as_tuple((model if call is None else call)(x))
    if weights is None:
        gen = torch.Generator().manual_seed(1)
        weights = [torch.randn(o.shape, generator=gen) for o in outs]
    sum((o * w).sum() for o, w in zip(outs, weights)).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return [o.detach() for o in outs], x.grad, grads, weights


def _assert_close(got, want, what, tol=TOL, scale=None):
    """max |got - want| <= tol * max(|want|.max(), scale): ``scale`` floors the denominator
    for a gradient whose true value is ~0 (only round-off left in both)."""
    assert got.shape == want.shape, (what, got.shape, want.shape)
    denom = float(want.abs().max())
    if scale is not None:
        denom = max(denom, scale)
    err = float((got - want).abs().max()) / max(denom, 1e-30)
    assert err <= tol, f'{what}: relative error {err:.2e} > {tol:.0e}'


# Python floats of the modules (LayerNorm eps, dropout p, attention scale) specialised from the
# start: with dynamic=True, Dynamo first traces them as symbolic inputs, fails to turn them into
# tensors and restarts the whole trace with them specialised (TensorifyScalarRestartAnalysis).
# The graph is the same either way; the discarded first trace is half the compile time.
_SPECIALIZE_FLOATS = dict(specialize_float=True)
if not hasattr(torch._dynamo.config, 'specialize_float'):  # older torch: specialised anyway
    _SPECIALIZE_FLOATS = {}


@pytest.mark.timeout(1200)
@pytest.mark.parametrize('name', params('traced'))
def test_traced_equals_eager_and_reference(name, request, tmp_path):
    from torch._dynamo.utils import counters
    torch._dynamo.reset()
    counters.clear()
    model = create_model(name, drop_path_rate=0.0).train()
    oracle = None
    if name in list_models(contract='reference'):
        oracle = ORACLES[name](model, request, tmp_path)
    model.train()
    x = example_input(name, 0)

    outs, x_grad, grads, weights = _run(model, x)
    compiled = torch.compile(model, backend='aot_eager', dynamic=True, fullgraph=True)
    with torch._dynamo.config.patch(**_SPECIALIZE_FLOATS):
        t_outs, t_x_grad, t_grads, _ = _run(model, x, weights, call=compiled)

    # fullgraph=True: a graph break raises; and no second graph (a recompile) was needed
    assert counters['stats']['unique_graphs'] == 1, dict(counters['stats'])
    assert len(t_outs) == len(outs)
    for i, (a, b) in enumerate(zip(t_outs, outs)):
        _assert_close(a, b, f'output {i}')
    _assert_close(t_x_grad, x_grad, 'input gradient')
    assert sorted(t_grads) == sorted(grads), 'traced and eager reach different parameters'
    floor = GRAD_FLOOR * max(float(g.abs().max()) for g in grads.values())
    for key, g in grads.items():
        _assert_close(t_grads[key], g, f'gradient of {key}', scale=floor)

    # a second odd size runs the same graph, forward and backward: no guard of the first trace
    # (a size, a stride that hinges on one, a memory layout) pins the example
    x1 = example_input(name, 1)
    outs1, x1_grad, _, weights1 = _run(model, x1)
    with torch._dynamo.config.patch(error_on_recompile=True, **_SPECIALIZE_FLOATS):
        t_outs1, t_x1_grad, _, _ = _run(model, x1, weights1, call=compiled)
    for i, (a, b) in enumerate(zip(t_outs1, outs1)):
        _assert_close(a, b, f'output {i} at the second size')
    _assert_close(t_x1_grad, x1_grad, 'input gradient at the second size')

    if oracle is not None:
        with torch.no_grad():
            want = oracle(x)
        assert len(want) == len(t_outs)
        for i, (a, b) in enumerate(zip(t_outs, want)):
            assert a.shape == b.shape, (i, a.shape, b.shape)
            err = max_rel_err(a, b)
            assert err < REF_TOL, f'output {i} against the reference: relative error {err:.2e}'


def test_every_entry_has_an_oracle_or_says_why_not():
    """A zoo entry meets the reference contract through an oracle here, or skips it with a
    reason (zoo.py); no oracle is kept for an entry that no longer exists or skips it."""
    assert 'reference' in CONTRACTS
    with_reference = set(list_models(contract='reference'))
    assert with_reference == set(ORACLES), (
        f'entries without an oracle: {sorted(with_reference - set(ORACLES))}; oracles '
        f'without an entry meeting the contract: {sorted(set(ORACLES) - with_reference)}')
    for name in set(ZOO) - with_reference:
        assert ZOO[name].skip['reference'].strip(), name

