"""ViT checkpoint formats -> mmvitswin layout (see ``VisionTransformerTrunk``'s docstring).

Formats (detected from the keys, no flag needed):

- ``mmvitswin``: ours (``blocks.N.attn.qkv`` with ``blocks.N.ffn.layers.*``).
- ``timm``: timm / DeiT / AugReg / MAE / ViTDet-style (``blocks.N.attn.qkv``, ``blocks.N.mlp.fc1``,
  ``patch_embed.proj``, ``cls_token``, ``pos_embed``, final ``norm``; ``fc_norm``/``head`` of
  classifiers and MAE decoders are left for the loader to report as unused). A DeiT
  ``dist_token`` is dropped together with its pos-embed entry. Released ViT-Adapter backbones
  (the same block names plus top-level ``level_embed``, ``spm.*``, ``interactions.*``, ``up``,
  ``norm1..4``) get their adapter keys moved under ``adapter.``.
- ``mmseg``: mmseg 1.x ``VisionTransformer`` (``layers.N.attn.attn.in_proj_weight`` of
  ``nn.MultiheadAttention``, ``layers.N.ln1/ln2``, ``ffn.layers.*``, ``patch_embed.projection``,
  final ``ln1``, pre-norm ``ln_pre``).
- ``mmpretrain``: mmpretrain ``VisionTransformer`` (``layers.N.attn.qkv``, ``ln1/ln2``,
  ``ffn.layers.*``, final ``ln1``, pre-norm ``pre_norm``).

The family (``VIT_CHECKPOINTS``, run by :func:`~.loading.fit_checkpoint`) fits a file to a model
(:func:`adapt_vit_state_dict`): the pos-embed grid is resized bicubically
with the CLS entry kept apart, the patch-embedding kernel is resampled to the model's patch
size (pseudo-inverse of the bicubic resize, FlexiViT's rule, so a resized image through the new
kernel gives the old tokens) and ViTDet's decomposed relative-position tables are resized
linearly.
"""
import re
import warnings
from collections import OrderedDict
from typing import Optional, Tuple

import torch
import torch.nn.functional as F

from ..layers import ConvStem, grid_size, resize_pos_embed, resize_rel_pos_1d
from .loading import CheckpointFamily, StateDict, fit_checkpoint

_TIMM_BLOCK = (('mlp.fc1.', 'ffn.layers.0.0.'), ('mlp.fc2.', 'ffn.layers.1.'))
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
def detect_vit_format(sd: StateDict) -> str:
    """Return 'mmvitswin', 'timm', 'mmseg' or 'mmpretrain'; ValueError for anything else."""
    keys = set(sd)
    if any(re.match(r'blocks\.\d+\.ffn\.layers\.', k) for k in keys):
        return 'mmvitswin'
    if any(re.match(r'blocks\.\d+\.(attn\.qkv|mlp\.fc1)\.', k) for k in keys):
        return 'timm'
    if any(re.match(r'layers\.\d+\.attn\.attn\.in_proj_weight', k) for k in keys):
        return 'mmseg'
    if any(re.match(r'layers\.\d+\.attn\.qkv\.', k) for k in keys):
        return 'mmpretrain'
    sample = sorted(keys)[:6]
    raise ValueError(f'unrecognised ViT checkpoint format; expected timm/DeiT/MAE, mmseg, '
                     f'mmpretrain or mmvitswin keys, got e.g. {sample}')


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
    """Number of prefix (CLS/distillation) entries in a checkpoint's pos-embed."""
    if 'cls_token' in sd:
        return 1 + int('dist_token' in sd)
    side = int(round(pos_len**0.5))
    return 0 if side * side == pos_len else 1


