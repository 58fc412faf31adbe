"""ViT-Adapter's interaction adapter (Chen et al., 2022, "Vision Transformer Adapter for Dense
Predictions"): a convolutional spatial prior exchanged with a plain ViT through multi-scale
deformable cross-attention, giving a 4-level NCHW pyramid at strides 4/8/16/32.

Data flow, for an image padded to ``H, W`` multiples of 32 and the ViT grid ``(h, w) =
(H / 16, W / 16)``::

    img --trunk.prepare_tokens--> [CLS | tokens] (B, P + hw, C)
    img --SPM--> c1 (B, C, H/4, W/4) map, c2/c3/c4 maps at strides 8/16/32 (+ level embeddings)
                 c = flattened cat(c2, c3, c4): (B, 4hw + hw + hw/4, C)
    for each interaction group (start, end):
        tokens = Injector(tokens attend to c)            # ViT tokens query the 3 SPM levels
        [CLS | tokens] = trunk.forward_blocks([CLS | tokens], (h, w), start, end)
        c      = Extractor(c attends to tokens)           # + ConvFFN; 2 extra ones at the end
    head: c -> maps c2/c3/c4; c1 += up(c2) (2x2 transposed conv); each map += the final ViT
          tokens resized to it (bilinear); optional 1x1 projection; one BatchNorm per level.

Interface (stable; ``vit.py``'s ``ViTAdapter(adapter='interaction')`` relies on it)::

    adapter = InteractionAdapter(
        embed_dims, num_heads, interaction_indexes,   # num_heads: deformable-attention heads
        in_channels=3, conv_inplane=64, n_points=4, deform_ratio=1.0, cffn_ratio=0.25,
        with_cffn=True, drop_path_rate=0., add_vit_feature=True, use_extra_extractor=True,
        with_cp=False, out_channels=None,
        norm_cfg=dict(type='BN'), init_values=0.)      # extras, keyword-only in practice
    f1, f2, f3, f4 = adapter(img, trunk)

- ``interaction_indexes``: half-open block ranges ``[(0, 3), (3, 6), (6, 9), (9, 12)]``,
  contiguous from 0 (the original ViT-Adapter configs write the same groups inclusively,
  ``[[0, 2], [3, 5], ...]``). The caller checks that the last ``end`` equals its depth.
- ``img``: ``(B, in_channels, H, W)`` already padded so ``H`` and ``W`` are multiples of 32
  (``size_divisibility``; the builder pads and crops back).
- ``trunk``: the ViT the adapter drives, passed in (not owned: its parameters stay the
  builder's). It provides ``prepare_tokens(img) -> (seq (B, P + h*w, embed_dims), (h, w))``
  with ``(h, w) == (H // 16, W // 16)`` and ``P = num_prefix_tokens`` leading CLS tokens, and
  ``forward_blocks(seq, (h, w), start, end)`` running its blocks ``[start, end)``. The adapter
  reads and writes the patch tokens; the prefix tokens travel through the trunk's blocks with
  them, as plain values (no state kept between calls).
- Returns ``(B, out_channels, H/4, W/4)``, ``(.., H/8, W/8)``, ``(.., H/16, W/16)``,
  ``(.., H/32, W/32)``; ``out_channels`` defaults to ``embed_dims``.

State-dict keys follow the original implementation (``level_embed``, ``spm.stem.0``,
``spm.conv2.0``, ``spm.fc1``, ``interactions.{i}.injector.{query_norm,feat_norm,gamma}``,
``...attn.{sampling_offsets,attention_weights,value_proj,output_proj}``,
``interactions.{i}.extractor.ffn.{fc1,dwconv.dwconv,fc2}``, ``extra_extractors.{j}``, ``up``,
``norm1``..``norm4``), so released ViT-Adapter weights map by a prefix rename.
"""
import math
from typing import List, NamedTuple, Optional, Sequence, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint as cp
from mmcv.ops import MultiScaleDeformableAttention

from ..layers import DropPath, build_batch_norm, is_tracing
from ..utils import check_image_input
from ..validate import check_args, check_number, check_positive_int

