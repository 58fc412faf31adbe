"""Video Swin checkpoints, and inflation of 2-D Swin checkpoints to 3-D.

Formats (detected from the patch-embedding kernel, no flag needed):

- ``video``: mmaction2 1.x / the Video Swin release (``patch_embed.proj.weight`` is a 5-D
  ``Conv3d`` kernel, ``layers.*.blocks.*.attn.qkv``, ``mlp.fc1``, ``norm{i}``). Already our
  layout: only derived buffers are dropped and tables resized to the model's window.
- ``image``: anything :func:`~mmvitswin.core.checkpoint.swin.convert_swin_state_dict` accepts
  (mmdet/mmseg, Microsoft, timm), inflated as mmaction2's ``inflate_weights`` does: the
  patch kernel is repeated over time and divided by its length (a clip of identical frames
  then gives the 2-D features), each relative-position table is resized to the spatial window
  and tiled over the ``2 * Wt - 1`` temporal offsets, the final ImageNet ``norm`` becomes the
  last stage's ``norm{n-1}``, and PatchMerging weights go back to neighbour-major order.
"""
import re
from collections import OrderedDict
from typing import Sequence, Tuple

import torch

from ..layers import resize_rel_pos_table
from .loading import DERIVED_KEYS, CheckpointFamily, StateDict, fit_checkpoint
from .swin import convert_swin_state_dict, resize_bias_table, swin_arch_of, swin_model_arch

_PATCH_KEYS = ('patch_embed.proj.weight', 'patch_embed.projection.weight')
_BLOCK_RENAMES = (
    ('attn.w_msa.', 'attn.'),
    ('ffn.layers.0.0.', 'mlp.fc1.'),
    ('ffn.layers.1.', 'mlp.fc2.'),
)


def detect_swin3d_format(sd: StateDict) -> str:
    """'video' for a 3-D (Conv3d patch embedding) Swin, 'image' for a 2-D one."""
    for key in _PATCH_KEYS:
        if key in sd:
            ndim = sd[key].dim()
            if ndim == 5:
                return 'video'
            if ndim == 4:
                return 'image'
            raise ValueError(f'{key} has {ndim} dims; expected a 4-D (image) or 5-D (video) '
                             'kernel')
    sample = sorted(sd)[:6]
    raise ValueError(f'unrecognised Swin checkpoint: no patch embedding '
                     f'({" or ".join(_PATCH_KEYS)}), got e.g. {sample}')


