"""``--count-kernels``: the work a GPU would be given, counted without one.

Each model, built on the CPU (mmdet's constructor calls ``.item()``), runs on the meta device:
no data, so no CPU-only branch runs, and a data-dependent op (``nonzero``, ``.item()``, boolean
indexing: a host sync on a GPU) fails. A forward (no grad) and a train step (forward, a sum
loss, backward) run under :class:`OpCounter`.
"""
import sys
from collections import Counter

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from mmvitswin.core import SwinTransformer, SwinTransformerV2, ViTAdapter

from .harness import error_text
from .peers import build_peer, import_timm

# ops that only allocate or change a tensor's metadata in place: no kernel on a GPU
METADATA_OPS = frozenset({
    '_unsafe_view', 'empty', 'empty_like', 'empty_strided', 'new_empty', 'new_empty_strided',
    't_', 'transpose_', 'unsqueeze_', 'squeeze_', 'as_strided_', 'detach_', 'resize_', 'set_',
    'lift_fresh', 'sym_size', 'sym_stride', 'sym_numel', 'sym_storage_offset', 'is_same_size'})
CASES = (  # (name, our model, note)
    ('Swin-T', lambda: SwinTransformer(drop_path_rate=0.), ''),
    ('SwinV2-T w16', lambda: SwinTransformerV2(arch='tiny', window_size=16, drop_path_rate=0.,
                                               pretrained_window_sizes=(16, 16, 16, 8)),
     'window 16; HF: Swinv2Backbone'),
    ('DINOv2-B', lambda: ViTAdapter(arch='dinov2-b', adapter=None),
     "trunk alone: ours ViTAdapter(arch='dinov2-b', adapter=None), HF Dinov2Model"),
)
IMPLS, SIZES = ('ours', 'mmdet', 'timm', 'hf'), ((288, 448), (800, 1216))


class OpCounter(TorchDispatchMode):
    """Counts the aten ops run inside it (``ops``) and the kernels among them (``kernels``, by
    op in ``names``): ops that return no view of an input (an alias, not written, in the op's
    schema: view, t, permute, expand, slice, ...) and are not in :data:`METADATA_OPS`."""

    def __init__(self):
        super().__init__()
        self.ops, self.kernels, self.names = 0, 0, Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        name = func.overloadpacket.__name__
        if name not in METADATA_OPS and not any(
                r.alias_info is not None and not r.alias_info.is_write
                for r in func._schema.returns):
            self.kernels += 1
            self.names[name] += 1
        return func(*args, **(kwargs or {}))


class FusedAttention(TorchFunctionMode):
    """SDPA on (B, H, L, E) as the memory-efficient attention op: the one kernel CUDA runs each
    way for a masked call, where the meta device takes torch's math path (about six ops)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        a = dict(zip(('query', 'key', 'value', 'attn_mask', 'dropout_p', 'is_causal', 'scale'),
                     args), **(kwargs or {})) if func is F.scaled_dot_product_attention else {}
        q, k, v, mask = (a.get(n) for n in ('query', 'key', 'value', 'attn_mask'))
        if q is None or q.dim() != 4 or a.get('enable_gqa') or (
                mask is not None and mask.dtype == torch.bool):  # a float bias or none
            return func(*args, **(kwargs or {}))
        if mask is not None:  # the op takes a bias of the full shape
            mask = mask.expand(q.shape[0], q.shape[1], q.shape[2], k.shape[2])
        grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad
                                                for t in (q, k, v, mask))
        return torch.ops.aten._scaled_dot_product_efficient_attention(
            q, k, v, mask, grad, a.get('dropout_p', 0.), a.get('is_causal', False),
            scale=a.get('scale'))[0]


def count(model, shape, train: bool) -> OpCounter:
    """The ops of one forward (``train``: forward, sum loss, backward) on a meta input."""
    x = torch.empty(shape, device='meta')
    model.train(train)
    model.zero_grad(set_to_none=True)  # a model counted again accumulates no gradient
    with FusedAttention(), OpCounter() as counter, torch.set_grad_enabled(train):
        out = model(x)
        if train:
            outs = [out] if torch.is_tensor(out) else list(out)
            sum((o.float().sum() for o in outs[1:]), outs[0].float().sum()).backward()
    return counter


def count_kernels(batch: int = 2, sizes=SIZES, cases=CASES) -> dict:
    """``{(case, size, pass): {impl: OpCounter or why there is none}}``."""
    table = {}
    for name, build, _ in cases:
        models = {}
        for impl in IMPLS:
            try:
                models[impl] = (build() if impl == 'ours' else build_peer(
                    impl, build(), load=False)).to('meta')
            except Exception as exc:  # noqa: BLE001  (LookupError: the peer has no such model)
                models[impl] = 'no such model' if isinstance(exc, LookupError) else \
                    'not built: ' + error_text(exc)[:80]
        for size, train in [(s, t) for s in sizes for t in (False, True)]:
            cells = table[name, size, 'train step' if train else 'forward'] = {}
            for impl, model in models.items():
                try:
                    cells[impl] = model if isinstance(model, str) else \
                        count(model, (batch, 3) + tuple(size), train)
                except Exception as exc:  # noqa: BLE001  (data-dependent: a host sync on a GPU)
                    cells[impl] = 'fails on meta: ' + error_text(exc)[:80]
            print(f'[kernels] {name} {size} train={train}: ' + ', '.join(
                f'{i} {getattr(c, "kernels", c)}' for i, c in cells.items()), file=sys.stderr)
    return table


def render_kernels(table: dict, batch: int, cases=CASES) -> str:
    """Markdown: kernels (all ops) per model and pass, the peer with the fewest kernels and
    whether ours has no more; where ours has more, the kernels that make the difference."""
    lines, notes = [f'## Kernels per call on the meta device (batch {batch})', '',
                    'kernels (all ops); a train step is forward, a sum loss and backward; '
                    'fewest: the peer with the fewest kernels.', '',
                    '| model | size | pass | ours | mmdet | timm | HF | fewest | ours <= it |',
                    '|---|---|---|---|---|---|---|---|---|'], []
    for (name, size, what), cells in table.items():
        done = {i: c for i, c in cells.items() if isinstance(c, OpCounter)}
        best = min((i for i in done if i != 'ours'), key=lambda i: done[i].kernels, default=None)
        verdict = '-' if best is None or 'ours' not in done else 'yes' if \
            done['ours'].kernels <= done[best].kernels else 'no'
        if verdict == 'no':
            diff = Counter(done['ours'].names)
            diff.subtract(done[best].names)
            notes.append(f'- {name} {size[0]}x{size[1]} {what}, ours - {best}: ' + ', '.join(
                f'{op} {n:+d}' for op, n in diff.most_common() if n))
        lines.append(f'| {name} | {size[0]}x{size[1]} | {what} | ' + ' | '.join(
            f'{c.kernels} ({c.ops})' if isinstance(c, OpCounter) else c for c in cells.values())
            + f' | {best or "-"} | {verdict} |')
    return '\n'.join(lines + [''] + [f'- {name}: {note}' for name, _, note in cases if note]
                     + notes + [f'- {import_timm()[1]}', '- SDPA counted as one fused kernel '
                                'each way (memory-efficient attention), views and allocations '
                                'as none.']) + '\n'
