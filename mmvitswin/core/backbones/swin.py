"""Swin Transformer backbone, state-dict compatible with mmdet 3.x and mmseg 1.x.

Output-size rule: for an input ``(B, C, H, W)`` the patch embedding gives a grid of
``ceil(H / ph) x ceil(W / pw)`` (``patch_size`` ``p`` or ``(ph, pw)``; zero padding at the
bottom/right), and the patch merging before stage ``i > 0`` (2x2 neighbourhoods every
``strides[i]`` rows and columns) divides that by ``strides[i]`` rounding up. With the default
strides (4, 2, 2, 2) stage ``i`` has ``ceil(H / (4 * 2**i))`` rows: Swin-T at 224x224 returns
(96, 56, 56), (192, 28, 28), (384, 14, 14), (768, 7, 7).
"""
import numbers
from typing import Dict, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
import torch.utils.checkpoint as cp

from ..layers import (FFN, DropPath, PatchEmbed, PatchMerging, WindowAttention, WindowPlan,
                      build_act, build_layer_norm, drop_path_schedule, effective_window,
                      resize_pos_embed, resolve_arch, resolve_indices, shift_mask_table,
                      to_tuple, validate_stages, window_plan)
from ..utils import (ArgumentIndexError, ArgumentTypeError, ArgumentValueError, check_args,
                     check_dict, check_image_input, check_int_sequence, check_positive_int)
from ..checkpoint.swin import SWIN_CHECKPOINTS
from .base import TransformerBackbone, init_linear_and_norm, pretrained_to_init_cfg

ARCH_ZOO: Dict[str, dict] = {
    'tiny': dict(embed_dims=96, depths=(2, 2, 6, 2), num_heads=(3, 6, 12, 24)),
    'small': dict(embed_dims=96, depths=(2, 2, 18, 2), num_heads=(3, 6, 12, 24)),
    'base': dict(embed_dims=128, depths=(2, 2, 18, 2), num_heads=(4, 8, 16, 32)),
    'large': dict(embed_dims=192, depths=(2, 2, 18, 2), num_heads=(6, 12, 24, 48)),
}
ARCH_ALIASES = {'t': 'tiny', 's': 'small', 'b': 'base', 'l': 'large'}
SWIN_ARCH_KEYS = ('embed_dims', 'depths', 'num_heads')


class ShiftWindowMSA(nn.Module):
    """Holds a block's window attention as ``w_msa`` (mmdet's/mmseg's/mmpretrain's key names:
    ``attn.w_msa.*``) and runs it: ``forward(x: (B, H, W, C), plan)``."""

    def __init__(self, w_msa: nn.Module):
        super().__init__()
        self.w_msa = w_msa

    def forward(self, x: torch.Tensor, plan: WindowPlan) -> torch.Tensor:
        return self.w_msa(x, plan)


class SwinBlockBase(nn.Module):
    """The Swin block on channels-last ``x: (B, *spatial, C)``: window attention, then MLP,
    each a residual branch; the windows (pad, shift, partition, and back) come in ``plan``
    (:func:`~mmvitswin.core.layers.window_plan`, built by the stage).

    Pre-norm, ``x + drop_path(attn(norm1(x)))`` (V1, video), or with ``post_norm`` Swin V2's
    ``x + drop_path(norm1(attn(x)))``. A subclass builds its modules under its checkpoints'
    names: ``attn`` (called as ``attn(x, plan)``), ``norm1``, ``norm2``, ``drop_path``, an MLP
    that :meth:`mlp_branch` runs, and sets ``with_cp``.
    """
    post_norm = False

    def mlp_branch(self, x: torch.Tensor) -> torch.Tensor:
        return self.ffn(x)

    def _attn_branch(self, x: torch.Tensor, plan: WindowPlan) -> torch.Tensor:
        if self.post_norm:
            return self.drop_path(self.norm1(self.attn(x, plan)))
        return self.drop_path(self.attn(self.norm1(x), plan))

    def _ffn_branch(self, x: torch.Tensor) -> torch.Tensor:
        if self.post_norm:
            return self.drop_path(self.norm2(self.mlp_branch(x)))
        return self.drop_path(self.mlp_branch(self.norm2(x)))

    def forward(self, x: torch.Tensor, plan: WindowPlan) -> torch.Tensor:
        if self.with_cp and x.requires_grad:
            # one checkpoint per branch: backward recomputes half a block at a time (about
            # half the activation peak of a whole-block checkpoint)
            x = x + cp.checkpoint(self._attn_branch, x, plan, use_reentrant=False)
            return x + cp.checkpoint(self._ffn_branch, x, use_reentrant=False)
        x = x + self._attn_branch(x, plan)
        return x + self._ffn_branch(x)