def microsoft_order_from_unfold(t: torch.Tensor) -> torch.Tensor:
    """Reorder the 4C merged-channel axis (last) from ``nn.Unfold``'s channel-major
    ``[c, dy, dx]`` to the neighbour-major ``[dx, dy, c]`` of Microsoft/mmaction2."""
    c4 = t.shape[-1]
    lead = t.shape[:-1]
    n = len(lead)
    t = t.reshape(*lead, c4 // 4, 2, 2)  # [c, dy, dx]
    return t.permute(*range(n), n + 2, n + 1, n).reshape(*lead, c4)


def _square_window(rows: int, key: str) -> Tuple[int, int]:
    side = int(round(rows**0.5))
    if side * side != rows or side % 2 == 0:
        raise ValueError(f'{key}: {rows} rows is not a square (2w-1)^2 table')
    return ((side + 1) // 2, ) * 2


def inflate_swin2d_state_dict(sd: StateDict, temporal_patch: int, window: Sequence[int],
                              num_stages: int) -> StateDict:
    """A 2-D Swin state dict (any supported layout) -> video Swin layout and shapes.

    ``temporal_patch``: the model's ``patch_size[0]``; ``window``: its ``(Wt, Wh, Ww)``;
    ``num_stages``: its number of stages (the ImageNet ``norm`` maps to ``norm{n-1}``).
    Keys without a 3-D counterpart are kept: the classification head for the loader to report
    unused, an absolute position embedding for the family to refuse (the video Swin has none).
    """
    converted, _ = convert_swin_state_dict(sd)  # our 2-D layout (mmdet names, Unfold order)
    wt, wh, ww = window
    out = OrderedDict()
    for key, value in converted.items():
        if key.endswith(DERIVED_KEYS):
            continue
        if key in ('patch_embed.projection.weight', 'patch_embed.projection.bias'):
            if value.dim() == 4:
                # Repeating over pt frames and dividing by pt keeps the response to a static
                # clip equal to the 2-D response to one frame.
                value = value.unsqueeze(2).repeat(1, 1, temporal_patch, 1, 1) / temporal_patch
            out[key.replace('.projection.', '.proj.')] = value
            continue
        if key in ('norm.weight', 'norm.bias'):
            out[f'norm{num_stages - 1}.{key.split(".")[1]}'] = value
            continue
        m = re.match(r'stages\.(\d+)\.(.*)', key)
        if m is None:
            out[key] = value
            continue
        rest = m.group(2)
        if rest.startswith(('downsample.reduction.', 'downsample.norm.')):
            value = microsoft_order_from_unfold(value)
        for old, new in _BLOCK_RENAMES:
            rest = rest.replace(old, new)
        if rest.endswith('relative_position_bias_table'):
            src = _square_window(value.shape[0], key)
            value = resize_rel_pos_table(value, src, (wh, ww))
            # Rows are ordered temporal offset first, so the 3-D table is the 2-D one stacked
            # once per temporal offset: the bias ignores time, as for a static clip.
            value = value.repeat(2 * wt - 1, 1)
        out[f'layers.{m.group(1)}.{rest}'] = value
    return out


def _source_window_3d(rows: int, window: Sequence[int], key: str) -> Tuple[int, int, int]:
    """The window a 3-D table of ``rows`` rows was trained with, assuming it differs from
    ``window`` either in time only or (square) in space only."""
    wt, wh, ww = window
    spatial = (2 * wh - 1) * (2 * ww - 1)
    if rows % spatial == 0 and (rows // spatial) % 2 == 1:
        return ((rows // spatial + 1) // 2, wh, ww)
    if rows % (2 * wt - 1) == 0:
        try:
            return (wt, ) + _square_window(rows // (2 * wt - 1), key)
        except ValueError:
            pass
    raise ValueError(f'{key}: cannot tell the window of a {rows}-row table (model window '
                     f'{tuple(window)}); only a temporal or a square spatial change is resized')


def swin3d_arch_of(sd: StateDict) -> dict:
    """:func:`~.swin.swin_arch_of` of a video Swin state dict (inflated, if it was an image
    one)."""
    return swin_arch_of(sd, stage_key='layers', embed_key='patch_embed.proj.weight')


def _detect(sd: StateDict) -> Tuple[StateDict, str]:
    """Video files are our layout already, but for the original Video-Swin release's (and
    mmaction2 0.x's) final ``norm``: the norm after the last stage, mmaction2 1.x's and our
    ``norm{last}`` (as mmaction2's own 2-D inflation renames it)."""
    fmt = detect_swin3d_format(sd)
    stages = [int(m.group(1)) for k in sd for m in [re.match(r'layers\.(\d+)\.', k)] if m]
    if fmt == 'video' and stages and any(k.startswith('norm.') for k in sd):
        last = f'norm{max(stages)}.'
        if not any(k.startswith(last) for k in sd):
            sd = OrderedDict((last + k[len('norm.'):] if k.startswith('norm.') else k, v)
                             for k, v in sd.items())
    return sd, fmt


def _inflate_images(sd: StateDict, fmt: str, model) -> StateDict:
    """Image (2-D) files inflated to the model's temporal patch, window and depth."""
    if fmt != 'image':
        return sd
    return inflate_swin2d_state_dict(sd, model.patch_size[0], model.window_size,
                                     model.num_layers)


def _resize_table_3d(key: str, value: torch.Tensor, own: torch.Tensor, model) -> torch.Tensor:
    return resize_bias_table(key, value, own, model, lambda rows, name: _source_window_3d(
        rows, model.window_size, name))


SWIN3D_CHECKPOINTS = CheckpointFamily(
    'Swin', _detect, swin3d_arch_of, swin_model_arch, transform=_inflate_images,
    resize=((r'relative_position_bias_table$', _resize_table_3d), ),
    # Per-stage norms of a 2-D mmdet checkpoint do not fit out_after_downsample=True (its
    # outputs have twice the channels): left initialised, reported missing.
    drop_mismatched=r'norm\d+\.(weight|bias)',
    unrepresentable=((r'\.attn\.qkv\.bias$', 'q/k/v biases', 'qkv_bias=True'),
                     (r'^absolute_pos_embed$', "an image Swin's absolute position embedding",
                      'an image Swin without one: the video Swin has none')))


def convert_swin3d_state_dict(sd: StateDict, model) -> StateDict:
    """Any supported Swin state dict -> ``model``'s (a ``SwinTransformer3D``) keys and sizes:
    video vs image detected, images inflated, the architecture checked, tables resized
    (:data:`SWIN3D_CHECKPOINTS` run by :func:`~.loading.fit_checkpoint`)."""
    return fit_checkpoint(SWIN3D_CHECKPOINTS, sd, model)