HW = Tuple[int, int]
# what the adapter uses of the trunk it drives (VisionTransformerTrunk provides it)
TRUNK_PROTOCOL = ('prepare_tokens', 'num_prefix_tokens', 'forward_blocks')

# The original adapter uses LayerNorm(eps=1e-6) in its injectors and extractors.
_LN_EPS = 1e-6


# --------------------------------------------------------------------------- pure helpers
def pixel_centres(hw: HW, device=None) -> torch.Tensor:
    """Normalised ``(x, y)`` of the pixel centres of an ``h x w`` grid, row-major: ``(h*w, 2)``.

    mmcv's deformable attention samples with ``align_corners=False``, where pixel ``i`` of a
    length-``n`` axis spans ``[i/n, (i+1)/n]``; its centre ``(i + 0.5) / n`` reads that pixel
    exactly, whatever ``n`` is (no divisibility assumption).
    """
    h, w = hw
    ys = (torch.arange(h, dtype=torch.float32, device=device) + 0.5) / h
    xs = (torch.arange(w, dtype=torch.float32, device=device) + 0.5) / w
    grid_y, grid_x = torch.meshgrid(ys, xs, indexing='ij')
    return torch.stack((grid_x.reshape(-1), grid_y.reshape(-1)), dim=-1)


def reference_points(shapes: Sequence[HW], device=None) -> torch.Tensor:
    """Reference points of queries laid out as the flattened levels ``shapes``:
    ``(1, sum(h*w), 1, 2)``; the singleton dims broadcast over batch and value levels, so a
    query at a given normalised position looks at the same position in every value level."""
    points = torch.cat([pixel_centres(hw, device) for hw in shapes], dim=0)
    return points[None, :, None, :]


class DeformInputs(NamedTuple):
    """What deformable attention needs to know about its query and value layout."""
    reference_points: torch.Tensor  # (1, num_query, 1, 2), normalised (x, y)
    value_shapes: Tuple[HW, ...]  # (h, w) of each value level, in the value's order
    spatial_shapes: Optional[torch.Tensor]  # the same as (num_levels, 2) long (mmcv's kernel)
    level_start_index: Optional[torch.Tensor]  # (num_levels, ) long offsets (mmcv's kernel)


def deform_inputs(query_shapes: Sequence[HW], value_shapes: Sequence[HW],
                  device=None) -> DeformInputs:
    """Deformable-attention inputs for queries on the levels ``query_shapes`` attending to a
    value made of the flattened levels ``value_shapes``. The tensor copies of the shapes that
    mmcv's CUDA kernel takes are only built outside tracing (they would freeze the sizes)."""
    value_shapes = tuple((h, w) for h, w in value_shapes)
    spatial_shapes = level_start_index = None
    if not is_tracing():
        spatial_shapes = torch.as_tensor(value_shapes, dtype=torch.long, device=device)
        sizes = spatial_shapes.prod(1)
        level_start_index = torch.cat((sizes.new_zeros(1), sizes.cumsum(0)[:-1]))
    return DeformInputs(reference_points(query_shapes, device), value_shapes, spatial_shapes,
                        level_start_index)


def sample_levels(value: torch.Tensor, value_shapes: Sequence[HW], locations: torch.Tensor,
                  weights: torch.Tensor) -> torch.Tensor:
    """The sampling core of multi-scale deformable attention, in plain PyTorch.

    value: (B, Nv, heads, d) with ``Nv = sum(h * w)`` over ``value_shapes`` (level-major,
    row-major inside a level); locations: (B, Nq, heads, levels, points, 2) normalised (x, y)
    in [0, 1] (align_corners=False convention); weights: (B, Nq, heads, levels, points).
    Every point reads its level bilinearly (zeros outside) and the reads are summed with their
    weights, level by level (no stacked copy of all samples). Returns (B, Nq, heads * d).
    """
    b, _, heads, d = value.shape
    nq, points = locations.shape[1], locations.shape[4]
    out = None
    start = 0
    for level, (h, w) in enumerate(value_shapes):
        v = value[:, start:start + h * w].permute(0, 2, 3, 1).reshape(b * heads, d, h, w)
        start += h * w
        grid = (2 * locations[:, :, :, level] - 1).transpose(1, 2).reshape(b * heads, nq,
                                                                          points, 2)
        sampled = F.grid_sample(v, grid, mode='bilinear', padding_mode='zeros',
                                align_corners=False)  # (B * heads, d, Nq, points)
        weight = weights[:, :, :, level].transpose(1, 2).reshape(b * heads, 1, nq, points)
        term = (sampled * weight).sum(-1)
        out = term if out is None else out + term
    return out.view(b, heads * d, nq).transpose(1, 2)


