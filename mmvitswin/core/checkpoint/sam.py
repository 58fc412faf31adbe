"""SAM image-encoder checkpoints -> our ViT trunk: the ``SAM_CHECKPOINTS`` family.

Segment Anything's image encoder is a plain ViT (no CLS token, no final norm) with an absolute
position embedding stored as a ``(1, 64, 64, C)`` grid, ViTDet's windowed + global blocks
with decomposed relative positions, and a conv neck to 256 channels
(:class:`~mmvitswin.core.layers.SamNeck`). Formats (detected from the keys, no flag needed):

- ``meta``: Meta's released ``sam_vit_{b,l,h}_*.pth`` (a whole SAM: ``image_encoder.*`` plus
  ``prompt_encoder.*`` / ``mask_decoder.*``, of which only the image encoder is taken), or the
  encoder's own state dict (``blocks.N.mlp.lin1``, ``neck.0..3``).
- ``hf``: HuggingFace ``SamModel`` (``vision_encoder.*`` beside the prompt encoder, mask
  decoder and shared embedding) and ``SamVisionModel`` (``vision_encoder.*``), or a bare
  ``SamVisionEncoder`` (``layers.N.layer_norm1``, ``patch_embed.projection``,
  ``neck.conv1/layer_norm1/conv2/layer_norm2``).
- ``timm``: timm's ``samvit_{base,large,huge}_patch16`` (``blocks.N.mlp.fc1``, an NHWC
  ``pos_embed``, ``neck.0..3``; a ``head`` is left to the leftover report).

Conversion: keys are renamed to our trunk's (``blocks.N.{norm1,attn.qkv,attn.proj,
attn.rel_pos_h,attn.rel_pos_w,norm2,ffn.layers.*}``, ``neck.0..3``), the ``(1, H, W, C)`` grid
flattened to a prefix-free ``(1, H*W, C)`` embedding. Fitting: the position grid resized
bicubically without antialias, as ViTDet's ``get_abs_pos`` does (:func:`fit_sam_pos_embed`);
decomposed tables resized linearly, as SAM's own ``get_rel_pos`` does; the patch kernel as the
ViT family does. The neck is a head on the trunk: a model built without
``neck='sam'`` does not take it (its keys are dropped, like the prompt encoder's).

Architecture check (a mismatch is a named error, never wrong features): width, depth, heads
(from the relative-position tables' head dim), the window size and which blocks are global
(from the tables' lengths), relative positions on/off; with a ``config.json`` (HF) also what
it says of these.
"""
import re
from collections import OrderedDict
from typing import Dict, Optional, Tuple

from .loading import CheckpointFamily, StateDict
from .vit import (_fit_pos_embed, _prefix_tokens, _resize_rel_pos, fit_vit_embeddings,
                  vit_arch_of, vit_model_arch)

__all__ = ['detect_sam_format', 'is_sam_checkpoint', 'convert_sam_state_dict',
           'sam_arch_of', 'sam_model_arch', 'sam_config_arch', 'SAM_CHECKPOINTS']

_WHOLE_MODEL_PREFIXES = {'meta': 'image_encoder.', 'hf': 'vision_encoder.'}
_HF_RENAMES = (
    ('patch_embed.projection.', 'patch_embed.proj.'),
    ('neck.conv1.', 'neck.0.'),
    ('neck.layer_norm1.', 'neck.1.'),
    ('neck.conv2.', 'neck.2.'),
    ('neck.layer_norm2.', 'neck.3.'),
)
_FFN = (('mlp.lin1.', 'ffn.layers.0.0.'), ('mlp.lin2.', 'ffn.layers.1.'),
        ('mlp.fc1.', 'ffn.layers.0.0.'), ('mlp.fc2.', 'ffn.layers.1.'))
_HF_BLOCK = (('layer_norm1.', 'norm1.'), ('layer_norm2.', 'norm2.')) + _FFN
_SAM_MODEL_TYPES = ('sam', 'sam_vision_model')


# ------------------------------------------------------------------------ pure functions
def _nhwc_pos_embed(sd: StateDict) -> bool:
    """Whether ``pos_embed`` is SAM's ``(1, H, W, C)`` grid (C = the patch embedding's width)."""
    pos = sd.get('pos_embed')
    kernel = sd.get('patch_embed.proj.weight')
    return (pos is not None and pos.dim() == 4 and kernel is not None
            and pos.shape[-1] == kernel.shape[0])


