"""DINOv3 ViT checkpoints -> our ViT trunk: the ``DINOV3_CHECKPOINTS`` family.

DINOv3's ViTs (S/S+/B/L/H+/7B, patch 16) are plain pre-norm ViTs with a CLS token, 4 register
("storage") tokens, LayerScale on both branches, **no** absolute position embedding but a 2-D
rotary embedding on q and k of the patch tokens (:mod:`mmvitswin.core.layers.rope`), no key
bias (the 7B: no q/k/v bias at all), and an MLP (S/B/L) or SwiGLU (S+/H+/7B) feed-forward.
Formats (detected from the keys, no flag needed; the 7B's HF snapshot comes as sharded
``.safetensors`` with ``model.safetensors.index.json``, read by ``checkpoint/files.py``):

- ``hf``: HuggingFace ``DINOv3ViTModel`` / ``DINOv3ViTBackbone`` (``embeddings.{cls_token,
  register_tokens,mask_token,patch_embeddings}``, ``layer.N`` as the hub ships it or
  ``model.layer.N`` as the module names it, ``attention.{q,k,v,o}_proj``,
  ``layer_scale{1,2}.lambda1``, ``mlp.{up,down}_proj`` or ``mlp.{gate,up,down}_proj``,
  ``norm``), with any prefix in front (a wrapping model's ``dinov3.``, ``backbone.``, ...).
- ``meta``: Meta's released ``dinov3_vit*_pretrain_*.pth`` (``storage_tokens``,
  ``rope_embed.periods``, ``blocks.N.attn.qkv.{weight,bias,bias_mask}``, ``ls{1,2}.gamma``,
  ``mlp.fc{1,2}`` or ``mlp.w{1,2,3}``); the masked key bias is applied (``bias * bias_mask``).
- ``timm``: timm's ``vit_*_patch16_dinov3`` (``Eva``: ``reg_token``, ``attn.qkv`` with
  ``attn.q_bias``/``attn.v_bias`` or no bias, ``gamma_{1,2}``, ``mlp.fc1_g``/``mlp.fc1_x``/
  ``mlp.fc2`` for SwiGLU).

Pretraining-only tensors (``mask_token``, Meta's ``local_cls_norm`` of the 7B and ViT-L
SAT-493M, used on local crops in training only) are dropped; so is Meta's ``cls_norm`` of
untied CLS norms (it normalises the CLS/register outputs, which the pyramid drops). The RoPE
periods are derived: checked against the model within bf16 rounding (Meta's files hold them
rounded to bf16; :func:`check_rope_periods`), never loaded.
A zero bias is the same as no bias: a file without q/k/v biases loads into a model with
``qkv_bias=True`` with zeros, as does the absent key bias.

Architecture check (named error on a mismatch): width, depth, heads (from ``config.json`` or
Meta's periods), register tokens, LayerScale, FFN kind and width, RoPE present and its theta
(``config.json`` ``rope_theta``, or Meta's periods within bf16 rounding), no absolute
position embedding, LayerNorm eps (``config.json``); a non-zero q/v bias into a model built
with ``qkv_bias=False`` (the 7B preset) is refused.
"""
import re
from collections import OrderedDict
from typing import Dict, Optional, Tuple

import torch

from .loading import CheckpointFamily, StateDict
from .vit import fit_vit_embeddings

__all__ = ['detect_dinov3_format', 'is_dinov3_checkpoint', 'convert_dinov3_state_dict',
           'check_rope_periods', 'dinov3_arch_of', 'dinov3_model_arch', 'dinov3_config_arch',
           'DINOV3_CHECKPOINTS']

_PERIODS = 'rope_embed.periods'
_HF_PATCH = 'embeddings.patch_embeddings.weight'
_HF_BLOCK = (
    ('layer_scale1.lambda1', 'ls1.gamma'),
    ('layer_scale2.lambda1', 'ls2.gamma'),
    ('attention.o_proj.', 'attn.proj.'),
)
_HF_MLP = (('mlp.up_proj.', 'mlp.fc1.'), ('mlp.down_proj.', 'mlp.fc2.'))
_HF_GATED = (('mlp.gate_proj.', 'mlp.w1.'), ('mlp.up_proj.', 'mlp.w2.'),
             ('mlp.down_proj.', 'mlp.w3.'))
