"""RoIAlign (average pooling) written as two batched matrix products, in plain PyTorch.

RoIAlign averages bilinear samples taken on a regular grid inside each output bin. The grid is
a Cartesian product of y positions and x positions, and a bilinear weight is a y-weight times
an x-weight, so one RoI's output is ``A_y @ F @ A_x^T``: ``A_y`` (bins x rows) holds, for each
output row, the averaged interpolation weights of its sample rows, ``A_x`` likewise for
columns. Only the window of rows and columns a RoI touches is gathered, so the work is
proportional to the RoI's area, and the backward is autograd's (an ``index_add`` and two
matrix products) instead of a scalar loop over every output element and channel, which is
what makes mmcv's CPU backward slow.

The numbers follow ``mmcv.ops.RoIAlign`` with ``pool_mode='avg'`` (the sampling positions,
the adaptive ``sampling_ratio=0``, the ``aligned`` half-pixel offset, and the zero contribution
of samples outside ``[-1, size]``), up to float summation order.
"""
from typing import List, Sequence, Tuple, Union

import torch
from torch import Tensor, nn

from ..validate import (check_bool, check_non_negative_int, check_positive_number,
                        int_tuple)

# Most gathered elements (RoIs x window rows x window columns x channels) held at once.
MAX_CROP_ELEMENTS = 1 << 24
_MIN_GROUP = 32


def _axis_weights(start: Tensor, size: Tensor, bins: int, sampling_ratio: int,
                  length: int) -> Tuple[Tensor, Tensor, Tensor]:
    """Interpolation weights along one axis for every RoI.

    Returns ``first`` (R,), the first row (column) a RoI reads, ``weights`` (R, bins, K), the
    averaged weights of rows ``first .. first + K - 1``, and ``span`` (R,), how many of those
    rows the RoI really uses.
    """
    if sampling_ratio > 0:
        samples = torch.full_like(size, sampling_ratio, dtype=torch.long)
    else:
        samples = torch.ceil(size / bins).long()  # 0 for an empty RoI: no samples, output 0
    most = max(int(samples.max()), 1)
    bin_size = size / bins
    count = samples.clamp(min=1).to(size.dtype)
    i = torch.arange(bins, dtype=size.dtype, device=size.device)
    a = torch.arange(most, dtype=size.dtype, device=size.device)
    # The positions in mmcv's expression order, so floor() lands on the same row.
    pos = (start[:, None, None] + i[None, :, None] * bin_size[:, None, None]
           + (a[None, None, :] + 0.5) * bin_size[:, None, None] / count[:, None, None])
    used = (a[None, None, :] < samples[:, None, None]) & (pos >= -1.0) & (pos <= length)
    pos = pos.clamp(min=0)
    low = pos.floor().long()
    at_end = low >= length - 1
    low = torch.where(at_end, torch.full_like(low, length - 1), low)
    pos = torch.where(at_end, low.to(pos.dtype), pos)
    high = torch.where(at_end, low, low + 1)
    frac = pos - low.to(pos.dtype)
    share = used.to(pos.dtype) / count[:, None, None]

    far = length + 1
    first = torch.where(used, low, torch.full_like(low, far)).flatten(1).amin(1)
    first = torch.where(first == far, torch.zeros_like(first), first)
    last = torch.where(used, high, torch.full_like(high, -1)).flatten(1).amax(1)
    span = (last - first + 1).clamp(min=1)
    width = int(span.max())
    weights = torch.zeros(size.shape[0], bins, width, dtype=pos.dtype, device=pos.device)
    # Unused samples have zero share; clamping keeps their (ignored) index in range.
    weights.scatter_add_(2, (low - first[:, None, None]).clamp(0, width - 1), (1 - frac) * share)
    weights.scatter_add_(2, (high - first[:, None, None]).clamp(0, width - 1), frac * share)
    return first, weights, span


