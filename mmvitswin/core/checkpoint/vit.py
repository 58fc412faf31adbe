"""ViT checkpoint formats -> mmvitswin layout (see ``VisionTransformerTrunk``'s docstring).

Formats (detected from the keys and, for HF snapshots, ``config.json``; no flag needed):

- ``mmvitswin``: ours (``blocks.N.attn.qkv`` with ``blocks.N.ffn.layers.*`` / ``ffn.w12``).
- ``timm``: timm / DeiT / DeiT-III / AugReg / MAE / ViTDet-style and timm's DINOv2
  (``vit_*_dinov2``, ``vit_*_reg4_dinov2``): ``blocks.N.attn.qkv``, ``blocks.N.mlp.fc1``
  (SwiGLU packed for ViT-g: ``fc1`` twice as wide as ``fc2``'s input), ``ls1/ls2.gamma``
  (DeiT-III's original ``gamma_1/gamma_2`` too), ``reg_token``, ``patch_embed.proj``,
  ``cls_token``, ``pos_embed`` with or without a CLS entry (``no_embed_class``), final
  ``norm``; ``fc_norm``/``head`` of classifiers and MAE decoders are left for the loader to
  report as unused. A DeiT ``dist_token`` is dropped together with its pos-embed entry.
  Released ViT-Adapter backbones (the same block names plus top-level ``level_embed``,
  ``spm.*``, ``interactions.*``, ``up``, ``norm1..4``) get their adapter keys moved under
  ``adapter.``.
- ``dinov2``: Meta's released DINOv2 ``.pth`` (timm-like blocks with ``ls1.gamma``,
  ``mlp.w12/w3`` for ViT-g, ``register_tokens``, ``mask_token``).
- ``hf-dinov2`` / ``hf-dinov2-reg`` / ``hf-vit``: HuggingFace ``Dinov2Model``,
  ``Dinov2WithRegistersModel``, ``ViTModel`` (hub names ``embeddings.*``,
  ``encoder.layer.N.attention.attention.{query,key,value}``, ``layer_scale1.lambda1``,
  ``mlp.weights_in``, ``intermediate.dense``...; and the names of transformers >= 5
  ``attention.q_proj``, ``mlp.gate_proj``, ``layers.N``), with or without the ``dinov2.`` /
  ``vit.`` prefix of the ``*ForImageClassification`` files; ``pooler``/``classifier`` are
  reported as unused.
- ``mmseg``: mmseg 1.x ``VisionTransformer`` (``layers.N.attn.attn.in_proj_weight`` of
  ``nn.MultiheadAttention``, ``layers.N.ln1/ln2``, ``ffn.layers.*``, ``patch_embed.projection``,
  final ``ln1``, pre-norm ``ln_pre``).
- ``mmpretrain``: mmpretrain ``VisionTransformer`` (``layers.N.attn.qkv``, ``ln1/ln2``,
  ``ffn.layers.*``, final ``ln1``, pre-norm ``pre_norm``).

``mask_token`` (DINOv2's masked-image-modelling token) is training-only and dropped.

The architecture the file reveals (width, depth, LayerScale, registers, FFN kind and width, qkv
bias; with ``config.json`` also heads and the LayerNorm eps) is checked against the model: a
difference is refused, naming the field. Each format records the position-embedding resize rule
of its implementation (:data:`FORMAT_POS_EMBED_RULES`, rules in
:mod:`mmvitswin.core.layers.pos_embed_rules`), used to fit the file's grid to the model's
pretraining grid on loading; the run-time rule is the model's ``pos_embed_resize`` (a
constructor argument, so training and testing agree): set it to the file's rule (the DINOv2
presets use HF's) to reproduce the source's features at every input size.

The family (``VIT_CHECKPOINTS``, run by :func:`~.loading.fit_checkpoint`) fits a file to a model
(:func:`adapt_vit_state_dict`): the pos-embed grid is resized by that rule with the CLS entry
kept apart, the patch-embedding kernel is resampled to the model's patch size (pseudo-inverse
of the bicubic resize, FlexiViT's rule, so a resized image through the new kernel gives the old
tokens) and ViTDet's decomposed relative-position tables are resized linearly.
"""
import re
import warnings
from collections import OrderedDict
from typing import Dict, Optional, Tuple