def convert_vit_state_dict(sd: StateDict) -> Tuple[StateDict, str]:
    """Rename any supported ViT layout to ours. Returns ``(state_dict, detected_format)``.

    Pure key/layout conversion, no resizing (see :func:`adapt_vit_state_dict`). Keys that have
    no counterpart (heads, ``fc_norm``, MAE decoder, layer-scale) keep their names, so the
    loader reports them in its one warning.
    """
    fmt = detect_vit_format(sd)
    # released ViT-Adapter backbones keep the adapter at the top level; ours nests it
    adapter_release = fmt == 'timm' and any(k.startswith(('spm.', 'interactions.')) for k in sd)
    if fmt in ('mmvitswin', 'timm'):
        out = OrderedDict()
        for key, value in sd.items():
            if key == 'dist_token':
                continue
            if adapter_release and _ADAPTER_TOP.match(key):
                out['adapter.' + key] = value
                continue
            if key == 'pos_embed' and 'dist_token' in sd:
                value = torch.cat([value[:, :1], value[:, 2:]], dim=1)  # drop the dist entry
            m = re.match(r'(blocks\.\d+\.)(.*)', key)
            if m and fmt == 'timm':
                rest = m.group(2)
                for old, new in _TIMM_BLOCK:
                    rest = rest.replace(old, new)
                key = m.group(1) + rest
            out[key] = value
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


def vit_arch_of(sd: StateDict) -> dict:
    """embed_dims and number of blocks of a state dict in our layout (None where unknown)."""
    blocks = {int(m.group(1)) for k in sd for m in [re.match(r'blocks\.(\d+)\.', k)] if m}
    w = sd.get('patch_embed.proj.weight')
    return dict(embed_dims=None if w is None else w.shape[0],
                num_layers=max(blocks) + 1 if blocks else None)


def vit_model_arch(model) -> dict:
    """The probe's fields of a ViT trunk (or a builder on one)."""
    return dict(embed_dims=model.embed_dims, num_layers=model.num_layers)


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
    pos = sd.get('pos_embed')
    if pos is not None and 'pos_embed' in own:
        out['pos_embed'] = _fit_pos_embed(pos, own['pos_embed'], model.pretrain_grid,
                                          _prefix_tokens(sd, pos.shape[1]),
                                          model.interpolate_mode)
    kernel = sd.get('patch_embed.proj.weight')
    target = own.get('patch_embed.proj.weight')
    if kernel is not None and isinstance(getattr(model, 'patch_embed', None), ConvStem):
        # a patchify kernel does not fit a conv stem's 1x1 projection: leave the stem as
        # initialised (reported missing) and say why
        del out['patch_embed.proj.weight']
        out.pop('patch_embed.proj.bias', None)
        warnings.warn(f'{type(model).__name__} has a conv stem (stem="conv"): the checkpoint\'s '
                      f'patchify conv patch_embed.proj {tuple(kernel.shape)} is not loaded',
                      stacklevel=2)
    elif kernel is not None and target is not None and kernel.shape[-2:] != target.shape[-2:]:
        out['patch_embed.proj.weight'] = resample_patch_kernel(kernel, target.shape[-2:])
    return out


VIT_CHECKPOINTS = CheckpointFamily(
    'ViT', convert_vit_state_dict, vit_arch_of, vit_model_arch,
    resize=((r'attn\.rel_pos_[hw]$', _resize_rel_pos), ), fit=fit_vit_embeddings)


def adapt_vit_state_dict(sd: StateDict, model) -> StateDict:
    """Fit a state dict (any supported ViT layout) to ``model`` (a ``VisionTransformerTrunk``):
    the architecture check, pos-embed, patch kernel and decomposed rel-pos tables resized
    (:data:`VIT_CHECKPOINTS` run by :func:`~.loading.fit_checkpoint`)."""
    return fit_checkpoint(VIT_CHECKPOINTS, sd, model)


def _fit_pos_embed(pos: torch.Tensor, own: torch.Tensor, dst_grid, prefix: int,
                   mode: str) -> torch.Tensor:
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
    grid = resize_pos_embed(pos[:, prefix:], src_grid, dst_grid, num_prefix_tokens=0, mode=mode)
    if cls is None:  # no CLS entry in the file: a zero entry adds nothing to the CLS token
        cls = torch.zeros_like(own[:, :1])
    return torch.cat([cls, grid], dim=1)