def deformable_attention(attn: MultiScaleDeformableAttention, query: torch.Tensor,
                         value: torch.Tensor, inputs: DeformInputs,
                         identity: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``identity + attn(query -> value)``; ``identity=None`` returns the attention branch alone.

    query: (B, Nq, C), value: (B, Nv, C) with Nv = sum of the value levels' sizes. The module's
    parameters (``value_proj``, ``sampling_offsets``, ``attention_weights``, ``output_proj``)
    are used as mmcv's ``MultiScaleDeformableAttention`` uses them, with the sampling core
    (:func:`sample_levels`) written in plain PyTorch so the adapter traces for compile/export.
    The sampling core always runs in fp32 (mmcv has no Half kernel, and fp16 offsets lose
    sub-pixel precision); the projections follow autocast. On CUDA outside tracing, the
    sampling runs in mmcv's kernel (fp32).
    """
    b, nq, _ = query.shape
    nv = value.shape[1]
    heads, levels, points = attn.num_heads, attn.num_levels, attn.num_points
    if len(inputs.value_shapes) != levels:
        raise ValueError(f'the value has {len(inputs.value_shapes)} levels, the attention '
                         f'module expects {levels}')
    v = attn.value_proj(value).view(b, nv, heads, -1)
    offsets = attn.sampling_offsets(query).view(b, nq, heads, levels, points, 2)
    weights = attn.attention_weights(query).view(b, nq, heads, levels * points)
    weights = weights.float().softmax(-1).view(b, nq, heads, levels, points)
    device = query.device.type
    with torch.autocast(device, enabled=False):
        # offsets are in pixels of each level: normalise by that level's (w, h)
        ref = inputs.reference_points.float()[:, :, 0, None, None, :]  # (1, Nq, 1, 1, 2)
        offsets = offsets.float()
        locations = torch.stack([
            ref + torch.stack((offsets[:, :, :, i, :, 0] / w, offsets[:, :, :, i, :, 1] / h), -1)
            for i, (h, w) in enumerate(inputs.value_shapes)
        ], dim=3)
        if query.is_cuda and not is_tracing() and inputs.spatial_shapes is not None:
            from mmcv.ops.multi_scale_deform_attn import MultiScaleDeformableAttnFunction
            out = MultiScaleDeformableAttnFunction.apply(
                v.float(), inputs.spatial_shapes, inputs.level_start_index, locations, weights,
                attn.im2col_step)
        else:
            out = sample_levels(v.float(), inputs.value_shapes, locations, weights)
    out = attn.dropout(attn.output_proj(out.to(v.dtype)))
    return out if identity is None else out + identity


def tokens_to_maps(x: torch.Tensor, shapes: Sequence[HW]) -> List[torch.Tensor]:
    """Split ``(B, sum(h*w), C)`` tokens into NCHW maps ``(B, C, h, w)``, one per level."""
    b, _, c = x.shape
    chunks = x.split([h * w for h, w in shapes], dim=1)
    return [t.transpose(1, 2).reshape(b, c, h, w) for t, (h, w) in zip(chunks, shapes)]


def maps_to_tokens(maps: Sequence[torch.Tensor]) -> torch.Tensor:
    """Inverse of ``tokens_to_maps``: NCHW maps -> ``(B, sum(h*w), C)``."""
    return torch.cat([m.flatten(2).transpose(1, 2) for m in maps], dim=1)


def _check_interaction_indexes(interaction_indexes) -> List[HW]:
    ranges, expected_start = [], 0
    try:
        pairs = [tuple(p) for p in interaction_indexes]
    except TypeError:
        pairs = None
    if not pairs:
        raise ValueError('interaction_indexes must be a non-empty sequence of (start, end) block '
                         f'ranges, got {interaction_indexes!r}')
    for pair in pairs:
        if (len(pair) != 2 or not all(isinstance(v, int) and not isinstance(v, bool)
                                      for v in pair)
                or pair[0] != expected_start or pair[1] <= pair[0]):
            raise ValueError(
                'interaction_indexes must be contiguous half-open (start, end) ranges from 0 '
                f'with start < end, e.g. [(0, 3), (3, 6)]; got {interaction_indexes!r}')
        ranges.append(pair)
        expected_start = pair[1]
    return ranges


# --------------------------------------------------------------------------------- layers
def _conv_bn_relu(cin: int, cout: int, stride: int, norm_cfg: Optional[dict]) -> List[nn.Module]:
    return [nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False),
            build_batch_norm(norm_cfg, cout), nn.ReLU(inplace=True)]


class SpatialPriorModule(nn.Module):
    """The convolutional branch: a ResNet-like stem (3 conv-BN-ReLU, max-pool) to stride 4, then
    stride-2 conv-BN-ReLU to strides 8/16/32, each level projected to ``embed_dims`` by a 1x1
    conv.

    ``forward(img: (B, in_channels, H, W))`` -> 4 maps ``(B, embed_dims, ceil(H / s), ..)`` for
    s = 4, 8, 16, 32 (each stride-2 layer rounds up).
    """

    def __init__(self, in_channels: int = 3, inplanes: int = 64, embed_dims: int = 384,
                 norm_cfg: Optional[dict] = None, with_cp: bool = False):
        super().__init__()
        self.with_cp = with_cp
        self.stem = nn.Sequential(
            *_conv_bn_relu(in_channels, inplanes, 2, norm_cfg),
            *_conv_bn_relu(inplanes, inplanes, 1, norm_cfg),
            *_conv_bn_relu(inplanes, inplanes, 1, norm_cfg),
            nn.MaxPool2d(kernel_size=3, stride=2, padding=1))
        self.conv2 = nn.Sequential(*_conv_bn_relu(inplanes, 2 * inplanes, 2, norm_cfg))
        self.conv3 = nn.Sequential(*_conv_bn_relu(2 * inplanes, 4 * inplanes, 2, norm_cfg))
        self.conv4 = nn.Sequential(*_conv_bn_relu(4 * inplanes, 4 * inplanes, 2, norm_cfg))
        self.fc1 = nn.Conv2d(inplanes, embed_dims, 1)
        self.fc2 = nn.Conv2d(2 * inplanes, embed_dims, 1)
        self.fc3 = nn.Conv2d(4 * inplanes, embed_dims, 1)
        self.fc4 = nn.Conv2d(4 * inplanes, embed_dims, 1)

    def _forward(self, img: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        c1 = self.stem(img)
        c2 = self.conv2(c1)
        c3 = self.conv3(c2)
        c4 = self.conv4(c3)
        return self.fc1(c1), self.fc2(c2), self.fc3(c3), self.fc4(c4)

    def forward(self, img: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        if self.with_cp and img.requires_grad:
            return cp.checkpoint(self._forward, img, use_reentrant=False)
        return self._forward(img)


class MultiLevelDWConv(nn.Module):
    """One depth-wise 3x3 conv shared by every level of a flattened multi-level sequence; each
    level is convolved as its own map so no kernel reads across a level boundary.

    ``forward(x: (B, sum(h*w), C), shapes)`` -> same shape.
    """

    def __init__(self, dims: int):
        super().__init__()
        self.dwconv = nn.Conv2d(dims, dims, 3, padding=1, groups=dims)

    def forward(self, x: torch.Tensor, shapes: Sequence[HW]) -> torch.Tensor:
        return maps_to_tokens([self.dwconv(m) for m in tokens_to_maps(x, shapes)])


class ConvFFN(nn.Module):
    """Linear -> depth-wise conv over the levels -> GELU -> Linear; the conv gives the
    extractor's queries some local spatial mixing. Returns the branch only."""

    def __init__(self, embed_dims: int, hidden_dims: int, drop: float = 0.):
        super().__init__()
        self.fc1 = nn.Linear(embed_dims, hidden_dims)
        self.dwconv = MultiLevelDWConv(hidden_dims)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden_dims, embed_dims)
        self.drop = nn.Dropout(drop)

    def forward(self, x: torch.Tensor, shapes: Sequence[HW]) -> torch.Tensor:
        x = self.drop(self.act(self.dwconv(self.fc1(x), shapes)))
        return self.drop(self.fc2(x))


