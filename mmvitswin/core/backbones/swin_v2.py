"""Swin Transformer V2 backbone (Liu et al., "Swin Transformer V2: Scaling Up Capacity and
Resolution", CVPR 2022) as a feature pyramid for detection and segmentation.

What differs from the V1 Swin (:mod:`.swin`), everything else being shared with it (patch
embedding, window gather with padding **before** the cyclic shift, the -100 shift mask, stage
structure, stochastic depth, output norms, freezing, the pyramid contract):

- scaled cosine attention with a learnt per-head logit scale (clamped at ``log(1 / 0.01)``) and
  a continuous position bias MLP on log-spaced relative coordinates
  (:class:`~mmvitswin.core.layers.CosineWindowAttention`);
- ``pretrained_window_sizes``: the window each stage's bias MLP was trained at. A window-8
  checkpoint runs at window 16 or 24 with ``pretrained_window_sizes=8``: no table to resample;
- residual post-norm blocks: ``x + drop_path(norm(branch(x)))``;
- V2 patch merging: the reduction, then the norm (over the 2C outputs);
- q/v biases (``q_bias``, ``v_bias``), no key bias.

Output-size rule as V1: stage ``i`` has ``ceil(H / (patch_size * 2**i))`` rows; Swin V2-T at
256x256 returns (96, 64, 64), (192, 32, 32), (384, 16, 16), (768, 8, 8). Unlike the classifiers
(Microsoft's, HF's, timm's), windows are never shrunk to a small map and the shift is never
dropped: small maps are padded to a full window, as detection/segmentation Swins do (and
mmpretrain's ``pad_small_map=True``).

State-dict keys are mmpretrain's ``SwinTransformerV2`` names with mmdet's stage layout (each
patch merging at the end of its stage, ``nn.Unfold`` channel order):
``patch_embed.projection``, ``stages.{s}.blocks.{b}.attn.w_msa.{qkv,q_bias,v_bias,logit_scale,
cpb_mlp.0,cpb_mlp.2,proj}``, ``.norm1``, ``.ffn.layers.0.0``, ``.ffn.layers.1``, ``.norm2``,
``stages.{s}.downsample.{reduction,norm}``, ``norm{i}``. Every released layout (Microsoft, timm,
HuggingFace, mmpretrain) is converted on load (:mod:`..checkpoint.swin_v2`).
"""
from typing import Dict, Optional, Sequence, Tuple

import torch.nn as nn

from ..checkpoint.swin_v2 import SWINV2_CHECKPOINTS
from ..layers import (FFN, CosineWindowAttention, DropPath, PatchEmbed, PatchMerging,
                      build_act, build_layer_norm, drop_path_schedule, resolve_arch, to_tuple)
from ..utils import check_int_sequence, check_positive_int
from .base import pretrained_to_init_cfg
from .swin import (ARCH_ALIASES, SWIN_ARCH_KEYS, ShiftWindowMSA, SwinBackbone, SwinBlockBase,
                   SwinStage, check_swin_args, validate_swin_config)

# The released Swin V2 models and their windows: T/S/B at 256 px with windows 8 and 16
# (ImageNet-1K), B/L at 192 px with window 12 (ImageNet-22K) and their 256/384-px fine-tunes at
# windows 16/24 (pretrained windows 12, 12, 12, 6: at 192 px the last stage's map is 6 x 6).
# The preset's window is the smallest released one.
ARCH_ZOO: Dict[str, dict] = {
    'tiny': dict(embed_dims=96, depths=(2, 2, 6, 2), num_heads=(3, 6, 12, 24), window_size=8),
    'small': dict(embed_dims=96, depths=(2, 2, 18, 2), num_heads=(3, 6, 12, 24), window_size=8),
    'base': dict(embed_dims=128, depths=(2, 2, 18, 2), num_heads=(4, 8, 16, 32), window_size=8),
    'large': dict(embed_dims=192, depths=(2, 2, 18, 2), num_heads=(6, 12, 24, 48),
                  window_size=12),
}


