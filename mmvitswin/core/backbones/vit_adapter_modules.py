"""ViT-Adapter's interaction adapter (Chen et al., 2022, "Vision Transformer Adapter for Dense
Predictions"): a convolutional spatial prior exchanged with a plain ViT through multi-scale
deformable cross-attention, giving a 4-level NCHW pyramid at strides 4/8/16/32.

Data flow, for an image padded to ``H, W`` multiples of 32 and the ViT grid ``(h, w) =
ceil((H, W) / vit_stride)`` (``vit_stride`` = the trunk's patch, 16 or e.g. 14)::

    builder: img --trunk embedding--> [prefix | tokens] (B, P + hw, C)   (prefix: CLS, registers)
    img --SPM--> c1 (B, C, H/4, W/4) map, c2/c3/c4 maps at strides 8/16/32 (+ level embeddings)
                 c = flattened cat(c2, c3, c4): (B, Nc, C)
    for each interaction group (start, end):
        tokens = Injector(tokens attend to c)            # ViT tokens query the 3 SPM levels
        [prefix | tokens] = blocks[start:end] run in order on [prefix | tokens]
        c      = Extractor(c attends to tokens)           # + ConvFFN; 2 extra ones at the end
    head: c -> maps c2/c3/c4; c1 += up(c2) (2x2 transposed conv); each map += the final ViT
          tokens resampled to it (bilinear, by position in the image); optional 1x1
          projection; one BatchNorm per level.

Every query and value level is placed by its stride in image pixels (reference points are the
query's pixel centre over each value level's extent), so a stride-14 token grid, which covers
``14 * ceil(H / 14)`` pixels, lines up with the stride-8/16/32 maps of the padded image.

Interface (stable; ``vit.py``'s ``ViTAdapter(adapter='interaction')`` relies on it)::

    adapter = InteractionAdapter(
        embed_dims, num_heads, interaction_indexes,   # num_heads: deformable-attention heads
        in_channels=3, conv_inplane=64, n_points=4, deform_ratio=1.0, cffn_ratio=0.25,
        with_cffn=True, drop_path_rate=0., add_vit_feature=True, use_extra_extractor=True,
        with_cp=False, out_channels=None,
        norm_cfg=dict(type='BN'), init_values=0., vit_stride=16)   # keyword-only in practice
    f1, f2, f3, f4 = adapter(img, seq, grid, blocks, num_prefix_tokens)

- ``interaction_indexes``: half-open block ranges ``[(0, 3), (3, 6), (6, 9), (9, 12)]``,
  contiguous from 0 (the original ViT-Adapter configs write the same groups inclusively,
  ``[[0, 2], [3, 5], ...]``). The caller checks that the last ``end`` equals its depth.
- ``img``: ``(B, in_channels, H, W)`` already padded so ``H`` and ``W`` are multiples of 32
  (``size_divisibility``; the builder pads and crops back).
- ``seq: (B, P + h*w, embed_dims)``, ``grid = (h, w)``: the trunk's embedding of ``img``
  (``P = num_prefix_tokens`` leading CLS/register tokens, then the grid row-major), with
  ``(h, w) == ceil((H, W) / vit_stride)``.
- ``blocks``: the trunk's blocks as a sequence (an ``nn.ModuleList``; not owned: their
  parameters stay the builder's); the adapter runs ``blocks[start:end]`` of each group, each
  called as ``block(seq, grid, num_prefix_tokens, plan) -> seq`` (``ViTBlock``'s signature;
  ``plan``: the windowed blocks' shared window plan, built once per forward). The
  adapter reads and writes the patch tokens; the prefix tokens travel through the blocks with
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

from ..compat import autocast_off
from ..layers import (DropPath, WindowPlan, blocks_window_plan, build_batch_norm, crop_to,
                      is_tracing)
from ..utils import check_image_input
from ..validate import check_args, check_number, check_positive_int

HW = Tuple[int, int]

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


def reference_points(shapes: Sequence[HW], device=None,
                     scales: Optional[Sequence[Tuple[float, float]]] = None) -> torch.Tensor:
    """Reference points of queries laid out as the flattened levels ``shapes``:
    ``(1, sum(h*w), L, 2)`` normalised ``(x, y)``, one entry per value level.

    ``scales``: per value level ``(sx, sy)`` = (query level extent) / (value level extent) in
    image pixels, both levels anchored at the image's top-left corner (Python numbers, or
    symbolic ones while tracing: they only multiply tensors, no branch depends on them); None:
    the levels cover the same extent and ``L = 1`` broadcasts over them (a query at a
    normalised position then reads the same position in every level).
    """
    points = torch.cat([pixel_centres(hw, device) for hw in shapes], dim=0)
    if scales is None:
        return points[None, :, None, :]
    per_level = [torch.stack((points[:, 0] * sx, points[:, 1] * sy), dim=-1) for sx, sy in scales]
    return torch.stack(per_level, dim=1)[None]


class DeformInputs(NamedTuple):
    """What deformable attention needs to know about its query and value layout."""
    reference_points: torch.Tensor  # (1, num_query, 1 or num_levels, 2), normalised (x, y)
    value_shapes: Tuple[HW, ...]  # (h, w) of each value level, in the value's order
    level_sizes: torch.Tensor  # (num_levels, 2) float: (w, h) of each value level
    level_starts: torch.Tensor  # (num_levels, ) long: the value row of each level's pixel 0
    level_strides: torch.Tensor  # (num_levels, 2) long: rows per step along x and y, (1, w)


def deform_inputs(query_shapes: Sequence[HW], value_shapes: Sequence[HW], device=None,
                  query_extent: Optional[HW] = None,
                  value_extents: Optional[Sequence[HW]] = None) -> DeformInputs:
    """Deformable-attention inputs for queries on the levels ``query_shapes`` attending to a
    value made of the flattened levels ``value_shapes``.

    ``query_extent`` (pixels ``(H, W)`` every query level covers) and ``value_extents`` (one
    per value level) place the levels in the image; None: all levels cover the same extent
    (the original adapter's layout, reference points broadcast over the value levels).
    Built once per forward and shared by every attention call on the same layout."""
    value_shapes = tuple((h, w) for h, w in value_shapes)
    scales = None
    if query_extent is not None and value_extents is not None:
        qh, qw = query_extent
        scales = [(qw / vw, qh / vh) for vh, vw in value_extents]
    # the sizes as tensors by ``full`` (they are symbolic while tracing, where ``torch.tensor``
    # of them would fix them to the example's)
    sizes = torch.stack([torch.stack((torch.full((), w, device=device),
                                      torch.full((), h, device=device))) for h, w in value_shapes])
    areas = sizes.prod(-1)
    strides = torch.stack((torch.ones_like(sizes[:, 0]), sizes[:, 0]), -1)
    return DeformInputs(reference_points(query_shapes, device, scales), value_shapes,
                        sizes.float(), areas.cumsum(0) - areas, strides)


def sample_levels(value: torch.Tensor, locations: torch.Tensor, weights: torch.Tensor,
                  layout: DeformInputs) -> torch.Tensor:
    """The sampling core of multi-scale deformable attention, in plain PyTorch.

    value: (B, Nv, heads, d), its levels flattened level-major, row-major inside a level;
    locations: (B, Nq, heads, levels, points, 2) normalised (x, y) in [0, 1] (align_corners=False
    convention); weights: (B, Nq, heads, levels, points); ``layout``: the value's levels
    (:class:`DeformInputs`; its sizes in the dtype of ``locations``). Returns (B, Nq, heads *
    d): every point's bilinear read of its level (zeros outside) times its weight, summed,
    which is ``grid_sample(align_corners=False, padding_mode='zeros')`` per level, with the
    same gradients.

    A point at pixel ``p = location * (w, h) - 0.5`` reads the four pixels ``floor(p) + {0, 1}``
    along x and y; a corner outside its level gets weight 0 and a clamped (valid) row. Every
    (query, head) is one bag of ``levels * points * 4`` corners summed straight out of
    ``value`` viewed as ``(B * Nv * heads, d)`` rows by one weighted ``embedding_bag``: no
    per-level copy of the value and no tensor of all samples, which is what makes it several
    times faster than ``grid_sample`` per level on a CPU; all levels at once, in a fixed
    number of kernels.
    """
    b, nv, heads, d = value.shape
    nq = locations.shape[1]
    device = value.device
    extent = layout.level_sizes[:, None, :, None]  # against (..., levels, points, axis, corner)
    pixel = locations * layout.level_sizes[:, None] - 0.5
    low = pixel.floor()
    frac = (pixel - low)[..., None]
    near = low[..., None] + torch.arange(2, device=device)  # floor + {0, 1} on both axes
    bilinear = torch.cat((1 - frac, frac), -1) * ((near >= 0) & (near < extent))
    # row of (image, level, pixel, head) in value viewed as (B * Nv * heads, d) rows
    near = torch.minimum(near.clamp(min=0), extent - 1).long()
    pos = near * layout.level_strides[:, None, :, None] * heads  # x and y parts of the row
    first = (torch.arange(b, device=device).view(b, 1, 1, 1, 1) * (nv * heads)
             + torch.arange(heads, device=device).view(heads, 1, 1)
             + layout.level_starts.view(-1, 1) * heads)  # (B, 1, heads, levels, 1)
    rows = pos[..., 1, :, None] + pos[..., 0, None, :] + first[..., None, None]
    corner_weights = (bilinear[..., 1, :, None] * bilinear[..., 0, None, :]
                      * weights[..., None, None])  # y-neighbour x x-neighbour, as ``rows``
    out = F.embedding_bag(rows.view(b * nq * heads, -1), value.reshape(-1, d), mode='sum',
                          per_sample_weights=corner_weights.view(b * nq * heads, -1))
    return out.view(b, nq, heads * d)


def sampling_locations(reference: torch.Tensor, offsets: torch.Tensor,
                       level_sizes: torch.Tensor) -> torch.Tensor:
    """``reference: (1, Nq, 1 or L, 2)`` normalised points plus ``offsets: (B, Nq, heads, L,
    points, 2)`` in pixels of each level (normalised by that level's ``(w, h)``, as mmcv does)
    -> ``(B, Nq, heads, L, points, 2)`` normalised ``(x, y)``."""
    return reference[:, :, None, :, None] + offsets / level_sizes[:, None]


def deformable_attention(attn: 'MultiScaleDeformableAttention', query: torch.Tensor,
                         value: torch.Tensor, inputs: DeformInputs,
                         identity: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``identity + attn(query -> value)``; ``identity=None`` returns the attention branch alone.

    query: (B, Nq, C), value: (B, Nv, C) with Nv = sum of the value levels' sizes. The module's
    parameters (``value_proj``, ``sampling_offsets``, ``attention_weights``, ``output_proj``)
    are used as mmcv's ``MultiScaleDeformableAttention`` uses them, with the sampling core
    (:func:`sample_levels`) in plain PyTorch on every device, so the adapter traces for
    compile/export. The sampling runs in fp32 (fp16 offsets lose sub-pixel precision); the
    projections follow autocast.
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
    with autocast_off(query.device.type):
        locations = sampling_locations(inputs.reference_points.float(), offsets.float(),
                                       inputs.level_sizes)
        out = sample_levels(v.float(), locations, weights, inputs)
    out = attn.dropout(attn.output_proj(out.to(v.dtype)))
    return out if identity is None else out + identity


class MultiScaleDeformableAttention(nn.Module):
    """Multi-scale deformable attention (Deformable DETR) with the parameters, names and
    initialisation of mmcv's ``MultiScaleDeformableAttention``, so ViT-Adapter checkpoints
    load unchanged: ``sampling_offsets`` (C -> heads * levels * points * 2), ``attention_weights``
    (C -> heads * levels * points), ``value_proj`` (C -> C * value_proj_ratio), ``output_proj``.

    ``forward(query (B, Nq, C), value (B, Nv, C), inputs, identity=None)`` -> ``(B, Nq, C)``
    (:func:`deformable_attention`; plain PyTorch, batch first).
    """

    def __init__(self, embed_dims: int, num_heads: int, num_levels: int, num_points: int,
                 value_proj_ratio: float = 1.0, dropout: float = 0.):
        super().__init__()
        value_dims = int(embed_dims * value_proj_ratio)
        if embed_dims % num_heads or value_dims % num_heads or value_dims < num_heads:
            raise ValueError(f'embed_dims ({embed_dims}) and embed_dims * value_proj_ratio '
                             f'({value_dims}) must be divisible by num_heads ({num_heads})')
        self.embed_dims = embed_dims
        self.num_heads = num_heads
        self.num_levels = num_levels
        self.num_points = num_points
        self.sampling_offsets = nn.Linear(embed_dims, num_heads * num_levels * num_points * 2)
        self.attention_weights = nn.Linear(embed_dims, num_heads * num_levels * num_points)
        self.value_proj = nn.Linear(embed_dims, value_dims)
        self.output_proj = nn.Linear(value_dims, embed_dims)
        self.dropout = nn.Dropout(dropout)
        self.init_weights()

    def init_weights(self) -> None:
        """mmcv's init: zero offset weights with a bias that starts head ``k``'s points ``1..P``
        pixels along the direction ``2 pi k / heads`` (scaled so the larger coordinate is 1),
        zero attention logits (uniform weights), Xavier-uniform value/output projections."""
        nn.init.zeros_(self.sampling_offsets.weight)
        thetas = torch.arange(self.num_heads, dtype=torch.float32) * (2.0 * math.pi /
                                                                      self.num_heads)
        grid = torch.stack([thetas.cos(), thetas.sin()], -1)
        grid = grid / grid.abs().max(-1, keepdim=True)[0]
        grid = grid.view(self.num_heads, 1, 1, 2).repeat(1, self.num_levels, self.num_points, 1)
        grid = grid * torch.arange(1, self.num_points + 1, dtype=torch.float32)[:, None]
        with torch.no_grad():
            self.sampling_offsets.bias.copy_(grid.reshape(-1))
        nn.init.zeros_(self.attention_weights.weight)
        nn.init.zeros_(self.attention_weights.bias)
        for lin in (self.value_proj, self.output_proj):
            nn.init.xavier_uniform_(lin.weight)
            nn.init.zeros_(lin.bias)

    def forward(self, query: torch.Tensor, value: torch.Tensor, inputs: DeformInputs,
                identity: Optional[torch.Tensor] = None) -> torch.Tensor:
        return deformable_attention(self, query, value, inputs, identity)


def resample_by_stride(x: torch.Tensor, src_stride: int, dst_stride: int, size: HW,
                       same_extent: bool) -> torch.Tensor:
    """Bilinearly resample an NCHW map of stride ``src_stride`` (cell ``i`` covers pixels
    ``[i s, (i + 1) s)``, both maps anchored at the image's top-left corner) to the stride
    ``dst_stride`` grid of ``size`` cells.

    ``same_extent`` (the caller knows it statically: the image is padded to a multiple of
    both strides): ``F.interpolate(size=size)``, the original adapter's rule. Otherwise ``x``
    covers at least ``size * dst_stride`` pixels and a scale factor ``src / dst`` keeps each
    output cell centre at the image position ``(j + 0.5) * dst_stride``; the excess is cropped.
    """
    if same_extent:
        if not is_tracing() and tuple(x.shape[-2:]) == tuple(size):
            return x
        return F.interpolate(x, size=size, mode='bilinear', align_corners=False)
    out = F.interpolate(x, scale_factor=src_stride / dst_stride, mode='bilinear',
                        align_corners=False, recompute_scale_factor=False)
    return crop_to(out, size)


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
    return MultiScaleDeformableAttention(embed_dims, num_heads, num_levels, n_points,
                                         value_proj_ratio=deform_ratio)


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


class Layout(NamedTuple):
    """The geometry of one adapter forward, shared by its interaction blocks."""
    grid: HW  # (h, w) of the ViT tokens
    c_shapes: Tuple[HW, ...]  # (h, w) of c2, c3, c4
    inject: DeformInputs  # ViT tokens -> the c levels
    extract: DeformInputs  # c levels -> the ViT tokens
    windows: Optional[WindowPlan]  # the windowed trunk blocks' plan of ``grid`` (or None)


class InteractionBlock(nn.Module):
    """Injector -> a group of the trunk's blocks -> extractor (+ ``num_extra_extractors``
    more extractors reading the same final tokens).

    ``forward(x, c, prefix, blocks, layout)`` -> ``(x (B, h*w, C), c (B, Nc, C), prefix (B, P,
    C))``; ``blocks``: the group's trunk blocks, run in order as ``block(seq, grid, P,
    layout.windows)``.
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

    def forward(self, x: torch.Tensor, c: torch.Tensor, prefix: torch.Tensor,
                blocks: Sequence[nn.Module],
                layout: Layout) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x: patch tokens (B, h*w, C); prefix: the trunk's prefix (CLS, register) tokens
        (B, P, C), which go through the blocks with them and are returned updated."""
        x = self.injector(x, c, layout.inject)
        p = prefix.shape[1]
        seq = torch.cat([prefix, x], dim=1)
        for block in blocks:
            seq = block(seq, layout.grid, p, layout.windows)
        prefix, x = seq[:, :p], seq[:, p:]
        c = self.extractor(c, x, layout.extract, layout.c_shapes)
        for extractor in self.extra_extractors or ():
            c = extractor(c, x, layout.extract, layout.c_shapes)
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
        vit_stride: the trunk's patch size (16; any other, e.g. DINOv2's 14, places the
            token grid by its stride in the image: module docstring).
    """

    def __init__(self, embed_dims: int, num_heads: int,
                 interaction_indexes: Sequence[Sequence[int]], in_channels: int = 3,
                 conv_inplane: int = 64, n_points: int = 4, deform_ratio: float = 1.0,
                 cffn_ratio: float = 0.25, with_cffn: bool = True, drop_path_rate: float = 0.,
                 add_vit_feature: bool = True, use_extra_extractor: bool = True,
                 with_cp: bool = False, out_channels: Optional[int] = None,
                 norm_cfg: Optional[dict] = None, init_values: float = 0.,
                 vit_stride: int = 16):
        super().__init__()
        for name, value in (('embed_dims', embed_dims), ('num_heads', num_heads),
                            ('in_channels', in_channels), ('conv_inplane', conv_inplane),
                            ('n_points', n_points), ('vit_stride', vit_stride)):
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
        self.vit_stride = vit_stride
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

    def _check_inputs(self, img: torch.Tensor, seq: torch.Tensor, grid, blocks,
                      num_prefix: int) -> HW:
        if is_tracing():  # sizes are symbolic: checking them would pin them to the example
            return tuple(grid)
        check_image_input(img, self.in_channels, name='img')
        b, _, h_img, w_img = img.shape
        if h_img < 32 or w_img < 32 or h_img % 32 or w_img % 32:
            raise ValueError(f'img must be padded so H and W are positive multiples of 32, got '
                             f'H, W = {h_img}, {w_img}')
        if not isinstance(blocks, Sequence) and not isinstance(blocks, nn.ModuleList):
            raise TypeError(f'blocks must be the trunk\'s blocks as a sequence (nn.ModuleList), '
                            f'got {type(blocks).__name__}')
        if len(blocks) != self.interaction_indexes[-1][1]:
            raise ValueError(f'blocks: {len(blocks)} blocks given, interaction_indexes '
                             f'{self.interaction_indexes} need {self.interaction_indexes[-1][1]}')
        s = self.vit_stride
        want = (-(-h_img // s), -(-w_img // s))
        hw = tuple(int(v) for v in grid)
        if hw != want:
            raise ValueError(f'grid: the tokens of img {tuple(img.shape)} at vit_stride {s} '
                             f'form a {want} grid, got {grid!r}')
        expected = (b, num_prefix + hw[0] * hw[1], self.embed_dims)
        if not isinstance(seq, torch.Tensor) or tuple(seq.shape) != expected:
            raise ValueError(f'the trunk\'s tokens must be (B, prefix + h * w, embed_dims) = '
                             f'{expected}, got {tuple(getattr(seq, "shape", ()))}')
        return hw

    def forward(self, img: torch.Tensor, seq: torch.Tensor, grid: HW,
                blocks: Sequence[nn.Module], num_prefix_tokens: int = 0
                ) -> Tuple[torch.Tensor, ...]:
        """img: (B, C_in, H, W), H and W multiples of 32; ``seq: (B, P + h*w, C)``, ``grid =
        (h, w) = ceil((H, W) / vit_stride)``: the trunk's embedding of ``img``; ``blocks``: the
        trunk's blocks (module docstring). Returns 4 maps (B, out_channels, H/s, W/s), s = 4,
        8, 16, 32."""
        hw = self._check_inputs(img, seq, grid, blocks, num_prefix_tokens)
        p = num_prefix_tokens
        prefix, x = seq[:, :p], seq[:, p:]
        c1, *levels = self.spm(img)
        c_shapes = tuple(tuple(m.shape[-2:]) for m in levels)
        c = maps_to_tokens([m + e[:, None, None] for m, e in zip(levels, self.level_embed)])
        s = self.vit_stride
        if 32 % s == 0:  # the token grid covers the padded image exactly (original layout)
            inject = deform_inputs([hw], c_shapes, img.device)
            extract = deform_inputs(c_shapes, [hw], img.device)
        else:  # e.g. stride 14: the grid covers 14 * ceil(H / 14) >= H pixels
            img_hw = tuple(img.shape[-2:])
            vit_hw = (hw[0] * s, hw[1] * s)
            inject = deform_inputs([hw], c_shapes, img.device, vit_hw, [img_hw] * 3)
            extract = deform_inputs(c_shapes, [hw], img.device, img_hw, [vit_hw])
        windows = blocks_window_plan(blocks, hw, img.device)
        layout = Layout(hw, c_shapes, inject, extract, windows)

        for block in self.interactions:
            start, end = block.block_range
            x, c, prefix = block(x, c, prefix, blocks[start:end], layout)

        c2, c3, c4 = tokens_to_maps(c, c_shapes)
        feats = [c1 + self.up(c2), c2, c3, c4]
        if self.add_vit_feature:
            vit = x.transpose(1, 2).reshape(x.shape[0], self.embed_dims, *hw)
            feats = [f + resample_by_stride(vit, s, stride, tuple(f.shape[-2:]), 32 % s == 0)
                     for f, stride in zip(feats, (4, 8, 16, 32))]
        return tuple(
            getattr(self, f'norm{i + 1}')(proj(f))
            for i, (proj, f) in enumerate(zip(self.out_projs, feats)))