def _deformable(embed_dims: int, num_heads: int, num_levels: int, n_points: int,
                deform_ratio: float) -> MultiScaleDeformableAttention:
    return MultiScaleDeformableAttention(
        embed_dims=embed_dims, num_heads=num_heads, num_levels=num_levels,
        num_points=n_points, dropout=0., batch_first=True, value_proj_ratio=deform_ratio)


class Injector(nn.Module):
    """ViT tokens (query) read the multi-level spatial prior (value) by deformable attention:
    ``x + gamma * attn(norm(x), norm(c))``. ``gamma`` starts at ``init_values`` (0), so at
    initialisation the pretrained ViT sees exactly its usual tokens.

    ``forward(x: (B, h*w, C), c: (B, Nc, C), inputs)`` -> ``(B, h*w, C)``.
    """

    def __init__(self, embed_dims: int, num_heads: int, n_points: int = 4, num_levels: int = 3,
                 deform_ratio: float = 1.0, init_values: float = 0., with_cp: bool = False):
        super().__init__()
        self.with_cp = with_cp
        self.init_values = init_values
        self.query_norm = nn.LayerNorm(embed_dims, eps=_LN_EPS)
        self.feat_norm = nn.LayerNorm(embed_dims, eps=_LN_EPS)
        self.attn = _deformable(embed_dims, num_heads, num_levels, n_points, deform_ratio)
        self.gamma = nn.Parameter(torch.full((embed_dims, ), float(init_values)))

    def forward(self, x: torch.Tensor, c: torch.Tensor, inputs: DeformInputs) -> torch.Tensor:

        def inner(x, c):
            attn = deformable_attention(self.attn, self.query_norm(x), self.feat_norm(c), inputs)
            return x + self.gamma * attn

        if self.with_cp and x.requires_grad:
            return cp.checkpoint(inner, x, c, use_reentrant=False)
        return inner(x, c)


