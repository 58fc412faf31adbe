"""Swin V2 checkpoint formats -> mmvitswin's layout: the ``SWINV2_CHECKPOINTS`` family.

Formats (detected from the keys, no flag needed):

- ``mmvitswin``: ours (``stages.{s}.blocks.{b}.attn.w_msa.*``, ``stages.{s}.downsample`` at the
  end of stage s, merged channels in ``nn.Unfold`` order);
- ``mmpretrain``: mmpretrain's ``SwinTransformerV2``: our names, but each downsample at the
  **start** of stage s + 1 (``stages.{s+1}.downsample``);
- ``microsoft``: the official release (``layers.{s}.blocks.{b}.attn.{qkv,q_bias,v_bias,
  logit_scale,cpb_mlp}``, ``mlp.fc1/fc2``, ``patch_embed.proj``, downsample at the end of stage
  s, merged channels neighbour-major, final ``norm`` and ``head``);
- ``timm``: timm's ``swinv2_*`` (.pth or .safetensors): Microsoft's names, each downsample at
  the start of stage s + 1 (a ``k_bias`` buffer, if saved, must be zero);
- ``hf``: HuggingFace ``Swinv2Model`` / ``Swinv2Backbone`` (``embeddings.*``,
  ``encoder.layers.*``, separate ``query``/``key``/``value``), with or without the ``swinv2.``
  prefix of ``Swinv2ForImageClassification`` / ``Swinv2ForMaskedImageModeling``.

Derived buffers (``relative_coords_table``, ``relative_position_index``) are never loaded; the
coordinate tables Microsoft's and mmpretrain's files carry are *read*, though: they reveal the
window each stage's position-bias MLP was trained at, and a model that normalises its
coordinates to another window (``pretrained_window_sizes`` not set for a window transfer) is
refused, naming the stage and the setting that fits. A HuggingFace ``config.json`` is checked
the same way, and so is a timm hub snapshot's (the model name it gives, e.g.
``swinv2_base_window12to16_192to256``, states the windows). Weights with neither (timm's and
HF's files alone) do not say which window they were trained at: ``pretrained_window_sizes`` is
then the user's to set. Final norms, heads, poolers and mask tokens are left under their own
names (the loader reports them unused).
"""
import re
from collections import OrderedDict
from typing import Dict, Optional, Tuple

import torch

from ..layers import pretrained_window_of
from .loading import CheckpointFamily, StateDict, fit_checkpoint
from .swin import (PATCH_NORM_UNREPRESENTABLE, hf_to_microsoft, swin_arch_of, swin_model_arch,
                   unfold_order_from_microsoft)

_MICROSOFT_BLOCK = (('attn.', 'attn.w_msa.'), ('mlp.fc1.', 'ffn.layers.0.0.'),
                    ('mlp.fc2.', 'ffn.layers.1.'))
# HF attention keys only V2 has -> Microsoft's names; the rest of HF's layout is V1's
_HF_V2_ATTN = re.compile(r'encoder\.layers\.(\d+)\.blocks\.(\d+)\.attention\.self\.'
                         r'(query\.bias|key\.bias|value\.bias|logit_scale|'
                         r'continuous_position_bias_mlp\.)(.*)$')
_HF_V2_NAMES = {'query.bias': 'q_bias', 'value.bias': 'v_bias', 'logit_scale': 'logit_scale',
                'continuous_position_bias_mlp.': 'cpb_mlp.'}