def detect_sam_format(sd: StateDict) -> str:
    """Return 'meta', 'hf' or 'timm' for a SAM image-encoder state dict (or a whole SAM);
    ValueError for anything else."""
    keys = set(sd)
    if any(k.startswith('image_encoder.blocks.') for k in keys):
        return 'meta'
    if any(k.startswith('vision_encoder.layers.') for k in keys):
        return 'hf'
    if any(re.match(r'blocks\.\d+\.mlp\.lin1\.', k) for k in keys):
        return 'meta'
    if any(re.match(r'layers\.\d+\.layer_norm1\.', k) for k in keys) and \
            'patch_embed.projection.weight' in keys:
        return 'hf'
    if any(re.match(r'blocks\.\d+\.mlp\.fc1\.', k) for k in keys) and (
            _nhwc_pos_embed(sd) or 'neck.0.weight' in keys):
        return 'timm'
    sample = sorted(keys)[:6]
    raise ValueError(f'unrecognised SAM checkpoint format; expected Meta segment_anything '
                     f'(image_encoder.*), HF SamModel/SamVisionModel (vision_encoder.*) or timm '
                     f'samvit keys, got e.g. {sample}')


def is_sam_checkpoint(sd: StateDict, config: Optional[dict] = None) -> bool:
    """Whether a state dict (or its ``config.json``) is a SAM image encoder's."""
    if config is not None and config.get('model_type') in _SAM_MODEL_TYPES:
        return True
    try:
        detect_sam_format(sd)
    except ValueError:
        return False
    return True


def _rename_block(key: str, renames) -> str:
    for old, new in renames:
        if key.startswith(old):
            return new + key[len(old):]
    return key


def convert_sam_state_dict(sd: StateDict) -> Tuple[StateDict, str]:
    """Rename any supported SAM layout to ours. Returns ``(state_dict, detected_format)``.

    The image encoder only (prompt encoder, mask decoder and HF's shared embedding are not
    ours); the NHWC position grid flattened to ``(1, H*W, C)``. No resizing here."""
    fmt = detect_sam_format(sd)
    prefix = _WHOLE_MODEL_PREFIXES.get(fmt)
    if prefix and any(k.startswith(prefix) for k in sd):
        sd = OrderedDict((k[len(prefix):], v) for k, v in sd.items() if k.startswith(prefix))
    out = OrderedDict()
    for key, value in sd.items():
        if fmt == 'hf':
            for old, new in _HF_RENAMES:
                if key.startswith(old):
                    key = new + key[len(old):]
                    break
            m = re.match(r'layers\.(\d+)\.(.*)', key)
            if m:
                key = f'blocks.{m.group(1)}.' + _rename_block(m.group(2), _HF_BLOCK)
        else:  # Meta's and timm's blocks: only the MLP is named differently
            m = re.match(r'blocks\.(\d+)\.(.*)', key)
            if m:
                key = f'blocks.{m.group(1)}.' + _rename_block(m.group(2), _FFN)
        out[key] = value
    pos = out.get('pos_embed')
    if pos is not None and pos.dim() == 4:
        if not _nhwc_pos_embed(out):
            raise ValueError(f'pos_embed {tuple(pos.shape)} is not a (1, H, W, C) grid of the '
                             f'patch embedding\'s width')
        out['pos_embed'] = pos.reshape(1, -1, pos.shape[-1])  # row-major grid, no prefix
    return out, fmt


def _block_table_rows(sd: StateDict) -> Dict[int, int]:
    rows = {}
    for key, value in sd.items():
        m = re.match(r'blocks\.(\d+)\.attn\.rel_pos_h$', key)
        if m:
            rows[int(m.group(1))] = value.shape[0]
    return rows


