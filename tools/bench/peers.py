"""The peers ours is measured against -- mmdet's (or mmseg's), timm's and HuggingFace's version
of the same model -- built from one of our models with its architecture and, exactly, its
weights.

Families (:func:`family_of`): ``swin`` (Swin V1: mmdet, mmseg, timm, hf), ``swinv2`` (timm, hf
``Swinv2Backbone``) and ``dinov2`` (timm, hf ``Dinov2Model``: the trunk alone, where ours may
carry an adapter). :func:`build_peer` with ``load=False`` builds the architecture only (the
meta-device kernel count has no weights to move).
"""
import importlib.machinery
import re
import sys
from typing import Callable, Optional, Tuple

import torch
import torch.nn as nn

from mmvitswin.core import SwinTransformer, SwinTransformerV2, VisionTransformerTrunk
from mmvitswin.core.checkpoint import DERIVED_KEYS

PEERS = ('timm', 'hf')  # the peers timed beside a case's reference by default
NOTE = ("peers: timm's Swin V1/V2 features_only, strict_img_size=False, always_partition=True "
        '(NHWC, without the level norms; rolls before padding), DINOv2 dynamic_img_size and pad; '
        "HF SwinBackbone, Swinv2Backbone (no level norms), Dinov2Model (the trunk alone)")
_TIMM: Optional[tuple] = None  # (module or None, note), imported once per process


def family_of(model: nn.Module) -> Optional[str]:
    if isinstance(model, SwinTransformerV2):
        return 'swinv2'
    if isinstance(model, SwinTransformer):
        return 'swin'
    if isinstance(model, VisionTransformerTrunk) and 'blocks.0.ls1.gamma' in model.state_dict():
        return 'dinov2'  # a trunk with LayerScale: DINOv2's
    return None


# ------------------------------------------------------------------------------ timm
class _Stub(type):
    """A torchvision name timm touches at import (a base class, an enum member): any attribute
    is another stub; calling one says it is missing."""

    def __getattr__(cls, name):
        if name.startswith('__'):
            raise AttributeError(name)
        return _Stub(name, (), {})

    def __call__(cls, *args, **kwargs):
        raise RuntimeError(f'torchvision stub: {cls.__name__} is not available here')


class _TorchvisionStub:
    """Import hook answering ``torchvision[.x]`` with stub modules while timm is imported."""

    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] == 'torchvision':
            return importlib.machinery.ModuleSpec(name, self, is_package=True)

    def create_module(self, spec):
        module = type('StubModule', (type(sys), ), {'__getattr__': _Stub.__getattr__})(spec.name)
        module.__path__, module.__version__ = [], '0.0.0+stub'
        return module

    def exec_module(self, module):
        pass


def _drop_modules(*packages: str) -> None:
    for name in [n for n in sys.modules if n.split('.')[0] in packages]:
        del sys.modules[name]


def import_timm() -> tuple:
    """``(timm or None, note)``. timm imports torchvision; where that fails (missing, or its
    C++ ops not loading beside this torch) timm is imported again with a torchvision stub,
    removed afterwards so that nothing else in the process sees it; the note says so."""
    global _TIMM
    if _TIMM is not None:
        return _TIMM
    try:
        import timm
        _TIMM = (timm, f'timm {timm.__version__}')
        return _TIMM
    except Exception as exc:  # noqa: BLE001  (ImportError, or torchvision's RuntimeError)
        first = f'{type(exc).__name__}: {exc}'.splitlines()[0][:160]
    _drop_modules('timm', 'torchvision')
    stub = _TorchvisionStub()
    sys.meta_path.insert(0, stub)
    try:
        import timm
        _TIMM = (timm, f'timm {timm.__version__} imported with a torchvision stub (import timm '
                       f'failed: {first})')
    except Exception as exc:  # noqa: BLE001
        _drop_modules('timm')
        _TIMM = (None, f'timm not available: {first}; with a torchvision stub: '
                       f'{type(exc).__name__}: {exc}'[:400])
    finally:
        sys.meta_path.remove(stub)
        _drop_modules('torchvision')
    return _TIMM


def _timm():
    timm, note = import_timm()
    if timm is None:
        raise ImportError(note)
    return timm


