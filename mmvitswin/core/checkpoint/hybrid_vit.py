"""Hybrid ResNetV2 + ViT checkpoints -> mmvitswin ``HybridViT`` layout.

Formats (detected from the keys, no flag needed):

- ``timm``: timm's ``vit_base_r50_s16_224_in21k`` / ``vit_base_r50_s16_384`` (and the other
  ``vit_*_r*_s16`` hybrids): the CNN under ``patch_embed.backbone.*`` (``stem.conv``,
  ``stem.norm``, ``stages.{i}.blocks.{j}.{conv,norm}{1,2,3}``, ``...downsample.{conv,norm}``),
  the 1x1 projection ``patch_embed.proj``, then a timm ViT (``cls_token``, ``pos_embed``,
  ``blocks.N.{norm1,attn.qkv,attn.proj,norm2,mlp.fc1,mlp.fc2}``, ``norm``, ``pre_logits.fc``
  for the in21k model, ``head``).
- ``mmvitswin``: ours -- the same CNN and projection keys, ViT blocks with ``ffn.layers.*``,
  plus the pyramid's ``level_projs.*``.

The CNN keys are already ours (``HybridViT`` names its modules as timm does); the ViT part goes
through the ViT converter (:mod:`mmvitswin.core.checkpoint.vit`), which also resizes the pos-embed.
Classifier keys (``head``, ``pre_logits``) keep their names so the loader reports them.
"""
import re
from collections import OrderedDict
from typing import Tuple

from .loading import StateDict, fit_checkpoint
from .vit import (VIT_CHECKPOINTS, convert_vit_state_dict, detect_vit_format, vit_arch_of,
                  vit_model_arch)

CNN_PREFIX = 'patch_embed.backbone.'


def detect_hybrid_format(sd: StateDict) -> str:
    """Return 'timm' or 'mmvitswin'; ValueError for anything else (e.g. a plain ViT)."""
    if f'{CNN_PREFIX}stem.conv.weight' not in sd:
        sample = sorted(sd)[:6]
        raise ValueError(f'not a hybrid ResNet+ViT checkpoint: no {CNN_PREFIX}stem.conv.weight '
                         f'(a plain ViT or another model?), got e.g. {sample}')
    fmt = detect_vit_format({k: v for k, v in sd.items() if not k.startswith(CNN_PREFIX)})
    if fmt not in ('timm', 'mmvitswin'):
        raise ValueError(f'hybrid checkpoint with a {fmt}-style ViT part is not supported '
                         "(expected timm's or ours)")
    return fmt


def convert_hybrid_state_dict(sd: StateDict) -> Tuple[StateDict, str]:
    """Rename a supported hybrid layout to ours. Returns ``(state_dict, detected_format)``.

    Pure key conversion, no resizing (see :func:`adapt_hybrid_state_dict`).
    """
    fmt = detect_hybrid_format(sd)
    cnn = OrderedDict((k, v) for k, v in sd.items() if k.startswith(CNN_PREFIX))
    vit, _ = convert_vit_state_dict(
        OrderedDict((k, v) for k, v in sd.items() if not k.startswith(CNN_PREFIX)))
    cnn.update(vit)
    return cnn, fmt


def hybrid_cnn_depths(sd: StateDict) -> Tuple[int, ...]:
    """Bottlenecks per CNN stage of a state dict in our layout."""
    depths = {}
    for k in sd:
        m = re.match(re.escape(CNN_PREFIX) + r'stages\.(\d+)\.blocks\.(\d+)\.', k)
        if m:
            s, b = int(m.group(1)), int(m.group(2))
            depths[s] = max(depths.get(s, 0), b + 1)
    return tuple(depths.get(s, 0) for s in range(max(depths) + 1)) if depths else ()


def hybrid_arch_of(sd: StateDict) -> dict:
    """Bottlenecks per CNN stage, then the ViT fields, of a state dict in our layout."""
    return dict(cnn_depths=hybrid_cnn_depths(sd) or None, **vit_arch_of(sd))


def hybrid_model_arch(model) -> dict:
    return dict(cnn_depths=tuple(model.cnn_depths), **vit_model_arch(model))


# The ViT family's rules (pos-embed, rel-pos tables) with the hybrid's layout and probe. A timm
# (classification) file cannot hold the pyramid projections: they keep their initialisation
# without being reported missing, so the one warning lists only surprises.
HYBRID_CHECKPOINTS = VIT_CHECKPOINTS._replace(
    name='hybrid ResNet+ViT', convert=convert_hybrid_state_dict, probe=hybrid_arch_of,
    model_probe=hybrid_model_arch, keep_initialised={'timm': r'level_projs\.'},
    convert_needs_config=False, config_probe=None)


def adapt_hybrid_state_dict(sd: StateDict, model) -> StateDict:
    """Fit a state dict (timm's hybrid or ours) to a ``HybridViT``: refuse a different CNN
    (clear message instead of a list of missing keys), then the ViT checks and resizing."""
    return fit_checkpoint(HYBRID_CHECKPOINTS, sd, model)
