"""Swin checkpoint formats -> mmvitswin/mmdet layout: the ``SWIN_CHECKPOINTS`` family.

Formats (detected from the keys, no flag needed):

- ``mmdet``: mmdet/mmseg ``SwinTransformer`` (``stages.*``, ``patch_embed.projection``,
  ``attn.w_msa.*``, ``ffn.layers.*``); PatchMerging weights in ``nn.Unfold`` order. Our own.
- ``microsoft``: the official release (``layers.*``, ``attn.qkv``, ``mlp.fc1``,
  ``patch_embed.proj``, ``attn_mask`` buffers, ``head``), also timm < 0.9; downsample at the
  **end** of stage s, merged channels neighbour-major.
- ``timm``: timm >= 0.9, the same names but each downsample at the **start** of stage s+1.
- ``hf``: HuggingFace ``transformers`` ``SwinModel``, ``SwinBackbone`` and
  ``SwinForImageClassification`` (with or without the ``swin.`` prefix), hub names
  (``attention.self.query``, ``attention.output.dense``, ``intermediate.dense``,
  ``output.dense``) and transformers 5 names (``attention.q_proj``/``k_proj``/``v_proj``/
  ``o_proj``, ``attention.relative_position_bias.*``, ``mlp.fc1``/``fc2``). q/k/v are joined
  into ``qkv``; ``SwinBackbone``'s ``hidden_states_norms.stage{i+1}`` become ``norm{i}``;
  its patch merging concatenates ``x[0::2, 0::2], x[1::2, 0::2], x[0::2, 1::2],
  x[1::2, 1::2]`` exactly as Microsoft's, so the same reorder to ``nn.Unfold`` order applies.
  ``SwinModel``'s final ``layernorm`` is left unused, as mmdet leaves Microsoft's ``norm``
  (``SwinBackbone`` carries it too but applies ``hidden_states_norms.stage4`` instead: there
  it is dropped).
  ``relative_position_index`` is derived, never read. A ``config.json`` beside the weights
  is checked against the model (:func:`swin_config_arch`).
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


_HF_EMBED = 'embeddings.patch_embeddings.projection.weight'
# (HF block-relative name, Microsoft name); hub names first, then transformers 5's. Applied
# to the part after ``blocks.{b}.``, first match wins ('attention.output.dense' before
# 'output.dense').
_HF_BLOCK_RENAMES = (
    ('layernorm_before.', 'norm1.'),
    ('layernorm_after.', 'norm2.'),
    ('attention.self.relative_position_bias_table', 'attn.relative_position_bias_table'),
    ('attention.relative_position_bias.relative_position_bias_table',
     'attn.relative_position_bias_table'),
    ('attention.output.dense.', 'attn.proj.'),
    ('attention.o_proj.', 'attn.proj.'),
    ('intermediate.dense.', 'mlp.fc1.'),
    ('output.dense.', 'mlp.fc2.'),
    ('mlp.fc1.', 'mlp.fc1.'),
    ('mlp.fc2.', 'mlp.fc2.'),
)
_HF_QKV = (('attention.self.query.', 'attention.self.key.', 'attention.self.value.'),
           ('attention.q_proj.', 'attention.k_proj.', 'attention.v_proj.'))


def _strip_hf_prefix(sd: StateDict) -> StateDict:
    """``swin.`` (SwinForImageClassification, transformers 5's SwinBackbone) removed."""
    return OrderedDict((k[len('swin.'):] if k.startswith('swin.') else k, v)
                       for k, v in sd.items())


def hf_to_microsoft(sd: StateDict) -> StateDict:
    """HuggingFace Swin keys -> Microsoft's (``layers.{s}.blocks.{b}.attn.qkv`` & co, downsample
    at the end of its stage, merged channels in Microsoft's neighbour order: HF's too).
    ``hidden_states_norms.stage{i+1}`` -> ``norm{i}`` (our names already); everything else
    this layout does not know (``classifier``, ``SwinModel``'s ``layernorm``, ``mask_token``,
    ``hidden_states_norms.stem``) keeps its name and is reported unused; ``SwinBackbone``'s
    ``layernorm`` (never applied there) is dropped."""
    sd = _strip_hf_prefix(sd)
    # SwinBackbone carries SwinModel's final layernorm but never applies it (its stage norms
    # replace it): not a leftover worth reporting
    backbone = any(k.startswith('hidden_states_norms.') for k in sd)
    out: StateDict = OrderedDict()
    blocks: Dict[str, Dict[str, torch.Tensor]] = OrderedDict()
    for key, value in sd.items():
        if key.endswith(DERIVED_KEYS) or (backbone and key.startswith('layernorm.')):
            continue
        m = re.match(r'encoder\.layers\.(\d+)\.(blocks\.\d+)\.(.*)', key)
        if m is not None:
            head, rest = f'layers.{m.group(1)}.{m.group(2)}', m.group(3)
            qkv = next(((i, name) for names in _HF_QKV for i, name in enumerate(names)
                        if rest.startswith(name)), None)
            if qkv is not None:  # joined below, in q, k, v order
                i, name = qkv
                blocks.setdefault(f'{head}.attn.qkv.{rest[len(name):]}', {})[i] = value
                continue
            for old, new in _HF_BLOCK_RENAMES:
                if rest.startswith(old):
                    rest = new + rest[len(old):]
                    break
            out[f'{head}.{rest}'] = value
            continue
        m = re.match(r'encoder\.layers\.(\d+)\.(downsample\..*)', key)
        if m is not None:
            out[f'layers.{m.group(1)}.{m.group(2)}'] = value
            continue
        m = re.match(r'hidden_states_norms\.stage(\d+)\.(.*)', key)
        if m is not None and int(m.group(1)) >= 1:
            out[f'norm{int(m.group(1)) - 1}.{m.group(2)}'] = value
            continue
        renamed = {'embeddings.patch_embeddings.projection.weight': 'patch_embed.proj.weight',
                   'embeddings.patch_embeddings.projection.bias': 'patch_embed.proj.bias',
                   'embeddings.norm.weight': 'patch_embed.norm.weight',
                   'embeddings.norm.bias': 'patch_embed.norm.bias',
                   'embeddings.position_embeddings': 'absolute_pos_embed'}.get(key, key)
        out[renamed] = value
    for key, parts in blocks.items():
        if sorted(parts) != [0, 1, 2]:
            have = ', '.join('qkv'[i] for i in sorted(parts))
            raise ValueError(f'{key}: the checkpoint has only the {have} projection(s) of '
                             f'this attention (a truncated or filtered state dict?)')
        out[key] = torch.cat([parts[0], parts[1], parts[2]], dim=0)
    return out


def is_swinv2_state_dict(sd: StateDict) -> bool:
    """Whether ``sd`` (any layout) is a Swin V2's: attention logit scales or a continuous
    position-bias MLP, which no Swin V1 has."""
    return any(k.endswith(('logit_scale', 'continuous_position_bias_mlp.0.weight',
                           'cpb_mlp.0.weight')) for k in sd)


def detect_swin_format(sd: StateDict) -> str:
    """Return 'mmdet', 'microsoft', 'timm' or 'hf'; ValueError for anything else (a Swin V2
    file included: its blocks would rename to V1's and load as nothing they were trained as)."""
    keys = set(sd)
    if is_swinv2_state_dict(sd):
        raise ValueError('a Swin V2 checkpoint (attention logit_scale, continuous position bias '
                         'MLP), which only SwinTransformerV2 loads: a Swin V1 (2-D, or the '
                         "video Swin's inflation) has no place for its blocks")
    if _HF_EMBED in keys or f'swin.{_HF_EMBED}' in keys or any(
            k.startswith(('encoder.layers.', 'swin.encoder.layers.')) for k in keys):
        return 'hf'
    if any(k.startswith('stages.') for k in keys) or 'patch_embed.projection.weight' in keys:
        return 'mmdet'
    if any(k.startswith('layers.') and '.blocks.' in k for k in keys):
        if 'layers.0.downsample.reduction.weight' in keys:
            return 'microsoft'
        if 'layers.1.downsample.reduction.weight' in keys:
            return 'timm'
        return 'microsoft'  # a single-stage model: the two layouts agree
    sample = sorted(keys)[:6]
    raise ValueError(f'unrecognised Swin checkpoint format; expected mmdet/mmseg, Microsoft, '
                     f'timm or HuggingFace keys, got e.g. {sample}')


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
    if fmt == 'hf':
        sd = hf_to_microsoft(sd)
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
    """embed_dims and blocks per stage of a Swin state dict (V1, V2 or video) whose blocks are
    named ``{stage_key}.{s}.blocks.{b}.*`` (``layers`` for the video Swin), and whether it has
    the patch embedding's norm: a file without one, in a model with one, would run a unit
    LayerNorm its weights were not trained with, and the other way round the norm's weights
    would go unused. None where unknown (no patch embedding: no say about its norm)."""
    depths: Dict[int, int] = {}
    for k in sd:
        m = re.match(rf'{stage_key}\.(\d+)\.blocks\.(\d+)\.', k)
        if m:
            s, b = int(m.group(1)), int(m.group(2))
            depths[s] = max(depths.get(s, 0), b + 1)
    w = sd.get(embed_key)
    norm = any(k.startswith('patch_embed.norm.') for k in sd)
    return dict(embed_dims=None if w is None else w.shape[0],
                depths=tuple(depths.get(s, 0) for s in range(max(depths) + 1)) if depths else None,
                patch_norm=norm if norm or w is not None else None)


def swin_model_arch(model) -> Dict[str, object]:
    """The probe's fields of a Swin model (V1, V2 or video)."""
    return dict(embed_dims=model.arch_settings['embed_dims'], depths=tuple(model.depths),
                patch_norm=model.patch_embed.norm is not None)


def swin2d_model_arch(model) -> Dict[str, object]:
    """The 2-D Swin's probe fields: :func:`swin_model_arch` plus those a HuggingFace
    ``config.json`` states (:func:`swin_config_arch`)."""
    block = next((b for stage in model.stages for b in stage.blocks), None)
    fc1 = None if block is None else block.ffn.layers[0][0].weight
    return dict(swin_model_arch(model), num_heads=tuple(model.num_heads),
                patch_size=model.patch_size, in_channels=model.in_channels,
                use_abs_pos_embed=model.use_abs_pos_embed,
                mlp_ratio=None if fc1 is None else fc1.shape[0] / fc1.shape[1],
                qkv_bias=None if block is None else block.attn.w_msa.qkv.bias is not None,
                layer_norm_eps=None if block is None else block.norm1.eps)


def swin_config_arch(config: dict) -> Dict[str, object]:
    """The architecture a HuggingFace ``SwinConfig`` (``config.json``, ``model_type`` 'swin')
    states, under :func:`swin2d_model_arch`'s field names; ``{}`` for another model type.
    The window is not compared: a table is resized to the model's window, as for any file."""
    if config.get('model_type', 'swin') != 'swin':
        return {}

    def tup(name):
        value = config.get(name)
        return tuple(value) if isinstance(value, (list, tuple)) else None

    return dict(embed_dims=config.get('embed_dim'), depths=tup('depths'),
                num_heads=tup('num_heads'), patch_size=config.get('patch_size'),
                in_channels=config.get('num_channels'),
                use_abs_pos_embed=config.get('use_absolute_embeddings'),
                mlp_ratio=config.get('mlp_ratio'), qkv_bias=config.get('qkv_bias'),
                layer_norm_eps=config.get('layer_norm_eps'))


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


# Keys of a file that a model built without the feature has no place for: refused, since
# dropping them would give wrong features (the stage norms of stages not returned are not
# here: those stages' outputs are simply not computed).
PATCH_NORM_UNREPRESENTABLE = (r'^patch_embed\.norm\.', 'a LayerNorm after the patch embedding',
                              'patch_norm=True')
SWIN_UNREPRESENTABLE = (
    (r'^absolute_pos_embed$', 'an absolute position embedding', 'use_abs_pos_embed=True'),
    PATCH_NORM_UNREPRESENTABLE,
    (r'\.attn\.w_msa\.qkv\.bias$', 'q/k/v biases', 'qkv_bias=True'),
)

SWIN_CHECKPOINTS = CheckpointFamily(
    'Swin', convert_swin_state_dict, swin_arch_of, swin2d_model_arch,
    resize=((r'relative_position_bias_table$', resize_bias_table),
            (r'^absolute_pos_embed$', _resize_abs_pos_embed)),
    config_probe=swin_config_arch, unrepresentable=SWIN_UNREPRESENTABLE)


def adapt_swin_state_dict(sd: StateDict, model) -> StateDict:
    """Fit a state dict (any supported Swin layout) to ``model``: the architecture check, the
    relative position tables (window change) and the absolute position embedding (pretrain
    size) resized (:data:`SWIN_CHECKPOINTS` run by :func:`~.loading.fit_checkpoint`)."""
    return fit_checkpoint(SWIN_CHECKPOINTS, sd, model)
