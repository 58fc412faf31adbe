"""Plain Vision Transformer trunk and ``ViTAdapter``: a ViT as a 4-level NCHW pyramid.

Layout (timm-like): pure functions first, then layers, then the trunk, then the registered
backbone. The checkpoint filter lives in :mod:`mmvitswin.core.checkpoint.vit`.

Output-size rule. The patch embedding pads the input at the bottom/right to a multiple of the
patch, so the token grid is ``ceil(H / p) x ceil(W / p)``. With ``adapter=None`` the backbone
returns that grid (stride ``p``) after each block in ``out_indices``, like mmseg's
``VisionTransformer``. With an adapter the input is first padded to a multiple of ``2p`` (32 for
``p = 16``) and every pyramid level is cropped back, so level ``i`` of stride ``s_i`` in
(4, 8, 16, 32) is exactly ``(B, C, ceil(H / s_i), ceil(W / s_i))``.

CLS token. The trunk keeps a learnable CLS token (``with_cls_token=True``) in front of the patch
tokens, as mmseg and timm do. Global blocks attend over CLS + patches. Windowed blocks (ViTDet
style) attend inside windows of patch tokens only: the CLS token is not put in any window, its
attention branch is zero in those blocks, and it still goes through the block's FFN. Decomposed
relative positions apply to patch-patch pairs; pairs involving the CLS token get no bias.
"""
from typing import Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint as cp

from ..layers import (FFN, POS_EMBED_RULES, Attention, ConvStem, DropPath, LayerNorm2d,
                      LayerScale, PatchEmbed, SwiGLUFFN, WindowPlan, blocks_window_plan,
                      build_act, build_layer_norm, ceil_div, crop_to, linear_drop_path,
                      merge_windows, pad_amount, partition_windows, resize_abs_pos_embed,
                      resize_rel_pos_1d, resolve_arch, resolve_indices, to_tuple, window_plan)
from ..checkpoint.vit import VIT_CHECKPOINTS
from ..checkpoint.dinov3 import DINOV3_CHECKPOINTS, is_dinov3_checkpoint
from ..checkpoint.loading import fit_checkpoint
from ..checkpoint.sam import SAM_CHECKPOINTS, is_sam_checkpoint
from ..layers import RotaryPositionEmbedding2d, SamNeck, apply_rope
from ..compat import get_autocast_dtype, is_autocast_enabled
from .base import TransformerBackbone, init_linear_and_norm, pretrained_to_init_cfg
from .vit_adapter_modules import InteractionAdapter, _check_interaction_indexes
from ..utils import (check_args, check_choice, check_image_input, check_int, parameters_on,
                     check_int_sequence, check_optional_dict, check_positive_int)

ARCH_ZOO: Dict[str, dict] = {
    'tiny': dict(embed_dims=192, num_layers=12, num_heads=3, feedforward_channels=768,
                 patch_size=16),
    'small': dict(embed_dims=384, num_layers=12, num_heads=6, feedforward_channels=1536,
                  patch_size=16),
    'base': dict(embed_dims=768, num_layers=12, num_heads=12, feedforward_channels=3072,
                 patch_size=16),
    'large': dict(embed_dims=1024, num_layers=24, num_heads=16, feedforward_channels=4096,
                  patch_size=16),
    'huge': dict(embed_dims=1280, num_layers=32, num_heads=16, feedforward_channels=5120,
                 patch_size=14),
}
# DINOv2 (Oquab et al. 2023) as released by Meta / on the HF hub: patch 14 at 518 px (a 37 x 37
# grid), LayerScale (init 1e-5 as Meta trains it), final LayerNorm, ViT-g with SwiGLU (hidden
# 4096 = DINOv2's 2/3 rule for 4 x 1536); '-reg': 4 register tokens (Darcet et al. 2024).
# ``pos_embed_resize`` is the run-time rule of HF's models (Dinov2Model: plain bicubic;
# Dinov2WithRegistersModel: antialiased bicubic); pass another for timm's or Meta's features.
_DINOV2 = dict(patch_size=14, img_size=518, layer_scale_init_value=1e-5, final_norm=True,
               pos_embed_resize='bicubic')
for _name, _dims, _depth, _heads in (('s', 384, 12, 6), ('b', 768, 12, 12), ('l', 1024, 24, 16),
                                     ('g', 1536, 40, 24)):
    _cfg = dict(_DINOV2, embed_dims=_dims, num_layers=_depth, num_heads=_heads,
                feedforward_channels=4 * _dims)
    if _name == 'g':
        _cfg.update(feedforward_channels=4096, ffn_type='swiglu')
    ARCH_ZOO[f'dinov2-{_name}'] = _cfg
    ARCH_ZOO[f'dinov2-{_name}-reg'] = dict(_cfg, num_register_tokens=4,
                                           pos_embed_resize='bicubic-antialias')
# keys of a preset that are constructor defaults (an explicit argument wins)
PRESET_DEFAULTS = ('patch_size', 'img_size', 'layer_scale_init_value', 'final_norm',
                   'num_register_tokens', 'ffn_type', 'pos_embed_resize')
FFN_TYPES = ('mlp', 'swiglu')
ARCH_ALIASES = {'t': 'tiny', 's': 'small', 'b': 'base', 'l': 'large', 'h': 'huge',
                'deit-tiny': 'tiny', 'deit-small': 'small', 'deit-base': 'base'}
ADAPTERS = (None, 'simple', 'interaction')
NECKS = (None, 'sam')
# SAM's image encoders (Kirillov et al. 2023; Meta's segment_anything, HF facebook/sam-vit-*,
# timm samvit_*): ViT/16 at 1024 px without CLS token or final norm, LayerNorm eps 1e-6,
# windows of 14 with 4 global blocks, decomposed relative positions.
# DINOv3 (Simeoni et al. 2025; HF facebook/dinov3-vit*16-pretrain-lvd1689m, timm
# vit_*_patch16_dinov3, Meta's dinov3_vit*16_pretrain_lvd1689m-*.pth): ViT/16 with CLS + 4
# registers, LayerScale (init 1e-5), 2-D RoPE (theta 100) and no absolute position embedding,
# final LayerNorm, eps 1e-5; S+/H+/7B with SwiGLU. Meta's SwiGLU width is
# ``int(2/3 * ffn_ratio * C)`` rounded up to a multiple of 8 (S+, H+: ratio 6 -> 1536 / 5120)
# or 64 (7B, 'swiglu64': ratio 3 -> 8192 = 2 C; HF intermediate_size 8192, timm mlp_ratio 2):
# the presets hold the resulting widths. The 7B (4096 wide, 40 blocks, 32 heads of 128) has
# no q/k/v bias at all (Meta qkv_bias=False, HF query/value_bias=False, timm qkv_bias=False),
# the others a q/v bias. ``defaults``: further constructor defaults of the preset (an
# explicit argument wins), applied by ViTAdapter.
for _name, _dims, _depth, _heads, _global in (('b', 768, 12, 12, (2, 5, 8, 11)),
                                              ('l', 1024, 24, 16, (5, 11, 17, 23)),
                                              ('h', 1280, 32, 16, (7, 15, 23, 31))):
    ARCH_ZOO[f'sam-{_name}'] = dict(
        embed_dims=_dims, num_layers=_depth, num_heads=_heads, feedforward_channels=4 * _dims,
        patch_size=16, img_size=1024, final_norm=False, pos_embed_resize='bicubic',
        defaults=dict(with_cls_token=False, window_size=14, global_attn_indexes=_global,
                      use_rel_pos=True, norm_cfg=dict(type='LN', eps=1e-6)))