class SwinBlockV2(SwinBlockBase):
    """Residual post-norm Swin V2 block on channels-last ``x: (B, H, W, C)``:
    ``x + drop_path(norm1(attn(x)))``, then ``x + drop_path(norm2(ffn(x)))``; the attention
    is :class:`~mmvitswin.core.layers.CosineWindowAttention` (keys ``attn.w_msa.*``).
    ``qk_scale`` is refused (the cosine logits have a learnt scale)."""
    post_norm = True

    def __init__(self, embed_dims: int, num_heads: int, ffn_dims: int, window: Tuple[int, ...],
                 pretrained_window: Tuple[int, ...] = (0, 0), qkv_bias: bool = True,
                 drop_rate: float = 0., attn_drop_rate: float = 0., drop_path_rate: float = 0.,
                 act_cfg: Optional[dict] = None, norm_cfg: Optional[dict] = None,
                 with_cp: bool = False, cpb_hidden_dims: int = 512):
        super().__init__()
        self.with_cp = with_cp
        self.attn = ShiftWindowMSA(CosineWindowAttention(
            embed_dims, num_heads, window, pretrained_window, qkv_bias=qkv_bias,
            attn_drop=attn_drop_rate, proj_drop=drop_rate, cpb_hidden_dims=cpb_hidden_dims))
        self.norm1 = build_layer_norm(norm_cfg, embed_dims)
        self.ffn = FFN(embed_dims, ffn_dims, drop=drop_rate, act_layer=build_act(act_cfg))
        self.norm2 = build_layer_norm(norm_cfg, embed_dims)
        self.drop_path = DropPath(drop_path_rate)


def _merging_v2(dims: int, norm_cfg: Optional[dict]) -> PatchMerging:
    """V2 patch merging ``dims -> 2 * dims`` (reduction, then a ``norm_cfg`` norm)."""
    merge = PatchMerging(dims, 2 * dims, norm_after=True)
    merge.norm = build_layer_norm(norm_cfg, 2 * dims)
    return merge


def build_swin_v2_stages(embed_dims: int, depths: Sequence[int], num_heads: Sequence[int],
                         windows: Sequence[Tuple[int, int]],
                         pretrained_windows: Sequence[Tuple[int, int]], mlp_ratio: float,
                         drop_path_rate: float, norm_cfg: Optional[dict],
                         **block_kwargs) -> nn.ModuleList:
    """V1's stage stack (:class:`~.swin.SwinStage`) with :class:`SwinBlockV2` blocks, a window
    and a pretrained window per stage, and V2 patch mergings."""
    last = len(depths) - 1
    widths = [embed_dims * 2**i for i in range(len(depths))]
    per_stage = zip(widths, num_heads, depths, windows, pretrained_windows,
                    drop_path_schedule(drop_path_rate, depths))
    return nn.ModuleList(
        SwinStage(width, heads, depth, window, mlp_ratio, rates,
                  downsample=None if i == last else _merging_v2(width, norm_cfg),
                  block_cls=SwinBlockV2, pretrained_window=pretrained, norm_cfg=norm_cfg,
                  **block_kwargs)
        for i, (width, heads, depth, window, pretrained, rates) in enumerate(per_stage))


def per_stage_sizes(name: str, value, num_stages: int, low: int) -> Tuple[Tuple[int, int], ...]:
    """An int (every stage) or one int per stage -> one square ``(s, s)`` per stage; ints
    ``>= low`` (TypeError/ValueError naming ``name``)."""
    if isinstance(value, int) and not isinstance(value, bool):
        value = (value, ) * num_stages
    sizes = check_int_sequence(name, value, length=num_stages, low=low)
    return tuple((s, s) for s in sizes)