def _groups(span_y: Tensor, span_x: Tensor,
            channels: int) -> List[Tuple[Tensor, int, int]]:
    """Split RoIs, in order of window area, into groups pooled together; returns each group's
    RoI indices and its padded window height and width.

    A group's windows are padded to its largest height and width, so a group closes when that
    padding would more than double its work (after at least ``_MIN_GROUP`` RoIs: small groups
    cost more in per-call overhead than in padding) or exceed ``MAX_CROP_ELEMENTS``.
    """
    area = span_y * span_x
    n = area.numel()
    top_y, top_x = int(span_y.max()), int(span_x.max())
    if n <= _MIN_GROUP and n * top_y * top_x * channels <= MAX_CROP_ELEMENTS:
        return [(torch.arange(n, device=area.device), top_y, top_x)]
    order = torch.argsort(area)
    ys, xs, areas = span_y[order].tolist(), span_x[order].tolist(), area[order].tolist()
    groups, begin, top_y, top_x, work = [], 0, 0, 0, 0
    for end in range(n):
        new_y, new_x = max(top_y, ys[end]), max(top_x, xs[end])
        padded = (end - begin + 1) * new_y * new_x
        if end > begin and (padded * channels > MAX_CROP_ELEMENTS or (
                end - begin >= _MIN_GROUP and padded > 2 * (work + areas[end]))):
            groups.append((order[begin:end], top_y, top_x))
            begin, new_y, new_x, work = end, ys[end], xs[end], 0
        top_y, top_x, work = new_y, new_x, work + areas[end]
    groups.append((order[begin:], top_y, top_x))
    return groups


def _settings(output_size, spatial_scale, sampling_ratio, aligned) -> tuple:
    """The pooling settings checked and normalised (one wording with every mmvitswin error)."""
    return (int_tuple('output_size', output_size, 2),
            check_positive_number('spatial_scale', spatial_scale),
            check_non_negative_int('sampling_ratio', sampling_ratio),  # 0: adaptive
            check_bool('aligned', aligned))