_TIMM_BLOCK = (('gamma_1', 'ls1.gamma'), ('gamma_2', 'ls2.gamma'), ('mlp.fc1_g.', 'mlp.w1.'),
               ('mlp.fc1_x.', 'mlp.w2.'))
_DROPPED = re.compile(r'(mask_token$|local_cls_norm\.|cls_norm\.)')
PERIODS_RTOL = 1e-2  # Meta's periods are bf16-rounded (<= 2 ** -8 off): see check_rope_periods


# ------------------------------------------------------------------------ pure functions
def _hf_prefix(sd: StateDict) -> Optional[str]:
    """The prefix in front of HF's ``embeddings.patch_embeddings.weight`` (None: not HF)."""
    for key in sd:
        if key.endswith(_HF_PATCH):
            prefix = key[:-len(_HF_PATCH)]
            if any(k.startswith(prefix + 'embeddings.register_tokens') for k in sd) or any(
                    re.match(re.escape(prefix) + r'(model\.)?layer\.\d+\.attention\.q_proj\.', k)
                    for k in sd):
                return prefix
    return None


def detect_dinov3_format(sd: StateDict) -> str:
    """Return 'hf', 'meta' or 'timm' for a DINOv3 ViT state dict; ValueError otherwise."""
    if _hf_prefix(sd) is not None:
        return 'hf'
    keys = set(sd)
    if 'storage_tokens' in keys or _PERIODS in keys or any(
            k.endswith('attn.qkv.bias_mask') for k in keys):
        return 'meta'
    eva_block = any(re.match(r'blocks\.\d+\.(gamma_1|attn\.q_bias)$', k) for k in keys)
    if eva_block and 'pos_embed' not in keys:
        return 'timm'
    sample = sorted(keys)[:6]
    raise ValueError(f'unrecognised DINOv3 checkpoint format; expected HF DINOv3ViTModel, '
                     f'Meta dinov3 or timm vit_*_dinov3 keys, got e.g. {sample}')


def is_dinov3_checkpoint(sd: StateDict, config: Optional[dict] = None) -> bool:
    """Whether a state dict (or its ``config.json``) is a DINOv3 ViT's."""
    if config is not None and config.get('model_type') == 'dinov3_vit':
        return True
    try:
        detect_dinov3_format(sd)
    except ValueError:
        return False
    return True


def _join_qkv(q: Optional[torch.Tensor], k: Optional[torch.Tensor],
              v: Optional[torch.Tensor], like: torch.Tensor) -> Optional[torch.Tensor]:
    """One fused q/k/v bias from separate parts; an absent part is zero (None: none at all)."""
    if q is None and k is None and v is None:
        return None
    zero = torch.zeros(like.shape[0], dtype=like.dtype)
    return torch.cat([zero if t is None else t for t in (q, k, v)])