class SwinBlock(SwinBlockBase):
    """The V1 Swin block under mmdet's/mmseg's names (``attn.w_msa.*``, ``ffn.layers.*``)."""

    def __init__(self, embed_dims: int, num_heads: int, ffn_dims: int, window: Tuple[int, ...],
                 qkv_bias: bool = True, qk_scale: Optional[float] = None,
                 drop_rate: float = 0., attn_drop_rate: float = 0., drop_path_rate: float = 0.,
                 act_cfg: Optional[dict] = None, norm_cfg: Optional[dict] = None,
                 with_cp: bool = False):
        super().__init__()
        self.with_cp = with_cp
        self.norm1 = build_layer_norm(norm_cfg, embed_dims)
        self.attn = ShiftWindowMSA(WindowAttention(
            embed_dims, num_heads, window, qkv_bias=qkv_bias, qk_scale=qk_scale,
            attn_drop=attn_drop_rate, proj_drop=drop_rate))
        self.norm2 = build_layer_norm(norm_cfg, embed_dims)
        self.ffn = FFN(embed_dims, ffn_dims, drop=drop_rate, act_layer=build_act(act_cfg))
        self.drop_path = DropPath(drop_path_rate)


class SwinStage(nn.Module):
    """``depth`` blocks alternating W-MSA / SW-MSA (shift ``window // 2``), then an optional
    patch merging.

    ``forward(x: (B, *spatial, C))`` returns ``(stage output, next input or None)``. The two
    window plans (unshifted, shifted: :func:`~mmvitswin.core.layers.window_plan`) are built
    once per forward and passed to the blocks. ``clamp_to_input``: windows larger than the
    input are clamped to it and lose their shift (the video Swin, as mmaction2); otherwise
    small maps are padded to a full window (mmdet). ``block_cls`` (default
    :class:`SwinBlock`) gets ``(embed_dims, num_heads, ffn_dims, window, drop_path_rate=...,
    **block_kwargs)``.
    """

    def __init__(self, embed_dims: int, num_heads: int, depth: int, window: Tuple[int, ...],
                 mlp_ratio: float, drop_path_rates: Sequence[float],
                 downsample: Optional[nn.Module] = None, block_cls: type = SwinBlock,
                 clamp_to_input: bool = False, **block_kwargs):
        super().__init__()
        self.window = tuple(window)
        self.shift = tuple(w // 2 for w in window)
        self.clamp_to_input = clamp_to_input
        # the shift masks of this window (derived, not saved); a clamped window builds its own
        self.register_buffer('shift_mask_table', shift_mask_table(self.window, self.shift),
                             persistent=False)
        self.blocks = nn.ModuleList([
            block_cls(embed_dims, num_heads, int(mlp_ratio * embed_dims), self.window,
                      drop_path_rate=drop_path_rates[i], **block_kwargs) for i in range(depth)
        ])
        self.downsample = downsample

    def window_plans(self, x: torch.Tensor) -> Tuple[WindowPlan, WindowPlan]:
        """The (unshifted, shifted) window plans of ``x``'s spatial size."""
        spatial = tuple(x.shape[1:-1])
        window, shift = self.window, self.shift
        if self.clamp_to_input:
            window, shift = effective_window(spatial, window, shift)
        plain = window_plan(spatial, window, (0, ) * len(window), x.device)
        if len(self.blocks) < 2 or not any(shift):
            return plain, plain
        table = self.shift_mask_table if (window, shift) == (self.window, self.shift) else None
        return plain, window_plan(spatial, window, shift, x.device, table)

    def forward(self, x: torch.Tensor):
        plans = self.window_plans(x) if len(self.blocks) else ()
        for i, block in enumerate(self.blocks):
            x = block(x, plans[i % 2])
        return x, (self.downsample(x) if self.downsample is not None else None)


def validate_swin_config(embed_dims, depths, num_heads, patch_size, window_size, strides,
                         out_indices, frozen_stages) -> Tuple[int, ...]:
    """The stage-layout checks of a Swin with one stride per stage (Swin V2 here): raise an
    :class:`~mmvitswin.core.validate.ArgumentError` naming the bad argument; returns
    ``out_indices`` as a tuple."""
    check_positive_int('patch_size', patch_size)
    depths = validate_stages(embed_dims, depths, num_heads, frozen_stages)['depths']
    strides = check_int_sequence('strides', strides, low=1)
    if len(strides) != len(depths):
        raise ArgumentIndexError(f'strides must have one entry per stage ({len(depths)}), got '
                                 f'{strides}')
    _check_strides(strides, patch_size, len(depths))
    return resolve_indices(out_indices, len(depths))


def _check_strides(strides: Tuple[int, ...], patch_size: int, num_stages: int) -> None:
    if strides[0] != patch_size:
        raise ArgumentValueError(f'strides[0] ({strides[0]}) must equal patch_size '
                                 f'({patch_size}): the patch embedding is non-overlapping')
    if any(s != 2 for s in strides[1:num_stages]):
        raise ArgumentValueError(f'strides[1:] must all be 2 (2x2 patch merging), got '
                                 f'{tuple(strides[1:num_stages])}')


def check_mmdet_strides(strides, patch_size, num_stages: int) -> Tuple[Tuple[int, int], ...]:
    """mmdet's/mmseg's ``patch_size`` and ``strides`` -> one ``(sh, sw)`` per stage: the patch
    (``patch_size``, an int or 2 ints, equal to ``strides[0]``: a non-overlapping embedding),
    then each patch merging's stride (an int or 2 ints). Entries past the last stage are
    ignored, as the references ignore them."""
    patch = to_tuple(patch_size, 2, 'patch_size')  # an int or 2 ints, each >= 1
    if isinstance(strides, (str, bytes)) or not isinstance(strides, Sequence):
        raise ArgumentTypeError(f'strides must be a list or tuple (one stride per stage), got '
                                f'{strides!r}')
    if len(strides) < num_stages:
        raise ArgumentIndexError(f'strides must have an entry for each of the {num_stages} '
                                 f'stages, got {strides}')
    pairs = tuple(to_tuple(v, 2, f'strides[{i}]') for i, v in enumerate(strides[:num_stages]))
    if pairs[0] != patch:  # as pairs: the references' == also refuses 4 vs (4, 4)
        raise ArgumentValueError(f'strides[0] ({strides[0]}) must equal patch_size '
                                 f'({patch_size}): the patch embedding is non-overlapping')
    return pairs


def check_mmdet_swin_layout(embed_dims, depths, num_heads, patch_size, strides, out_indices,
                            frozen_stages) -> Tuple[Tuple[int, ...], Tuple[int, ...],
                                                    Tuple[int, ...], Tuple[Tuple[int, int],
                                                                           ...]]:
    """The stage layout mmdet 3.3's and mmseg 1.2's ``SwinTransformer`` accept, with their
    meaning; anything else raises an :class:`~mmvitswin.core.validate.ArgumentError` naming
    the argument (an ``AssertionError`` too, and an ``IndexError`` for a count or an index
    out of range: what the references raise there).

    - ``depths``: blocks (>= 0) per stage, any number of stages >= 1;
    - ``num_heads`` and ``strides``: an entry for every stage; entries past the last stage are
      ignored, as the references ignore them (a 3-stage model keeps the default 4 strides);
    - ``patch_size`` and each stride: an int or 2 ints (rows, columns), ``strides[0] ==
      patch_size`` (non-overlapping patch embedding); ``strides[i > 0]``: the step of stage
      ``i``'s 2x2 patch merging (mmdet's ``nn.Unfold(kernel_size=2, stride=s)``);
    - ``out_indices``: a list or tuple of stage indices, possibly empty (no outputs);
    - ``frozen_stages``: an int up to the number of stages; negative freezes nothing.

    Returns ``(depths, num_heads, out_indices, strides)`` as tuples, ``num_heads`` cut to the
    stages, ``strides`` one ``(sh, sw)`` per stage (:func:`check_mmdet_strides`).
    """
    depths = check_int_sequence('depths', depths, low=0)
    num_heads = check_int_sequence('num_heads', num_heads, low=1)
    if len(num_heads) > len(depths) and isinstance(out_indices, (list, tuple)) and any(
            isinstance(i, int) and i >= len(depths) for i in out_indices):
        # (the references cut num_heads to the stages; an output past the last stage means
        # the two were meant to have one length)
        raise ArgumentIndexError(f'depths ({len(depths)} stages: {depths}) and num_heads '
                                 f'({len(num_heads)} stages: {num_heads}) must have the same '
                                 f'length: out_indices {tuple(out_indices)} names stages past '
                                 f'the last one of depths')
    if len(num_heads) < len(depths):
        raise ArgumentIndexError(f'num_heads must have an entry for each of the {len(depths)} '
                                 f'stages of depths={depths}, got {num_heads}')
    num_heads = num_heads[:len(depths)]
    strides = check_mmdet_strides(strides, patch_size, len(depths))
    validate_stages(embed_dims, depths, num_heads, frozen_stages)
    out_indices = resolve_indices(out_indices, len(depths), allow_empty=True, allow_int=False)
    return depths, num_heads, out_indices, strides


def mmdet_pretrain_img_size(value) -> Tuple[int, int]:
    """``pretrain_img_size`` as mmdet/mmseg read it: an int or a 2-tuple, and a 1-tuple
    ``(s,)`` means ``(s, s)``. Other lengths: ArgumentIndexError (they assert)."""
    if isinstance(value, tuple) and len(value) == 1:
        value = value[0]
    return to_tuple(value, 2, 'pretrain_img_size')


def check_square_window(window_size) -> Tuple[int, int]:
    """mmdet's/mmseg's ``window_size``: one int, the side of square windows."""
    if isinstance(window_size, bool) or not isinstance(window_size, numbers.Integral):
        raise ArgumentTypeError(f'window_size must be an int (the side of the square windows), '
                                f'got {window_size!r}')
    return to_tuple(window_size, 2, 'window_size')


def check_swin_args(mlp_ratio, qk_scale, drop_rate, attn_drop_rate, drop_path_rate, act_cfg,
                    norm_cfg, init_cfg, qkv_bias, with_cp, **flags) -> dict:
    """Check the block arguments both Swin backbones (2-D and video) take, plus their other
    bool ``flags`` (an :class:`~mmvitswin.core.validate.ArgumentError` naming the bad one;
    ``act_cfg``/``norm_cfg`` must be dicts: the references build layers from them); return
    the block arguments as the keyword arguments of :func:`build_swin_stages`."""
    check_dict('act_cfg', act_cfg)
    check_dict('norm_cfg', norm_cfg)
    check_args(positive=dict(mlp_ratio=mlp_ratio), optional_positive=dict(qk_scale=qk_scale),
               probabilities=dict(drop_rate=drop_rate, attn_drop_rate=attn_drop_rate,
                                  drop_path_rate=drop_path_rate),
               flags=dict(qkv_bias=qkv_bias, with_cp=with_cp, **flags),
               cfgs=dict(init_cfg=init_cfg))
    return dict(mlp_ratio=mlp_ratio, drop_path_rate=drop_path_rate, norm_cfg=norm_cfg,
                qkv_bias=qkv_bias, qk_scale=qk_scale, drop_rate=drop_rate,
                attn_drop_rate=attn_drop_rate, act_cfg=act_cfg, with_cp=with_cp)


def build_swin_stages(embed_dims: int, depths: Sequence[int], num_heads: Sequence[int],
                      window: Tuple[int, ...], mlp_ratio: float, drop_path_rate: float,
                      norm_cfg: Optional[dict], channel_order: str = 'unfold',
                      block_cls: type = SwinBlock, merge_norm: bool = True,
                      merge_strides: Optional[Sequence] = None,
                      **block_kwargs) -> nn.ModuleList:
    """The stage stack of a Swin (2-D or video): stage ``i`` has ``embed_dims * 2**i``
    channels and ``depths[i]`` blocks (stochastic depth rising over all blocks), every stage
    but the last ends in a 2x2 patch merging (``channel_order``: mmdet's ``'unfold'`` or
    mmaction2's ``'microsoft'``; stride ``merge_strides[i]``, default 2) with a ``norm_cfg``
    LayerNorm, or none without ``merge_norm`` (mmdet's/mmseg's ``patch_norm=False`` drops
    it)."""
    rates = drop_path_schedule(drop_path_rate, depths)
    stages = nn.ModuleList()
    for i, depth in enumerate(depths):
        dims = embed_dims * 2**i
        downsample = None
        if i < len(depths) - 1:
            stride = 2 if merge_strides is None else merge_strides[i]
            downsample = PatchMerging(dims, 2 * dims, stride=stride, channel_order=channel_order)
            downsample.norm = (build_layer_norm(norm_cfg, 4 * dims) if merge_norm else
                               nn.Identity())
        stages.append(SwinStage(dims, num_heads[i], depth, window, mlp_ratio, rates[i],
                                downsample=downsample, block_cls=block_cls, norm_cfg=norm_cfg,
                                **block_kwargs))
    return stages


class SwinBackbone(TransformerBackbone):
    """What the 2-D Swins (V1 and V2) share after their constructors: the forward (patch
    embedding, optional absolute position embedding, stages, output norms), the frozen parts
    and layer-wise lr decay. A subclass builds ``patch_embed``, ``drop_after_pos``,
    ``stages`` (:class:`SwinStage` s), ``norm{i}`` for ``out_indices`` and sets
    ``use_abs_pos_embed``, ``frozen_stages``, ``depths``, ``in_channels``."""

    def frozen_modules(self):
        """Modules frozen by ``frozen_stages``, in the order mmdet freezes them."""
        if self.frozen_stages < 0:
            return []
        mods = [self.patch_embed, self.drop_after_pos]
        for i in range(1, self.frozen_stages + 1):
            if i - 1 in self.out_indices:
                mods.append(getattr(self, f'norm{i - 1}'))
            mods.append(self.stages[i - 1])
        return mods

    def frozen_parameters(self):
        if self.frozen_stages >= 0 and self.use_abs_pos_embed:
            return [self.absolute_pos_embed]
        return []

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        """x: (B, in_channels, H, W), any H, W >= 1 -> tuple of (B, C_i, H_i, W_i)."""
        check_image_input(x, self.in_channels, model=self)
        x, grid = self.patch_embed(x)  # (B, Hp, Wp, C)
        if self.use_abs_pos_embed:
            pos = resize_pos_embed(self.absolute_pos_embed, self.pretrain_grid, grid)
            x = x + pos.view(1, grid[0], grid[1], -1)
        x = self.drop_after_pos(x)
        outs = []
        for i, stage in enumerate(self.stages):
            out, x = stage(x)
            if i in self.out_indices:
                out = getattr(self, f'norm{i}')(out)
                outs.append(out.permute(0, 3, 1, 2).contiguous())
        return tuple(outs)

    # ----------------------------------------------------------------- layer-wise lr decay
    @property
    def num_layers_for_decay(self) -> int:
        """Blocks counted by layer-wise lr decay: every block of every stage."""
        return sum(self.depths)

    def get_layer_depth(self, param_name: str) -> int:
        """Layer-decay depth of a parameter (name relative to the backbone): 0 for the patch
        embedding and absolute pos-embed, ``j + 1`` for overall block ``j`` (blocks counted
        across stages), the patch merging of a stage with its last block, and
        ``num_layers_for_decay + 1`` for the output norms."""
        if param_name.startswith('patch_embed.') or param_name == 'absolute_pos_embed':
            return 0
        parts = param_name.split('.')
        if len(parts) > 3 and parts[0] == 'stages' and parts[1].isdigit():
            stage = int(parts[1])
            before = sum(self.depths[:stage])
            if parts[2] == 'blocks' and parts[3].isdigit():
                return before + int(parts[3]) + 1
            if parts[2] == 'downsample':
                return before + self.depths[stage]
        return self.num_layers_for_decay + 1


class SwinTransformer(SwinBackbone):
    """Swin Transformer returning NCHW maps at strides 4/8/16/32 (for ``out_indices``; other
    ``patch_size`` / ``strides`` as mmdet's: the module docstring's output-size rule).

    Constructor: the union of mmdet 3.3's and mmseg 1.2's ``SwinTransformer`` arguments with
    their defaults, in mmdet's positional order, plus the keyword-only ``arch`` ('tiny' |
    'small' | 'base' | 'large', or a dict) whose values explicit ``embed_dims`` / ``depths`` /
    ``num_heads`` override (left as None they are Swin-T's, mmdet's defaults).

    Pretrained weights: ``init_cfg=dict(type='Pretrained', checkpoint=PATH_OR_URL)``; the format
    (mmdet/mmseg, Microsoft release, timm old/new, with ``state_dict``/``model``/``module.``/
    ``backbone.`` wrappers) is detected automatically and relative-position tables and the
    absolute position embedding are resized to this model. ``convert_weights`` is accepted for
    config compatibility and is no longer needed.

    Arguments are accepted and refused as mmdet's and mmseg's class do (the table with each
    reference's behaviour is ``tests/test_reference_args.py``); where they ``assert``, ours
    raises an :class:`~mmvitswin.core.validate.ArgumentError` naming the argument: an
    ``AssertionError`` that is also a ``ValueError`` or ``TypeError``. ``pretrained=PATH``
    means what it means in mmseg (load it; mmdet 3.3 drops it by accident).
    """

    def __init__(self,
                 pretrain_img_size=224,
                 in_channels: int = 3,
                 embed_dims: Optional[int] = None,
                 patch_size: Union[int, Sequence[int]] = 4,
                 window_size: int = 7,
                 mlp_ratio: float = 4,
                 depths: Optional[Sequence[int]] = None,
                 num_heads: Optional[Sequence[int]] = None,
                 strides: Sequence[Union[int, Sequence[int]]] = (4, 2, 2, 2),
                 out_indices: Sequence[int] = (0, 1, 2, 3),
                 qkv_bias: bool = True,
                 qk_scale: Optional[float] = None,
                 patch_norm: bool = True,
                 drop_rate: float = 0.,
                 attn_drop_rate: float = 0.,
                 drop_path_rate: float = 0.1,
                 use_abs_pos_embed: bool = False,
                 act_cfg: dict = dict(type='GELU'),
                 norm_cfg: dict = dict(type='LN'),
                 with_cp: bool = False,
                 pretrained: Optional[str] = None,
                 convert_weights: bool = False,
                 frozen_stages: int = -1,
                 init_cfg: Optional[dict] = None,
                 *,
                 arch='tiny'):
        super().__init__(init_cfg=pretrained_to_init_cfg(pretrained, init_cfg))

        preset = resolve_arch(arch, ARCH_ZOO, ARCH_ALIASES, SWIN_ARCH_KEYS, exact=True)
        embed_dims = preset['embed_dims'] if embed_dims is None else embed_dims
        depths, num_heads, out_indices, strides = check_mmdet_swin_layout(
            embed_dims, preset['depths'] if depths is None else depths,
            preset['num_heads'] if num_heads is None else num_heads, patch_size, strides,
            out_indices, frozen_stages)
        window = check_square_window(window_size)
        check_positive_int('in_channels', in_channels)
        stage_cfg = check_swin_args(mlp_ratio, qk_scale, drop_rate, attn_drop_rate,
                                    drop_path_rate, act_cfg, norm_cfg, init_cfg, qkv_bias,
                                    with_cp, patch_norm=patch_norm,
                                    use_abs_pos_embed=use_abs_pos_embed,
                                    convert_weights=convert_weights)

        self.arch_settings = dict(embed_dims=embed_dims, depths=depths, num_heads=num_heads)
        self.pretrain_img_size = mmdet_pretrain_img_size(pretrain_img_size)
        self.in_channels = in_channels
        patch = strides[0]
        # an int where the patch is square (what the checkpoint probe compares with a
        # HuggingFace config's patch_size); mmdet/mmseg keep no such attribute
        self.patch_size = patch[0] if patch[0] == patch[1] else patch
        self.window_size = window
        self.depths = depths
        self.num_heads = num_heads
        self.out_indices = out_indices
        self.use_abs_pos_embed = use_abs_pos_embed
        self.convert_weights = convert_weights  # accepted for mmdet configs; detection is automatic
        self.frozen_stages = frozen_stages
        self.num_layers = len(depths)
        self.num_features = [int(embed_dims * 2**i) for i in range(self.num_layers)]

        self.patch_embed = PatchEmbed(in_channels, embed_dims, patch,
                                      norm=patch_norm, proj_name='projection')
        if patch_norm:  # norm_cfg's eps and requires_grad hold here too, as in mmdet/mmseg
            self.patch_embed.norm = build_layer_norm(norm_cfg, embed_dims)
        if use_abs_pos_embed:
            self.pretrain_grid = tuple(s // p for s, p in zip(self.pretrain_img_size, patch))
            if min(self.pretrain_grid) < 1:
                raise ArgumentValueError(
                    f'pretrain_img_size {self.pretrain_img_size} must be at least patch_size '
                    f'({patch_size}) with use_abs_pos_embed=True: the position embedding has '
                    'one entry per pretraining patch')
            self.absolute_pos_embed = nn.Parameter(
                torch.zeros(1, self.pretrain_grid[0] * self.pretrain_grid[1], embed_dims))
        self.drop_after_pos = nn.Dropout(drop_rate)

        self.stages = build_swin_stages(embed_dims, depths, num_heads, window,
                                        merge_norm=patch_norm, merge_strides=strides[1:],
                                        **stage_cfg)
        for i in out_indices:
            self.add_module(f'norm{i}', build_layer_norm(norm_cfg, self.num_features[i]))
        self._init_random()
        self._freeze_stages()

    # ----------------------------------------------------------------------------- weights
    def _init_random(self) -> None:
        """Truncated-normal init for linear layers and tables, as mmdet's ``init_weights``."""
        if self.use_abs_pos_embed:
            nn.init.trunc_normal_(self.absolute_pos_embed, std=0.02)
        init_linear_and_norm(self.modules())

    # ------------------------------------------------------------------------ checkpoints
    def checkpoint_family(self):
        return SWIN_CHECKPOINTS