def detect_swinv2_format(sd: StateDict) -> str:
    """'mmvitswin', 'mmpretrain', 'microsoft', 'timm' or 'hf'; ValueError for anything else,
    a Swin V1 file included."""
    keys = set(sd)
    if not any(k.endswith('logit_scale') for k in keys):
        if any('relative_position_bias_table' in k for k in keys):
            hint = (' (it has relative_position_bias_table: a Swin V1 checkpoint, load it into '
                    'SwinTransformer)')
        elif any('.attn.meta_mlp.' in k or k.endswith('.attn.tau') for k in keys):
            hint = (" (it has attn.meta_mlp and attn.tau: timm's swinv2_cr_* models, another "
                    'Swin V2 implementation with its own position-bias network and temperature, '
                    'which this model does not implement)')
        else:
            hint = ''
        raise ValueError(f'not a Swin V2 checkpoint: no attention logit_scale{hint}; got e.g. '
                         f'{sorted(keys)[:4]}')
    if any(k.startswith(('embeddings.', 'encoder.layers.', 'swinv2.')) for k in keys):
        return 'hf'
    stage = 'stages' if any(k.startswith('stages.') for k in keys) else 'layers'
    if (stage == 'layers' and not any(k.startswith('layers.') and '.blocks.' in k for k in keys)
            or stage == 'stages' and not any('.attn.w_msa.' in k for k in keys)):
        raise ValueError(f'unrecognised Swin V2 checkpoint format; expected mmvitswin, '
                         f'mmpretrain, Microsoft, timm or HuggingFace keys, got e.g. '
                         f'{sorted(keys)[:4]}')
    merged = {int(m.group(1)) for k in keys
              for m in [re.match(rf'{stage}\.(\d+)\.downsample\.reduction\.', k)] if m}
    at_end = not merged or 0 in merged  # a merging at stage 0 ends it; else it starts stage 1
    if stage == 'stages':
        return 'mmvitswin' if at_end else 'mmpretrain'
    return 'microsoft' if at_end else 'timm'


def _hf_to_microsoft(sd: StateDict) -> StateDict:
    """HuggingFace Swin V2 keys -> Microsoft's: the V2-only attention keys here (``query.bias``
    / ``value.bias`` -> ``q_bias`` / ``v_bias``, the logit scale, the bias MLP), the rest by
    the V1 family's :func:`~.swin.hf_to_microsoft` (same names as HF's Swin). A key bias,
    which Swin V2 does not have, is refused unless zero."""
    rest, v2 = OrderedDict(), OrderedDict()
    for key, value in sd.items():
        key = key[len('swinv2.'):] if key.startswith('swinv2.') else key
        m = _HF_V2_ATTN.match(key)
        if m is None:
            rest[key] = value
        elif m.group(3) == 'key.bias':
            if bool(value.ne(0).any()):
                raise ValueError(f'{key} is not zero: Swin V2 has no key bias')
        else:
            name = _HF_V2_NAMES[m.group(3)] + m.group(4)
            v2[f'layers.{m.group(1)}.blocks.{m.group(2)}.attn.{name}'] = value
    return OrderedDict(list(hf_to_microsoft(rest).items()) + list(v2.items()))


def _microsoft_to_ours(key: str, value: torch.Tensor, fmt: str):
    """One Microsoft/timm/mmpretrain key -> ``(our key, tensor)``, or None to drop it."""
    stage_key = 'stages' if fmt == 'mmpretrain' else 'layers'
    m = re.match(rf'{stage_key}\.(\d+)\.(.*)', key)
    if m is None:
        return key.replace('patch_embed.proj.', 'patch_embed.projection.'), value
    stage, rest = int(m.group(1)), m.group(2)
    if rest.startswith('downsample.'):
        # timm and mmpretrain merge at the start of the next stage, we at the end of this one
        stage -= fmt in ('mmpretrain', 'timm')
        if fmt != 'mmpretrain' and rest == 'downsample.reduction.weight':
            value = unfold_order_from_microsoft(value)
        return f'stages.{stage}.{rest}', value
    if fmt == 'mmpretrain':
        return key, value
    if rest.endswith('attn.k_bias'):  # timm's zero buffer
        if bool(value.ne(0).any()):
            raise ValueError(f'{key} is not zero: Swin V2 has no key bias')
        return None
    for old, new in _MICROSOFT_BLOCK:
        rest = rest.replace(old, new)
    return f'stages.{stage}.{rest}', value


