"""The peers: mmdet's, timm's and HuggingFace's version of one of our models, with its
architecture and, exactly, its weights. Swin V1 (mmdet, timm, HF ``SwinBackbone``), Swin V2
(timm, HF ``Swinv2Backbone``), DINOv2 (timm, HF ``Dinov2Model``: the trunk alone, where ours may
carry an adapter). timm's Swins are ``features_only`` (NHWC, rolled before padding) and, as HF's
Swin V2, without our level norms.
"""
import functools
import importlib.abc
import importlib.machinery
import re
import sys
from typing import Callable, Optional

import torch
import torch.nn as nn

from mmvitswin.core import SwinTransformer, SwinTransformerV2, VisionTransformerTrunk
from mmvitswin.core.checkpoint import DERIVED_KEYS

PEERS = ('timm', 'hf')  # timed beside a case's reference
FAMILIES = dict(swin=('mmdet', 'timm', 'hf'), swinv2=('timm', 'hf'), dinov2=('timm', 'hf'))
# ours-only weights a peer has no place for, and peer parameters it never applies
OURS_ONLY = r'(norm\d+|adapter|neck)\.'
PEER_ONLY = dict(mmdet=r'$^', timm=r'model\.norm\.',
                 hf=r'model\.(swin\.)?(layernorm|embeddings\.mask_token)')


def family_of(model: nn.Module) -> Optional[str]:
    if isinstance(model, VisionTransformerTrunk):  # with LayerScale: DINOv2's
        return 'dinov2' if 'blocks.0.ls1.gamma' in model.state_dict() else None
    return 'swinv2' if isinstance(model, SwinTransformerV2) else 'swin' if isinstance(
        model, SwinTransformer) else None


def has_peer(model: nn.Module, impl: str) -> bool:
    return impl in FAMILIES.get(family_of(model), ())


# ------------------------------------------------------------------------------ timm
def _stub(name: str):
    """A torchvision name timm touches at import (a base class, an enum member): a class whose
    attributes are stubs too."""
    if name.startswith('__'):
        raise AttributeError(name)
    return type('Stub', (type, ), {'__getattr__': lambda cls, attr: _stub(attr)})(name, (), {})


class _TorchvisionStub(importlib.abc.Loader):
    """An import hook answering ``import torchvision[.x]`` with a module of stubs."""

    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] == 'torchvision':
            return importlib.machinery.ModuleSpec(name, self, is_package=True)

    def exec_module(self, module):
        module.__getattr__ = _stub


@functools.lru_cache(None)
def import_timm() -> tuple:
    """``(timm or None, note)``. timm imports torchvision; where that fails (missing, or its C++
    ops not loading beside this torch) timm is imported again with torchvision stubbed during
    the import (its models do not use it); the note says so."""
    def forget(*packages):
        for name in [n for n in sys.modules if n.split('.')[0] in packages]:
            del sys.modules[name]
    try:
        import timm
        return timm, f'timm {timm.__version__}'
    except Exception as exc:  # noqa: BLE001  (ImportError, or torchvision's RuntimeError)
        first = f'{type(exc).__name__}: {exc}'.splitlines()[0][:160]
    forget('timm', 'torchvision')
    stub = _TorchvisionStub()
    sys.meta_path.insert(0, stub)
    try:
        import timm
        return timm, f'timm {timm.__version__} imported with a torchvision stub ({first})'
    except Exception as exc:  # noqa: BLE001
        return None, f'timm not available: {first}; with a torchvision stub: {exc}'[:400]
    finally:
        sys.meta_path.remove(stub)
        forget('torchvision')


# ------------------------------------------------------------------------------ weights
def load_from_ours(peer: nn.Module, ours: dict, to_ours: Callable[[dict], dict],
                   ours_only: str = r'$^', peer_only: str = r'$^') -> None:
    """Load our state dict ``ours`` into ``peer`` by running ``to_ours`` (our conversion of the
    peer's layout into ours: renames, q/k/v joins, channel reorders) on a probe holding each
    peer element's own index (float64, exact): every element of ours then names the peer
    element it came from, so the inverse is exact. ValueError for a weight of ours the peer has
    no place for (unless its key matches ``ours_only``), or a peer parameter left unset (unless
    its name matches ``peer_only``: weights the peer has but never applies)."""
    own = peer.state_dict()
    probe, spans, total = {}, {}, 0
    for key, value in own.items():
        if value.is_floating_point():
            probe[key] = torch.arange(total, total + value.numel(),
                                      dtype=torch.float64).reshape(value.shape)
            spans[key], total = (total, value.numel()), total + value.numel()
    values, used = torch.full((total, ), float('nan'), dtype=torch.float64), set()
    for key, index in to_ours(probe).items():
        if not (torch.is_tensor(index) and index.dtype == torch.float64):
            continue  # derived on our side
        if key not in ours or ours[key].shape != index.shape:
            raise ValueError(f'{key}: the peer has it with shape {tuple(index.shape)}, ours '
                             + (f'has {tuple(ours[key].shape)}' if key in ours else 'does not'))
        values[index.reshape(-1).long()] = ours[key].detach().to('cpu', torch.float64).reshape(-1)
        used.add(key)
    left = [k for k, v in ours.items() if k not in used and v.is_floating_point()
            and not k.endswith(DERIVED_KEYS) and not re.match(ours_only, k)]
    unset = [k for k, (s, n) in spans.items() if torch.isnan(values[s:s + n]).any()]
    params = dict(peer.named_parameters())
    bad = [k for k in unset if k in params and not re.match(peer_only, k)]
    if left or bad:
        raise ValueError(f'weights of ours without a place in the peer: {left[:4]}; peer '
                         f'parameters left unset: {bad[:4]}')
    peer.load_state_dict({k: values[s:s + n].reshape(own[k].shape).to(own[k].dtype)
                          for k, (s, n) in spans.items() if k not in unset}, strict=False)


