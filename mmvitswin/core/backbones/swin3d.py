"""Video Swin Transformer (3-D) backbone, state-dict compatible with mmaction2 1.2.

Shares the N-D window pieces of ``models/layers`` with the 2-D Swin: only the block (whose
sub-module names follow mmaction2's checkpoints: ``attn.qkv``, ``mlp.fc1``) lives here.

Output-size rule: for a clip ``(B, C, T, H, W)`` and patch ``(pt, ph, pw)`` the patch embedding
gives ``ceil(T / pt) x ceil(H / ph) x ceil(W / pw)`` tokens (zero padding at the end of each
dim); every patch merging halves H and W rounding up and keeps T. Swin-T at 8 x 224 x 224
returns ``(B, 768, 4, 7, 7)`` for its last stage. Windows larger than the input are clamped to
it (and lose their shift), as in mmaction2.
"""
import numbers
import warnings
from typing import Dict, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn

from ..layers import (DropPath, FcNamedFFN, PatchEmbed, WindowAttention, build_act,
                      build_layer_norm, resolve_arch, resolve_indices, to_tuple, validate_stages)
from ..checkpoint.swin3d import SWIN3D_CHECKPOINTS
from .base import TransformerBackbone
from ..utils import ArgumentTypeError, check_image_input, check_positive_int
from .swin import (ARCH_ALIASES, ARCH_ZOO, SWIN_ARCH_KEYS, SwinBlockBase, build_swin_stages,
                   check_swin_args)