class Extractor(nn.Module):
    """Spatial-prior queries (the flattened c2/c3/c4 levels) read the ViT tokens (one level at
    stride 16) by deformable attention, then an optional ConvFFN with stochastic depth.

    ``forward(c: (B, Nc, C), x: (B, h*w, C), inputs, c_shapes)`` -> ``(B, Nc, C)``.
    """

    def __init__(self, embed_dims: int, num_heads: int, n_points: int = 4,
                 deform_ratio: float = 1.0, with_cffn: bool = True, cffn_ratio: float = 0.25,
                 drop: float = 0., drop_path_rate: float = 0., with_cp: bool = False):
        super().__init__()
        self.with_cp = with_cp
        self.query_norm = nn.LayerNorm(embed_dims, eps=_LN_EPS)
        self.feat_norm = nn.LayerNorm(embed_dims, eps=_LN_EPS)
        self.attn = _deformable(embed_dims, num_heads, 1, n_points, deform_ratio)
        self.with_cffn = with_cffn
        if with_cffn:
            self.ffn = ConvFFN(embed_dims, int(embed_dims * cffn_ratio), drop)
            self.ffn_norm = nn.LayerNorm(embed_dims, eps=_LN_EPS)
            self.drop_path = DropPath(drop_path_rate)

    def forward(self, c: torch.Tensor, x: torch.Tensor, inputs: DeformInputs,
                c_shapes: Sequence[HW]) -> torch.Tensor:

        def inner(c, x):
            c = deformable_attention(self.attn, self.query_norm(c), self.feat_norm(x), inputs,
                                     identity=c)
            if self.with_cffn:
                c = c + self.drop_path(self.ffn(self.ffn_norm(c), c_shapes))
            return c

        if self.with_cp and c.requires_grad:
            return cp.checkpoint(inner, c, x, use_reentrant=False)
        return inner(c, x)