for _name, _dims, _depth, _heads, _ffn, _hidden, _qkv_bias in (
        ('s', 384, 12, 6, 'mlp', 1536, True), ('s+', 384, 12, 6, 'swiglu', 1536, True),
        ('b', 768, 12, 12, 'mlp', 3072, True), ('l', 1024, 24, 16, 'mlp', 4096, True),
        ('h+', 1280, 32, 20, 'swiglu', 5120, True), ('7b', 4096, 40, 32, 'swiglu', 8192, False)):
    ARCH_ZOO[f'dinov3-{_name}'] = dict(
        embed_dims=_dims, num_layers=_depth, num_heads=_heads, feedforward_channels=_hidden,
        ffn_type=_ffn, patch_size=16, img_size=224, layer_scale_init_value=1e-5,
        num_register_tokens=4, final_norm=True,
        defaults=dict(rope_theta=100.0, abs_pos_embed=False, qkv_bias=_qkv_bias,
                      norm_cfg=dict(type='LN', eps=1e-5)))


# DINOv3 is released and supported in bf16 and fp32, not fp16 (its maintainers in
# facebookresearch/dinov3#181; fp16 runs of its layers fail, transformers#41885): a trunk with
# the 2-D RoPE refuses float16, in the tools before training and in the forward.
FP16_REFUSAL = ('a DINOv3-style trunk (rope_theta set) does not run in float16: DINOv3 is '
                'released for bf16 and fp32 only; use bfloat16 (tools: --amp-dtype bf16; '
                "torch.autocast(..., dtype=torch.bfloat16); FSDP2Strategy "
                "mixed_precision=dict(param_dtype='bfloat16'))")


def fp16_refusal(backbone: dict) -> Optional[str]:
    """Why a ``ViTAdapter``/``HybridViT`` built from the config dict ``backbone`` refuses
    float16 (:data:`FP16_REFUSAL`), or None."""
    kwargs = preset_defaults(backbone.get('arch', 'base'))
    kwargs.update(backbone)
    return FP16_REFUSAL if kwargs.get('rope_theta') is not None else None


def preset_defaults(arch) -> dict:
    """The extra constructor defaults of preset ``arch`` (``{}`` for a dict or other preset)."""
    if not isinstance(arch, str):
        return {}
    name = ARCH_ALIASES.get(arch.lower(), arch.lower())
    return dict(ARCH_ZOO.get(name, {}).get('defaults', {}))
VIT_ARCH_KEYS = ('embed_dims', 'num_layers', 'num_heads', 'feedforward_channels')


# ------------------------------------------------------------------------ pure functions
def rel_pos_lookup(length: int, table: torch.Tensor) -> torch.Tensor:
    """Per-axis relative-position embeddings for ``length`` positions: ``(length, length, C)``.

    ``table: (L, C)`` holds one row per offset ``-(L//2) .. L//2``; it is linearly resized to
    ``2 * length - 1`` rows first when the axis length differs from the one it was built for
    (ViTDet's rule, for query and key axes of equal length).
    """
    table = resize_rel_pos_1d(table, 2 * length - 1)
    pos = torch.arange(length, device=table.device)
    return table[pos[:, None] - pos[None, :] + (length - 1)]


def decomposed_rel_pos_bias(q: torch.Tensor, grid: Tuple[int, int], rel_pos_h: torch.Tensor,
                            rel_pos_w: torch.Tensor) -> torch.Tensor:
    """ViTDet's decomposed relative position term as an additive attention bias.

    ``q: (B, heads, h*w, head_dim)`` are the *unscaled* queries of the grid tokens. For query
    ``(i, j)`` and key ``(k, l)`` the bias is ``q . Rh[i - k] + q . Rw[j - l]``. Returns
    ``(B, heads, h*w, h*w)``.
    """
    h, w = grid
    b, heads, n, d = q.shape
    rh = rel_pos_lookup(h, rel_pos_h)  # (h, h, d)
    rw = rel_pos_lookup(w, rel_pos_w)  # (w, w, d)
    rq = q.reshape(b, heads, h, w, d)
    bias_h = torch.einsum('bnhwc,hkc->bnhwk', rq, rh.to(q.dtype))
    bias_w = torch.einsum('bnhwc,wkc->bnhwk', rq, rw.to(q.dtype))
    bias = bias_h[..., :, None] + bias_w[..., None, :]  # (b, heads, h, w, h, w)
    return bias.reshape(b, heads, n, n)


