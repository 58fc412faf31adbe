"""Plain Vision Transformer trunk and ``ViTAdapter``: a ViT as a 4-level NCHW pyramid.

Layout (timm-like): pure functions first, then layers, then the trunk, then the registered
backbone. The checkpoint filter lives in :mod:`mmvitswin.checkpoint.vit`.

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

from ...registry import MODELS
from ..layers import (FFN, Attention, ConvStem, DropPath, LayerNorm2d, PatchEmbed,  # noqa: F401
                      ceil_div, linear_drop_path, pad_amount, pad_to_multiple, resize_pos_embed,
                      resize_rel_pos_1d, to_tuple, window_partition, window_reverse)
from .base import TransformerBackbone, init_linear_and_norm, pretrained_to_init_cfg
from ..utils import (build_act, build_layer_norm, check_bool, check_choice,
                     check_image_input, check_int, check_int_sequence, check_optional_dict,
                     check_positive_int, check_positive_number, check_probability)

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
ARCH_ALIASES = {'t': 'tiny', 's': 'small', 'b': 'base', 'l': 'large', 'h': 'huge',
                'deit-tiny': 'tiny', 'deit-small': 'small', 'deit-base': 'base'}
ADAPTERS = (None, 'simple', 'interaction')


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


def crop_to(x: torch.Tensor, size: Tuple[int, int]) -> torch.Tensor:
    """Crop an NCHW map at the bottom/right to ``size`` (undoes corner padding)."""
    return x[..., :size[0], :size[1]]


# --------------------------------------------------------------------------------- layers
class ViTAttention(Attention):
    """``layers.Attention`` plus optional decomposed relative positions (ViTDet ``use_rel_pos``).

    The relative term is built as an additive bias and handed to ``Attention.attend``, so SDPA
    stays in use. ``rel_pos_size`` is the (h, w) grid the per-axis tables ``rel_pos_h: (2h-1,
    head_dim)`` and ``rel_pos_w: (2w-1, head_dim)`` are built for; other grids resize them.
    """

    def __init__(self, dim: int, num_heads: int, rel_pos_size: Optional[Tuple[int, int]] = None,
                 **kwargs):
        super().__init__(dim, num_heads, **kwargs)
        self.use_rel_pos = rel_pos_size is not None
        if self.use_rel_pos:
            # zero init as ViTDet (rel_pos_zero_init=True): training starts from plain ViT.
            self.rel_pos_h = nn.Parameter(torch.zeros(2 * rel_pos_size[0] - 1, self.head_dim))
            self.rel_pos_w = nn.Parameter(torch.zeros(2 * rel_pos_size[1] - 1, self.head_dim))

    def forward(self, x: torch.Tensor, grid: Optional[Tuple[int, int]] = None,
                num_prefix: int = 0) -> torch.Tensor:
        """x: (B, num_prefix + h*w, C) -> same shape; ``grid = (h, w)`` needed with rel pos."""
        if not self.use_rel_pos:
            return super().forward(x)
        q, k, v = self.qkv_heads(x)
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
                 norm_cfg: Optional[dict] = None, with_cp: bool = False):
        super().__init__()
        self.window_size = window_size
        self.with_cp = with_cp
        self.norm1 = build_layer_norm(norm_cfg, embed_dims)
        if window_size and rel_pos_size is not None:
            rel_pos_size = (window_size, window_size)
        self.attn = ViTAttention(embed_dims, num_heads, rel_pos_size=rel_pos_size,
                                 qkv_bias=qkv_bias, attn_drop=attn_drop_rate,
                                 proj_drop=drop_rate)
        self.norm2 = build_layer_norm(norm_cfg, embed_dims)
        self.ffn = FFN(embed_dims, feedforward_channels, drop=drop_rate,
                       act_layer=build_act(act_cfg))
        self.drop_path = DropPath(drop_path_rate)

    def _attention(self, x: torch.Tensor, grid: Tuple[int, int], num_prefix: int):
        if not self.window_size:
            return self.attn(x, grid, num_prefix)
        b, _, c = x.shape
        prefix, tokens = x[:, :num_prefix], x[:, num_prefix:]
        window = (self.window_size, self.window_size)
        tokens, padded = pad_to_multiple(tokens.reshape(b, grid[0], grid[1], c), window)
        out = self.attn(window_partition(tokens, window), window, 0)
        out = window_reverse(out, window, padded)[:, :grid[0], :grid[1]]
        out = out.reshape(b, grid[0] * grid[1], c)
        if num_prefix:
            out = torch.cat([torch.zeros_like(prefix), out], dim=1)
        return out

    def _forward(self, x: torch.Tensor, grid: Tuple[int, int], num_prefix: int):
        x = x + self.drop_path(self._attention(self.norm1(x), grid, num_prefix))
        return x + self.drop_path(self.ffn(self.norm2(x)))

    def forward(self, x: torch.Tensor, grid: Tuple[int, int], num_prefix: int = 0):
        if self.with_cp and x.requires_grad:
            return cp.checkpoint(self._forward, x, grid, num_prefix, use_reentrant=False)
        return self._forward(x, grid, num_prefix)


class SimpleFeaturePyramid(nn.Module):
    """ViTDet's simple feature pyramid: strides 4, 8, 16, 32 from one stride-``in_stride`` map.

    For a stride-16 map (ViTDet): x4 = two 2x2 stride-2 deconvolutions with LayerNorm2d + GELU
    between, x2 = one deconvolution, x1 = identity, x1/2 = 2x2 max-pool. Other power-of-two
    strides shift the same recipe (stride 8: x2, identity, /2 and /4 max-pools). Each level
    then goes through 1x1 conv + LayerNorm2d + 3x3 conv + LayerNorm2d to ``out_channels``
    (convs without bias, as the norms follow). ``forward((B, C, h, w))`` returns four NCHW maps,
    finest first.
    """

    def __init__(self, in_channels: int, out_channels: int = 256, in_stride: int = 16):
        super().__init__()
        check_positive_int('in_channels', in_channels)
        check_positive_int('out_channels', out_channels)
        check_choice('in_stride', in_stride, (4, 8, 16, 32))
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
        return [head(rescale(x)) for head, rescale in zip(self.outputs, self.rescale)]


# ---------------------------------------------------------------------------------- trunk
class VisionTransformerTrunk(TransformerBackbone):
    """Plain ViT trunk: patch embedding, CLS token, abs pos-embed, blocks, final norm.

    Unregistered; :class:`ViTAdapter` (and the hybrid ResNet+ViT) build on it. Parameter names
    (our checkpoint layout): ``patch_embed.proj``, ``cls_token``, ``pos_embed``, ``norm_pre``,
    ``blocks.{i}.{norm1,attn.qkv,attn.proj,attn.rel_pos_h,attn.rel_pos_w,norm2,ffn.layers.0.0,
    ffn.layers.1}``, ``norm``.

    Interface for subclasses and adapters:

    - ``patch_embed`` (ctor arg): optional replacement module. It must map ``(B, C_in, H, W)``
      to ``(tokens (B, h, w, embed_dims), (h, w))`` like ``layers.PatchEmbed``, with ``h, w``
      a function of H, W only. It is stored as ``self.patch_embed`` (so layer decay gives it
      depth 0). ``patch_size`` must then be its total stride: it sets the pretraining grid
      ``img_size // patch_size`` of ``pos_embed`` and the adapter padding.
    - ``prepare_tokens(x) -> (seq, grid)``: image ``(B, C_in, H, W)`` to the token sequence
      ``seq: (B, P + h*w, C)`` (``P = num_prefix_tokens`` CLS tokens first, then the grid
      row-major) with pos-embed added (resized bicubically to ``grid``), dropout, pre-norm.
    - ``forward_blocks(seq, grid, start, end) -> seq``: run ``blocks[start:end]``.
    - ``seq_to_map(seq, grid) -> (B, C, h, w)``: drop the prefix tokens, go NCHW.
    - ``forward(x)``: the maps after each block in ``out_indices`` (``final_norm`` applied
      after the last block), as mmseg's ``VisionTransformer``.

    Args (OpenMMLab names where mmseg has one): ``img_size`` pretraining size of ``pos_embed``;
    ``window_size``/``global_attn_indexes`` ViTDet windowing (0: all global; with a window the
    listed blocks stay global, default the last of each quarter); ``use_rel_pos`` decomposed
    relative positions (window tables ``2w-1`` rows, global ones ``2 * img_size/p - 1``);
    ``frozen_stages``: -1 none, 0 patch embed + CLS + pos-embed (+ pre-norm), ``k`` also blocks
    ``0..k-1``, ``num_layers`` also the final norm (frozen parts: no grad and eval mode).
    ``stem``: ``'patch'`` (default, the ViT patchify conv that checkpoints carry) or ``'conv'``
    (:class:`layers.ConvStem`, for training from scratch).
    """

    def __init__(self,
                 arch='base',
                 img_size=224,
                 patch_size: Optional[int] = None,
                 in_channels: int = 3,
                 embed_dims: Optional[int] = None,
                 num_layers: Optional[int] = None,
                 num_heads: Optional[int] = None,
                 mlp_ratio: Optional[float] = None,
                 out_indices=-1,
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
                 final_norm: bool = False,
                 interpolate_mode: str = 'bicubic',
                 window_size: int = 0,
                 global_attn_indexes: Optional[Sequence[int]] = None,
                 use_rel_pos: bool = False,
                 with_cp: bool = False,
                 frozen_stages: int = -1,
                 patch_embed: Optional[nn.Module] = None,
                 stem: str = 'patch',
                 pretrained: Optional[str] = None,
                 init_cfg=None):
        super().__init__(init_cfg=pretrained_to_init_cfg(pretrained, init_cfg))
        if stem not in ('patch', 'conv'):
            raise ValueError(f"stem must be 'patch' (one patchify conv) or 'conv' (3x3 conv "
                             f"stem), got {stem!r}")
        if stem != 'patch' and patch_embed is not None:
            raise ValueError(f'stem={stem!r} and a patch_embed module exclude each other')
        preset = self._resolve_arch(arch)
        embed_dims = preset['embed_dims'] if embed_dims is None else embed_dims
        num_layers = preset['num_layers'] if num_layers is None else num_layers
        num_heads = preset['num_heads'] if num_heads is None else num_heads
        patch_size = preset.get('patch_size', 16) if patch_size is None else patch_size
        for name, value in (('embed_dims', embed_dims), ('num_layers', num_layers),
                            ('num_heads', num_heads), ('patch_size', patch_size),
                            ('in_channels', in_channels)):
            check_positive_int(name, value)
        if mlp_ratio is not None:
            check_positive_number('mlp_ratio', mlp_ratio)
        ffn_dims = (preset['feedforward_channels'] * embed_dims // preset['embed_dims']
                    if mlp_ratio is None else int(mlp_ratio * embed_dims))
        if ffn_dims < 1:
            raise ValueError(f'mlp_ratio * embed_dims must give a hidden width >= 1, got '
                             f'mlp_ratio={mlp_ratio!r}, embed_dims={embed_dims}')
        if embed_dims % num_heads:
            raise ValueError(f'embed_dims ({embed_dims}) must be divisible by num_heads '
                             f'({num_heads})')
        for name, rate in (('drop_rate', drop_rate), ('attn_drop_rate', attn_drop_rate),
                           ('drop_path_rate', drop_path_rate)):
            check_probability(name, rate)
        for name, flag in (('qkv_bias', qkv_bias), ('with_cls_token', with_cls_token),
                           ('patch_norm', patch_norm), ('patch_bias', patch_bias),
                           ('pre_norm', pre_norm), ('final_norm', final_norm),
                           ('use_rel_pos', use_rel_pos), ('with_cp', with_cp)):
            check_bool(name, flag)
        check_choice('interpolate_mode', interpolate_mode, ('bicubic', 'bilinear'))
        check_optional_dict('norm_cfg', norm_cfg)
        check_optional_dict('act_cfg', act_cfg)
        check_optional_dict('init_cfg', init_cfg, allow_list=True)
        if isinstance(window_size, bool) or not isinstance(window_size, int) or window_size < 0:
            raise ValueError(f'window_size must be an int >= 0 (0: global attention), got '
                             f'{window_size!r}')
        check_int('frozen_stages', frozen_stages, -1, num_layers)
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
        self.out_indices = self._resolve_out_indices(out_indices, num_layers)

        self.arch_settings = dict(embed_dims=embed_dims, num_layers=num_layers,
                                  num_heads=num_heads, feedforward_channels=ffn_dims)
        self.in_channels = in_channels
        self.patch_size = patch_size
        self.embed_dims = embed_dims
        self.num_layers = num_layers
        self.num_heads = num_heads
        self.with_cls_token = with_cls_token
        self.num_prefix_tokens = 1 if with_cls_token else 0
        self.interpolate_mode = interpolate_mode
        self.window_size = window_size
        self.global_attn_indexes = global_attn_indexes
        self.use_rel_pos = use_rel_pos
        self.final_norm = final_norm
        self.frozen_stages = frozen_stages

        if patch_embed is None and stem == 'conv':
            patch_embed = ConvStem(in_channels, embed_dims, patch_size)
        elif patch_embed is None:
            patch_embed = PatchEmbed(in_channels, embed_dims, (patch_size, patch_size),
                                     norm=False, proj_name='proj', bias=patch_bias)
            if patch_norm:
                patch_embed.norm = build_layer_norm(norm_cfg, embed_dims)
        elif not isinstance(patch_embed, nn.Module):
            raise TypeError(f'patch_embed must be an nn.Module or None, got '
                            f'{type(patch_embed).__name__}')
        self.patch_embed = patch_embed
        if with_cls_token:
            self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dims))
        # One CLS entry is always stored (also without a CLS token) so checkpoints map 1:1.
        self.pos_embed = nn.Parameter(
            torch.zeros(1, 1 + self.pretrain_grid[0] * self.pretrain_grid[1], embed_dims))
        self.drop_after_pos = nn.Dropout(drop_rate)
        self.norm_pre = build_layer_norm(norm_cfg, embed_dims) if pre_norm else None

        rates = linear_drop_path(drop_path_rate, num_layers)
        self.blocks = nn.ModuleList([
            ViTBlock(embed_dims, num_heads, ffn_dims,
                     window_size=0 if i in global_attn_indexes else window_size,
                     rel_pos_size=self.pretrain_grid if use_rel_pos else None,
                     qkv_bias=qkv_bias, drop_rate=drop_rate, attn_drop_rate=attn_drop_rate,
                     drop_path_rate=rates[i], act_cfg=act_cfg, norm_cfg=norm_cfg,
                     with_cp=with_cp) for i in range(num_layers)
        ])
        self.norm = build_layer_norm(norm_cfg, embed_dims) if final_norm else None
        self._init_random()
        self._freeze_stages()

    # ----------------------------------------------------------------------------- config
    @staticmethod
    def _resolve_arch(arch) -> dict:
        if isinstance(arch, dict):
            missing = {'embed_dims', 'num_layers', 'num_heads', 'feedforward_channels'} - set(arch)
            if missing:
                raise ValueError(f'arch dict is missing {sorted(missing)}')
            return arch
        if not isinstance(arch, str):
            raise TypeError(f'arch must be a str or dict, got {type(arch).__name__}')
        name = ARCH_ALIASES.get(arch.lower(), arch.lower())
        if name not in ARCH_ZOO:
            raise ValueError(f'arch must be one of {sorted(ARCH_ZOO)} (or a dict), got {arch!r}')
        return ARCH_ZOO[name]

    @staticmethod
    def _resolve_out_indices(out_indices, num_layers: int) -> Tuple[int, ...]:
        if isinstance(out_indices, int) and not isinstance(out_indices, bool):
            out_indices = (out_indices, )
        if not isinstance(out_indices, (list, tuple)):
            raise TypeError(f'out_indices must be an int, list or tuple, got {out_indices!r}')
        resolved = []
        for i in out_indices:
            if isinstance(i, bool) or not isinstance(i, int) or not -num_layers <= i < num_layers:
                raise ValueError(f'out_indices must be block indices in [-{num_layers}, '
                                 f'{num_layers - 1}], got {tuple(out_indices)}')
            resolved.append(i % num_layers)
        return tuple(resolved)

    # ---------------------------------------------------------------------------- weights
    def _init_random(self) -> None:
        """timm/mmseg init: trunc-normal(0.02) for pos-embed, CLS and linear weights."""
        nn.init.trunc_normal_(self.pos_embed, std=0.02)
        if self.with_cls_token:
            nn.init.trunc_normal_(self.cls_token, std=0.02)
        # adapters and a replacement stem keep their own init
        init_linear_and_norm(
            m for name, m in self.named_modules()
            if not (name.startswith('adapter.') or (name.startswith('patch_embed.') and
                                                   not isinstance(self.patch_embed, PatchEmbed))))

    def convert_checkpoint(self, state_dict):
        """Any supported ViT state dict -> this model's keys and sizes (used by init_cfg)."""
        from ...checkpoint.vit import adapt_vit_state_dict, convert_vit_state_dict
        converted, _ = convert_vit_state_dict(state_dict)
        return adapt_vit_state_dict(converted, self)

    # ------------------------------------------------------------------------ layer decay
    def get_layer_depth(self, param_name: str) -> int:
        """Depth for layer-wise lr decay: 0 for the embedding (patch embed, CLS, pos-embed,
        pre-norm), ``i + 1`` for ``blocks.i``, ``num_layers + 1`` for everything after."""
        if param_name.startswith(('patch_embed.', 'norm_pre.')) or param_name in (
                'cls_token', 'pos_embed'):
            return 0
        if param_name.startswith('blocks.'):
            return int(param_name.split('.')[1]) + 1
        return self.num_layers + 1

    # ------------------------------------------------------------------------------ modes
    def frozen_modules(self) -> List[nn.Module]:
        if self.frozen_stages < 0:
            return []
        mods = [self.patch_embed, self.drop_after_pos]
        if self.norm_pre is not None:
            mods.append(self.norm_pre)
        mods += list(self.blocks[:self.frozen_stages])
        if self.frozen_stages == self.num_layers and self.norm is not None:
            mods.append(self.norm)
        return mods

    def frozen_parameters(self) -> List[nn.Parameter]:
        if self.frozen_stages < 0:
            return []
        return [self.pos_embed] + ([self.cls_token] if self.with_cls_token else [])

    # ---------------------------------------------------------------------------- forward
    def prepare_tokens(self, x: torch.Tensor) -> Tuple[torch.Tensor, Tuple[int, int]]:
        """x: (B, C_in, H, W) -> (seq (B, P + h*w, C), grid (h, w)); see class docstring."""
        tokens, grid = self.patch_embed(x)
        return self.embed_tokens(tokens, grid)

    def embed_tokens(self, tokens: torch.Tensor,
                     grid: Tuple[int, int]) -> Tuple[torch.Tensor, Tuple[int, int]]:
        """Patch-embedding output ``tokens: (B, h, w, C)`` -> ``(seq, grid)`` as
        :meth:`prepare_tokens` (CLS, resized pos-embed, dropout, pre-norm). Lets a caller that
        ran ``patch_embed`` itself (the hybrid keeps the CNN maps) finish the embedding."""
        b = tokens.shape[0]
        tokens = tokens.reshape(b, grid[0] * grid[1], -1)
        pos = resize_pos_embed(self.pos_embed, self.pretrain_grid, grid, num_prefix_tokens=1,
                               mode=self.interpolate_mode)
        seq = tokens + pos[:, 1:]
        if self.with_cls_token:
            seq = torch.cat([(self.cls_token + pos[:, :1]).expand(b, -1, -1), seq], dim=1)
        seq = self.drop_after_pos(seq)
        if self.norm_pre is not None:
            seq = self.norm_pre(seq)
        return seq, tuple(grid)

    def forward_blocks(self, seq: torch.Tensor, grid: Tuple[int, int], start: int = 0,
                       end: Optional[int] = None) -> torch.Tensor:
        """Run ``blocks[start:end]`` on ``seq: (B, P + h*w, C)``; returns the same shape."""
        for block in self.blocks[start:end]:
            seq = block(seq, grid, self.num_prefix_tokens)
        return seq

    def seq_to_map(self, seq: torch.Tensor, grid: Tuple[int, int]) -> torch.Tensor:
        """(B, P + h*w, C) -> (B, C, h, w), prefix tokens dropped."""
        tokens = seq[:, self.num_prefix_tokens:]
        return tokens.transpose(1, 2).reshape(seq.shape[0], -1, grid[0], grid[1]).contiguous()

    def forward_trunk(self, x: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        """Maps (B, C, ceil(H/p), ceil(W/p)) after each block in ``out_indices``."""
        seq, grid = self.prepare_tokens(x)
        outs = []
        for i, block in enumerate(self.blocks):
            seq = block(seq, grid, self.num_prefix_tokens)
            if i == self.num_layers - 1 and self.norm is not None:
                seq = self.norm(seq)
            if i in self.out_indices:
                outs.append(self.seq_to_map(seq, grid))
        return tuple(outs)

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        check_image_input(x, self.in_channels, model=self)
        return self.forward_trunk(x)


# ------------------------------------------------------------------------------- backbone
@MODELS.register_module()
class ViTAdapter(VisionTransformerTrunk):
    """ViT backbone for dense prediction: the plain trunk or a 4-level pyramid.

    ``adapter=None``: the trunk's maps at stride ``p`` for ``out_indices`` (block indices,
    default the last block), as mmseg's ``VisionTransformer``. ``adapter='simple'``: ViTDet's
    simple feature pyramid from the last block (``adapter_cfg``: ``out_channels``, default
    256). ``adapter='interaction'``: ViT-Adapter's spatial prior module + injector/extractor
    interactions over groups of blocks (``adapter_cfg`` goes to that module). In adapter modes
    ``out_indices`` selects pyramid levels (default (0, 1, 2, 3) = strides 4, 8, 16, 32) and
    ``patch_size`` must be 16. All other arguments: :class:`VisionTransformerTrunk`.
    """

    def __init__(self, arch='base', adapter: Optional[str] = None,
                 adapter_cfg: Optional[dict] = None, out_indices=None, **kwargs):
        check_choice('adapter', adapter, ADAPTERS)
        check_optional_dict('adapter_cfg', adapter_cfg)
        adapter_cfg = dict(adapter_cfg or {})
        if adapter is None:
            super().__init__(arch, out_indices=-1 if out_indices is None else out_indices,
                             **kwargs)
        else:
            super().__init__(arch, **kwargs)  # the trunk's own out_indices: its last block
            levels = (0, 1, 2, 3) if out_indices is None else out_indices
            if isinstance(levels, int) and not isinstance(levels, bool):
                levels = (levels, )
            if not isinstance(levels, (list, tuple)) or any(
                    isinstance(i, bool) or i not in (0, 1, 2, 3) for i in levels):
                raise ValueError(f'out_indices must be pyramid levels in 0..3 with an adapter, '
                                 f'got {out_indices!r}')
            self.out_indices = tuple(levels)
            allowed = (4, 8, 16, 32) if adapter == 'simple' else (16, )
            if self.patch_size not in allowed:
                raise ValueError(f'adapter={adapter!r} needs patch_size in {allowed} (strides '
                                 f'4..32 are built from the stride-patch map), got '
                                 f'{self.patch_size}; checkpoints with other patch sizes are '
                                 'resampled on loading')
        self.adapter_type = adapter
        if adapter == 'simple':
            out_channels = adapter_cfg.pop('out_channels', 256)
            if adapter_cfg:
                raise ValueError(f"adapter_cfg for 'simple' accepts out_channels only, got "
                                 f'{sorted(adapter_cfg)}')
            self.adapter = SimpleFeaturePyramid(self.embed_dims, out_channels, self.patch_size)
        elif adapter == 'interaction':
            self.adapter = self._build_interaction(adapter_cfg)
        else:
            self.adapter = None

    def _build_interaction(self, cfg: dict) -> nn.Module:
        """ViT-Adapter's ``InteractionAdapter``; ``interaction_indexes`` defaults to four equal
        groups of blocks and ``num_heads`` (deformable heads) to 6 below ViT-L, 16 from it."""
        from .vit_adapter_modules import InteractionAdapter, _check_interaction_indexes
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
        return InteractionAdapter(self.embed_dims, num_heads, indexes, **cfg)

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        """x: (B, C_in, H, W) -> tuple of NCHW maps (see the module docstring for sizes)."""
        check_image_input(x, self.in_channels, model=self)
        if self.adapter_type is None:
            return self.forward_trunk(x)
        h, w = x.shape[-2:]
        multiple = max(32, 2 * self.patch_size)  # the coarsest level is stride 32
        x = F.pad(x, (0, pad_amount(w, multiple), 0, pad_amount(h, multiple)))
        if self.adapter_type == 'simple':
            seq, grid = self.prepare_tokens(x)
            seq = self.forward_blocks(seq, grid)
            if self.norm is not None:
                seq = self.norm(seq)
            levels = self.adapter(self.seq_to_map(seq, grid))
        else:
            levels = self._forward_interaction(x)
        outs = []
        for i in self.out_indices:
            stride = 4 * 2**i
            # contiguous NCHW: LayerNorm2d leaves channels-last strides and the crop a view,
            # and mmcv's RoIAlign (CPU) reads its input as dense NCHW memory
            outs.append(crop_to(levels[i], (ceil_div(h, stride), ceil_div(w, stride))).contiguous())
        return tuple(outs)

    def _forward_interaction(self, x: torch.Tensor) -> List[torch.Tensor]:
        """x padded to a multiple of 32 -> the adapter's 4 maps. The CLS token (if any) is
        carried between the adapter's calls into the trunk; the adapter sees patch tokens."""
        seq, grid = self.prepare_tokens(x)
        p = self.num_prefix_tokens
        prefix = [seq[:, :p]]

        def run_blocks(tokens: torch.Tensor, start: int, end: int, hw) -> torch.Tensor:
            out = self.forward_blocks(torch.cat([prefix[0], tokens], dim=1), hw, start, end)
            prefix[0] = out[:, :p]
            return out[:, p:]

        return list(self.adapter(x, seq[:, p:], grid, run_blocks))
