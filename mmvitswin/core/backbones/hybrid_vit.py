"""Hybrid ResNet50 + ViT backbone (the "R50+ViT-B/16" of the ViT paper) as a feature pyramid.

A ResNetV2-style CNN front end (weight-standardised convolutions, GroupNorm with 32 groups, no
BatchNorm, stages of (3, 4, 9) non-pre-activation bottlenecks) turns an image into a stride-16
map of 1024 channels; a 1x1 convolution maps it to ViT tokens, one per stride-16 cell (so the
ViT sees 14 x 14 = 196 tokens + CLS at 224 x 224); the shared ViT trunk of
:mod:`mmvitswin.core.backbones.vit` runs its blocks on them.

Pyramid (``out_indices`` picks among these four levels, ``out_channels`` projects them):

====== ======= ================================ ===============================
level  stride  source                           native channels
====== ======= ================================ ===============================
0      4       CNN stage 1 (3 bottlenecks)      ``cnn_channels[0]`` (256)
1      8       CNN stage 2 (4 bottlenecks)      ``cnn_channels[1]`` (512)
2      16      ViT output tokens (CLS dropped)  ``embed_dims`` (768)
3      32      2 x 2 max-pool of level 2        ``embed_dims`` (768)
====== ======= ================================ ===============================

Any ``H, W``: level ``i`` is ``ceil(H / stride_i) x ceil(W / stride_i)``. Every strided op
(stem conv, stem pool, the stride-2 3x3 convs and 1x1 shortcuts, the stride-32 pool) pads
TensorFlow-'SAME' style, which rounds up exactly like padding the image to a multiple of 32 and
cropping back would, without feeding tokens of an empty border into global attention.

Weight standardisation (:class:`StdConv2d`): per output channel ``o`` the kernel is replaced
by ``(w - mean_o) / sqrt(var_o + eps)`` with the *biased* variance over ``in/groups x kh x kw``
and ``eps = 1e-8`` -- the value timm's R50 hybrid (``vit_base_r50_s16_*``) uses, so its
weights reproduce its features; timm's generic ``StdConv2d`` default is 1e-6.
"""
from functools import partial
from typing import List, Optional, Sequence, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint as cp

from ..layers import (DropPath, MaxPool2dSame, StdConv2d, drop_path_schedule,  # noqa: F401
                      group_norm, resolve_indices, same_padding)
from ..utils import (check_bool, check_image_input, check_int, check_int_sequence,
                     check_positive_int, check_positive_number, check_probability)
from ..checkpoint.hybrid_vit import HYBRID_CHECKPOINTS
from .vit import VisionTransformerTrunk

# -------------------------------------------------------------------------------- layers
class Downsample(nn.Module):
    """Projection shortcut: strided 1x1 StdConv + GroupNorm (no activation)."""

    def __init__(self, in_channels: int, out_channels: int, stride: int, eps: float):
        super().__init__()
        self.conv = StdConv2d(in_channels, out_channels, 1, stride=stride, eps=eps)
        self.norm = group_norm(out_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.conv(x))


class Bottleneck(nn.Module):
    """Non-pre-activation bottleneck (ResNet v1.5 order, stride on the 3x3) with StdConv + GN.

    ``x: (B, in, H, W) -> (B, out, ceil(H / stride), ceil(W / stride))``:
    ``relu(norm3(conv3(relu(norm2(conv2(relu(norm1(conv1(x)))))))) + shortcut(x))``.
    Submodule names follow timm's ResNetV2 ``Bottleneck`` so hybrid checkpoints map 1:1.
    """

    def __init__(self, in_channels: int, out_channels: int, stride: int = 1,
                 project: bool = False, bottle_ratio: float = 0.25, drop_path_rate: float = 0.,
                 eps: float = 1e-8, with_cp: bool = False):
        super().__init__()
        mid = int(out_channels * bottle_ratio)
        self.with_cp = with_cp
        if not project and (stride != 1 or in_channels != out_channels):
            raise ValueError('a bottleneck that changes stride or channels needs project=True')
        self.downsample = Downsample(in_channels, out_channels, stride, eps) if project else None
        self.conv1 = StdConv2d(in_channels, mid, 1, eps=eps)
        self.norm1 = group_norm(mid)
        self.conv2 = StdConv2d(mid, mid, 3, stride=stride, eps=eps)
        self.norm2 = group_norm(mid)
        self.conv3 = StdConv2d(mid, out_channels, 1, eps=eps)
        self.norm3 = group_norm(out_channels)
        self.drop_path = DropPath(drop_path_rate)

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        shortcut = x if self.downsample is None else self.downsample(x)
        y = F.relu(self.norm1(self.conv1(x)))
        y = F.relu(self.norm2(self.conv2(y)))
        y = self.norm3(self.conv3(y))
        return F.relu(self.drop_path(y) + shortcut)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.with_cp and x.requires_grad:
            return cp.checkpoint(self._forward, x, use_reentrant=False)
        return self._forward(x)