# ------------------------------------------------------------------------------ weights
def load_from_ours(peer: nn.Module, ours: dict, to_ours: Callable[[dict], dict],
                   ours_only: str = r'$^', peer_only: str = r'$^') -> None:
    """Load our state dict ``ours`` into ``peer`` by running ``to_ours`` (the conversion of the
    peer's layout into ours: renames, q/k/v joins, channel reorders) on a probe that holds each
    peer element's own index (float64, exact): every element of ours then names the peer element
    it came from, so the inverse is exact. ValueError for a weight of ours the peer has no place
    for (unless its key matches ``ours_only``), or a peer parameter left unset (unless its name
    matches ``peer_only``: weights the peer has but never applies)."""
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
    """A peer returning a tuple of tensors, as our backbones do: HF's feature maps or last
    hidden state, timm's features."""

    def __init__(self, model: nn.Module, pick: Callable):
        super().__init__()
        self.model, self.pick = model, pick

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        return tuple(self.pick(self.model, x))


def _ratio(a: int, b: int):
    return a // b if a % b == 0 else a / b


def _swin_arch(ours: nn.Module) -> dict:
    """Swin V1/V2 sizes of ``ours`` (window and MLP width read from its weights)."""
    sd = ours.state_dict()
    table = sd.get('stages.0.blocks.0.attn.w_msa.relative_position_bias_table')
    return dict(embed=ours.num_features[0], depths=list(ours.depths),
                heads=list(ours.num_heads), patch=ours.patch_size,
                window=None if table is None else (round(table.shape[0]**0.5) + 1) // 2,
                mlp=_ratio(sd['stages.0.blocks.0.ffn.layers.0.0.weight'].shape[0],
                           ours.num_features[0]),
                qkv_bias='stages.0.blocks.0.attn.w_msa.qkv.bias' in sd,
                drop_path=max((getattr(m, 'drop_prob', 0.) for m in ours.modules()), default=0.))


def _host_swin(impl: str, ours, a: dict, with_cp: bool):
    host = __import__(f'{impl}.models.backbones.swin', fromlist=['SwinTransformer'])
    return host.SwinTransformer(
        embed_dims=a['embed'], depths=a['depths'], num_heads=a['heads'], window_size=a['window'],
        mlp_ratio=a['mlp'], strides=(a['patch'], 2, 2, 2)[:len(a['depths'])],
        patch_size=a['patch'], qkv_bias=a['qkv_bias'], drop_path_rate=a['drop_path'],
        out_indices=ours.out_indices, with_cp=with_cp), dict


def _timm_swin(impl, ours, a, with_cp):
    v2 = isinstance(ours, SwinTransformerV2)
    extra = dict(window_size=ours.window_sizes[0][0], pretrained_window_sizes=tuple(
        p[0] for p in ours.pretrained_window_sizes)) if v2 else dict(window_size=a['window'])
    model = _timm().create_model(
        'swinv2_tiny_window16_256' if v2 else 'swin_tiny_patch4_window7_224', pretrained=False,
        features_only=True, strict_img_size=False, always_partition=True,
        out_indices=tuple(ours.out_indices),
        patch_size=a['patch'], embed_dim=a['embed'], depths=tuple(a['depths']),
        num_heads=tuple(a['heads']), mlp_ratio=a['mlp'], drop_path_rate=a['drop_path'],
        **extra, **({} if v2 else dict(qkv_bias=a['qkv_bias'])))
    # features_only names stage N 'layers_N'; its features are NHWC, without our level norms
    return Outputs(model, lambda m, x: m(x)), lambda sd: ours.convert_checkpoint(
        {re.sub(r'^layers_(\d+)\.', r'layers.\1.', k[len('model.'):]): v for k, v in sd.items()})


