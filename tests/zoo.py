"""The zoo: one small configuration of every core backbone, for the contract tests.

Every "for every backbone" test is parametrised over :func:`list_models`, as timm's tests are
over ``timm.list_models()``: shapes at odd sizes, gradients, checkpoint round trip
(tests/test_zoo_contract.py), AMP, ONNX, bounded state (tests/test_deploy_paths.py), eager =
``torch.compile`` = a reference (tests/test_eager_traced.py), dense NCHW outputs
(tests/test_output_layout.py), input checks (tests/test_reliability_inputs.py) and the
torch-only fresh interpreter (tests/test_core_standalone.py). A backbone added here is covered
by all of them.

Adding a backbone is one entry in ``ZOO`` (and, if new, an import from ``mmvitswin.core``)::

    'swinv2': Entry(SwinTransformerV2, dict(embed_dims=16, depths=(2, 2, 2, 2),
                                            num_heads=(1, 2, 4, 8), window_size=4),
                    out_channels=(16, 32, 64, 128)),

- ``cls``: the core class (``mmvitswin.core`` only: never an ``mmvitswin.openmmlab`` class,
  never anything that imports mmengine/mmcv/mmdet/mmseg: the standalone test builds the zoo
  with those unimportable), or any callable returning the module;
- ``kwargs``: constructor arguments at small widths (a forward-backward of two 64-px images in
  well under a second on one core); ``drop_path_rate`` > 0 where the backbone has it, so the
  training paths trace it;
- ``out_channels`` / ``out_strides``: what the model must return, one entry per map (the
  oracle of the shape contract, written down rather than read from the model). A video stride
  is ``(t, h, w)``; an output of input size ``S`` at stride ``s`` has size ``ceil(S / s)``;
- ``video=True`` for ``(B, C, T, H, W)`` input;
- ``sizes``: two odd input sizes (``(H, W)`` or ``(T, H, W)``) that need padding at every
  stage; compile checks that the second reuses the graph traced at the first;
- ``skip``: ``{contract: reason}`` for a contract this backbone is not meant to meet
  (contracts: see ``CONTRACTS``): the tests of that contract leave the entry out;
- ``xfail``: ``{contract: reason}`` for a known bug (strict: the test reports when it is fixed,
  then delete the line). Prefer a fix over either.

Tests take their parameters from ``params(contract)`` (pytest params, xfail marks applied);
``list_models(contract=...)`` gives plain names.

The entries are the union of the three tables the contract tests used before (test_deploy_paths,
test_output_layout, test_reliability_inputs): every feature one of them exercised is in one entry.
"""
import fnmatch
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import pytest
import torch

from mmvitswin.core.backbones.hybrid_vit import HybridViT
from mmvitswin.core.backbones.swin import SwinTransformer
from mmvitswin.core.backbones.swin3d import SwinTransformer3D
from mmvitswin.core.backbones.swin_v2 import SwinTransformerV2
from mmvitswin.core.backbones.vit import ViTAdapter

Size = Tuple[int, ...]
Stride = Union[int, Tuple[int, int, int]]

# Contracts an entry may opt out of (with a reason): keep in step with the tests using them.
# traced: eager = torch.compile(aot_eager, dynamic), forward and backward, and a second size
# without a recompilation (tests/test_eager_traced.py); reference: the
# same compiled outputs equal a reference implementation's on the same weights (its oracle in
# tests/test_eager_traced.py; an entry without one skips it, saying why); meta: builds and runs
# forward + backward on the meta device (tests/test_meta_device.py).
CONTRACTS = ('shapes', 'gradients', 'checkpoint', 'amp', 'onnx', 'bounded_state', 'layout',
             'inputs', 'standalone', 'traced', 'reference', 'meta')

# Two odd image sizes that need padding at every stage (Swin-like pyramids, 4..32).
IMAGE_SIZES: Tuple[Size, Size] = ((45, 77), (37, 53))
PYRAMID = (4, 8, 16, 32)