class SwinBlock3D(SwinBlockBase):
    """Pre-norm video Swin block on channels-last ``x: (B, T, H, W, C)``, under mmaction2's
    names: the attention is the ``WindowAttention`` itself (``attn.qkv``,
    ``attn.relative_position_bias_table``) and the MLP is ``mlp.fc1/fc2``, so mmaction2
    checkpoints load without renaming."""

    def __init__(self, embed_dims: int, num_heads: int, ffn_dims: int, window: Tuple[int, ...],
                 qkv_bias: bool = True, qk_scale: Optional[float] = None,
                 drop_rate: float = 0., attn_drop_rate: float = 0., drop_path_rate: float = 0.,
                 act_cfg: Optional[dict] = None, norm_cfg: Optional[dict] = None,
                 with_cp: bool = False):
        super().__init__()
        self.with_cp = with_cp
        self.norm1 = build_layer_norm(norm_cfg, embed_dims)
        self.attn = WindowAttention(embed_dims, num_heads, window, qkv_bias=qkv_bias,
                                    qk_scale=qk_scale, attn_drop=attn_drop_rate,
                                    proj_drop=drop_rate)
        self.drop_path = DropPath(drop_path_rate)
        self.norm2 = build_layer_norm(norm_cfg, embed_dims)
        self.mlp = FcNamedFFN(embed_dims, ffn_dims, drop=drop_rate, act_layer=build_act(act_cfg))

    def mlp_branch(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(x)


def validate_swin3d_config(embed_dims: int, depths: Sequence[int], num_heads: Sequence[int],
                           out_indices: Sequence[int], frozen_stages: int,
                           in_channels: int) -> Tuple[int, ...]:
    """mmaction2 1.2's checks, with its meaning: 1 to 4 stages, ``depths`` and ``num_heads``
    of one length, ``out_indices`` a non-empty list or tuple of stage indices. Raises an
    :class:`~mmvitswin.core.validate.ArgumentError` naming the bad argument (an
    ``AssertionError``, as mmaction2 asserts; an ``IndexError`` where it indexes out of
    range); returns ``out_indices`` as a tuple."""
    check_positive_int('in_channels', in_channels)
    depths = validate_stages(embed_dims, depths, num_heads, frozen_stages,
                             max_stages=4)['depths']
    return resolve_indices(out_indices, len(depths), allow_int=False)


def check_window_3d(window_size) -> Tuple[int, int, int]:
    """mmaction2's ``window_size``: a sequence of 3 ints ``(Wt, Wh, Ww)`` (it iterates it, so
    a bare int is a TypeError there too)."""
    if isinstance(window_size, numbers.Integral):
        raise ArgumentTypeError(f'window_size must be a sequence of 3 ints (Wt, Wh, Ww), got '
                                f'{window_size!r}')
    return to_tuple(window_size, 3, 'window_size')


class SwinTransformer3D(TransformerBackbone):
    """Video Swin Transformer returning ``(B, C_i, T', H_i, W_i)`` maps for ``out_indices``.

    Constructor, defaults and state-dict keys are those of mmaction2 1.2's
    ``SwinTransformer3D``: ``arch`` ('tiny' | 'small' | 'base' | 'large', their one-letter
    aliases, or a dict with ``embed_dims``, ``depths``, ``num_heads``), ``patch_size=(2, 4, 4)``,
    ``window_size=(8, 7, 7)``, ``out_indices=(3, )``, ... Like mmaction2, a single output stage
    is returned as a tensor and several as a tuple; ``out_after_downsample=True`` takes each
    stage's output after its patch merging (channels ``2 * C_i``, half the size).

    Pretrained weights: ``pretrained=PATH`` or ``init_cfg=dict(type='Pretrained',
    checkpoint=PATH)``. Video Swin checkpoints (mmaction2, also a whole ``Recognizer3D`` or a
    runner checkpoint) load as they are; any 2-D Swin checkpoint the 2-D loader accepts
    (mmdet/mmseg, Microsoft, timm) is inflated to 3-D. The kind is detected from the
    patch-embedding kernel, so ``pretrained2d`` is accepted for config compatibility only.

    ``frozen_stages`` follows mmaction2: ``0`` freezes the patch embedding, ``k >= 1`` also the
    first ``k`` stages (the output norms stay trainable).

    Arguments are accepted and refused as mmaction2 does (``tests/test_reference_args.py``
    holds the table); where it asserts, ours raises an
    :class:`~mmvitswin.core.validate.ArgumentError` naming the argument: an ``AssertionError``
    that is also a ``ValueError`` or ``TypeError``. One addition: an int ``patch_size``
    (mmaction2 documents it, then fails in its forward) means ``(p, p, p)``.
    """

    def __init__(self,
                 arch: Union[str, Dict] = 'tiny',
                 pretrained: Optional[str] = None,
                 pretrained2d: bool = True,
                 patch_size: Union[int, Sequence[int]] = (2, 4, 4),
                 in_channels: int = 3,
                 window_size: Union[int, Sequence[int]] = (8, 7, 7),
                 mlp_ratio: float = 4.,
                 qkv_bias: bool = True,
                 qk_scale: Optional[float] = None,
                 drop_rate: float = 0.,
                 attn_drop_rate: float = 0.,
                 drop_path_rate: float = 0.1,
                 act_cfg: dict = dict(type='GELU'),
                 norm_cfg: dict = dict(type='LN'),
                 patch_norm: bool = True,
                 frozen_stages: int = -1,
                 with_cp: bool = False,
                 out_indices: Union[int, Sequence[int]] = (3, ),
                 out_after_downsample: bool = False,
                 init_cfg: Optional[Union[dict, list]] = None):
        if pretrained is not None:
            if not isinstance(pretrained, str):
                raise ArgumentTypeError(f'pretrained must be a str (path or URL) or None, got '
                                f'{type(pretrained).__name__}')
            if init_cfg is not None:
                warnings.warn('SwinTransformer3D: pretrained is set, so init_cfg is ignored '
                              '(as in mmaction2)')
            init_cfg = dict(type='Pretrained', checkpoint=pretrained)
        super().__init__(init_cfg=init_cfg)

        preset = resolve_arch(arch, ARCH_ZOO, ARCH_ALIASES, SWIN_ARCH_KEYS, exact=True)
        embed_dims = preset['embed_dims']
        depths = tuple(preset['depths'])
        num_heads = tuple(preset['num_heads'])
        out_indices = validate_swin3d_config(embed_dims, depths, num_heads, out_indices,
                                             frozen_stages, in_channels)
        stage_cfg = check_swin_args(mlp_ratio, qk_scale, drop_rate, attn_drop_rate,
                                    drop_path_rate, act_cfg, norm_cfg, init_cfg, qkv_bias,
                                    with_cp, pretrained2d=pretrained2d, patch_norm=patch_norm,
                                    out_after_downsample=out_after_downsample)
        patch = to_tuple(patch_size, 3, 'patch_size')
        window = check_window_3d(window_size)

        self.arch_settings = dict(embed_dims=embed_dims, depths=depths, num_heads=num_heads)
        self.pretrained = pretrained
        self.pretrained2d = pretrained2d
        self.embed_dims = embed_dims
        self.depths = depths
        self.num_heads = num_heads
        self.num_layers = len(depths)
        self.in_channels = in_channels
        self.patch_size = patch
        self.window_size = window
        self.out_indices = out_indices
        self.out_after_downsample = out_after_downsample
        self.frozen_stages = frozen_stages
        stage_dims = [embed_dims * 2**i for i in range(self.num_layers)]
        if out_after_downsample:  # a stage's output is the next stage's input
            self.num_features = stage_dims[1:] + stage_dims[-1:]
        else:
            self.num_features = stage_dims

        self.patch_embed = PatchEmbed(in_channels, embed_dims, patch, norm=patch_norm,
                                      proj_name='proj')
        if patch_norm:
            self.patch_embed.norm = build_layer_norm(norm_cfg, embed_dims)
        self.pos_drop = nn.Dropout(drop_rate)

        # Merges 2x2 over space only; the neighbour order is the one mmaction2 (and the
        # Microsoft release it inflates) trained ``reduction`` with.
        self.layers = build_swin_stages(embed_dims, depths, num_heads, window,
                                        channel_order='microsoft', block_cls=SwinBlock3D,
                                        clamp_to_input=True, **stage_cfg)
        for i in out_indices:
            self.add_module(f'norm{i}', build_layer_norm(norm_cfg, self.num_features[i]))
        self._init_random()
        self._freeze_stages()

    # ------------------------------------------------------------------------------ modes
    def frozen_modules(self):
        """Modules frozen by ``frozen_stages``, in mmaction2's order."""
        if self.frozen_stages < 0:
            return []
        mods = [self.patch_embed]
        if self.frozen_stages >= 1:
            mods.append(self.pos_drop)
            mods.extend(self.layers[:self.frozen_stages])
        return mods

    # ---------------------------------------------------------------------------- forward
    def forward(self, x: torch.Tensor) -> Union[torch.Tensor, Tuple[torch.Tensor, ...]]:
        """x: (B, in_channels, T, H, W), any T, H, W >= 1 -> (B, C_i, T_i, H_i, W_i) per
        ``out_indices``: a tensor for one stage, else a tuple."""
        check_image_input(x, self.in_channels, ndim=5, model=self)
        x, _ = self.patch_embed(x)  # (B, T', H', W', C)
        x = self.pos_drop(x)
        outs = []
        for i, stage in enumerate(self.layers):
            out, merged = stage(x)
            if self.out_after_downsample and merged is not None:
                out = merged
            if i in self.out_indices:
                out = getattr(self, f'norm{i}')(out)
                outs.append(out.permute(0, 4, 1, 2, 3).contiguous())
            x = merged
        return outs[0] if len(outs) == 1 else tuple(outs)

    # ------------------------------------------------------------------------ checkpoints
    def checkpoint_family(self):
        return SWIN3D_CHECKPOINTS