def _from_hf(sd: StateDict) -> StateDict:
    prefix = _hf_prefix(sd)
    sd = OrderedDict((k[len(prefix):], v) for k, v in sd.items() if k.startswith(prefix))
    gated = {int(m.group(1)) for k in sd
             for m in [re.match(r'(?:model\.)?layer\.(\d+)\.mlp\.gate_proj\.', k)] if m}
    out = OrderedDict()
    qkv: Dict[int, Dict[str, torch.Tensor]] = {}
    for key, value in sd.items():
        if key.startswith('embeddings.'):
            name = key[len('embeddings.'):]
            name = {'register_tokens': 'reg_token',
                    'patch_embeddings.weight': 'patch_embed.proj.weight',
                    'patch_embeddings.bias': 'patch_embed.proj.bias'}.get(name, name)
            out[name] = value
            continue
        m = re.match(r'(?:model\.)?layer\.(\d+)\.(.*)', key)
        if m is None:
            out[key] = value  # norm.*, anything unknown (reported by the loader)
            continue
        i, rest = int(m.group(1)), m.group(2)
        mq = re.match(r'attention\.([qkv])_proj\.(weight|bias)$', rest)
        if mq:
            qkv.setdefault(i, {})[f'{mq.group(1)}_{mq.group(2)}'] = value
            continue
        for old, new in _HF_BLOCK:
            if rest.startswith(old):
                rest = new + rest[len(old):]
                break
        # HF's MLP is up -> down; its gated MLP silu(gate) * up -> down (Meta's w1, w2, w3)
        names = _HF_GATED if i in gated else _HF_MLP
        for old, new in names:
            if rest.startswith(old):
                rest = new + rest[len(old):]
                break
        out[f'blocks.{i}.{rest}'] = value
    for i, parts in sorted(qkv.items()):
        missing = [p for p in ('q_weight', 'k_weight', 'v_weight') if p not in parts]
        if missing:
            raise ValueError(f'layer {i}: attention lacks {missing[0].replace("_", "_proj.")}')
        out[f'blocks.{i}.attn.qkv.weight'] = torch.cat(
            [parts['q_weight'], parts['k_weight'], parts['v_weight']])
        bias = _join_qkv(parts.get('q_bias'), parts.get('k_bias'), parts.get('v_bias'),
                         parts['q_weight'])
        if bias is not None:
            out[f'blocks.{i}.attn.qkv.bias'] = bias
    return out


def _from_meta(sd: StateDict) -> StateDict:
    out = OrderedDict()
    for key, value in sd.items():
        if key.endswith('attn.qkv.bias_mask'):
            continue
        if key.endswith('attn.qkv.bias'):
            mask = sd.get(key + '_mask')
            # Meta's LinearKMaskedBias multiplies the bias by its mask (zeros on k) at run time
            value = value if mask is None else value * mask.to(value.dtype)
        out['reg_token' if key == 'storage_tokens' else key] = value
    return out


def _from_timm(sd: StateDict) -> StateDict:
    out = OrderedDict()
    q_bias: Dict[str, torch.Tensor] = {}
    for key, value in sd.items():
        m = re.match(r'(blocks\.\d+\.)(.*)', key)
        if m is None:
            out[key] = value
            continue
        head, rest = m.group(1), m.group(2)
        if rest in ('attn.q_bias', 'attn.v_bias', 'attn.k_bias'):
            q_bias[head + rest[-6]] = value  # 'q', 'v' or 'k'
            continue
        for old, new in _TIMM_BLOCK:
            if rest.startswith(old):
                rest = new + rest[len(old):]
                break
        if rest.startswith('mlp.fc2.') and f'{head}mlp.fc1_g.weight' in sd:
            rest = 'mlp.w3.' + rest[len('mlp.fc2.'):]
        out[head + rest] = value
    heads = sorted({k[:-1] for k in q_bias})
    for head in heads:
        weight = out[head + 'attn.qkv.weight']
        dim = weight.shape[0] // 3
        bias = _join_qkv(q_bias.get(head + 'q'), q_bias.get(head + 'k'), q_bias.get(head + 'v'),
                         weight[:dim])
        out[head + 'attn.qkv.bias'] = bias
    return out


def _to_ours(sd: StateDict) -> StateDict:
    """The intermediate layout (timm ViT names, Meta's ``mlp.w1/w2/w3``) -> ours: registers
    as ``register_tokens``, the MLP as ``ffn.layers.{0.0,1}``, SwiGLU packed as ``ffn.w12``
    (gate half first, then the value half) and ``ffn.w3``."""
    out = OrderedDict()
    for key, value in sd.items():
        if key == 'reg_token':
            out['register_tokens'] = value
            continue
        m = re.match(r'(blocks\.\d+\.)mlp\.(fc1|fc2|w1|w2|w3)\.(weight|bias)$', key)
        if m is None:
            out[key] = value
            continue
        head, name, kind = m.groups()
        if name == 'w2':
            continue  # packed with w1
        if name == 'w1':
            value_half = sd[f'{head}mlp.w2.{kind}']
            out[f'{head}ffn.w12.{kind}'] = torch.cat([value, value_half])
            continue
        new = {'fc1': 'ffn.layers.0.0', 'fc2': 'ffn.layers.1', 'w3': 'ffn.w3'}[name]
        out[f'{head}{new}.{kind}'] = value
    return out