import torch
import torch.nn.functional as F

from ..layers import ConvStem, grid_size, resize_abs_pos_embed, resize_rel_pos_1d
from .loading import CheckpointFamily, StateDict, fit_checkpoint

_TIMM_BLOCK = (('mlp.fc1.', 'ffn.layers.0.0.'), ('mlp.fc2.', 'ffn.layers.1.'))
# Meta's DINOv2 SwiGLU (``SwiGLUFFNFused``) and DeiT-III's original LayerScale names
_META_BLOCK = (('mlp.w12.', 'ffn.w12.'), ('mlp.w3.', 'ffn.w3.'), ('gamma_1', 'ls1.gamma'),
               ('gamma_2', 'ls2.gamma'))
_MM_BLOCK = (
    ('ln1.', 'norm1.'),
    ('ln2.', 'norm2.'),
    ('attn.attn.in_proj_weight', 'attn.qkv.weight'),
    ('attn.attn.in_proj_bias', 'attn.qkv.bias'),
    ('attn.attn.out_proj.', 'attn.proj.'),
)
_ADAPTER_TOP = re.compile(r'(level_embed$|spm\.|interactions\.|up\.|norm[1-4]\.)')
_MM_TOP = (('patch_embed.projection.', 'patch_embed.proj.'), ('ln1.', 'norm.'),
           ('ln_pre.', 'norm_pre.'), ('pre_norm.', 'norm_pre.'))


# ------------------------------------------------------------------------ pure functions
_HF_PATCH = 'embeddings.patch_embeddings.projection.weight'
_HF_PREFIXES = ('dinov2.', 'vit.')
# the position-embedding resize rule of each format's implementation (None: the model's own)
FORMAT_POS_EMBED_RULES: Dict[str, Optional[str]] = {
    'mmvitswin': None, 'mmseg': None, 'mmpretrain': 'bicubic', 'timm': 'bicubic-antialias',
    'dinov2': 'bicubic-offset', 'dinov2-reg': 'bicubic-antialias', 'hf-vit': 'bicubic',
    'hf-dinov2': 'bicubic', 'hf-dinov2-reg': 'bicubic-antialias'}


def _hf_prefix(sd: StateDict) -> Optional[str]:
    """'' or the ``dinov2.``/``vit.`` prefix of an HF file, None when it is not one."""
    if _HF_PATCH in sd:
        return ''
    return next((p for p in _HF_PREFIXES if p + _HF_PATCH in sd), None)


def detect_vit_format(sd: StateDict, config: Optional[dict] = None) -> str:
    """Return 'mmvitswin', 'timm', 'dinov2', 'hf-dinov2', 'hf-dinov2-reg', 'hf-vit', 'mmseg' or
    'mmpretrain'; ValueError for anything else. ``config``: an HF ``config.json`` (its
    ``model_type`` decides between the HF models when present)."""
    keys = set(sd)
    prefix = _hf_prefix(sd)
    if prefix is not None:
        model_type = (config or {}).get('model_type')
        if model_type in ('dinov2', 'dinov2_with_registers', 'vit'):
            return {'dinov2': 'hf-dinov2', 'dinov2_with_registers': 'hf-dinov2-reg',
                    'vit': 'hf-vit'}[model_type]
        if prefix + 'embeddings.register_tokens' in keys:
            return 'hf-dinov2-reg'
        if any(re.search(r'\.(layer_scale1|norm1)\.', k) for k in keys):
            return 'hf-dinov2'
        return 'hf-vit'
    if any(re.match(r'blocks\.\d+\.ffn\.(layers|w12)\.', k) for k in keys):
        return 'mmvitswin'
    if any(re.match(r'blocks\.\d+\.(attn\.qkv|mlp\.fc1|mlp\.w12)\.', k) for k in keys):
        return 'dinov2' if keys & {'mask_token', 'register_tokens'} else 'timm'
    if any(re.match(r'layers\.\d+\.attn\.attn\.in_proj_weight', k) for k in keys):
        return 'mmseg'
    if any(re.match(r'layers\.\d+\.attn\.qkv\.', k) for k in keys):
        return 'mmpretrain'
    sample = sorted(keys)[:6]
    raise ValueError(f'unrecognised ViT checkpoint format; expected timm/DeiT/MAE/DINOv2, HF '
                     f'ViT/Dinov2, mmseg, mmpretrain or mmvitswin keys, got e.g. {sample}')


