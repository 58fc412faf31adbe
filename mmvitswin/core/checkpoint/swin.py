"""Swin checkpoint formats -> mmvitswin/mmdet layout: the ``SWIN_CHECKPOINTS`` family.

Formats (detected from the keys, no flag needed):

- ``mmdet``: mmdet/mmseg ``SwinTransformer`` (``stages.*``, ``patch_embed.projection``,
  ``attn.w_msa.*``, ``ffn.layers.*``); PatchMerging weights in ``nn.Unfold`` order. Our own.
- ``microsoft``: the official release (``layers.*``, ``attn.qkv``, ``mlp.fc1``,
  ``patch_embed.proj``, ``attn_mask`` buffers, ``head``), also timm < 0.9; downsample at the
  **end** of stage s, merged channels neighbour-major.
- ``timm``: timm >= 0.9, the same names but each downsample at the **start** of stage s+1.
"""
import re
from collections import OrderedDict
from typing import Dict, Tuple

import torch

from ..layers import relative_position_index, resize_pos_embed, resize_rel_pos_table
from .loading import DERIVED_KEYS, CheckpointFamily, StateDict, fit_checkpoint

_BLOCK_RENAMES = (
    ('attn.qkv.', 'attn.w_msa.qkv.'),
    ('attn.proj.', 'attn.w_msa.proj.'),
    ('attn.relative_position_bias_table', 'attn.w_msa.relative_position_bias_table'),
    ('mlp.fc1.', 'ffn.layers.0.0.'),
    ('mlp.fc2.', 'ffn.layers.1.'),
)


def detect_swin_format(sd: StateDict) -> str:
    """Return 'mmdet', 'microsoft' or 'timm'; ValueError for anything else."""
    keys = set(sd)
    if any(k.startswith('stages.') for k in keys) or 'patch_embed.projection.weight' in keys:
        return 'mmdet'
    if any(k.startswith('layers.') and '.blocks.' in k for k in keys):
        if 'layers.0.downsample.reduction.weight' in keys:
            return 'microsoft'
        if 'layers.1.downsample.reduction.weight' in keys:
            return 'timm'
        return 'microsoft'  # a single-stage model: the two layouts agree
    sample = sorted(keys)[:6]
    raise ValueError(f'unrecognised Swin checkpoint format; expected mmdet/mmseg, Microsoft or '
                     f'timm keys, got e.g. {sample}')


def unfold_order_from_microsoft(t: torch.Tensor) -> torch.Tensor:
    """Reorder the 4C merged-channel axis (last) from neighbour-major ``[dx, dy, c]`` to
    ``nn.Unfold``'s channel-major ``[c, dy, dx]``."""
    c4 = t.shape[-1]
    lead = t.shape[:-1]
    t = t.reshape(*lead, 2, 2, c4 // 4)
    n = len(lead)
    return t.permute(*range(n), n + 2, n + 1, n).reshape(*lead, c4)


def convert_swin_state_dict(sd: StateDict) -> Tuple[StateDict, str]:
    """Rename any supported Swin layout to ours. Returns ``(state_dict, detected_format)``.

    Pure key/layout conversion: no resizing (see :func:`adapt_swin_state_dict`). Classification
    heads and the final ImageNet ``norm`` are kept under their original names so the loader
    reports them as unused, exactly like mmdet's converter leaves them out of the backbone.
    """
    fmt = detect_swin_format(sd)
    if fmt == 'mmdet':
        return OrderedDict(sd), fmt
    out = OrderedDict()
    for key, value in sd.items():
        if key.endswith(DERIVED_KEYS):
            continue
        m = re.match(r'layers\.(\d+)\.(.*)', key)
        if m is None:
            out[key.replace('patch_embed.proj.', 'patch_embed.projection.')] = value
            continue
        stage, rest = int(m.group(1)), m.group(2)
        if rest.startswith('downsample.'):
            if fmt == 'timm':
                stage -= 1
            if rest.startswith(('downsample.reduction.', 'downsample.norm.')):
                value = unfold_order_from_microsoft(value)
            out[f'stages.{stage}.{rest}'] = value
            continue
        for old, new in _BLOCK_RENAMES:
            rest = rest.replace(old, new)
        out[f'stages.{stage}.{rest}'] = value
        if rest.endswith('relative_position_bias_table'):
            # mmdet/mmseg save the derived index too: a converted file (no model to take it
            # from, tools/convert_checkpoint.py) carries it so it loads strictly there
            side = (int(round(value.shape[0]**0.5)) + 1) // 2
            index_key = f'stages.{stage}.{rest[:-len("bias_table")]}index'
            out[index_key] = relative_position_index((side, side))
    return out, fmt


def swin_arch_of(sd: StateDict, stage_key: str = 'stages',
                 embed_key: str = 'patch_embed.projection.weight') -> Dict[str, object]:
    """embed_dims and blocks per stage of a Swin state dict whose blocks are named
    ``{stage_key}.{s}.blocks.{b}.*`` (``layers`` for the video Swin); None where unknown."""
    depths: Dict[int, int] = {}
    for k in sd:
        m = re.match(rf'{stage_key}\.(\d+)\.blocks\.(\d+)\.', k)
        if m:
            s, b = int(m.group(1)), int(m.group(2))
            depths[s] = max(depths.get(s, 0), b + 1)
    w = sd.get(embed_key)
    return dict(embed_dims=None if w is None else w.shape[0],
                depths=tuple(depths.get(s, 0) for s in range(max(depths) + 1)) if depths else None)


def swin_model_arch(model) -> Dict[str, object]:
    """The probe's fields of a Swin model (2-D or video)."""
    return dict(embed_dims=model.arch_settings['embed_dims'], depths=tuple(model.depths))


def resize_bias_table(key: str, value: torch.Tensor, own: torch.Tensor, model,
                      source_window=None) -> torch.Tensor:
    """A relative-position bias table ``(rows, heads)`` resized to the model's window; the
    table's own window comes from ``source_window(rows, key)`` (square 2-D by default)."""
    if value.shape[1] != own.shape[1]:
        raise ValueError(f'{key}: checkpoint has {value.shape[1]} heads, model has '
                         f'{own.shape[1]}')
    side = int(round(value.shape[0]**0.5))
    src = ((side + 1) // 2, ) * 2 if source_window is None else source_window(value.shape[0],
                                                                              key)
    return resize_rel_pos_table(value, src, model.window_size)


def _resize_abs_pos_embed(key: str, value: torch.Tensor, own: torch.Tensor, model):
    if value.dim() == 4:  # (1, C, H, W) as some mmdet releases stored it
        src = tuple(value.shape[2:])
        value = value.flatten(2).transpose(1, 2)
    else:
        side = int(round(value.shape[1]**0.5))
        src = (side, side)
    return resize_pos_embed(value, src, model.pretrain_grid)


SWIN_CHECKPOINTS = CheckpointFamily(
    'Swin', convert_swin_state_dict, swin_arch_of, swin_model_arch,
    resize=((r'relative_position_bias_table$', resize_bias_table),
            (r'^absolute_pos_embed$', _resize_abs_pos_embed)))


def adapt_swin_state_dict(sd: StateDict, model) -> StateDict:
    """Fit a state dict (any supported Swin layout) to ``model``: the architecture check, the
    relative position tables (window change) and the absolute position embedding (pretrain
    size) resized (:data:`SWIN_CHECKPOINTS` run by :func:`~.loading.fit_checkpoint`)."""
    return fit_checkpoint(SWIN_CHECKPOINTS, sd, model)
