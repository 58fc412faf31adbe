"""ONNX export of a backbone with dynamic batch, height and width, and its check in onnxruntime.

Used by ``tools/export_onnx.py`` and the tests. The exporter is ``torch.onnx.export(...,
dynamo=True)`` (torch >= 2.5): it traces the model with ``torch.export`` and symbolic sizes,
so the graph holds for any input size; our layers keep every size-dependent step in tensor
ops (``layers/window.py``), which is what makes one graph possible. Needs the
``deploy`` extra: ``pip install -e .[deploy]`` (onnx, onnxscript, onnxruntime).
"""
from typing import List, Optional, Sequence, Tuple

import torch

from .compat import HAS_DYNAMO_ONNX_EXPORT


def _input_names(ndim: int) -> Tuple[str, dict]:
    """The input's name and its dynamic axes (batch and every spatial dim)."""
    axes = {0: 'batch'}
    names = ['height', 'width'] if ndim == 4 else ['time', 'height', 'width']
    for i, name in enumerate(names):
        axes[2 + i] = name
    return 'x', axes


def export_onnx(model: torch.nn.Module, example: torch.Tensor, path: str,
                opset: int = 18) -> List[str]:
    """Export ``model`` (eval mode) traced on ``example`` to ``path`` with every dim of the input
    but the channels dynamic. Returns the output names (``out0``, ``out1``, ...)."""
    if not HAS_DYNAMO_ONNX_EXPORT:
        raise RuntimeError(f'ONNX export needs torch >= 2.5 (torch.onnx.export(dynamo=True)); '
                           f'this is torch {torch.__version__}')
    if opset < 16:
        raise ValueError(f'opset must be >= 16 (ScatterND with reduction, used for '
                         f'embedding_bag), got {opset}')
    from torch.export import Dim
    model = model.eval()
    with torch.no_grad():
        outs = model(example)
    outs = outs if isinstance(outs, (tuple, list)) else (outs, )
    out_names = [f'out{i}' for i in range(len(outs))]
    name, axes = _input_names(example.dim())
    dynamic = {name: {axis: Dim.AUTO for axis in axes}}
    bags = {op: _embedding_bag_onnx for op in (torch.ops.aten._embedding_bag.default,
                                               torch.ops.aten._embedding_bag_forward_only.default,
                                               torch.ops.aten.embedding_bag.padding_idx)}
    with torch.no_grad():  # an inference graph: no bias needs a gradient (SDPA's choice)
        torch.onnx.export(model, (example, ), path, input_names=[name],
                          output_names=out_names, dynamic_shapes=dynamic, opset_version=opset,
                          dynamo=True, external_data=False, custom_translation_table=bags)
    return out_names


def _embedding_bag_onnx(weight, indices, offsets, scale_grad_by_freq=False, mode=0,
                        sparse=False, per_sample_weights=None, include_last_offset=False,
                        padding_idx=None):
    """``embedding_bag(mode='sum')`` in ONNX as one gather and one scatter-add, for any bags.

    onnxscript's own translation loops over the bags one at a time (an ONNX ``Loop``), which
    onnxruntime runs one bag after another; the deformable sampling of the interaction adapter
    has one bag per query and head. Here every looked-up row is scaled by its weight and added
    into the row of its bag, the bag of index ``i`` being the number of bag starts at or
    before ``i`` (a cumulative sum of start marks), so empty and unequal bags come out as
    PyTorch's. The other three outputs only have PyTorch's shapes (empty, then zeros per
    bag): in sum mode they are internals of its backward, which an exported graph never runs.
    """
    from onnxscript import opset18 as op
    if mode != 0 or (padding_idx is not None and padding_idx >= 0):
        raise NotImplementedError(f'ONNX export of embedding_bag supports mode="sum" without '
                                  f'padding_idx, got mode={mode}, padding_idx={padding_idx}')
    indices = op.Reshape(indices, op.Constant(value_ints=[-1]))
    rows = op.Gather(weight, indices, axis=0)  # (N, d)
    if per_sample_weights is not None:
        rows = op.Mul(rows, op.Unsqueeze(op.Reshape(per_sample_weights,
                                                    op.Constant(value_ints=[-1])),
                                         op.Constant(value_ints=[1])))
    zero, one = op.Constant(value_ints=[0]), op.Constant(value_ints=[1])
    num = op.Shape(indices)
    num_bags = op.Shape(offsets)
    if include_last_offset:
        num_bags = op.Sub(num_bags, one)
    # a mark at every later bag's start (room for starts at N: trailing empty bags)
    starts = op.Slice(offsets, one, num_bags)
    marks = op.ScatterElements(op.Expand(op.Constant(value_int=0), op.Add(num, one)), starts,
                               op.Expand(op.Constant(value_int=1), op.Shape(starts)),
                               axis=0, reduction='add')
    bag_of_index = op.CumSum(op.Slice(marks, zero, num), op.Constant(value_int=0))
    total = op.Expand(op.CastLike(op.Constant(value_float=0.0), weight),
                      op.Concat(num_bags, op.Shape(weight, start=1, end=2), axis=0))
    sums = op.ScatterND(total, op.Unsqueeze(bag_of_index, one), rows, reduction='add')
    sizes = op.Expand(op.Constant(value_int=0), num_bags)
    return sums, op.Slice(bag_of_index, zero, zero), sizes, sizes


def run_onnx(path: str, x: torch.Tensor) -> List[torch.Tensor]:
    """Run an exported model in onnxruntime (CPU) on ``x``."""
    import onnxruntime as ort
    session = ort.InferenceSession(path, providers=['CPUExecutionProvider'])
    outs = session.run(None, {session.get_inputs()[0].name: x.detach().cpu().numpy()})
    return [torch.from_numpy(o) for o in outs]


def compare_onnx(model: torch.nn.Module, path: str, x: torch.Tensor) -> List[float]:
    """Max error of each ONNX output relative to the eager output's max magnitude at ``x``."""
    with torch.no_grad():
        eager = model.eval()(x)
    eager = eager if isinstance(eager, (tuple, list)) else (eager, )
    got = run_onnx(path, x)
    if len(got) != len(eager):
        raise RuntimeError(f'ONNX model returned {len(got)} outputs, eager {len(eager)}')
    errors = []
    for g, e in zip(got, eager):
        if tuple(g.shape) != tuple(e.shape):
            raise RuntimeError(f'ONNX output shape {tuple(g.shape)} != eager {tuple(e.shape)}')
        scale = e.abs().max().clamp_min(1e-12)
        errors.append(float((g - e).abs().max() / scale))
    return errors


def second_size(shape: Sequence[int], check: Optional[Sequence[int]] = None) -> Tuple[int, ...]:
    """The spatial size to check at: ``check`` or an odd size different from ``shape``."""
    if check is not None:
        return tuple(check)
    return tuple((s * 3 // 4) | 1 if (s * 3 // 4) | 1 != s else s + 2 for s in shape)