def resample_patch_kernel(weight: torch.Tensor, size: Tuple[int, int]) -> torch.Tensor:
    """Resample a patch-embedding kernel ``(C_out, C_in, p, p)`` to ``size``.

    Solves for the kernel that, applied to a bicubically resized patch, gives the tokens the
    old kernel gives on the original patch (least squares via the pseudo-inverse of the resize
    matrix; exact when upsampling).
    """
    old = tuple(weight.shape[-2:])
    size = tuple(size)
    if old == size:
        return weight
    n_old = old[0] * old[1]
    basis = torch.eye(n_old, dtype=torch.float64).reshape(n_old, 1, *old)
    # resize_matrix[i] = the resized image of the i-th one-hot patch: resize(x) = x @ matrix
    resize_matrix = F.interpolate(basis, size=size, mode='bicubic',
                                  align_corners=False).reshape(n_old, -1)
    flat = weight.reshape(-1, n_old).double()
    new = flat @ torch.linalg.pinv(resize_matrix).t()
    return new.reshape(*weight.shape[:-2], *size).to(weight.dtype)


def _prefix_tokens(sd: StateDict, pos_len: int) -> int:
    """Number of prefix (CLS/distillation) entries in a checkpoint's pos-embed: none when its
    length is a square grid (timm's ``no_embed_class``: DeiT-III, DINOv2 with registers),
    else one per CLS/distillation token (registers never have one)."""
    side = int(round(pos_len**0.5))
    if side * side == pos_len:
        return 0
    return 1 + int('dist_token' in sd)


_HF_BLOCK = (  # (HF block-key rest, ours); both the hub names and those of transformers >= 5
    ('layernorm_before.', 'norm1.'), ('layernorm_after.', 'norm2.'),
    ('attention.output.dense.', 'attn.proj.'), ('attention.o_proj.', 'attn.proj.'),
    ('layer_scale1.lambda1', 'ls1.gamma'), ('layer_scale2.lambda1', 'ls2.gamma'),
    ('intermediate.dense.', 'ffn.layers.0.0.'), ('output.dense.', 'ffn.layers.1.'),
    ('mlp.fc1.', 'ffn.layers.0.0.'), ('mlp.fc2.', 'ffn.layers.1.'),
    ('mlp.weights_in.', 'ffn.w12.'), ('mlp.weights_out.', 'ffn.w3.'),
    ('mlp.down_proj.', 'ffn.w3.'))
_HF_QKV = re.compile(r'attention\.(?:attention\.(query|key|value)|([qkv])_proj)\.(weight|bias)$')
_HF_GLU = re.compile(r'mlp\.(gate|up)_proj\.(weight|bias)$')
_HF_TOP = (('embeddings.cls_token', 'cls_token'), ('embeddings.position_embeddings', 'pos_embed'),
           ('embeddings.register_tokens', 'register_tokens'),
           ('embeddings.patch_embeddings.projection.', 'patch_embed.proj.'),
           ('layernorm.', 'norm.'))