class ResNetStage(nn.Module):
    """``depth`` bottlenecks; the first one strides and always carries the projection shortcut
    (as in timm, even when stride and width would allow an identity)."""

    def __init__(self, in_channels: int, out_channels: int, depth: int, stride: int,
                 drop_path_rates: Sequence[float], eps: float, with_cp: bool = False):
        super().__init__()
        self.blocks = nn.Sequential(*[
            Bottleneck(in_channels if i == 0 else out_channels, out_channels,
                       stride=stride if i == 0 else 1, project=i == 0,
                       drop_path_rate=drop_path_rates[i], eps=eps, with_cp=with_cp)
            for i in range(depth)
        ])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks(x)


class ResNetStem(nn.Module):
    """7x7/2 StdConv ('same') + GN + ReLU + 3x3/2 max-pool ('same'): stride 4."""

    def __init__(self, in_channels: int, out_channels: int = 64, eps: float = 1e-8):
        super().__init__()
        self.conv = StdConv2d(in_channels, out_channels, 7, stride=2, eps=eps)
        self.norm = group_norm(out_channels)
        self.pool = MaxPool2dSame(kernel_size=3, stride=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(F.relu(self.norm(self.conv(x))))


class ResNetV2FrontEnd(nn.Module):
    """The hybrid's CNN: stem (stride 4), then stages with strides 1, 2, 2, ...

    ``forward(x: (B, in, H, W))`` returns the list of stage outputs; with the default
    ``depths=(3, 4, 9)``, ``channels=(256, 512, 1024)`` at 224 x 224 they are
    (256, 56, 56), (512, 28, 28), (1024, 14, 14). Key names match timm's ``ResNetV2``
    (``stem.conv``, ``stem.norm``, ``stages.{i}.blocks.{j}.{conv,norm}{1,2,3}``,
    ``...downsample.{conv,norm}``).
    """

    def __init__(self, in_channels: int = 3, stem_channels: int = 64,
                 depths: Sequence[int] = (3, 4, 9), channels: Sequence[int] = (256, 512, 1024),
                 drop_path_rate: float = 0., eps: float = 1e-8, with_cp: bool = False):
        super().__init__()
        if len(depths) != len(channels) or not depths:
            raise ValueError(f'cnn_depths {tuple(depths)} and cnn_channels {tuple(channels)} '
                             'must be non-empty and of the same length')
        if any(d < 1 for d in depths):
            raise ValueError(f'cnn_depths must be positive, got {tuple(depths)}')
        for c in channels:
            if c % 4 or (c // 4) % 32:
                raise ValueError(f'cnn_channels must be multiples of 128 (bottleneck width '
                                 f'c/4 is group-normed in 32 groups), got {tuple(channels)}')
        self.depths = tuple(depths)
        self.channels = tuple(channels)
        self.stem = ResNetStem(in_channels, stem_channels, eps=eps)
        rates = drop_path_schedule(drop_path_rate, depths)
        self.stages = nn.Sequential()
        prev = stem_channels
        for i, (d, c) in enumerate(zip(depths, channels)):
            self.stages.add_module(str(i), ResNetStage(
                prev, c, d, stride=1 if i == 0 else 2, drop_path_rates=rates[i], eps=eps,
                with_cp=with_cp))
            prev = c

    @property
    def stride(self) -> int:
        return 4 * 2**(len(self.depths) - 1)

    def forward(self, x: torch.Tensor) -> List[torch.Tensor]:
        x = self.stem(x)
        outs = []
        for stage in self.stages:
            x = stage(x)
            outs.append(x)
        return outs


class HybridEmbed(nn.Module):
    """The hybrid's patch embedding: CNN front end + 1x1 projection to ``embed_dims``.

    ``forward(x: (B, C_in, H, W))`` returns ``(tokens (B, h, w, embed_dims), (h, w), maps)``
    with ``h = ceil(H / 16)``, ``w = ceil(W / 16)`` and ``maps`` the CNN stage outputs
    (strides 4, 8, 16) that the hybrid's pyramid uses beside the tokens; the ViT trunk reads the
    first two entries (its patch-embedding interface). ``map_channels`` are the maps' widths.
    The names ``backbone`` / ``proj`` are timm's (``patch_embed.backbone.*``,
    ``patch_embed.proj.*``), so its checkpoints map without renaming.
    """

    def __init__(self, backbone: ResNetV2FrontEnd, embed_dims: int):
        super().__init__()
        self.backbone = backbone
        # kernel 1, stride 1: one token per stride-16 CNN cell, only the channels change.
        self.proj = nn.Conv2d(backbone.channels[-1], embed_dims, kernel_size=1, stride=1)
        self.map_channels = tuple(backbone.channels)
        self.depths = tuple(backbone.depths)

    def forward(self, x: torch.Tensor
                ) -> Tuple[torch.Tensor, Tuple[int, int], List[torch.Tensor]]:
        maps = self.backbone(x)
        tokens = self.proj(maps[-1])
        return tokens.permute(0, 2, 3, 1), (tokens.shape[2], tokens.shape[3]), maps

    def frozen_modules(self, stages: int) -> List[nn.Module]:
        """The CNN parts frozen by ``stages``: -1 none, 0 the stem, ``k`` also stages
        ``0..k-1`` (the projection belongs to the trunk's embedding and freezes with it)."""
        if stages < 0:
            return []
        return [self.backbone.stem] + list(self.backbone.stages[:stages])

    @classmethod
    def build(cls, in_channels: int, embed_dims: int, **cnn_cfg) -> 'HybridEmbed':
        """The factory the trunk calls (``patch_embed=partial(HybridEmbed.build, ...)``):
        a :class:`ResNetV2FrontEnd` of ``cnn_cfg`` and the projection to ``embed_dims``."""
        return cls(ResNetV2FrontEnd(in_channels, **cnn_cfg), embed_dims)


def _level_channels(out_channels, native: Sequence[int]) -> List[Optional[int]]:
    """``out_channels`` (None, int, or 4 entries of int/None) -> one entry per level."""
    if out_channels is None or (isinstance(out_channels, int) and
                                not isinstance(out_channels, bool)):
        return [out_channels] * len(native)
    if not isinstance(out_channels, (list, tuple)) or len(out_channels) != len(native):
        raise TypeError(f'out_channels must be None, an int or a list of {len(native)} '
                        f'ints/None (one per level), got {out_channels!r}')
    return list(out_channels)


# --------------------------------------------------------------------------------- model
class HybridViT(VisionTransformerTrunk):
    """Hybrid ResNetV2 + ViT ("R50+ViT-B/16") backbone returning a 4-level NCHW pyramid.

    It is the shared ViT trunk (:class:`~mmvitswin.core.backbones.vit.VisionTransformerTrunk`)
    with :class:`HybridEmbed` injected as its patch embedding (``patch_embed=HybridEmbed.build``,
    built by the trunk once ``in_channels``/``embed_dims`` are resolved), so the ViT part (CLS token, pos-embed
    resizing, blocks, windowing, rel-pos, layer-decay depths) is the same code as ``ViTAdapter``.
    See the module docstring for the levels and sizes: for ``(B, C_in, H, W)`` level ``i``
    (stride ``s`` = 4, 8, 16, 32) is ``(B, C_i, ceil(H / s), ceil(W / s))`` for any H, W.

    Args (the ViT ones, ``**vit_kwargs``, go to the trunk unchanged: ``embed_dims``,
    ``num_layers``, ``num_heads``, ``mlp_ratio``, ``qkv_bias``, drop rates, ``norm_cfg``,
    ``act_cfg``, ``interpolate_mode``, windowing, ``pretrained``, ``init_cfg``; defaults give
    timm's ``vit_base_r50_s16_*``):
        arch: ViT preset ('tiny' | 'small' | 'base' | 'large' | dict); explicit ``embed_dims``/
            ``num_layers``/``num_heads``/``mlp_ratio`` override it.
        img_size: pretraining image size; ``pos_embed`` holds ``(img_size / 16)**2 + 1``
            entries and is resized bicubically (CLS kept apart) to the actual grid.
        cnn_depths, cnn_channels, stem_channels: the front end (three stages, strides 4, 8,
            16; (3, 4, 9) / (256, 512, 1024) / 64 is the ViT paper's R50 with the fourth
            stage's blocks moved into the third). ``ws_eps``: weight-standardisation eps.
        out_channels: None keeps the native channels (256, 512, embed_dims, embed_dims); an
            int or a list of 4 (int or None per level) adds a 1x1 conv (+ GroupNorm(32) when
            ``out_norm``) to that level.
        out_indices: pyramid levels to return (0..3).
        final_norm: apply the trunk's final LayerNorm to the stride-16 tokens (timm's
            ``norm``; True so its weights are used).
        frozen_stages: -1 nothing; 0 the CNN stem; 1, 2 also CNN stages 1, 2 (sources of
            levels 0, 1); 3 also CNN stage 3, ``patch_embed.proj``, CLS and pos-embed (the
            whole embedding); ``3 + k`` also ViT blocks ``0..k-1``; ``3 + num_layers`` also the
            final norm. Frozen parts get no grad and stay in eval mode; the level projections
            are never frozen (they are new for every task).
        with_cp: activation checkpointing in every CNN bottleneck and ViT block.
        init_cfg: ``dict(type='Pretrained', checkpoint=...)`` loads timm's hybrid layout or
            ours, detected from the keys (:mod:`mmvitswin.core.checkpoint.hybrid_vit`).
    """

    CNN_STRIDE = 16

    def __init__(self,
                 arch='base',
                 img_size=224,
                 in_channels: int = 3,
                 cnn_depths: Sequence[int] = (3, 4, 9),
                 cnn_channels: Sequence[int] = (256, 512, 1024),
                 stem_channels: int = 64,
                 ws_eps: float = 1e-8,
                 out_channels=None,
                 out_norm: bool = True,
                 out_indices: Sequence[int] = (0, 1, 2, 3),
                 cnn_drop_path_rate: float = 0.,
                 final_norm: bool = True,
                 with_cp: bool = False,
                 frozen_stages: int = -1,
                 **vit_kwargs):
        cnn_depths = check_int_sequence('cnn_depths', cnn_depths)
        cnn_channels = check_int_sequence('cnn_channels', cnn_channels)
        if len(cnn_depths) != 3 or len(cnn_channels) != 3:
            raise ValueError(f'cnn_depths and cnn_channels need 3 stages (strides 4, 8, 16), got '
                             f'{tuple(cnn_depths)} and {tuple(cnn_channels)}')
        if check_positive_int('stem_channels', stem_channels) % 32:
            raise ValueError(f'stem_channels must be a multiple of 32 (GroupNorm(32) follows the '
                             f'stem conv), got {stem_channels!r}')
        check_positive_number('ws_eps', ws_eps)
        check_probability('cnn_drop_path_rate', cnn_drop_path_rate)
        check_bool('out_norm', out_norm)
        cnn_cfg = dict(stem_channels=stem_channels, depths=cnn_depths, channels=cnn_channels,
                       drop_path_rate=cnn_drop_path_rate, eps=ws_eps, with_cp=with_cp)
        # the trunk builds the embedding once in_channels and embed_dims are resolved
        super().__init__(arch, img_size=img_size, patch_size=self.CNN_STRIDE,
                         in_channels=in_channels, final_norm=final_norm, with_cp=with_cp,
                         patch_embed=partial(HybridEmbed.build, **cnn_cfg), **vit_kwargs)
        self.out_indices = resolve_indices(out_indices, 4, 'pyramid levels')
        self.frozen_stages = check_int('frozen_stages', frozen_stages, -1, 3 + self.num_layers)
        dims, cnn_channels = self.embed_dims, self.patch_embed.map_channels
        self.cnn_depths = self.patch_embed.depths
        self.strides = (4, 8, 16, 32)
        native = [cnn_channels[0], cnn_channels[1], dims, dims]
        wanted = _level_channels(out_channels, native)
        projs = []
        for level, (c_in, c_out) in enumerate(zip(native, wanted)):
            if c_out is None:
                projs.append(nn.Identity())
                continue
            if isinstance(c_out, bool) or not isinstance(c_out, int) or c_out < 1:
                raise ValueError(f'out_channels[{level}] must be a positive int or None, got '
                                 f'{c_out!r}')
            if out_norm and c_out % 32:
                raise ValueError(f'out_channels[{level}]={c_out} must be divisible by 32 for '
                                 'GroupNorm(32) (or set out_norm=False)')
            layers = [nn.Conv2d(c_in, c_out, 1, bias=not out_norm)]
            if out_norm:
                layers.append(nn.GroupNorm(32, c_out))
            projs.append(nn.Sequential(*layers))
        self.level_projs = nn.ModuleList(projs)
        self.num_features = [c if w is None else w for c, w in zip(native, wanted)]
        self.downsample32 = MaxPool2dSame(kernel_size=2, stride=2)
        self._freeze_stages()

    # ------------------------------------------------------------------------------ modes
    def frozen_modules(self) -> List[nn.Module]:
        """Modules frozen by ``frozen_stages`` (see the class docstring), input side first: the
        CNN stem and stages, then (from 3 on) the trunk's embedding and blocks."""
        return (self.patch_embed.frozen_modules(min(self.frozen_stages, 3)) +
                self.trunk_frozen_modules(self.frozen_stages - 3))

    def frozen_parameters(self) -> List[nn.Parameter]:
        return self.trunk_frozen_parameters(self.frozen_stages - 3)

    # ---------------------------------------------------------------------------- forward
    def forward_vit_input(self, x: torch.Tensor):
        """Run the front end: ``(cnn maps [s4, s8, s16], seq (B, 1 + h*w, C), grid)``; ``seq``
        is what the first ViT block receives (CLS + pos-embed added)."""
        tokens, grid, feats = self.patch_embed(x)
        seq, grid = self.embed_tokens(tokens, grid)
        return feats, seq, grid

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        """x: (B, in_channels, H, W), any H, W >= 1 -> tuple of (B, C_i, ceil(H/s_i),
        ceil(W/s_i)) for the levels in ``out_indices``.

        No global padding is needed: every strided op pads TF-'SAME' style, so the CNN maps
        are already ``ceil(H / s)`` and the ViT attends to real tokens only (padding the
        image to 32 would add tokens of an empty border to the global attention and change
        the features of the image itself).
        """
        check_image_input(x, self.in_channels, model=self)
        feats, seq, grid = self.forward_vit_input(x)
        vit_map, = self.forward_intermediates(x, embedded=(seq, grid))
        levels = [feats[0], feats[1], vit_map]
        if 3 in self.out_indices:
            levels.append(self.downsample32(vit_map))
        return tuple(self.level_projs[i](levels[i]) for i in self.out_indices)

    # ------------------------------------------------------------------------ checkpoints
    def checkpoint_family(self):
        return HYBRID_CHECKPOINTS