@dataclass(frozen=True)
class Entry:
    cls: Callable[..., torch.nn.Module]
    kwargs: Mapping[str, Any]
    out_channels: Tuple[int, ...]
    out_strides: Tuple[Stride, ...] = PYRAMID
    video: bool = False
    sizes: Tuple[Size, Size] = IMAGE_SIZES
    skip: Mapping[str, str] = field(default_factory=dict)
    xfail: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self):
        if len(self.out_channels) != len(self.out_strides):
            raise ValueError(f'out_channels {self.out_channels} and out_strides '
                             f'{self.out_strides} need one entry per output map')
        unknown = (set(self.skip) | set(self.xfail)) - set(CONTRACTS)
        if unknown:
            raise ValueError(f'skip/xfail name unknown contracts {sorted(unknown)}; known: '
                             f'{CONTRACTS}')


def _vit(**kwargs) -> dict:
    """A 4-block ViT, 64 wide, patch 16 (blocks 1 and 3 can be the global ones of ViTDet)."""
    cfg = dict(arch=dict(embed_dims=64, num_layers=4, num_heads=4, feedforward_channels=128),
               img_size=64, patch_size=16, drop_path_rate=0.1)
    cfg.update(kwargs)
    return cfg


def perturb_like_trained(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Every parameter moved off its init as training moves it: biases no longer 0, norm gains
    around 1 (not exactly), logit scales (``*logit_scale``, Swin V2) spread over [log 5, log 20].
    Works on any model by parameter names (ours and HF's: ``layernorm_before`` has 'norm')."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            if name.endswith('logit_scale'):
                p.copy_(math.log(5) + math.log(4) * torch.rand(p.shape, generator=gen))
            elif 'norm' in name and name.endswith('weight'):
                p.copy_(1 + 0.2 * noise)
            else:
                p.add_(0.05 * noise)
    return model


def _swinv2(**kwargs) -> torch.nn.Module:
    """A Swin V2 with trained-like weights. At its random init a post-norm network is
    ill-conditioned for bf16: every block's tiny branch output is normalised up to unit scale,
    its bf16 rounding with it, so the stage-4 map deviates ~10% from fp32 (HF's Swinv2Backbone at
    its init: 12%, measured); off the init both deviate 1-3%, like the pre-norm backbones."""
    return perturb_like_trained(SwinTransformerV2(**kwargs))


# Entries without a reference implementation to compare against (the `reference` contract).
_NO_PYRAMID_REFERENCE = ("ViTDet's simple feature pyramid: its reference (detectron2) is not "
                         "installed, and HF's VitDetBackbone is the trunk alone")
_NO_ADAPTER_REFERENCE = ("ViT-Adapter's interaction adapter: its reference (the ViT-Adapter "
                         "repository) is not installable here; its deformable attention is "
                         "checked against mmcv's in tests/test_vit_adapter_modules.py")
_NO_HYBRID_REFERENCE = ("R50+ViT: the reference is timm's vit_base_r50_s16 (ResNetV2 + ViT), "
                        "which no test builds (timm imports here only behind a torchvision "
                        "stub); tests/test_hybrid_vit.py checks its parts by hand compositions")
ZOO: Dict[str, Entry] = {
    # Swin-T's layout (4 stages of 2 blocks: plain + shifted windows, patch merging), narrow.
    # The sizes keep every stage's window count on the same side of 1 at both sizes (compile
    # specialises a size of 1, as PyTorch does for every dim).
    'swin': Entry(SwinTransformer,
                  dict(embed_dims=32, depths=(2, 2, 2, 2), num_heads=(1, 2, 4, 8),
                       window_size=4, drop_path_rate=0.1),
                  out_channels=(32, 64, 128, 256), sizes=((45, 77), (37, 69))),
    # Swin V2 (cosine attention, continuous position bias, post-norm, V2 merging): V1's layout
    # and sizes, windows of 4 trained at 2 (the window-transfer path of the bias MLP).
    'swinv2': Entry(_swinv2,
                    dict(embed_dims=16, depths=(2, 2, 2, 2), num_heads=(1, 2, 4, 8),
                         window_size=4, pretrained_window_sizes=2, drop_path_rate=0.1),
                    out_channels=(16, 32, 64, 128), sizes=((45, 77), (37, 69))),
    # Video Swin: patch (2, 4, 4), 3-D windows clamped (and the shift dropped) at the same
    # stages at both sizes, which an exported graph assumes of every input (docs/deploy.md).
    'swin3d': Entry(SwinTransformer3D,
                    dict(arch=dict(embed_dims=16, depths=(2, 2, 2, 2), num_heads=(1, 2, 2, 4)),
                         window_size=(2, 4, 4), drop_path_rate=0.1, out_indices=(0, 1, 2, 3)),
                    out_channels=(16, 32, 64, 128),
                    out_strides=((2, 4, 4), (2, 8, 8), (2, 16, 16), (2, 32, 32)),
                    video=True, sizes=((5, 45, 61), (7, 37, 53))),
    # The plain trunk (adapter=None, as mmseg's VisionTransformer): maps of blocks 1 and 3 at
    # stride 16, CLS token dropped from the maps.
    'vit': Entry(ViTAdapter, _vit(out_indices=(1, 3)), out_channels=(64, 64),
                 out_strides=(16, 16)),
    # ViTDet: windowed blocks with decomposed rel-pos, two global blocks, simple pyramid.
    'vit-simple': Entry(ViTAdapter,
                        _vit(window_size=3, global_attn_indexes=(1, 3), use_rel_pos=True,
                             adapter='simple', adapter_cfg=dict(out_channels=32)),
                        out_channels=(32, 32, 32, 32),
                        skip={'reference': _NO_PYRAMID_REFERENCE}),
    # patch 8 through the conv stem, no CLS token, windows of 4 without relative positions
    # (windows with no attention bias): the simple pyramid from stride 8.
    'vit-simple-p8-conv-stem': Entry(
        ViTAdapter,
        _vit(patch_size=8, stem='conv', with_cls_token=False, window_size=4,
             adapter='simple', adapter_cfg=dict(out_channels=32)),
        out_channels=(32, 32, 32, 32), skip={'reference': _NO_PYRAMID_REFERENCE}),
    # ViT-Adapter: spatial prior module + interaction blocks with deformable attention, the
    # outputs projected to out_channels.
    'vit-interaction': Entry(ViTAdapter,
                             _vit(adapter='interaction',
                                  adapter_cfg=dict(num_heads=4, conv_inplane=8, n_points=2,
                                                   out_channels=32)),
                             out_channels=(32, 32, 32, 32),
                             skip={'reference': _NO_ADAPTER_REFERENCE}),
    # DINOv2-style trunk: patch 14, LayerScale, 2 register tokens, SwiGLU FFN, timm's
    # antialiased pos-embed resize; the simple pyramid resamples the stride-14 map to 16.
    'vit-p14-simple': Entry(ViTAdapter,
                            _vit(patch_size=14, img_size=56, layer_scale_init_value=1e-5,
                                 num_register_tokens=2, ffn_type='swiglu', final_norm=True,
                                 pos_embed_resize='bicubic-antialias', adapter='simple',
                                 adapter_cfg=dict(out_channels=32)),
                            out_channels=(32, 32, 32, 32),
                            skip={'reference': _NO_PYRAMID_REFERENCE}),
    # the interaction adapter on a patch-14 trunk (levels placed by stride in the image),
    # LayerScale + registers, Meta's DINOv2 pos-embed resize (scale factor with offset 0.1)
    'vit-p14-interaction': Entry(ViTAdapter,
                                 _vit(patch_size=14, img_size=56, layer_scale_init_value=1e-5,
                                      num_register_tokens=2, pos_embed_resize='bicubic-offset',
                                      adapter='interaction',
                                      adapter_cfg=dict(num_heads=4, conv_inplane=8, n_points=2,
                                                       interaction_indexes=[(0, 2), (2, 4)])),
                                 out_channels=(64, 64, 64, 64),
                                 skip={'reference': _NO_ADAPTER_REFERENCE}),
    # R50+ViT: ResNetV2 front end (StdConv, GroupNorm), ViT on its stride-16 map; all 4 levels.
    # GroupNorm has 32 groups: at least 64 channels (stem, bottleneck middles = channels / 4)
    # keep 2 values per group on a 1-pixel input, as in R50 itself.
    # SAM's image encoder: no CLS token, windows + global blocks with decomposed rel-pos,
    # SAM's conv neck (one stride-16 map).
    'vit-sam-neck': Entry(ViTAdapter,
                          _vit(with_cls_token=False, window_size=3, global_attn_indexes=(1, 3),
                               use_rel_pos=True, neck='sam', neck_cfg=dict(out_channels=32)),
                          out_channels=(32, ), out_strides=(16, )),
    # DINOv3: 2-D RoPE on every (global) block, no absolute pos-embed, CLS + 4 registers,
    # LayerScale, SwiGLU, final norm.
    'vit-dinov3': Entry(ViTAdapter,
                        _vit(rope_theta=100.0, abs_pos_embed=False, num_register_tokens=4,
                             layer_scale_init_value=1e-5, ffn_type='swiglu', final_norm=True,
                             out_indices=(1, 3)),
                        out_channels=(64, 64), out_strides=(16, 16)),
    'hybrid': Entry(HybridViT,
                    dict(arch=dict(embed_dims=64, num_layers=2, num_heads=4,
                                   feedforward_channels=128),
                         img_size=64, stem_channels=64, cnn_depths=(1, 1, 1),
                         cnn_channels=(256, 256, 256), out_indices=(0, 1, 2, 3),
                         drop_path_rate=0.1),
                    out_channels=(256, 256, 64, 64),
                    skip={'reference': _NO_HYBRID_REFERENCE}),
}


def list_models(pattern: str = '*', exclude: Sequence[str] = (),
                contract: Optional[str] = None) -> List[str]:
    """Sorted zoo names matching the ``fnmatch`` ``pattern``, minus those matching any of
    ``exclude`` and, with ``contract``, minus the entries that skip it."""
    if contract is not None and contract not in CONTRACTS:
        raise ValueError(f'contract must be one of {CONTRACTS}, got {contract!r}')
    names = [n for n in sorted(ZOO) if fnmatch.fnmatch(n, pattern)
             and not any(fnmatch.fnmatch(n, e) for e in exclude)]
    if contract is not None:
        names = [n for n in names if contract not in ZOO[n].skip]
    return names


def params(contract: str, pattern: str = '*', exclude: Sequence[str] = ()) -> list:
    """``list_models(pattern, exclude, contract)`` as pytest params (id = name), each entry's
    known failure of ``contract`` marked ``xfail(strict=True)``."""
    out = []
    for name in list_models(pattern, exclude, contract):
        reason = ZOO[name].xfail.get(contract)
        marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
        out.append(pytest.param(name, marks=marks, id=name))
    return out


def create_model(name: str, seed: int = 0, **overrides) -> torch.nn.Module:
    """The zoo model ``name`` built with ``torch.manual_seed(seed)`` (same seed, same weights);
    ``overrides`` replace constructor arguments (e.g. ``init_cfg=...``, ``with_cp=True``)."""
    if name not in ZOO:
        raise KeyError(f'no zoo model {name!r}; known: {sorted(ZOO)}')
    entry = ZOO[name]
    torch.manual_seed(seed)
    return entry.cls(**dict(entry.kwargs, **overrides))


def example_input(name: str, which: int = 0, batch: int = 2,
                  size: Optional[Size] = None) -> torch.Tensor:
    """Random input for ``name``: ``(batch, 3, *size)``, ``size`` defaulting to the entry's
    ``sizes[which]`` (``(H, W)``, or ``(T, H, W)`` for video)."""
    size = ZOO[name].sizes[which] if size is None else tuple(size)
    return torch.randn(batch, 3, *size)


def expected_shapes(name: str, input_shape: Sequence[int]) -> List[Tuple[int, ...]]:
    """The output shapes the entry promises for an input of ``input_shape``
    (``(B, C, H, W)`` or ``(B, C, T, H, W)``): ``(B, C_i, *ceil(size / stride_i))``."""
    entry = ZOO[name]
    batch, spatial = input_shape[0], tuple(input_shape[2:])
    shapes = []
    for channels, stride in zip(entry.out_channels, entry.out_strides):
        strides = stride if isinstance(stride, tuple) else (stride, ) * len(spatial)
        shapes.append((batch, channels) + tuple(-(-s // k) for s, k in zip(spatial, strides)))
    return shapes


def as_tuple(out) -> Tuple[torch.Tensor, ...]:
    """A backbone's output as a tuple of maps (a single tensor becomes a 1-tuple)."""
    return tuple(out) if isinstance(out, (tuple, list)) else (out, )