def convert_swinv2_state_dict(sd: StateDict) -> Tuple[StateDict, str]:
    """Rename any supported Swin V2 layout to ours. Returns ``(state_dict, detected_format)``.
    Pure key/layout conversion (the derived coordinate tables are renamed too, so that the
    family's check can read them; the engine drops them afterwards)."""
    fmt = detect_swinv2_format(sd)
    if fmt == 'mmvitswin':
        return OrderedDict(sd), fmt
    layout = fmt
    if fmt == 'hf':  # HF's merging order and stage layout are Microsoft's
        sd, layout = _hf_to_microsoft(sd), 'microsoft'
    renamed = (_microsoft_to_ours(key, value, layout) for key, value in sd.items())
    return OrderedDict(item for item in renamed if item is not None), fmt


# ------------------------------------------------------------------------------ arch checks
def _stage_blocks(sd: StateDict, suffix: str) -> Dict[int, torch.Tensor]:
    """``{stage: tensor}`` of the first block of each stage that has ``attn.w_msa.<suffix>``."""
    found: Dict[int, Tuple[int, torch.Tensor]] = {}
    for key, value in sd.items():
        m = re.match(rf'stages\.(\d+)\.blocks\.(\d+)\.attn\.w_msa\.{suffix}$', key)
        if m and (int(m.group(1)) not in found or int(m.group(2)) < found[int(m.group(1))][0]):
            found[int(m.group(1))] = (int(m.group(2)), value)
    return {s: v for s, (_, v) in found.items()}


def swinv2_arch_of(sd: StateDict) -> Dict[str, object]:
    """embed_dims, blocks per stage and heads per stage of a converted state dict (None where
    unknown); the position-bias window is read from the coordinate tables by
    :func:`check_position_bias_windows` instead (the engine drops them before the probe)."""
    arch = swin_arch_of(sd)
    scales = _stage_blocks(sd, 'logit_scale')
    depths = arch['depths']
    heads = None
    if depths is not None and all(s in scales for s, d in enumerate(depths) if d):
        heads = tuple(int(scales[s].shape[0]) if s in scales else None
                      for s in range(len(depths)))
    return dict(arch, num_heads=heads, pretrained_window_sizes=None)


def _square(p: Tuple[int, int]):
    return p[0] if p[0] == p[1] else p


def model_position_bias_windows(model) -> tuple:
    """The window each stage of ``model`` normalises its bias coordinates to."""
    return tuple(_square(tuple(p if p > 0 else w for w, p in zip(window, pretrained)))
                 for window, pretrained in zip(model.window_sizes,
                                               model.pretrained_window_sizes))


def swinv2_model_arch(model) -> Dict[str, object]:
    return dict(swin_model_arch(model), num_heads=tuple(model.num_heads),
                pretrained_window_sizes=model_position_bias_windows(model))


def check_position_bias_windows(sd: StateDict, fmt: str, model) -> StateDict:
    """ValueError when a saved ``relative_coords_table`` was normalised to another window than
    the model's stage normalises to (the file was trained at window ``p``: run it at any
    window with ``pretrained_window_sizes[s] = p``)."""
    tables = _stage_blocks(sd, 'relative_coords_table')
    want = model_position_bias_windows(model)
    for stage, table in sorted(tables.items()):
        if stage >= len(want) or table.shape[-1] != 2:
            continue
        have = pretrained_window_of(table)
        if 0 in have:  # a window of 1 along an axis: no offsets to read
            continue
        if _square(have) != want[stage]:
            raise ValueError(
                f'checkpoint stage {stage} has position-bias coordinates normalised to window '
                f'{_square(have)} (relative_coords_table), but this model normalises them to '
                f'window {want[stage]}: set pretrained_window_sizes[{stage}]={_square(have)} '
                f'(window_size may differ)')
    return sd


def _pair(value) -> Tuple[int, int]:
    return tuple(int(v) for v in value) if isinstance(value, (list, tuple)) else \
        (int(value), int(value))