def convert_dinov3_state_dict(sd: StateDict) -> Tuple[StateDict, str]:
    """Rename any supported DINOv3 layout to ours. Returns ``(state_dict, detected_format)``.

    Through one intermediate layout (timm ViT names: ``reg_token``, ``blocks.N.{attn.qkv,
    ls1.gamma,mlp.fc1|mlp.w1/w2/w3}``) to ours (:func:`_to_ours`). Meta's
    ``rope_embed.periods`` is kept for the architecture probe and dropped by the fit."""
    fmt = detect_dinov3_format(sd)
    out = {'hf': _from_hf, 'meta': _from_meta, 'timm': _from_timm}[fmt](sd)
    # a zero q/k/v bias is no bias (timm's *_qkvb variants, the distilled B/L/H+ files): drop
    # it, so that it loads into a model with or without one (the fit fills zeros)
    out = OrderedDict((k, v) for k, v in out.items() if not _DROPPED.match(k) and not (
        k.endswith('attn.qkv.bias') and not bool(v.any())))
    return _to_ours(out), fmt


def _theta_of(periods: torch.Tensor) -> Optional[float]:
    """rope theta from Meta's ``n = D / 4`` periods ``theta ** (k / n)``: the least-squares
    fit of ``log theta`` over all of them (robust to their bf16 rounding), for messages."""
    n = periods.numel()
    if n < 2:
        return None
    k = torch.arange(n, dtype=torch.float64)
    log_p = periods.detach().double().cpu().log()
    return float(torch.exp(n * (k * log_p).sum() / k.square().sum()))


def check_rope_periods(periods: torch.Tensor, model) -> None:
    """Meta's ``rope_embed.periods`` against the model's RoPE (``theta ** (4 k / head_dim)``
    for its ``rope_theta`` and head dim); ValueError naming ``rope_theta`` when they differ.

    Meta's files hold the periods rounded to bf16 (trained with ``pos_embed_rope_dtype``
    bf16; HF's and timm's conversions recompute them in fp32): up to ``2 ** -8`` relative off
    the exact values, ``theta`` read back from one of them is off by percents (``periods[1] **
    (D / 4)`` gives 104 for theta 100, head dim 128). So they are compared within
    :data:`PERIODS_RTOL`, which still tells apart thetas a few percent apart.
    """
    theta = getattr(model, 'rope_theta', None)
    head_dim = model.embed_dims // model.num_heads
    n = head_dim // 4
    if theta is None or periods.numel() != n:
        raise ValueError(f'checkpoint is a DINOv3 with {periods.numel()} RoPE periods per axis '
                         f'(head_dim {4 * periods.numel()}), but this model has '
                         f'rope_theta={theta} and head_dim {head_dim} (num_heads='
                         f'{model.num_heads})')
    want = float(theta)**(torch.arange(n, dtype=torch.float64) / n)
    got = periods.detach().double().cpu().reshape(-1)
    if not torch.allclose(got, want, rtol=PERIODS_RTOL, atol=0.):
        fitted = _theta_of(periods)
        raise ValueError(f'checkpoint is a DINOv3 with rope_theta='
                         f'{"?" if fitted is None else f"{fitted:.4g}"} (fitted to its RoPE '
                         f'periods), but this model has rope_theta={theta}')


def _ffn_of(sd: StateDict) -> Tuple[Optional[str], Optional[int]]:
    w12 = sd.get('blocks.0.ffn.w12.weight')
    if w12 is not None:
        return 'swiglu', w12.shape[0] // 2
    fc1 = sd.get('blocks.0.ffn.layers.0.0.weight')
    return ('mlp', fc1.shape[0]) if fc1 is not None else (None, None)