def sam_arch_of(sd: StateDict) -> Dict[str, object]:
    """The architecture a converted SAM state dict reveals (None where the keys do not say).

    Heads: ``embed_dims / head_dim`` of the relative-position tables. Window layout: a
    block's table has ``2 * grid - 1`` rows when it is global (``grid``: the position
    embedding's side) and ``2 * window - 1`` when windowed."""
    # the ViT trunk's fields first (width, depth, LayerScale, registers, FFN, biases, the parts
    # around the blocks: the file is our ViT layout by now), then what only SAM's keys tell
    arch = dict(vit_arch_of(sd), num_heads=None, use_rel_pos=None, window_size=None,
                global_attn_indexes=None)
    embed_dims = arch['embed_dims']
    if arch['num_layers'] is None:  # (no blocks)
        return arch
    rows = _block_table_rows(sd)
    arch['use_rel_pos'] = bool(rows)
    if not rows:
        return arch
    head_dim = sd[f'blocks.{min(rows)}.attn.rel_pos_h'].shape[1]
    if embed_dims is not None and head_dim and embed_dims % head_dim == 0:
        arch['num_heads'] = embed_dims // head_dim
    pos = sd.get('pos_embed')
    grid = None
    if pos is not None and pos.dim() == 3:
        side = int(round(pos.shape[1]**0.5))
        grid = side if side * side == pos.shape[1] else None
    if grid is None:  # global tables are the longest ones, when lengths differ at all
        longest = max(rows.values())
        global_rows = longest if longest != min(rows.values()) else None
    else:
        global_rows = 2 * grid - 1
    global_idx = tuple(sorted(i for i, r in rows.items() if r == global_rows))
    windowed = sorted({r for i, r in rows.items() if r != global_rows})
    if len(windowed) == 1:
        arch['window_size'] = (windowed[0] + 1) // 2
    if global_rows is not None and len(rows) == arch['num_layers']:
        arch['global_attn_indexes'] = global_idx
        if not windowed:
            arch['window_size'] = 0
    return arch


def sam_model_arch(model) -> Dict[str, object]:
    """The probe's fields of a ViT trunk (or a builder on one): the ViT family's, and its
    window layout."""
    window = model.window_size
    return dict(vit_model_arch(model), use_rel_pos=bool(model.use_rel_pos),
                window_size=window,
                global_attn_indexes=tuple(sorted(model.global_attn_indexes)) if window else
                tuple(range(model.num_layers)))


def sam_config_arch(config: dict) -> Dict[str, object]:
    """What a HuggingFace ``SamConfig`` / ``SamVisionConfig`` says of the probe's fields
    (``{}`` for a config of another model type)."""
    if config.get('model_type') == 'sam':
        config = config.get('vision_config') or {}
    elif config.get('model_type') != 'sam_vision_model':
        return {}
    layers = config.get('num_hidden_layers')
    window = config.get('window_size')
    global_idx = config.get('global_attn_indexes')
    if window == 0 and layers is not None:
        global_idx = range(layers)
    return dict(embed_dims=config.get('hidden_size'), num_layers=layers,
                num_heads=config.get('num_attention_heads'),
                use_rel_pos=config.get('use_rel_pos'), window_size=window,
                global_attn_indexes=None if global_idx is None else tuple(sorted(global_idx)))


def fit_sam_pos_embed(sd: StateDict, fmt: str, model) -> StateDict:
    """The family's ``transform``: the file's prefix-free grid resized to the model's
    pretraining grid bicubically (no antialias: ViTDet's ``get_abs_pos``, the rule SAM's
    windowed-ViT design comes from; Meta's and HF's SAM never resize), a zero CLS entry
    in front (the model stores one). A width mismatch is left to the architecture check."""
    pos = sd.get('pos_embed')
    own = model.state_dict().get('pos_embed')
    if pos is None or own is None or pos.shape[-1] != own.shape[-1]:
        return sd
    out = OrderedDict(sd)
    out['pos_embed'] = _fit_pos_embed(pos, own, model.pretrain_grid,
                                      _prefix_tokens(sd, pos.shape[1]), 'bicubic')
    return out


def fit_sam_state_dict(sd: StateDict, model) -> StateDict:
    """The ViT family's fitting (:func:`~.vit.fit_vit_embeddings`), after dropping the neck
    when the model has none (SAM's neck is a head on the trunk)."""
    if getattr(model, 'neck', None) is None:
        sd = OrderedDict((k, v) for k, v in sd.items() if not k.startswith('neck.'))
    return fit_vit_embeddings(sd, model)


SAM_CHECKPOINTS = CheckpointFamily(
    'SAM', convert_sam_state_dict, sam_arch_of, sam_model_arch,
    resize=((r'attn\.rel_pos_[hw]$', _resize_rel_pos), ), transform=fit_sam_pos_embed,
    fit=fit_sam_state_dict,
    config_probe=sam_config_arch,
    unrepresentable=((r'attn\.rel_pos_[hw]$', "SAM's decomposed relative positions",
                      'use_rel_pos=True'),
                     (r'^pos_embed$', "SAM's absolute position embedding", 'abs_pos_embed=True')))