def convert_hf_vit_state_dict(sd: StateDict, prefix: str = '') -> StateDict:
    """HF ``ViTModel`` / ``Dinov2Model`` / ``Dinov2WithRegistersModel`` keys -> ours: q/k/v
    joined into ``qkv``, the SwiGLU gate and up halves into ``w12``; ``mask_token`` dropped;
    keys outside the backbone (``pooler``, ``classifier``) keep their names."""
    out = OrderedDict()
    qkv: Dict[Tuple[str, str], Dict[str, torch.Tensor]] = {}
    glu: Dict[Tuple[str, str], Dict[str, torch.Tensor]] = {}
    for key, value in sd.items():
        if prefix and key.startswith(prefix):
            key = key[len(prefix):]
        if key == 'embeddings.mask_token':
            continue
        m = re.match(r'(?:encoder\.layer|layers)\.(\d+)\.(.*)', key)
        if m is None:
            for old, new in _HF_TOP:
                if key.startswith(old):
                    key = new + key[len(old):]
                    break
            out[key] = value
            continue
        block, rest = f'blocks.{m.group(1)}.', m.group(2)
        hit = _HF_QKV.match(rest)
        if hit:
            part = (hit.group(1) or {'q': 'query', 'k': 'key', 'v': 'value'}[hit.group(2)])
            qkv.setdefault((block, hit.group(3)), {})[part] = value
            out.setdefault(f'{block}attn.qkv.{hit.group(3)}', None)  # keeps the key order
            continue
        hit = _HF_GLU.match(rest)
        if hit:
            glu.setdefault((block, hit.group(2)), {})[hit.group(1)] = value
            out.setdefault(f'{block}ffn.w12.{hit.group(2)}', None)
            continue
        for old, new in _HF_BLOCK:
            if rest.startswith(old):
                rest = new + rest[len(old):]
                break
        out[block + rest] = value
    for (block, kind), parts in qkv.items():
        if set(parts) != {'query', 'key', 'value'}:
            raise ValueError(f'{block}: the HF attention needs query, key and value {kind}s, '
                             f'got {sorted(parts)}')
        out[f'{block}attn.qkv.{kind}'] = torch.cat(
            [parts['query'], parts['key'], parts['value']], dim=0)
    for (block, kind), parts in glu.items():
        if set(parts) != {'gate', 'up'}:
            raise ValueError(f'{block}: the HF SwiGLU needs gate_proj and up_proj, got '
                             f'{sorted(parts)}')
        out[f'{block}ffn.w12.{kind}'] = torch.cat([parts['gate'], parts['up']], dim=0)
    return out


def _timm_mlp_names(sd: StateDict, block: str) -> Tuple[Tuple[str, str], ...]:
    """timm's ``mlp.fc1/fc2`` of one block -> ours: SwiGLU-packed (``fc1`` twice as wide as
    ``fc2``'s input, timm's ``SwiGLUPacked`` of ViT-g) -> ``ffn.w12/w3``, else the MLP."""
    fc1, fc2 = sd.get(block + 'mlp.fc1.weight'), sd.get(block + 'mlp.fc2.weight')
    if fc1 is not None and fc2 is not None and fc1.shape[0] == 2 * fc2.shape[1]:
        return (('mlp.fc1.', 'ffn.w12.'), ('mlp.fc2.', 'ffn.w3.'))
    return _TIMM_BLOCK