def dinov3_arch_of(sd: StateDict) -> Dict[str, object]:
    """The architecture a converted DINOv3 state dict reveals (None where it does not say)."""
    blocks = {int(m.group(1)) for k in sd for m in [re.match(r'blocks\.(\d+)\.', k)] if m}
    kernel = sd.get('patch_embed.proj.weight')
    embed_dims = None if kernel is None else kernel.shape[0]
    reg = sd.get('register_tokens')
    periods = sd.get(_PERIODS)
    ffn, hidden = _ffn_of(sd)
    return dict(
        embed_dims=embed_dims, num_layers=max(blocks) + 1 if blocks else None,
        num_heads=(embed_dims // (4 * periods.numel())
                   if periods is not None and embed_dims else None),
        num_register_tokens=None if reg is None else reg.shape[1],
        layer_scale=any(k.endswith('.ls1.gamma') for k in sd) if blocks else None,
        ffn_type=ffn, feedforward_channels=hidden, rope=True,
        rope_theta=None,  # Meta's periods: compared with a tolerance in the fit
        abs_pos_embed=False, norm_eps=None)


def _config_ffn(config: dict) -> str:
    """'mlp' (GELU) or 'swiglu' (a gated MLP with SiLU: the released S+/H+/7B); another
    activation is named in the value, which no model of ours has (refused as a mismatch)."""
    act = config.get('hidden_act', 'gelu')
    if config.get('use_gated_mlp'):
        return 'swiglu' if act in ('silu', 'swish') else f'gated-{act}'
    return 'mlp' if act == 'gelu' else f'mlp-{act}'


def dinov3_config_arch(config: dict) -> Dict[str, object]:
    """What a HuggingFace ``DINOv3ViTConfig`` says of the probe's fields (``{}`` for another
    model type)."""
    if config.get('model_type') != 'dinov3_vit':
        return {}
    return dict(embed_dims=config.get('hidden_size'), num_layers=config.get('num_hidden_layers'),
                num_heads=config.get('num_attention_heads'),
                num_register_tokens=config.get('num_register_tokens'), layer_scale=True,
                ffn_type=_config_ffn(config),
                feedforward_channels=config.get('intermediate_size'), rope=True,
                rope_theta=(None if config.get('rope_theta') is None else
                            float(config['rope_theta'])),
                abs_pos_embed=False, norm_eps=config.get('layer_norm_eps'))


def dinov3_model_arch(model) -> Dict[str, object]:
    """The probe's fields of a ViT trunk (or a builder on one)."""
    theta = getattr(model, 'rope_theta', None)
    return dict(embed_dims=model.embed_dims, num_layers=model.num_layers,
                num_heads=model.num_heads, num_register_tokens=model.num_register_tokens,
                layer_scale=model.layer_scale_init_value is not None,
                ffn_type=model.ffn_type, feedforward_channels=model.feedforward_channels,
                rope=theta is not None, rope_theta=theta,
                abs_pos_embed=getattr(model, 'pos_embed', None) is not None,
                norm_eps=model.norm_eps)


def fit_dinov3_state_dict(sd: StateDict, model) -> StateDict:
    """The ViT family's fitting (patch kernel resampled to the model's patch size) after
    checking Meta's RoPE periods against the model (:func:`check_rope_periods`), dropping
    them (derived) and filling any bias the file lacks (beside its weight) with zeros."""
    if _PERIODS in sd:
        check_rope_periods(sd[_PERIODS], model)
    sd = OrderedDict((k, v) for k, v in sd.items() if k != _PERIODS)
    own = model.state_dict()
    for key, value in own.items():
        # HF's query/value/proj/mlp_bias=False, the all-zero q/v biases dropped on conversion
        if key.endswith('.bias') and key not in sd and key[:-len('bias')] + 'weight' in sd:
            sd[key] = torch.zeros_like(value)  # a zero bias is no bias
    return fit_vit_embeddings(sd, model)


DINOV3_CHECKPOINTS = CheckpointFamily(
    'DINOv3', convert_dinov3_state_dict, dinov3_arch_of, dinov3_model_arch,
    fit=fit_dinov3_state_dict, config_probe=dinov3_config_arch,
    unrepresentable=((r'attn\.qkv\.bias$', 'a q/v bias', 'qkv_bias=True'), ))