class InteractionBlock(nn.Module):
    """Injector -> the trunk's blocks ``[start, end)`` -> extractor (+ ``num_extra_extractors``
    more extractors reading the same final tokens).

    ``forward(x, c, prefix, trunk, grid_hw, inject_inputs, extract_inputs, c_shapes)`` ->
    ``(x (B, h*w, C), c (B, Nc, C), prefix (B, P, C))``.
    """

    def __init__(self, embed_dims: int, num_heads: int, block_range: HW, n_points: int = 4,
                 deform_ratio: float = 1.0, with_cffn: bool = True, cffn_ratio: float = 0.25,
                 drop_path_rate: float = 0., init_values: float = 0.,
                 num_extra_extractors: int = 0, with_cp: bool = False):
        super().__init__()
        self.block_range = tuple(block_range)
        self.injector = Injector(embed_dims, num_heads, n_points, 3, deform_ratio, init_values,
                                 with_cp)
        extractor_kwargs = dict(n_points=n_points, deform_ratio=deform_ratio,
                                with_cffn=with_cffn, cffn_ratio=cffn_ratio,
                                drop_path_rate=drop_path_rate, with_cp=with_cp)
        self.extractor = Extractor(embed_dims, num_heads, **extractor_kwargs)
        self.extra_extractors = nn.Sequential(*[
            Extractor(embed_dims, num_heads, **extractor_kwargs)
            for _ in range(num_extra_extractors)
        ]) if num_extra_extractors else None

    def forward(self, x: torch.Tensor, c: torch.Tensor, prefix: torch.Tensor, trunk: nn.Module,
                grid_hw: HW, inject_inputs: DeformInputs, extract_inputs: DeformInputs,
                c_shapes: Sequence[HW]) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x: patch tokens (B, h*w, C); prefix: the trunk's prefix (CLS) tokens (B, P, C), which
        go through the trunk's blocks with them and are returned updated:
        ``(x, c, prefix)``."""
        x = self.injector(x, c, inject_inputs)
        start, end = self.block_range
        p = prefix.shape[1]
        seq = trunk.forward_blocks(torch.cat([prefix, x], dim=1), grid_hw, start, end)
        prefix, x = seq[:, :p], seq[:, p:]
        c = self.extractor(c, x, extract_inputs, c_shapes)
        for extractor in self.extra_extractors or ():
            c = extractor(c, x, extract_inputs, c_shapes)
        return x, c, prefix


# ---------------------------------------------------------------------------------- model
class InteractionAdapter(nn.Module):
    """ViT-Adapter around a caller-owned ViT trunk; see the module docstring for the interface.

    Args:
        embed_dims: ViT width C.
        num_heads: heads of the deformable attentions (``embed_dims * deform_ratio`` must be
            divisible by it; the original uses 6 for ViT-T/S/B, 16 for ViT-L).
        interaction_indexes: contiguous half-open block ranges, one interaction per range.
        in_channels: image channels.
        conv_inplane: width of the SPM stem (levels use 1x, 2x, 4x, 4x of it).
        n_points: sampling points per head and level.
        deform_ratio: value-projection width of the deformable attentions, relative to C.
        cffn_ratio: hidden width of the extractors' ConvFFN, relative to C.
        with_cffn: use the ConvFFN in the extractors.
        drop_path_rate: stochastic depth of every extractor's ConvFFN branch.
        add_vit_feature: add the final ViT tokens (resized) to every output level.
        use_extra_extractor: two more extractors after the last interaction.
        with_cp: activation checkpointing of the SPM, injectors and extractors.
        out_channels: channels of the 4 outputs (a 1x1 conv projects when != embed_dims).
        norm_cfg: the output and SPM BatchNorms, ``dict(type='BN')`` or ``'SyncBN'``.
        init_values: initial value of the injectors' ``gamma``.
    """

    def __init__(self, embed_dims: int, num_heads: int,
                 interaction_indexes: Sequence[Sequence[int]], in_channels: int = 3,
                 conv_inplane: int = 64, n_points: int = 4, deform_ratio: float = 1.0,
                 cffn_ratio: float = 0.25, with_cffn: bool = True, drop_path_rate: float = 0.,
                 add_vit_feature: bool = True, use_extra_extractor: bool = True,
                 with_cp: bool = False, out_channels: Optional[int] = None,
                 norm_cfg: Optional[dict] = None, init_values: float = 0.):
        super().__init__()
        for name, value in (('embed_dims', embed_dims), ('num_heads', num_heads),
                            ('in_channels', in_channels), ('conv_inplane', conv_inplane),
                            ('n_points', n_points)):
            check_positive_int(name, value)
        check_args(positive=dict(deform_ratio=deform_ratio),
                   optional_positive=dict(cffn_ratio=cffn_ratio if with_cffn else None),
                   probabilities=dict(drop_path_rate=drop_path_rate),
                   flags=dict(with_cffn=with_cffn, add_vit_feature=add_vit_feature,
                              use_extra_extractor=use_extra_extractor, with_cp=with_cp),
                   cfgs=dict(norm_cfg=norm_cfg))
        check_number('init_values', init_values)
        value_dims = int(embed_dims * deform_ratio)
        if embed_dims % num_heads or value_dims < num_heads or value_dims % num_heads:
            raise ValueError(f'embed_dims ({embed_dims}) and embed_dims * deform_ratio '
                             f'({value_dims}) must be divisible by num_heads ({num_heads})')
        if with_cffn and int(embed_dims * cffn_ratio) < 1:
            raise ValueError(f'cffn_ratio must give a hidden width >= 1, got {cffn_ratio!r}')
        out_channels = check_positive_int(
            'out_channels', embed_dims if out_channels is None else out_channels)
        self.interaction_indexes = _check_interaction_indexes(interaction_indexes)
        self.embed_dims = embed_dims
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.add_vit_feature = add_vit_feature
        self.init_values = init_values
        self.size_divisibility = 32  # the padding the builder applies (coarsest level: 32)

        self.level_embed = nn.Parameter(torch.zeros(3, embed_dims))
        self.spm = SpatialPriorModule(in_channels, conv_inplane, embed_dims, norm_cfg, with_cp)
        last = len(self.interaction_indexes) - 1
        self.interactions = nn.Sequential(*[
            InteractionBlock(embed_dims, num_heads, block_range, n_points=n_points,
                             deform_ratio=deform_ratio, with_cffn=with_cffn,
                             cffn_ratio=cffn_ratio, drop_path_rate=drop_path_rate,
                             init_values=init_values,
                             num_extra_extractors=2 if use_extra_extractor and i == last else 0,
                             with_cp=with_cp)
            for i, block_range in enumerate(self.interaction_indexes)
        ])
        self.up = nn.ConvTranspose2d(embed_dims, embed_dims, 2, stride=2)
        self.out_projs = nn.ModuleList([
            nn.Identity() if out_channels == embed_dims else
            nn.Conv2d(embed_dims, out_channels, 1, bias=False) for _ in range(4)
        ])
        for i in range(1, 5):
            self.add_module(f'norm{i}', build_batch_norm(norm_cfg, out_channels))
        self.init_weights()

    def init_weights(self) -> None:
        """The original recipe: truncated-normal linears, He-normal (fan-out) convs, unit norms,
        mmcv's own deformable-attention init, N(0, 1) level embeddings, ``gamma = init_values``.
        A caller applying a trunk-wide init must call this again afterwards."""
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, (nn.LayerNorm, nn.modules.batchnorm._BatchNorm)):
                if m.weight is not None:
                    nn.init.ones_(m.weight)
                    nn.init.zeros_(m.bias)
            elif isinstance(m, (nn.Conv2d, nn.ConvTranspose2d)):
                fan_out = m.kernel_size[0] * m.kernel_size[1] * m.out_channels // m.groups
                nn.init.normal_(m.weight, 0., math.sqrt(2. / fan_out))
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
        for m in self.modules():
            if isinstance(m, MultiScaleDeformableAttention):
                m.init_weights()
            elif isinstance(m, Injector):
                nn.init.constant_(m.gamma, float(m.init_values))
        nn.init.normal_(self.level_embed)

    def _check_trunk(self, img: torch.Tensor, trunk) -> None:
        if is_tracing():  # sizes are symbolic: checking them would pin them to the example
            return
        check_image_input(img, self.in_channels, name='img')
        h_img, w_img = img.shape[-2:]
        if h_img < 32 or w_img < 32 or h_img % 32 or w_img % 32:
            raise ValueError(f'img must be padded so H and W are positive multiples of 32, got '
                             f'H, W = {h_img}, {w_img}')
        if not all(hasattr(trunk, name) for name in TRUNK_PROTOCOL):
            raise TypeError(f'trunk must provide {", ".join(TRUNK_PROTOCOL)} (a '
                            f'VisionTransformerTrunk), got {type(trunk).__name__}')

    def _check_tokens(self, img: torch.Tensor, seq, grid_hw, num_prefix: int) -> HW:
        if is_tracing():
            return tuple(grid_hw)
        b, _, h_img, w_img = img.shape
        hw = tuple(int(v) for v in grid_hw)
        if hw != (h_img // 16, w_img // 16):
            raise ValueError(f'the trunk must embed img of shape {tuple(img.shape)} into a '
                             f'stride-16 grid ({h_img // 16}, {w_img // 16}), got {grid_hw!r}')
        expected = (b, num_prefix + hw[0] * hw[1], self.embed_dims)
        if tuple(seq.shape) != expected:
            raise ValueError(f'the trunk\'s tokens must be (B, prefix + h * w, embed_dims) = '
                             f'{expected}, got {tuple(seq.shape)}')
        return hw

    def forward(self, img: torch.Tensor, trunk: nn.Module) -> Tuple[torch.Tensor, ...]:
        """img: (B, C_in, H, W), H and W multiples of 32; ``trunk`` embeds it into a (H/16,
        W/16) grid and runs its blocks group by group (``TRUNK_PROTOCOL``). Returns 4 maps
        (B, out_channels, H/s, W/s), s = 4, 8, 16, 32."""
        self._check_trunk(img, trunk)
        seq, grid = trunk.prepare_tokens(img)
        p = trunk.num_prefix_tokens
        hw = self._check_tokens(img, seq, grid, p)
        prefix, x = seq[:, :p], seq[:, p:]
        c1, *levels = self.spm(img)
        c_shapes = [tuple(m.shape[-2:]) for m in levels]
        c = maps_to_tokens([m + e[:, None, None] for m, e in zip(levels, self.level_embed)])
        inject_inputs = deform_inputs([hw], c_shapes, img.device)
        extract_inputs = deform_inputs(c_shapes, [hw], img.device)

        for block in self.interactions:
            x, c, prefix = block(x, c, prefix, trunk, hw, inject_inputs, extract_inputs,
                                 c_shapes)

        c2, c3, c4 = tokens_to_maps(c, c_shapes)
        feats = [c1 + self.up(c2), c2, c3, c4]
        if self.add_vit_feature:
            vit = x.transpose(1, 2).reshape(x.shape[0], self.embed_dims, *hw)
            feats = [
                f + (vit if f.shape[-2:] == vit.shape[-2:] else F.interpolate(
                    vit, size=f.shape[-2:], mode='bilinear', align_corners=False))
                for f in feats
            ]
        return tuple(
            getattr(self, f'norm{i + 1}')(proj(f))
            for i, (proj, f) in enumerate(zip(self.out_projs, feats)))

    def pyramid(self, trunk: nn.Module, img: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        """The builder's entry point (same as :class:`SimpleFeaturePyramid`'s)."""
        return self(img, trunk)