def convert_vit_state_dict(sd: StateDict, config: Optional[dict] = None
                           ) -> Tuple[StateDict, str]:
    """Rename any supported ViT layout to ours. Returns ``(state_dict, detected_format)``
    (``'dinov2-reg'`` for Meta's files with registers).

    Pure key/layout conversion, no resizing (see :func:`adapt_vit_state_dict`). Keys that have
    no counterpart (heads, ``fc_norm``, MAE decoder, pooler) keep their names, so the loader
    reports them in its one warning.
    """
    fmt = detect_vit_format(sd, config)
    if fmt.startswith('hf-'):
        return convert_hf_vit_state_dict(sd, _hf_prefix(sd)), fmt
    # released ViT-Adapter backbones keep the adapter at the top level; ours nests it
    adapter_release = fmt == 'timm' and any(k.startswith(('spm.', 'interactions.')) for k in sd)
    if fmt in ('mmvitswin', 'timm', 'dinov2'):
        out = OrderedDict()
        for key, value in sd.items():
            if key in ('dist_token', 'mask_token'):
                continue
            if adapter_release and _ADAPTER_TOP.match(key):
                out['adapter.' + key] = value
                continue
            if key == 'pos_embed' and 'dist_token' in sd:
                value = torch.cat([value[:, :1], value[:, 2:]], dim=1)  # drop the dist entry
            if key == 'reg_token':
                key = 'register_tokens'
            m = re.match(r'(blocks\.\d+\.)(.*)', key)
            if m and fmt != 'mmvitswin':
                rest = m.group(2)
                renames = _timm_mlp_names(sd, m.group(1)) + _META_BLOCK
                for old, new in renames:
                    if rest.startswith(old):
                        rest = new + rest[len(old):]
                        break
                key = m.group(1) + rest
            out[key] = value
        if fmt == 'dinov2' and 'register_tokens' in sd:
            fmt = 'dinov2-reg'
        return out, fmt
    out = OrderedDict()
    for key, value in sd.items():
        m = re.match(r'layers\.(\d+)\.(.*)', key)
        if m:
            rest = m.group(2)
            for old, new in _MM_BLOCK:
                if rest.startswith(old):
                    rest = new + rest[len(old):]
                    break
            out[f'blocks.{m.group(1)}.{rest}'] = value
            continue
        for old, new in _MM_TOP:
            if key.startswith(old):
                key = new + key[len(old):]
                break
        out[key] = value
    return out, fmt


def trunk_layout_of(sd: StateDict) -> dict:
    """The parts around a ViT trunk's blocks a state dict in our layout has (None: the keys do
    not say): the patch embedding's norm and bias and a norm before the blocks, either way
    (a file without one cannot serve a model with it, and one with it has no use in a model
    without it); an absolute position embedding, either way; a final norm and a CLS token one
    way only: a file with them serves a model without them (their keys go unused: mmseg's
    ``final_norm=False`` recipes, ViTDet's trunks without the CLS token on MAE weights), a file
    without them cannot serve a model with them (initialised, they would change every
    feature)."""
    patch = 'patch_embed.proj.weight' in sd
    return dict(patch_norm='patch_embed.norm.weight' in sd if patch else None,
                patch_bias='patch_embed.proj.bias' in sd if patch else None,
                pre_norm='norm_pre.weight' in sd, abs_pos_embed='pos_embed' in sd,
                final_norm=None if 'norm.weight' in sd else False,
                with_cls_token=None if 'cls_token' in sd else False)


def trunk_layout_of_model(model) -> dict:
    """:func:`trunk_layout_of`'s fields of a ViT trunk (None where its patch embedding is not
    the plain patchify one: a conv stem, a CNN)."""
    embed = model.patch_embed
    proj = getattr(embed, 'proj', None) if not isinstance(embed, ConvStem) else None
    plain = isinstance(proj, torch.nn.Conv2d)
    return dict(patch_norm=getattr(embed, 'norm', None) is not None if plain else None,
                patch_bias=proj.bias is not None if plain else None,
                pre_norm=getattr(model, 'norm_pre', None) is not None,
                abs_pos_embed=getattr(model, 'pos_embed', None) is not None,
                final_norm=bool(getattr(model, 'final_norm', False)),
                with_cls_token=bool(getattr(model, 'with_cls_token', False)))