def default_global_indexes(num_layers: int) -> Tuple[int, ...]:
    """ViTDet's choice of global blocks: the last block of each quarter (2, 5, 8, 11 for 12)."""
    step = max(num_layers // 4, 1)
    return tuple(i for i in range(step - 1, num_layers, step))


def build_vit_ffn(ffn_type: str, embed_dims: int, hidden_dims: int, drop: float,
                  act_cfg: Optional[dict]) -> nn.Module:
    """A block's feed-forward branch: ``'mlp'`` (fc -> act -> fc, mmcv's ``FFN`` layout
    ``ffn.layers.*``) or ``'swiglu'`` (``ffn.w12``/``ffn.w3``, ``hidden_dims`` wide)."""
    if ffn_type == 'swiglu':
        return SwiGLUFFN(embed_dims, hidden_dims, drop=drop)
    return FFN(embed_dims, hidden_dims, drop=drop, act_layer=build_act(act_cfg))


def resample_stride_to_16(x: torch.Tensor, stride: int) -> torch.Tensor:
    """A token map ``(B, C, h, w)`` of patch ``stride`` (cell ``i`` covers pixels ``[i s,
    (i + 1) s)``) resampled bilinearly to stride 16: output cell ``j`` reads the image
    position ``(j + 0.5) * 16``. Returns ``floor(h * stride / 16)`` rows (ditto columns),
    which is at least ``H / 16`` for an image of ``H <= h * stride`` rows."""
    return F.interpolate(x, scale_factor=stride / 16, mode='bilinear', align_corners=False,
                         recompute_scale_factor=False)


# --------------------------------------------------------------------------------- layers
class ViTAttention(Attention):
    """``layers.Attention`` plus optional decomposed relative positions (ViTDet ``use_rel_pos``).

    The relative term is built as an additive bias and handed to ``Attention.attend``, so SDPA
    stays in use. ``rel_pos_size`` is the (h, w) grid the per-axis tables ``rel_pos_h: (2h-1,
    head_dim)`` and ``rel_pos_w: (2w-1, head_dim)`` are built for; other grids resize them.
    """

    def __init__(self, dim: int, num_heads: int, rel_pos_size: Optional[Tuple[int, int]] = None,
                 rope_theta: Optional[float] = None, **kwargs):
        super().__init__(dim, num_heads, **kwargs)
        self.use_rel_pos = rel_pos_size is not None
        # DINOv3's 2-D RoPE (layers/rope.py): q and k of the patch tokens rotated by their
        # grid position; derived from (head_dim, theta), nothing in the state dict
        self.rope = (RotaryPositionEmbedding2d(self.head_dim, rope_theta)
                     if rope_theta is not None else None)
        if self.use_rel_pos:
            # zero init as ViTDet (rel_pos_zero_init=True): training starts from plain ViT.
            self.rel_pos_h = nn.Parameter(torch.zeros(2 * rel_pos_size[0] - 1, self.head_dim))
            self.rel_pos_w = nn.Parameter(torch.zeros(2 * rel_pos_size[1] - 1, self.head_dim))

    def forward(self, x: torch.Tensor, grid: Optional[Tuple[int, int]] = None,
                num_prefix: int = 0) -> torch.Tensor:
        """x: (B, num_prefix + h*w, C) -> same shape; ``grid = (h, w)`` needed with rel pos."""
        if not self.use_rel_pos and self.rope is None:
            return super().forward(x)
        q, k, v = self.qkv_heads(x)
        if self.rope is not None:
            cos, sin = self.rope(grid)
            q, k = apply_rope(q, cos, sin, num_prefix), apply_rope(k, cos, sin, num_prefix)
            if not self.use_rel_pos:
                return self.out_proj(self.attend(q, k, v, None))
        bias = decomposed_rel_pos_bias(q[:, :, num_prefix:], grid, self.rel_pos_h,
                                       self.rel_pos_w)
        if num_prefix:
            bias = F.pad(bias, (num_prefix, 0, num_prefix, 0))  # prefix pairs: no bias
        return self.out_proj(self.attend(q, k, v, bias))


class ViTBlock(nn.Module):
    """Pre-norm transformer block on a token sequence ``(B, P + h*w, C)``.

    ``window_size=0``: global attention over all tokens. ``window_size=w``: the ``h x w`` grid
    of patch tokens is zero-padded (after ``norm1``, as ViTDet) to a multiple of ``w`` and
    attended in ``w x w`` windows; the ``P`` prefix (CLS) tokens skip attention in this block.
    """

    def __init__(self, embed_dims: int, num_heads: int, feedforward_channels: int,
                 window_size: int = 0, rel_pos_size: Optional[Tuple[int, int]] = None,
                 qkv_bias: bool = True, drop_rate: float = 0., attn_drop_rate: float = 0.,
                 drop_path_rate: float = 0., act_cfg: Optional[dict] = None,
                 norm_cfg: Optional[dict] = None, with_cp: bool = False,
                 layer_scale_init_value: Optional[float] = None, ffn_type: str = 'mlp',
                 rope_theta: Optional[float] = None):
        super().__init__()
        self.window_size = window_size
        self.with_cp = with_cp
        self.norm1 = build_layer_norm(norm_cfg, embed_dims)
        if window_size and rel_pos_size is not None:
            rel_pos_size = (window_size, window_size)
        self.attn = ViTAttention(embed_dims, num_heads, rel_pos_size=rel_pos_size,
                                 qkv_bias=qkv_bias, attn_drop=attn_drop_rate,
                                 proj_drop=drop_rate, rope_theta=rope_theta)
        self.norm2 = build_layer_norm(norm_cfg, embed_dims)
        self.ffn = build_vit_ffn(ffn_type, embed_dims, feedforward_channels, drop_rate, act_cfg)
        # LayerScale (DeiT-III, DINOv2): keys ``ls1.gamma``/``ls2.gamma``; none without it
        with_ls = layer_scale_init_value is not None
        self.ls1 = LayerScale(embed_dims, layer_scale_init_value) if with_ls else nn.Identity()
        self.ls2 = LayerScale(embed_dims, layer_scale_init_value) if with_ls else nn.Identity()
        self.drop_path = DropPath(drop_path_rate)

    def _attention(self, x: torch.Tensor, grid: Tuple[int, int], num_prefix: int,
                   plan: Optional[WindowPlan]):
        if not self.window_size:
            return self.attn(x, grid, num_prefix)
        b, _, c = x.shape
        prefix, tokens = x[:, :num_prefix], x[:, num_prefix:]
        window = (self.window_size, self.window_size)
        if plan is None:
            plan = window_plan(grid, window, (0, 0), x.device)
        elif plan.window != window:
            raise ValueError(f'plan is for windows of {plan.window}, this block attends in '
                             f'windows of {window}')
        # zero padding after norm1 (as ViTDet), windows by one gather each way
        shape = (b, grid[0], grid[1], c)
        windows = partition_windows(tokens.reshape(shape), plan)
        out = merge_windows(self.attn(windows, window, 0), plan, shape)
        out = out.view(b, grid[0] * grid[1], c)
        if num_prefix:
            out = torch.cat([torch.zeros_like(prefix), out], dim=1)
        return out

    def _forward(self, x: torch.Tensor, grid: Tuple[int, int], num_prefix: int,
                 plan: Optional[WindowPlan]):
        x = x + self.drop_path(self.ls1(self._attention(self.norm1(x), grid, num_prefix, plan)))
        return x + self.drop_path(self.ls2(self.ffn(self.norm2(x))))

    def forward(self, x: torch.Tensor, grid: Tuple[int, int], num_prefix: int = 0,
                plan: Optional[WindowPlan] = None):
        """``plan``: the window plan of ``grid`` (:func:`~..layers.blocks_window_plan`), which
        the trunk builds once per forward for all its windowed blocks; None: built here."""
        if self.with_cp and x.requires_grad:
            return cp.checkpoint(self._forward, x, grid, num_prefix, plan, use_reentrant=False)
        return self._forward(x, grid, num_prefix, plan)


class SimpleFeaturePyramid(nn.Module):
    """ViTDet's simple feature pyramid: strides 4, 8, 16, 32 from one stride-``in_stride`` map.

    For a stride-16 map (ViTDet): x4 = two 2x2 stride-2 deconvolutions with LayerNorm2d + GELU
    between, x2 = one deconvolution, x1 = identity, x1/2 = 2x2 max-pool. Other power-of-two
    strides shift the same recipe (stride 8: x2, identity, /2 and /4 max-pools). Each level
    then goes through 1x1 conv + LayerNorm2d + 3x3 conv + LayerNorm2d to ``out_channels``
    (convs without bias, as the norms follow). ``forward((B, C, h, w))`` returns four NCHW maps,
    finest first; :meth:`pyramid` runs it on a trunk's last block.

    Any other stride (DINOv2's 14) is first resampled bilinearly to stride 16 by position in
    the image (:func:`resample_stride_to_16`): the trunk keeps its pretrained patch and grid,
    so its tokens are exactly the pretrained model's, and the stride-16 recipe follows.

    Padding constraint (declared, not applied): ``size_divisibility`` is the multiple an image
    must have for every level to be exactly ``H / s``; the backbone pads and crops back.
    """

    def __init__(self, in_channels: int, out_channels: int = 256, in_stride: int = 16):
        super().__init__()
        check_positive_int('in_channels', in_channels)
        check_positive_int('out_channels', out_channels)
        check_positive_int('in_stride', in_stride)
        self.resample_from = None if in_stride in (4, 8, 16, 32) else in_stride
        if self.resample_from is not None:
            in_stride = 16
        self.size_divisibility = max(32, 2 * in_stride)
        self.rescale = nn.ModuleList()
        dims = []
        for stride in (4, 8, 16, 32):
            c, layers = in_channels, []
            up = in_stride // stride  # number of x2 upsamplings = log2(up)
            while up > 1:
                if layers:
                    layers += [LayerNorm2d(c), nn.GELU()]
                layers.append(nn.ConvTranspose2d(c, c // 2, 2, stride=2))
                c, up = c // 2, up // 2
            if stride > in_stride:
                layers.append(nn.MaxPool2d(stride // in_stride, stride=stride // in_stride))
            self.rescale.append(nn.Sequential(*layers) if layers else nn.Identity())
            dims.append(c)
        self.outputs = nn.ModuleList([
            nn.Sequential(
                nn.Conv2d(d, out_channels, 1, bias=False), LayerNorm2d(out_channels),
                nn.Conv2d(out_channels, out_channels, 3, padding=1, bias=False),
                LayerNorm2d(out_channels)) for d in dims
        ])

    def forward(self, x: torch.Tensor) -> List[torch.Tensor]:
        """x: (B, C, h, w) at ``in_stride`` -> 4 maps at strides 4..32 (for a stride-14 map of
        ``ceil(H / 14)`` cells: at least ``H / s`` cells each, the builder crops)."""
        if self.resample_from is not None:
            x = resample_stride_to_16(x, self.resample_from)
        return [head(rescale(x)) for head, rescale in zip(self.outputs, self.rescale)]


# ---------------------------------------------------------------------------------- trunk
class VisionTransformerTrunk(TransformerBackbone):
    """Plain ViT trunk: patch embedding, CLS token, abs pos-embed, blocks, final norm.

    The trunk has no output or freezing policy of its own: the registered builders
    (:class:`ViTAdapter`, ``HybridViT``) choose which maps to return (``out_indices``) and what
    to freeze (``frozen_stages``) with their own documented meaning, and call
    :meth:`forward_intermediates` / :meth:`trunk_frozen_modules`. Parameter names (our
    checkpoint layout): ``patch_embed.proj``, ``cls_token``, ``register_tokens``, ``pos_embed``,
    ``norm_pre``, ``blocks.{i}.{norm1,attn.qkv,attn.proj,attn.rel_pos_h,attn.rel_pos_w,ls1.gamma,
    norm2,ffn.layers.0.0,ffn.layers.1 | ffn.w12,ffn.w3,ls2.gamma}``, ``norm``.

    The trunk protocol (what adapters and builders use):

    - ``patch_embed`` (ctor arg, injected): a module, or a factory called as
      ``patch_embed(in_channels, embed_dims)`` once those are resolved, mapping
      ``(B, C_in, H, W)`` to ``(tokens (B, h, w, embed_dims), (h, w), *extras)`` like
      ``layers.PatchEmbed`` (no extras), with ``h, w`` a function of H, W only; extras (the
      hybrid's CNN maps) are for the builder that injected the embedding. It is stored as
      ``self.patch_embed`` (layer decay gives it depth 0) and initialises itself.
      ``patch_size`` must then be its total stride: it sets the pretraining grid
      ``img_size // patch_size`` of ``pos_embed``.
    - ``prepare_tokens(x) -> (seq, grid)``: image ``(B, C_in, H, W)`` to the token sequence
      ``seq: (B, P + h*w, C)`` (``P = num_prefix_tokens`` CLS tokens first, then the grid
      row-major) with pos-embed added (resized bicubically to ``grid``), dropout, pre-norm;
      ``embed_tokens(tokens, grid)`` does the part after ``patch_embed``.
    - ``blocks``: an ``nn.ModuleList``, each called as ``block(seq, grid, num_prefix_tokens,
      plan)`` with the windowed blocks' shared plan (:func:`~..layers.blocks_window_plan`; the
      interaction adapter receives the blocks and runs them in groups).
    - ``forward_intermediates(x, indices, embedded=None, frozen=-1)``: the NCHW maps after
      each block in ``indices`` (``final_norm`` applied after the last block): the one
      intermediates method.
    - ``forward(x)``: the map of the last block.

    Args (OpenMMLab names where mmseg has one): ``img_size`` pretraining size of ``pos_embed``;
    ``window_size``/``global_attn_indexes`` ViTDet windowing (0: all global; with a window the
    listed blocks stay global, default the last of each quarter); ``use_rel_pos`` decomposed
    relative positions (window tables ``2w-1`` rows, global ones ``2 * img_size/p - 1``);
    ``stem``: ``'patch'`` (default, the ViT patchify conv that checkpoints carry) or ``'conv'``
    (:class:`layers.ConvStem`, for training from scratch). DINOv2-era features (defaults from
    the preset, e.g. ``arch='dinov2-b'``; docs/foundation_vits.md): ``layer_scale_init_value``
    (LayerScale on both residual branches; None: none), ``num_register_tokens`` (after CLS, no
    position, dropped from the maps), ``ffn_type`` (``'mlp'`` | ``'swiglu'``, hidden width
    ``feedforward_channels``), ``pos_embed_resize`` (the run-time rule:
    :data:`~mmvitswin.core.layers.POS_EMBED_RULES`; default the preset's, else
    ``interpolate_mode``). Presets also set ``patch_size``, ``img_size`` and ``final_norm``.
    ``block_device='meta'``: the blocks' parameters are built without memory (their buffers
    as usual), for a sharding strategy that gives each process its shard and fills it from the
    pretrained checkpoint (``FSDP2Strategy(meta_init=True)``, docs/fsdp.md); such a trunk
    cannot run until then.
    """

    def __init__(self,
                 arch='base',
                 img_size=None,
                 patch_size: Optional[int] = None,
                 in_channels: int = 3,
                 embed_dims: Optional[int] = None,
                 num_layers: Optional[int] = None,
                 num_heads: Optional[int] = None,
                 mlp_ratio: Optional[float] = None,
                 qkv_bias: bool = True,
                 drop_rate: float = 0.,
                 attn_drop_rate: float = 0.,
                 drop_path_rate: float = 0.,
                 with_cls_token: bool = True,
                 norm_cfg: Optional[dict] = dict(type='LN', eps=1e-6),
                 act_cfg: Optional[dict] = dict(type='GELU'),
                 patch_norm: bool = False,
                 patch_bias: bool = True,
                 pre_norm: bool = False,
                 final_norm: Optional[bool] = None,
                 interpolate_mode: str = 'bicubic',
                 layer_scale_init_value: Optional[float] = None,
                 num_register_tokens: Optional[int] = None,
                 ffn_type: Optional[str] = None,
                 pos_embed_resize: Optional[str] = None,
                 rope_theta: Optional[float] = None,
                 abs_pos_embed: bool = True,
                 window_size: int = 0,
                 global_attn_indexes: Optional[Sequence[int]] = None,
                 use_rel_pos: bool = False,
                 with_cp: bool = False,
                 patch_embed=None,
                 stem: str = 'patch',
                 block_device: Optional[str] = None,
                 pretrained: Optional[str] = None,
                 init_cfg=None):
        super().__init__(init_cfg=pretrained_to_init_cfg(pretrained, init_cfg))
        check_choice('block_device', block_device, (None, 'meta'))
        if stem not in ('patch', 'conv'):
            raise ValueError(f"stem must be 'patch' (one patchify conv) or 'conv' (3x3 conv "
                             f"stem), got {stem!r}")
        if stem != 'patch' and patch_embed is not None:
            raise ValueError(f'stem={stem!r} and a patch_embed module exclude each other')
        if patch_embed is not None and not callable(patch_embed):
            raise TypeError(f'patch_embed must be an nn.Module, a factory '
                            f'(in_channels, embed_dims) -> nn.Module, or None, got '
                            f'{type(patch_embed).__name__}')
        preset = resolve_arch(arch, ARCH_ZOO, ARCH_ALIASES, VIT_ARCH_KEYS)
        embed_dims = preset['embed_dims'] if embed_dims is None else embed_dims
        num_layers = preset['num_layers'] if num_layers is None else num_layers
        num_heads = preset['num_heads'] if num_heads is None else num_heads
        patch_size = preset.get('patch_size', 16) if patch_size is None else patch_size
        img_size = preset.get('img_size', 224) if img_size is None else img_size
        final_norm = preset.get('final_norm', False) if final_norm is None else final_norm
        if layer_scale_init_value is None:
            layer_scale_init_value = preset.get('layer_scale_init_value')
        if num_register_tokens is None:
            num_register_tokens = preset.get('num_register_tokens', 0)
        ffn_type = preset.get('ffn_type', 'mlp') if ffn_type is None else ffn_type
        check_choice('ffn_type', ffn_type, FFN_TYPES)
        check_int('num_register_tokens', num_register_tokens, 0)
        if layer_scale_init_value is not None:
            check_args(positive=dict(layer_scale_init_value=layer_scale_init_value))
        if pos_embed_resize is not None:
            check_choice('pos_embed_resize', pos_embed_resize, POS_EMBED_RULES)
        for name, value in (('embed_dims', embed_dims), ('num_layers', num_layers),
                            ('num_heads', num_heads), ('patch_size', patch_size),
                            ('in_channels', in_channels)):
            check_positive_int(name, value)
        check_args(optional_positive=dict(mlp_ratio=mlp_ratio),
                   probabilities=dict(drop_rate=drop_rate, attn_drop_rate=attn_drop_rate,
                                      drop_path_rate=drop_path_rate),
                   flags=dict(qkv_bias=qkv_bias, with_cls_token=with_cls_token,
                              patch_norm=patch_norm, patch_bias=patch_bias, pre_norm=pre_norm,
                              final_norm=final_norm, use_rel_pos=use_rel_pos, with_cp=with_cp),
                   cfgs=dict(norm_cfg=norm_cfg, act_cfg=act_cfg, init_cfg=init_cfg))
        ffn_dims = (preset['feedforward_channels'] * embed_dims // preset['embed_dims']
                    if mlp_ratio is None else int(mlp_ratio * embed_dims))
        if ffn_dims < 1:
            raise ValueError(f'mlp_ratio * embed_dims must give a hidden width >= 1, got '
                             f'mlp_ratio={mlp_ratio!r}, embed_dims={embed_dims}')
        if embed_dims % num_heads:
            raise ValueError(f'embed_dims ({embed_dims}) must be divisible by num_heads '
                             f'({num_heads})')
        check_choice('interpolate_mode', interpolate_mode, ('bicubic', 'bilinear'))
        # the run-time resize rule: explicit > the preset's > ``interpolate_mode`` (a file's
        # own rule fits its grid on loading: checkpoint.vit.FORMAT_POS_EMBED_RULES)
        self.pos_embed_resize = (pos_embed_resize or preset.get('pos_embed_resize')
                                 or interpolate_mode)
        if isinstance(window_size, bool) or not isinstance(window_size, int) or window_size < 0:
            raise ValueError(f'window_size must be an int >= 0 (0: global attention), got '
                             f'{window_size!r}')
        if rope_theta is not None:  # DINOv3's 2-D RoPE: global blocks, head_dim % 4 == 0
            check_args(positive=dict(rope_theta=rope_theta))
            if window_size:
                raise ValueError(f'rope_theta (2-D RoPE) needs global attention in every block '
                                 f'(window_size=0), got window_size={window_size}')
            if use_rel_pos:
                raise ValueError('rope_theta and use_rel_pos exclude each other (one relative '
                                 'position scheme per model)')
            if (embed_dims // num_heads) % 4:
                raise ValueError(f'rope_theta needs a head dim (embed_dims / num_heads = '
                                 f'{embed_dims // num_heads}) divisible by 4')
        check_args(flags=dict(abs_pos_embed=abs_pos_embed))
        self.rope_theta = None if rope_theta is None else float(rope_theta)
        self.img_size = to_tuple(img_size, 2, 'img_size')
        self.pretrain_grid = tuple(s // patch_size for s in self.img_size)
        if min(self.pretrain_grid) < 1:
            raise ValueError(f'img_size {self.img_size} is smaller than patch_size {patch_size}')
        if global_attn_indexes is None:
            global_attn_indexes = default_global_indexes(num_layers) if window_size else ()
        global_attn_indexes = check_int_sequence('global_attn_indexes', global_attn_indexes,
                                                 low=0, allow_empty=True)
        if any(not 0 <= i < num_layers for i in global_attn_indexes):
            raise ValueError(f'global_attn_indexes must be block indices in [0, {num_layers - 1}]'
                             f', got {global_attn_indexes}')

        self.arch_settings = dict(embed_dims=embed_dims, num_layers=num_layers,
                                  num_heads=num_heads, feedforward_channels=ffn_dims)
        self.in_channels = in_channels
        self.patch_size = patch_size
        self.embed_dims = embed_dims
        self.num_layers = num_layers
        self.num_heads = num_heads
        self.with_cls_token = with_cls_token
        self.num_register_tokens = num_register_tokens
        self.num_prefix_tokens = int(with_cls_token) + num_register_tokens
        self.layer_scale_init_value = layer_scale_init_value
        self.ffn_type = ffn_type
        self.feedforward_channels = ffn_dims
        self.norm_eps = (norm_cfg or {}).get('eps', 1e-5)
        self.interpolate_mode = interpolate_mode
        self.window_size = window_size
        self.global_attn_indexes = global_attn_indexes
        self.use_rel_pos = use_rel_pos
        self.final_norm = final_norm

        if stem == 'conv':
            patch_embed = ConvStem(in_channels, embed_dims, patch_size)
        elif patch_embed is None:
            patch_embed = PatchEmbed(in_channels, embed_dims, (patch_size, patch_size),
                                     norm=False, proj_name='proj', bias=patch_bias)
            if patch_norm:
                patch_embed.norm = build_layer_norm(norm_cfg, embed_dims)
        elif not isinstance(patch_embed, nn.Module):
            patch_embed = patch_embed(in_channels, embed_dims)  # an injected factory
        self.patch_embed = patch_embed
        if with_cls_token:
            self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dims))
        if num_register_tokens:  # Meta's name (timm: reg_token); they get no position
            self.register_tokens = nn.Parameter(torch.zeros(1, num_register_tokens, embed_dims))
        # One CLS entry is always stored (also without a CLS token) so checkpoints map 1:1;
        # none at all with abs_pos_embed=False (DINOv3: positions come from the RoPE).
        self.pos_embed = nn.Parameter(
            torch.zeros(1, 1 + self.pretrain_grid[0] * self.pretrain_grid[1], embed_dims)
        ) if abs_pos_embed else None
        self.drop_after_pos = nn.Dropout(drop_rate)
        self.norm_pre = build_layer_norm(norm_cfg, embed_dims) if pre_norm else None

        rates = linear_drop_path(drop_path_rate, num_layers)
        with parameters_on(block_device):
            self.blocks = nn.ModuleList([
                ViTBlock(embed_dims, num_heads, ffn_dims,
                         window_size=0 if i in global_attn_indexes else window_size,
                         rel_pos_size=self.pretrain_grid if use_rel_pos else None,
                         qkv_bias=qkv_bias, drop_rate=drop_rate,
                         attn_drop_rate=attn_drop_rate, drop_path_rate=rates[i],
                         act_cfg=act_cfg, norm_cfg=norm_cfg, with_cp=with_cp,
                         layer_scale_init_value=layer_scale_init_value, ffn_type=ffn_type,
                         rope_theta=self.rope_theta) for i in range(num_layers)
            ])
        self.norm = build_layer_norm(norm_cfg, embed_dims) if final_norm else None
        self.init_trunk_weights()

    # ---------------------------------------------------------------------------- weights
    def init_trunk_weights(self) -> None:
        """timm/mmseg init: trunc-normal(0.02) for pos-embed, CLS and the blocks' linear
        weights. The patch embedding (built here or injected) keeps its own init."""
        if self.pos_embed is not None:
            nn.init.trunc_normal_(self.pos_embed, std=0.02)
        if self.with_cls_token:
            nn.init.trunc_normal_(self.cls_token, std=0.02)
        if self.num_register_tokens:
            nn.init.normal_(self.register_tokens, std=1e-6)  # as Meta's DINOv2
        for part in (self.norm_pre, self.blocks, self.norm):
            if part is not None:
                init_linear_and_norm(part.modules())
                for m in part.modules():
                    if isinstance(m, LayerScale):
                        m.reset_parameters()

    def _init_random(self) -> None:
        self.init_trunk_weights()

    def checkpoint_family(self):
        return VIT_CHECKPOINTS

    def convert_checkpoint(self, state_dict, config: Optional[dict] = None):
        """As the base class, with the family chosen by the file: DINOv3 and SAM checkpoints
        (recognised by their keys or ``config.json``) have their own families
        (``checkpoint/dinov3.py``, ``checkpoint/sam.py``), everything else the ViT family."""
        for is_family, family in ((is_dinov3_checkpoint, DINOV3_CHECKPOINTS),
                                  (is_sam_checkpoint, SAM_CHECKPOINTS)):
            if is_family(state_dict, config):
                return fit_checkpoint(family, state_dict, self, config=config)
        return super().convert_checkpoint(state_dict, config)

    # ------------------------------------------------------------------------ layer decay
    def get_layer_depth(self, param_name: str) -> int:
        """Depth for layer-wise lr decay: 0 for the embedding (patch embed, CLS, pos-embed,
        pre-norm), ``i + 1`` for ``blocks.i``, ``num_layers + 1`` for everything after."""
        if param_name.startswith(('patch_embed.', 'norm_pre.')) or param_name in (
                'cls_token', 'pos_embed', 'register_tokens'):
            return 0
        if param_name.startswith('blocks.'):
            return int(param_name.split('.')[1]) + 1
        return self.num_layers + 1

    # ----------------------------------------------------------------------------- freezing
    def trunk_frozen_modules(self, stages: int) -> List[nn.Module]:
        """What freezing the trunk up to ``stages`` means: -1 nothing, 0 the embedding (patch
        embed + pos dropout + pre-norm), ``k`` also blocks ``0..k-1``, ``num_layers`` also the
        final norm."""
        if stages < 0:
            return []
        mods = [self.patch_embed, self.drop_after_pos]
        if self.norm_pre is not None:
            mods.append(self.norm_pre)
        mods += list(self.blocks[:stages])
        if stages == self.num_layers and self.norm is not None:
            mods.append(self.norm)
        return mods

    def trunk_frozen_parameters(self, stages: int) -> List[nn.Parameter]:
        """The position embedding and CLS token, frozen with the embedding (``stages >= 0``)."""
        if stages < 0:
            return []
        return (([self.pos_embed] if self.pos_embed is not None else []) +
                ([self.cls_token] if self.with_cls_token else []) +
                ([self.register_tokens] if self.num_register_tokens else []))

    # ---------------------------------------------------------------------------- forward
    def prepare_tokens(self, x: torch.Tensor) -> Tuple[torch.Tensor, Tuple[int, int]]:
        """x: (B, C_in, H, W) -> (seq (B, P + h*w, C), grid (h, w)); see class docstring."""
        # an embedding may return more than (tokens, grid) (the hybrid's CNN maps): unused here
        tokens, grid = self.patch_embed(x)[:2]
        return self.embed_tokens(tokens, grid)

    def embed_tokens(self, tokens: torch.Tensor,
                     grid: Tuple[int, int]) -> Tuple[torch.Tensor, Tuple[int, int]]:
        """Patch-embedding output ``tokens: (B, h, w, C)`` -> ``(seq, grid)`` as
        :meth:`prepare_tokens` (CLS, resized pos-embed, dropout, pre-norm). Lets a caller that
        ran ``patch_embed`` itself (the hybrid keeps the CNN maps) finish the embedding."""
        if self.rope_theta is not None and (tokens.dtype == torch.float16 or (
                is_autocast_enabled(tokens.device.type) and
                get_autocast_dtype(tokens.device.type) == torch.float16)):
            raise ValueError(FP16_REFUSAL)
        b = tokens.shape[0]
        tokens = tokens.reshape(b, grid[0] * grid[1], -1)
        seq, cls = tokens, getattr(self, 'cls_token', None)
        if self.pos_embed is not None:
            seq = seq + resize_abs_pos_embed(self.pos_embed[:, 1:], self.pretrain_grid, grid,
                                             self.pos_embed_resize)
            if cls is not None:
                cls = cls + self.pos_embed[:, :1]
        prefix = []
        if self.with_cls_token:
            prefix.append(cls.expand(b, -1, -1))
        if self.num_register_tokens:  # after CLS, before the patches; no position (DINOv2)
            prefix.append(self.register_tokens.expand(b, -1, -1))
        if prefix:
            seq = torch.cat(prefix + [seq], dim=1)
        seq = self.drop_after_pos(seq)
        if self.norm_pre is not None:
            seq = self.norm_pre(seq)
        return seq, tuple(grid)

    def seq_to_map(self, seq: torch.Tensor, grid: Tuple[int, int]) -> torch.Tensor:
        """(B, P + h*w, C) -> (B, C, h, w), prefix tokens dropped."""
        tokens = seq[:, self.num_prefix_tokens:]
        return tokens.transpose(1, 2).reshape(seq.shape[0], -1, grid[0], grid[1]).contiguous()

    def forward_intermediates(self, x: Optional[torch.Tensor], indices: Sequence[int] = (-1, ),
                              embedded=None, frozen: int = -1) -> List[torch.Tensor]:
        """Maps ``(B, C, h, w)`` after each block in ``indices`` (block indices, negative ones
        from the end; ``final_norm`` applied after the last block), in block order.

        ``x``: the image ``(B, C_in, H, W)``; or ``embedded = (seq, grid)`` when the caller ran
        the embedding itself (:meth:`embed_tokens`), with ``x`` unused. ``frozen``: the frozen
        prefix (``frozen_stages``' meaning, :meth:`trunk_frozen_modules`) runs without
        autograd: nothing before it trains, so none of its activations is kept."""
        wanted = {i % self.num_layers for i in indices}
        grad = torch.is_grad_enabled()
        with torch.set_grad_enabled(grad and frozen < 0):
            seq, grid = self.prepare_tokens(x) if embedded is None else embedded
        plan = blocks_window_plan(self.blocks, grid, seq.device)
        outs = []
        for i, block in enumerate(self.blocks):
            with torch.set_grad_enabled(grad and i >= frozen):
                seq = block(seq, grid, self.num_prefix_tokens, plan)
                if i == self.num_layers - 1 and self.norm is not None:
                    seq = self.norm(seq)
            if i in wanted:
                outs.append(self.seq_to_map(seq, grid))
        return outs

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        """The map (B, C, ceil(H/p), ceil(W/p)) after the last block, as a 1-tuple."""
        check_image_input(x, self.in_channels, model=self)
        return tuple(self.forward_intermediates(x))


# ------------------------------------------------------------------------------- backbone
class ViTAdapter(VisionTransformerTrunk):
    """ViT backbone for dense prediction: the trunk's block maps or a 4-level pyramid.

    The trunk (:class:`VisionTransformerTrunk`, all other arguments) plus an optional adapter
    module that turns it into a pyramid, held as ``adapter`` (state-dict keys ``adapter.*``):

    - ``adapter=None``: ``out_indices`` are block indices (default -1, the last block); the
      maps of those blocks at stride ``p``, as mmseg's ``VisionTransformer``.
    - ``adapter='simple'``: ViTDet's :class:`SimpleFeaturePyramid` on the last block
      (``adapter_cfg``: ``out_channels``, default 256).
    - ``adapter='interaction'``: ViT-Adapter's
      :class:`~mmvitswin.core.backbones.vit_adapter_modules.InteractionAdapter`, which drives
      the trunk's blocks in groups (``adapter_cfg`` goes to it).

    With an adapter ``out_indices`` are pyramid levels (default (0, 1, 2, 3) = strides 4, 8,
    16, 32); the image is padded to the adapter's ``size_divisibility`` and each level cropped
    back to ``ceil(H / s)``. ``frozen_stages``: -1 none, 0 the embedding (patch embed, CLS,
    pos-embed, pre-norm), ``k`` also blocks ``0..k-1``, ``num_layers`` also the final norm
    (frozen parts: no grad and eval mode; the adapter is never frozen). A frozen prefix runs
    without autograd (its activations are not kept): the embedding and, without the
    interaction adapter, the frozen blocks.

    ``neck='sam'`` (without an adapter): SAM's conv neck
    (:class:`~mmvitswin.core.layers.SamNeck`, ``neck_cfg``: ``out_channels``, default 256) on
    the last block, as SAM's image encoder returns it: one ``(B, out_channels, ceil(H/p),
    ceil(W/p))`` map (keys ``neck.0..3``).
    SAM and DINOv3 presets (``arch='sam-b'``, ``'dinov3-b'``, ...; docs/foundation_vits.md)
    also set trunk defaults beyond the widths (:func:`preset_defaults`): SAM's window layout
    and no CLS token; DINOv3's ``rope_theta`` (2-D RoPE on q/k of the patch tokens,
    ``layers/rope.py``; global blocks only), ``abs_pos_embed=False`` (no absolute position
    embedding) and ``qkv_bias`` (False for ``'dinov3-7b'``, whose released weights have no
    q/k/v bias). An explicit argument wins over a preset value.
    """

    def __init__(self, arch='base', adapter: Optional[str] = None,
                 adapter_cfg: Optional[dict] = None, out_indices=None, frozen_stages: int = -1,
                 neck: Optional[str] = None, neck_cfg: Optional[dict] = None, **kwargs):
        check_choice('adapter', adapter, ADAPTERS)
        check_optional_dict('adapter_cfg', adapter_cfg)
        check_choice('neck', neck, NECKS)
        check_optional_dict('neck_cfg', neck_cfg)
        if neck is not None and adapter is not None:
            raise ValueError(f'neck={neck!r} maps the last block to one stride-patch map; it '
                             f'excludes a pyramid adapter (got adapter={adapter!r})')
        if neck is None and neck_cfg:
            raise ValueError('neck_cfg needs a neck (neck=\'sam\')')
        for key, value in preset_defaults(arch).items():
            kwargs.setdefault(key, value)
        super().__init__(arch, **kwargs)
        check_int('frozen_stages', frozen_stages, -1, self.num_layers)
        self.adapter_type = adapter
        self.frozen_stages = frozen_stages
        if adapter is None:
            self.out_indices = resolve_indices(-1 if out_indices is None else out_indices,
                                               self.num_layers, 'block indices',
                                               allow_negative=True)
            self.adapter = None
        else:
            self.out_indices = resolve_indices((0, 1, 2, 3) if out_indices is None else
                                               out_indices, 4, 'pyramid levels',
                                               note=' with an adapter')
            if adapter == 'simple' and self.patch_size > 32:
                raise ValueError(f"adapter='simple' needs patch_size <= 32 (strides 4..32 are "
                                 f'built from the stride-patch map), got {self.patch_size}')
            build = self._simple_pyramid if adapter == 'simple' else self._interaction_adapter
            self.adapter = build(dict(adapter_cfg or {}))
        self.neck = None
        if neck is not None:  # SAM's conv neck on the last block (ViTAdapter's 'sam' neck)
            cfg = dict(neck_cfg or {})
            out_channels = cfg.pop('out_channels', 256)
            if cfg:
                raise ValueError(f"neck_cfg for 'sam' accepts out_channels only, got "
                                 f'{sorted(cfg)}')
            if self.out_indices != (self.num_layers - 1, ):
                raise ValueError(f'neck={neck!r} runs on the last block: out_indices must be -1, '
                                 f'got {out_indices!r}')
            self.neck = SamNeck(self.embed_dims, out_channels)
        self._freeze_stages()

    def _simple_pyramid(self, cfg: dict) -> SimpleFeaturePyramid:
        out_channels = cfg.pop('out_channels', 256)
        if cfg:
            raise ValueError(f"adapter_cfg for 'simple' accepts out_channels only, got "
                             f'{sorted(cfg)}')
        return SimpleFeaturePyramid(self.embed_dims, out_channels, self.patch_size)

    def _interaction_adapter(self, cfg: dict) -> nn.Module:
        """ViT-Adapter's ``InteractionAdapter``; ``interaction_indexes`` defaults to four equal
        groups of blocks and ``num_heads`` (deformable heads) to 6 below ViT-L, 16 from it."""
        if self.window_size and not self.global_attn_indexes:
            raise ValueError('adapter="interaction" with windowed blocks needs global blocks')
        step = self.num_layers // 4
        default = [(i * step, (i + 1) * step if i < 3 else self.num_layers) for i in range(4)]
        indexes = _check_interaction_indexes(cfg.pop('interaction_indexes', default))
        if not indexes or indexes[-1][-1] != self.num_layers:
            raise ValueError(f'interaction_indexes must end at num_layers ({self.num_layers}), '
                             f'got {indexes}')
        num_heads = cfg.pop('num_heads', 6 if self.embed_dims < 1024 else 16)
        cfg.setdefault('in_channels', self.in_channels)
        cfg.setdefault('vit_stride', self.patch_size)
        return InteractionAdapter(self.embed_dims, num_heads, indexes, **cfg)

    def frozen_modules(self) -> List[nn.Module]:
        return self.trunk_frozen_modules(self.frozen_stages)

    def frozen_parameters(self) -> List[nn.Parameter]:
        return self.trunk_frozen_parameters(self.frozen_stages)

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        """x: (B, C_in, H, W) -> tuple of NCHW maps (see the module docstring for sizes)."""
        check_image_input(x, self.in_channels, model=self)
        frozen = self.frozen_stages
        if self.neck is not None:
            return (self.neck(self.forward_intermediates(x, frozen=frozen)[-1]), )
        if self.adapter is None:
            return tuple(self.forward_intermediates(x, self.out_indices, frozen=frozen))
        h, w = x.shape[-2:]
        multiple = self.adapter.size_divisibility
        x = F.pad(x, (0, pad_amount(w, multiple), 0, pad_amount(h, multiple)))
        if self.adapter_type == 'simple':
            levels = self.adapter(self.forward_intermediates(x, frozen=frozen)[-1])
        else:  # the adapter runs the trunk's blocks on the trunk's embedding, group by group
            # (its injectors feed them: frozen blocks still pass gradients back to the adapter)
            with torch.set_grad_enabled(torch.is_grad_enabled() and frozen < 0):
                seq, grid = self.prepare_tokens(x)
            levels = self.adapter(x, seq, grid, self.blocks, self.num_prefix_tokens)
        outs = []
        for i in self.out_indices:
            stride = 4 * 2**i
            # dense NCHW: LayerNorm2d leaves channels-last strides (and the crop keeps them),
            # and mmcv's RoIAlign (CPU) reads its input as dense NCHW memory
            level = crop_to(levels[i], (ceil_div(h, stride), ceil_div(w, stride)))
            outs.append(level.clone(memory_format=torch.contiguous_format))
        return tuple(outs)