def _hf_swin(impl, ours, a, with_cp):
    import transformers as tf
    stages = [f'stage{i + 1}' for i in ours.out_indices]
    if isinstance(ours, SwinTransformerV2):
        # image_size large: HF never shrinks a window or drops a shift, as ours at any size
        model = tf.Swinv2Backbone(tf.Swinv2Config(
            image_size=4096, patch_size=a['patch'], embed_dim=a['embed'], depths=a['depths'],
            num_heads=a['heads'], window_size=ours.window_sizes[0][0], mlp_ratio=float(a['mlp']),
            pretrained_window_sizes=[p[0] for p in ours.pretrained_window_sizes],
            drop_path_rate=a['drop_path'], out_features=stages))
    else:
        model = tf.SwinBackbone(tf.SwinConfig(
            patch_size=a['patch'], embed_dim=a['embed'], depths=a['depths'], num_heads=a['heads'],
            window_size=a['window'], mlp_ratio=a['mlp'], qkv_bias=a['qkv_bias'],
            drop_path_rate=a['drop_path'], out_features=stages))
    return (Outputs(model, lambda m, x: m(pixel_values=x).feature_maps),
            lambda sd: ours.convert_checkpoint({k[len('model.'):]: v for k, v in sd.items()}))


def _dinov2(impl, ours, a, with_cp):
    size, patch = ours.img_size[0], ours.patch_size
    if impl == 'timm':
        model = _timm().create_model(
            'vit_base_patch14_dinov2', pretrained=False, num_classes=0, img_size=size,
            patch_size=patch, embed_dim=ours.embed_dims, depth=ours.num_layers,
            num_heads=ours.num_heads, mlp_ratio=_ratio(ours.feedforward_channels, ours.embed_dims),
            dynamic_img_size=True, dynamic_img_pad=True, reg_tokens=ours.num_register_tokens)
        pick = lambda m, x: [m.forward_features(x)]  # noqa: E731
    else:
        import transformers as tf
        cfg = dict(hidden_size=ours.embed_dims, num_hidden_layers=ours.num_layers,
                   num_attention_heads=ours.num_heads, image_size=size, patch_size=patch,
                   mlp_ratio=_ratio(ours.feedforward_channels, ours.embed_dims),
                   layer_norm_eps=ours.norm_eps, use_swiglu_ffn=ours.ffn_type == 'swiglu')
        if ours.ffn_type == 'swiglu':
            cfg['mlp_ratio'] = 4  # HF's SwiGLU width follows DINOv2's 2/3 rule of a 4x MLP
        model = (tf.Dinov2WithRegistersModel(tf.Dinov2WithRegistersConfig(
            num_register_tokens=ours.num_register_tokens, **cfg)) if ours.num_register_tokens
            else tf.Dinov2Model(tf.Dinov2Config(**cfg)))
        pick = lambda m, x: [m(pixel_values=x).last_hidden_state]  # noqa: E731
    return Outputs(model, pick), lambda sd: ours.convert_checkpoint(
        {k[len('model.'):]: v for k, v in sd.items()})


BUILDERS = {('swin', 'mmdet'): _host_swin, ('swin', 'mmseg'): _host_swin,
            ('swin', 'timm'): _timm_swin, ('swin', 'hf'): _hf_swin,
            ('swinv2', 'timm'): _timm_swin, ('swinv2', 'hf'): _hf_swin,
            ('dinov2', 'timm'): _dinov2, ('dinov2', 'hf'): _dinov2}
# ours-only weights a peer has no place for, and peer parameters it never applies
OURS_ONLY = dict(timm=r'(norm\d+|adapter|neck)\.', hf=r'(norm\d+|adapter|neck)\.')
PEER_ONLY = dict(hf=r'model\.(swin\.)?(layernorm|embeddings\.mask_token)', timm=r'model\.norm\.')


def build_peer(impl: str, ours: nn.Module, load: bool = True, with_cp: bool = False):
    """Peer ``impl`` ('mmdet', 'mmseg', 'timm', 'hf') of our model ``ours``, with our weights
    when ``load``. LookupError where the peer has no such model; ImportError where the peer's
    package is missing."""
    builder = BUILDERS.get((family_of(ours), impl))
    if builder is None:
        raise LookupError(f'{impl} has no peer of {type(ours).__name__} ({family_of(ours)})')
    a = _swin_arch(ours) if family_of(ours) != 'dinov2' else {}
    peer, to_ours = builder(impl, ours, a, with_cp)
    if load and impl in ('mmdet', 'mmseg'):  # their keys are ours
        peer.load_state_dict({k: v for k, v in ours.state_dict().items()
                              if not k.startswith('norm') or k in peer.state_dict()})
    elif load:
        load_from_ours(peer, ours.state_dict(), to_ours, OURS_ONLY[impl], PEER_ONLY[impl])
    return peer