def vit_arch_of(sd: StateDict) -> dict:
    """The architecture a state dict in our layout reveals (None where unknown): width, depth,
    LayerScale, register tokens, FFN kind and hidden width, qkv bias, and the parts around the
    blocks (:func:`trunk_layout_of`)."""
    blocks = {int(m.group(1)) for k in sd for m in [re.match(r'blocks\.(\d+)\.', k)] if m}
    w = sd.get('patch_embed.proj.weight')
    arch = dict(embed_dims=None if w is None else w.shape[0],
                num_layers=max(blocks) + 1 if blocks else None)
    if not blocks:
        return arch
    arch.update(trunk_layout_of(sd))
    first = f'blocks.{min(blocks)}.'
    regs = sd.get('register_tokens')
    arch.update(layer_scale=first + 'ls1.gamma' in sd,
                num_register_tokens=0 if regs is None else regs.shape[1])
    if first + 'ffn.w12.weight' in sd:
        arch.update(ffn_type='swiglu', feedforward_channels=sd[first + 'ffn.w3.weight'].shape[1])
    elif first + 'ffn.layers.0.0.weight' in sd:
        arch.update(ffn_type='mlp',
                    feedforward_channels=sd[first + 'ffn.layers.0.0.weight'].shape[0])
    if first + 'attn.qkv.weight' in sd:
        arch['qkv_bias'] = first + 'attn.qkv.bias' in sd
    return arch


def vit_config_arch(config: dict) -> dict:
    """The architecture an HF ``config.json`` of a ViT / Dinov2 / Dinov2WithRegisters model
    reveals ({} for another model type)."""
    model_type = config.get('model_type')
    if model_type not in ('vit', 'dinov2', 'dinov2_with_registers'):
        return {}
    arch = dict(embed_dims=config.get('hidden_size'), num_layers=config.get('num_hidden_layers'),
                num_heads=config.get('num_attention_heads'),
                norm_eps=config.get('layer_norm_eps'), qkv_bias=config.get('qkv_bias'))
    if model_type == 'vit':
        arch.update(layer_scale=False, num_register_tokens=0, ffn_type='mlp',
                    feedforward_channels=config.get('intermediate_size'))
    else:
        arch.update(layer_scale=True, ffn_type='swiglu' if config.get('use_swiglu_ffn') else 'mlp',
                    num_register_tokens=config.get('num_register_tokens', 0))
    return arch


def vit_model_arch(model) -> dict:
    """The probe's fields of a ViT trunk (or a builder on one)."""
    block = model.blocks[0]
    return dict(trunk_layout_of_model(model), embed_dims=model.embed_dims,
                num_layers=model.num_layers,
                num_heads=model.num_heads, layer_scale=model.layer_scale_init_value is not None,
                num_register_tokens=model.num_register_tokens, ffn_type=model.ffn_type,
                feedforward_channels=model.feedforward_channels,
                qkv_bias=block.attn.qkv.bias is not None, norm_eps=block.norm1.eps)


def fit_pos_embed_by_source(sd: StateDict, fmt: str, model) -> StateDict:
    """The family's ``transform``: the file's ``pos_embed`` resized to the model's pretraining
    grid by the rule of the file's implementation (:data:`FORMAT_POS_EMBED_RULES`; ours and
    mmseg's: the model's own ``pos_embed_resize``), its CLS entry kept apart (none in the file:
    a zero entry). A width mismatch is left to the architecture check."""
    pos = sd.get('pos_embed')
    own = model.state_dict().get('pos_embed')
    if pos is None or own is None or pos.shape[-1] != own.shape[-1]:
        return sd
    rule = FORMAT_POS_EMBED_RULES.get(fmt) or model.pos_embed_resize
    out = OrderedDict(sd)
    out['pos_embed'] = _fit_pos_embed(pos, own, model.pretrain_grid,
                                      _prefix_tokens(sd, pos.shape[1]), rule)
    return out


def _resize_rel_pos(key: str, value: torch.Tensor, own: torch.Tensor, model) -> torch.Tensor:
    if value.shape[1] != own.shape[1]:
        raise ValueError(f'{key}: checkpoint head_dim {value.shape[1]} vs model {own.shape[1]}')
    return resize_rel_pos_1d(value, own.shape[0])