def _bias_windows(window, image, patch, pretrained, stages: int) -> tuple:
    """The window each stage normalises its bias coordinates to, as the classifiers build
    it (Microsoft's, HF's, timm's): the stage's ``pretrained`` entry where > 0, else its window
    shrunk to the stage's map at ``image`` px."""
    window, image, patch = _pair(window), _pair(image), _pair(patch)
    pretrained = tuple(pretrained) if pretrained else (0, ) * stages
    windows = []
    for i, p in enumerate(pretrained):
        grid = [s // q // 2**i for s, q in zip(image, patch)]
        windows.append(_square(tuple(p if p > 0 else min(g, w)
                                     for g, w in zip(grid, window))))
    return tuple(windows)


# timm's registered Swin V2 names: window<W>[to<W'>]_<I>[to<I'>] (the file was trained at
# window W on I px; a 'to' model runs at W' and I', its position-bias MLP still normalised to
# what it had at W and I px); timm < 0.9 appended _22k / _22kft1k
_TIMM_V2_NAME = re.compile(r'swinv2_(?:tiny|small|base|large)_window(\d+)(?:to(\d+))?_'
                           r'(\d+)(?:to(\d+))?(?:_22k|_22kft1k)?')


def _timm_config_windows(config: dict) -> Optional[tuple]:
    """The bias windows a timm hub ``config.json`` states (its ``architecture``, with any
    ``model_args`` over the registered values), None where it names no Swin V2 of timm's."""
    m = _TIMM_V2_NAME.fullmatch(str(config.get('architecture', '')).split('.')[0])
    if m is None:
        return None
    trained_window, window, trained_image, image = m.groups()
    pretrained = 0
    if window is not None:  # 'to': normalised to the trained window at the trained size
        pretrained = _bias_windows(trained_window, trained_image, 4, None, 4)  # (square)
    args = config.get('model_args') or {}
    window = args.get('window_size', window or trained_window)
    image = args.get('img_size', image or trained_image)
    pretrained = args.get('pretrained_window_sizes', pretrained)
    depths = args.get('depths', (2, 2, 2, 2))  # (only their number matters here)
    if isinstance(pretrained, int):
        pretrained = (pretrained, ) * len(depths)
    return _bias_windows(window, image, args.get('patch_size', 4), pretrained, len(depths))


def swinv2_config_arch(config: dict) -> Dict[str, object]:
    """The probe's fields from a ``config.json``: a HuggingFace ``Swinv2Config``'s, or the
    bias windows of a timm hub snapshot's (its ``architecture`` name and ``model_args``); {}
    for another model. The position-bias window of a stage is its ``pretrained_window_sizes``
    entry, else its window as the classifier builds it: shrunk to the stage's map at its image
    size."""
    if config.get('model_type') != 'swinv2':
        windows = _timm_config_windows(config)
        return {} if windows is None else dict(pretrained_window_sizes=windows)
    depths = tuple(config['depths'])
    windows = _bias_windows(config['window_size'], config.get('image_size', 224),
                            config.get('patch_size', 4), config.get('pretrained_window_sizes'),
                            len(depths))
    return dict(embed_dims=int(config['embed_dim']), depths=depths,
                num_heads=tuple(config['num_heads']), pretrained_window_sizes=windows)


SWINV2_CHECKPOINTS = CheckpointFamily(
    'SwinV2', convert_swinv2_state_dict, swinv2_arch_of, swinv2_model_arch,
    transform=check_position_bias_windows, config_probe=swinv2_config_arch,
    unrepresentable=((r'^absolute_pos_embed$', 'an absolute position embedding',
                      'a Swin V2 without one: no release has it'),
                     PATCH_NORM_UNREPRESENTABLE,
                     (r'\.attn\.w_msa\.[qv]_bias$', 'q/v biases', 'qkv_bias=True')))


def adapt_swinv2_state_dict(sd: StateDict, model, config: Optional[dict] = None) -> StateDict:
    """Fit a state dict (any supported Swin V2 layout) to ``model``: the architecture checks,
    then our keys (:data:`SWINV2_CHECKPOINTS` run by :func:`~.loading.fit_checkpoint`)."""
    return fit_checkpoint(SWINV2_CHECKPOINTS, sd, model, config=config)