class SwinTransformerV2(SwinBackbone):
    """Swin Transformer V2 returning NCHW maps at strides 4/8/16/32 (for ``out_indices``).

    Constructor: V1's (mmdet/mmseg ``SwinTransformer`` kwargs; no ``qk_scale``, no absolute
    position embedding: no released V2 has one) plus

    - ``arch``: 'tiny' | 'small' | 'base' | 'large' (or 't'/'s'/'b'/'l', or a dict with
      ``embed_dims``, ``depths``, ``num_heads``), whose values explicit arguments override;
    - ``window_size``: an int or one per stage (None: the preset's, 8 for T/S/B, 12 for L);
    - ``pretrained_window_sizes``: the window each stage's position-bias MLP was trained at
      (an int or one per stage; 0: this stage's window). Set it when running a checkpoint at
      another window: e.g. ``window_size=16, pretrained_window_sizes=8`` for a window-8 file.
      Loading refuses a file whose saved coordinates were normalised to another window;
    - ``cpb_mlp_hidden_dims``: the bias MLP's width (512 in every release).

    Pretrained weights: ``init_cfg=dict(type='Pretrained', checkpoint=PATH_OR_URL)``; Microsoft's
    release, timm (``.pth``/``.safetensors``), HuggingFace (``Swinv2Model``, ``Swinv2Backbone``,
    ``Swinv2For*``, snapshot directories) and mmpretrain files are detected and converted.
    """

    def __init__(self, arch='tiny', pretrain_img_size=256, in_channels: int = 3,
                 embed_dims: Optional[int] = None, patch_size: int = 4, window_size=None,
                 pretrained_window_sizes=0, mlp_ratio: float = 4,
                 depths: Optional[Sequence[int]] = None,
                 num_heads: Optional[Sequence[int]] = None,
                 strides: Sequence[int] = (4, 2, 2, 2), out_indices: Sequence[int] = (0, 1, 2, 3),
                 qkv_bias: bool = True, patch_norm: bool = True, drop_rate: float = 0.,
                 attn_drop_rate: float = 0., drop_path_rate: float = 0.1,
                 act_cfg: dict = dict(type='GELU'), norm_cfg: dict = dict(type='LN'),
                 with_cp: bool = False, pretrained: Optional[str] = None,
                 frozen_stages: int = -1, cpb_mlp_hidden_dims: int = 512,
                 init_cfg: Optional[dict] = None):
        super().__init__(init_cfg=pretrained_to_init_cfg(pretrained, init_cfg))

        preset = resolve_arch(arch, ARCH_ZOO, ARCH_ALIASES, SWIN_ARCH_KEYS)
        embed_dims = preset['embed_dims'] if embed_dims is None else embed_dims
        depths = check_int_sequence('depths', preset['depths'] if depths is None else depths,
                                    low=0)
        num_heads = check_int_sequence(
            'num_heads', preset['num_heads'] if num_heads is None else num_heads)
        check_int_sequence('strides', strides)
        check_positive_int('in_channels', in_channels)
        check_positive_int('cpb_mlp_hidden_dims', cpb_mlp_hidden_dims)
        if window_size is None:
            window_size = preset.get('window_size', 8)
        windows = per_stage_sizes('window_size', window_size, len(depths), low=1)
        pretrained_windows = per_stage_sizes('pretrained_window_sizes', pretrained_window_sizes,
                                             len(depths), low=0)
        if any(p == 1 for p, _ in pretrained_windows):  # (upstream divides by p - 1 = 0)
            raise ValueError(f'pretrained_window_sizes must be 0 (the stage\'s own window) or a '
                             f'window of at least 2 per stage, got {pretrained_window_sizes}')
        stage_cfg = check_swin_args(mlp_ratio, None, drop_rate, attn_drop_rate, drop_path_rate,
                                    act_cfg, norm_cfg, init_cfg, qkv_bias, with_cp,
                                    patch_norm=patch_norm)
        del stage_cfg['qk_scale']
        out_indices = validate_swin_config(embed_dims, depths, num_heads, patch_size, windows,
                                           tuple(strides), out_indices, frozen_stages)

        self.arch_settings = dict(embed_dims=embed_dims, depths=depths, num_heads=num_heads)
        self.depths, self.num_heads, self.out_indices = depths, num_heads, out_indices
        self.window_sizes, self.pretrained_window_sizes = windows, pretrained_windows
        self.in_channels, self.patch_size, self.frozen_stages = in_channels, patch_size, \
            frozen_stages
        self.pretrain_img_size = to_tuple(pretrain_img_size, 2, 'pretrain_img_size')
        self.use_abs_pos_embed = False  # no released Swin V2 has one
        self.num_layers = len(depths)
        self.num_features = [int(embed_dims * 2**i) for i in range(self.num_layers)]

        self.patch_embed = PatchEmbed(in_channels, embed_dims, (patch_size, patch_size),
                                      norm=patch_norm, proj_name='projection')
        self.drop_after_pos = nn.Dropout(drop_rate)
        self.stages = build_swin_v2_stages(embed_dims, depths, num_heads, windows,
                                           pretrained_windows, cpb_hidden_dims=cpb_mlp_hidden_dims,
                                           **stage_cfg)
        for i in out_indices:
            self.add_module(f'norm{i}', build_layer_norm(norm_cfg, self.num_features[i]))
        self._init_random()
        self._freeze_stages()

    # ---------------------------------------------------------------- backbone protocol
    @property
    def out_strides(self) -> Tuple[int, ...]:
        return tuple(self.patch_size * 2**i for i in self.out_indices)

    @property
    def out_channels(self) -> Tuple[int, ...]:
        return tuple(self.num_features[i] for i in self.out_indices)

    size_divisibility = 1  # any input size: every stage pads to its windows internally

    def checkpoint_family(self):
        return SWINV2_CHECKPOINTS