def fit_vit_embeddings(sd: StateDict, model) -> StateDict:
    """The ViT family's whole-dict fitting: pos-embed grid resized (CLS entry kept apart), the
    patch kernel resampled to the model's patch size, a patchify kernel left out of a
    conv-stem model (with a warning)."""
    own = model.state_dict()
    out = OrderedDict(sd)
    kernel = sd.get('patch_embed.proj.weight')
    target = own.get('patch_embed.proj.weight')
    if (kernel is not None and isinstance(getattr(model, 'patch_embed', None), ConvStem)
            and (target is None or kernel.shape != target.shape)):
        # a patchify kernel does not fit a conv stem's 1x1 projection (a conv-stem model's
        # own file does): leave the stem as initialised (reported missing) and say why
        del out['patch_embed.proj.weight']
        out.pop('patch_embed.proj.bias', None)
        warnings.warn(f'{type(model).__name__} has a conv stem (stem="conv"): the checkpoint\'s '
                      f'patchify conv patch_embed.proj {tuple(kernel.shape)} is not loaded',
                      stacklevel=2)
    elif kernel is not None and target is not None and kernel.shape[-2:] != target.shape[-2:]:
        out['patch_embed.proj.weight'] = resample_patch_kernel(kernel, target.shape[-2:])
    return out


# keys of features a model may be built without: refused (naming how to build it) rather than
# left over with wrong features
VIT_UNREPRESENTABLE = (
    (r'\.ls[12]\.gamma$', 'LayerScale', 'layer_scale_init_value=<float> (e.g. 1e-5)'),
    (r'^register_tokens$', 'register tokens', 'num_register_tokens=<N>'),
    (r'\.ffn\.w(12|3)\.', 'a SwiGLU FFN', "ffn_type='swiglu'"),
    (r'\.attn\.rel_pos_[hw]$', 'decomposed relative positions', 'use_rel_pos=True'),
)

VIT_CHECKPOINTS = CheckpointFamily(
    'ViT', convert_vit_state_dict, vit_arch_of, vit_model_arch,
    resize=((r'attn\.rel_pos_[hw]$', _resize_rel_pos), ), fit=fit_vit_embeddings,
    transform=fit_pos_embed_by_source, config_probe=vit_config_arch, convert_needs_config=True,
    unrepresentable=VIT_UNREPRESENTABLE)


def adapt_vit_state_dict(sd: StateDict, model, config: Optional[dict] = None) -> StateDict:
    """Fit a state dict (any supported ViT layout) to ``model`` (a ``VisionTransformerTrunk``):
    the architecture check, pos-embed, patch kernel and decomposed rel-pos tables resized
    (:data:`VIT_CHECKPOINTS` run by :func:`~.loading.fit_checkpoint`)."""
    return fit_checkpoint(VIT_CHECKPOINTS, sd, model, config=config)


def _fit_pos_embed(pos: torch.Tensor, own: torch.Tensor, dst_grid, prefix: int,
                   rule: str) -> torch.Tensor:
    """(1, prefix + S*S, C) -> the model's (1, 1 + h*w, C): one CLS entry, grid resized."""
    if pos.dim() == 4:  # (1, C, H, W) grid without prefix
        src_grid = tuple(pos.shape[2:])
        pos = pos.flatten(2).transpose(1, 2)
        prefix = 0
    else:
        src_grid = grid_size(pos.shape[1] - prefix)
    if pos.shape[-1] != own.shape[-1]:
        raise ValueError(f'pos_embed: checkpoint has {pos.shape[-1]} channels, model '
                         f'{own.shape[-1]}')
    cls: Optional[torch.Tensor] = pos[:, :1] if prefix else None
    grid = resize_abs_pos_embed(pos[:, prefix:], src_grid, dst_grid, rule)
    if cls is None:  # no CLS entry in the file: a zero entry adds nothing to the CLS token
        cls = torch.zeros_like(own[:, :1])
    return torch.cat([cls, grid], dim=1)