def roi_align(input: Tensor, rois: Tensor, output_size: Union[int, Sequence[int]],
              spatial_scale: float = 1.0, sampling_ratio: int = 0,
              aligned: bool = True) -> Tensor:
    """Average RoIAlign of ``rois`` (R, 5: image index, x1, y1, x2, y2, in input pixels) on
    ``input`` (N, C, H, W); returns (R, C, *output_size) in ``input``'s dtype.

    Same arguments and values as ``mmcv.ops.roi_align(..., pool_mode='avg')``. The pooling is
    computed in fp32 (outside autocast) whatever the input dtype, like mmcv's CPU kernels;
    gradients flow to ``input``, not to ``rois``.
    """
    if not isinstance(input, Tensor) or input.dim() != 4:
        raise ValueError(f'input must be a (N, C, H, W) tensor, got '
                         f'{tuple(input.shape) if isinstance(input, Tensor) else type(input)}')
    if not isinstance(rois, Tensor) or rois.dim() != 2 or rois.shape[1] != 5:
        raise ValueError('rois must be a (R, 5) tensor of (image index, x1, y1, x2, y2), got '
                         f'{tuple(rois.shape) if isinstance(rois, Tensor) else type(rois)}')
    if not input.is_floating_point():
        raise TypeError(f'input must be a floating-point tensor, got {input.dtype}')
    (out_h, out_w), spatial_scale, sampling_ratio, aligned = _settings(
        output_size, spatial_scale, sampling_ratio, aligned)
    batch, channels, height, width = input.shape
    n = rois.shape[0]
    if n == 0 or channels == 0:
        return input.new_zeros(n, channels, out_h, out_w)

    with torch.no_grad():
        boxes = rois.detach().float()
        image = boxes[:, 0].long()
        if int(image.min()) < 0 or int(image.max()) >= batch:
            raise ValueError(f'rois[:, 0] must index the {batch} images of input, got values '
                             f'in [{int(image.min())}, {int(image.max())}]')
        offset = 0.5 if aligned else 0.0
        x1 = boxes[:, 1] * spatial_scale - offset
        y1 = boxes[:, 2] * spatial_scale - offset
        box_w = boxes[:, 3] * spatial_scale - offset - x1
        box_h = boxes[:, 4] * spatial_scale - offset - y1
        if not aligned:  # mmcv's legacy mode: at least one pixel
            box_w, box_h = box_w.clamp(min=1.0), box_h.clamp(min=1.0)
        first_y, weight_y, span_y = _axis_weights(y1, box_h, out_h, sampling_ratio, height)
        first_x, weight_x, span_x = _axis_weights(x1, box_w, out_w, sampling_ratio, width)
        groups = _groups(span_y, span_x, channels)

    with torch.autocast(input.device.type, enabled=False):
        # One row per pixel, channels contiguous: a RoI's window is an index_select of rows.
        pixels = input.float().permute(0, 2, 3, 1).reshape(-1, channels)
        parts = []
        for group, rows_n, cols_n in groups:
            count = group.numel()
            rows = (first_y[group, None] + torch.arange(rows_n, device=input.device))
            cols = (first_x[group, None] + torch.arange(cols_n, device=input.device))
            rows = (image[group, None] * height + rows.clamp(max=height - 1))
            # (R, columns, rows) order: the first product contracts the columns.
            index = rows[:, None, :] * width + cols.clamp(max=width - 1)[:, :, None]
            window = pixels.index_select(0, index.reshape(-1))
            window = window.view(count, cols_n, rows_n * channels)
            pooled = torch.bmm(weight_x[group, :, :cols_n], window)  # (R, out_w, rows * C)
            pooled = pooled.view(count, out_w, rows_n, channels).transpose(1, 2)
            pooled = torch.bmm(weight_y[group, :, :rows_n],
                               pooled.reshape(count, rows_n, out_w * channels))
            parts.append(pooled)
        pooled = parts[0] if len(parts) == 1 else torch.cat(parts).index_select(
            0, torch.argsort(torch.cat([group for group, _, _ in groups])))
    pooled = pooled.view(n, out_h, out_w, channels).permute(0, 3, 1, 2)
    return pooled.contiguous().to(input.dtype)


class SeparableRoIAlign(nn.Module):
    """Drop-in for ``mmcv.ops.RoIAlign`` (``pool_mode='avg'``) computed by :func:`roi_align`.

    Same constructor and call as mmcv's (``output_size``, ``spatial_scale``,
    ``sampling_ratio``, ``pool_mode``, ``aligned``; ``forward(input, rois)``), so mmdet's RoI
    extractors build it from ``roi_layer=dict(type=...)`` (see
    :class:`mmvitswin.openmmlab.models.SeparableRoIExtractor`). ``pool_mode='max'`` has no separable
    form: use mmcv's op for it.
    """

    def __init__(self, output_size: Union[int, Sequence[int]], spatial_scale: float = 1.0,
                 sampling_ratio: int = 0, pool_mode: str = 'avg', aligned: bool = True,
                 use_torchvision: bool = False):
        super().__init__()
        if pool_mode != 'avg':
            raise ValueError(f"SeparableRoIAlign supports pool_mode='avg' only, got "
                             f"{pool_mode!r} (mmcv.ops.RoIAlign has 'max')")
        if use_torchvision:
            raise ValueError('SeparableRoIAlign is its own implementation; '
                             'use_torchvision must be False')
        self.output_size, self.spatial_scale, self.sampling_ratio, self.aligned = _settings(
            output_size, spatial_scale, sampling_ratio, aligned)
        self.pool_mode = pool_mode

    def forward(self, input: Tensor, rois: Tensor) -> Tensor:
        return roi_align(input, rois, self.output_size, self.spatial_scale,
                         self.sampling_ratio, self.aligned)

    def extra_repr(self) -> str:
        return (f'output_size={self.output_size}, spatial_scale={self.spatial_scale}, '
                f'sampling_ratio={self.sampling_ratio}, aligned={self.aligned}')