# ------------------------------------------------------------------------------ peers
class Outputs(nn.Module):
    """A peer returning a tuple of tensors, as our backbones do."""

    def __init__(self, model: nn.Module, pick: Callable):
        super().__init__()
        self.model, self.pick = model, pick

    def forward(self, x: torch.Tensor) -> tuple:
        return tuple(self.pick(self.model, x))


def _ratio(width: int, dims: int):
    return width // dims if width % dims == 0 else width / dims  # an int where it is one


def _swin_arch(ours: nn.Module) -> dict:
    """Swin V1/V2 sizes of ``ours`` (window and MLP width read from its weights)."""
    sd = ours.state_dict()
    table = sd.get('stages.0.blocks.0.attn.w_msa.relative_position_bias_table')
    return dict(embed_dim=ours.num_features[0], depths=list(ours.depths),
                num_heads=list(ours.num_heads), patch_size=ours.patch_size,
                window_size=(round(table.shape[0]**0.5) + 1) // 2 if table is not None
                else ours.window_sizes[0][0],
                mlp_ratio=_ratio(sd['stages.0.blocks.0.ffn.layers.0.0.weight'].shape[0],
                                 ours.num_features[0]),
                drop_path_rate=max((getattr(m, 'drop_prob', 0.) for m in ours.modules()),
                                   default=0.))


def _build(impl: str, ours: nn.Module, family: str) -> nn.Module:
    """The architecture of peer ``impl`` of ``ours`` (random weights)."""
    if impl == 'timm':
        timm, note = import_timm()
        if timm is None:
            raise ImportError(note)
    elif impl == 'hf':
        import transformers as tf
    if family == 'dinov2':
        ratio = _ratio(ours.feedforward_channels, ours.embed_dims)
        swiglu = ours.ffn_type == 'swiglu'
        if impl == 'timm':
            return Outputs(timm.create_model(
                'vit_base_patch14_dinov2', pretrained=False, num_classes=0,
                img_size=ours.img_size[0], patch_size=ours.patch_size, embed_dim=ours.embed_dims,
                depth=ours.num_layers, num_heads=ours.num_heads, mlp_ratio=ratio,
                dynamic_img_size=True, dynamic_img_pad=True, reg_tokens=ours.num_register_tokens),
                lambda m, x: [m.forward_features(x)])
        cfg = dict(hidden_size=ours.embed_dims, num_hidden_layers=ours.num_layers,
                   num_attention_heads=ours.num_heads, image_size=ours.img_size[0],
                   patch_size=ours.patch_size, layer_norm_eps=ours.norm_eps,
                   use_swiglu_ffn=swiglu, mlp_ratio=4 if swiglu else ratio)  # HF: SwiGLU of 4x
        return Outputs(tf.Dinov2Model(tf.Dinov2Config(**cfg)),
                       lambda m, x: [m(pixel_values=x).last_hidden_state])
    a, v2 = _swin_arch(ours), family == 'swinv2'
    pretrained_windows = [p[0] for p in ours.pretrained_window_sizes] if v2 else None
    if impl == 'mmdet':
        from mmdet.models.backbones.swin import SwinTransformer as MMDetSwin
        return MMDetSwin(embed_dims=a['embed_dim'], depths=a['depths'], num_heads=a['num_heads'],
                         window_size=a['window_size'], mlp_ratio=a['mlp_ratio'],
                         strides=(a['patch_size'], 2, 2, 2), patch_size=a['patch_size'],
                         drop_path_rate=a['drop_path_rate'], out_indices=ours.out_indices)
    if impl == 'timm':
        return Outputs(timm.create_model(
            'swinv2_tiny_window16_256' if v2 else 'swin_tiny_patch4_window7_224',
            pretrained=False, features_only=True, strict_img_size=False, always_partition=True,
            out_indices=tuple(ours.out_indices), **a, **(
                dict(pretrained_window_sizes=tuple(pretrained_windows)) if v2 else {})),
            lambda m, x: m(x))
    cfg = dict(a, mlp_ratio=float(a['mlp_ratio']), out_features=[
        f'stage{i + 1}' for i in ours.out_indices])
    # Swin V2 image_size large: HF never shrinks a window or drops a shift, as ours at any size
    model = tf.Swinv2Backbone(tf.Swinv2Config(
        image_size=4096, pretrained_window_sizes=pretrained_windows, **cfg)) if v2 \
        else tf.SwinBackbone(tf.SwinConfig(**cfg))
    return Outputs(model, lambda m, x: m(pixel_values=x).feature_maps)


def build_peer(impl: str, ours: nn.Module, load: bool = True) -> nn.Module:
    """Peer ``impl`` ('mmdet', 'timm', 'hf') of our model ``ours``, with our weights when
    ``load``. LookupError where the peer has no such model, ImportError where its package is
    missing."""
    if not has_peer(ours, impl):
        raise LookupError(f'{impl} has no peer of {type(ours).__name__}')
    peer = _build(impl, ours, family_of(ours))
    if load:  # mmdet's keys are ours; timm's features_only names stage N 'layers_N'
        to_ours = dict if impl == 'mmdet' else lambda sd: ours.convert_checkpoint({re.sub(
            r'^layers_(\d+)\.', r'layers.\1.', k[len('model.'):]): v for k, v in sd.items()})
        load_from_ours(peer, ours.state_dict(), to_ours, OURS_ONLY, PEER_ONLY[impl])
    return peer
