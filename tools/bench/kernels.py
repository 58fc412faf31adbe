"""``--count-kernels``: the work a GPU would be given, counted without one.

Each model is built on ``torch.device('meta')`` -- no data, so no CPU-only branch runs, and a
data-dependent op (``nonzero``, ``.item()``, boolean indexing), a host sync on a GPU, fails:
such a model is reported as failing on meta. Its forward (no grad) and train step (forward, a
sum loss, backward) run under :class:`OpCounter`, which counts every aten op reaching the
backend, and the kernels among them (:func:`is_kernel`, the one rule). Ours against mmdet's,
timm's and HF's version of the same model (:mod:`.peers`, architecture only).

Two rules make the count the GPU's: pure views and allocations launch no kernel; and
``scaled_dot_product_attention``, which on the meta device takes torch's math path (about six
ops), is counted as the one fused kernel a GPU runs (forward and backward), by routing it to
the memory-efficient attention op, CUDA's choice for a masked call.
"""
import sys
from collections import Counter

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from mmvitswin.core import SwinTransformer, SwinTransformerV2, ViTAdapter

from .peers import build_peer, import_timm

# ops that only allocate or change a tensor's metadata in place: no kernel on a GPU
METADATA_OPS = frozenset({
    '_unsafe_view', 'empty', 'empty_like', 'empty_strided', 'new_empty', 'new_empty_strided',
    't_', 'transpose_', 'unsqueeze_', 'squeeze_', 'as_strided_', 'detach_', 'resize_', 'set_',
    'lift_fresh', 'sym_size', 'sym_stride', 'sym_numel', 'sym_storage_offset', 'is_same_size'})


def is_kernel(func) -> bool:
    """Whether aten op ``func`` launches a kernel: it returns no view of an input's storage
    (view, reshape's alias, as_strided, t, transpose, permute, expand, (un)squeeze, slice,
    select, detach, split, unbind, ...: an alias, not written, in its schema) and is not in
    :data:`METADATA_OPS`."""
    view = any(r.alias_info is not None and not r.alias_info.is_write
               for r in func._schema.returns)
    return not view and func.overloadpacket.__name__ not in METADATA_OPS


class OpCounter(TorchDispatchMode):
    """Counts the aten ops run inside it: ``ops``, ``kernels`` and ``names`` (kernels by op)."""

    def __init__(self):
        super().__init__()
        self.ops, self.kernels, self.names = 0, 0, Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        if is_kernel(func):
            self.kernels += 1
            self.names[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


class FusedAttention(TorchFunctionMode):
    """SDPA on (B, H, L, E) as the memory-efficient attention op (one kernel each way)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        a = dict(zip(('query', 'key', 'value', 'attn_mask', 'dropout_p', 'is_causal', 'scale'),
                     args), **(kwargs or {}))
        if func is not F.scaled_dot_product_attention or a['query'].dim() != 4 or \
                a.get('enable_gqa'):
            return func(*args, **(kwargs or {}))
        q, k, v, mask = a['query'], a['key'], a['value'], a.get('attn_mask')
        if mask is not None and mask.dtype == torch.bool:  # True: attend
            mask = torch.zeros(mask.shape, dtype=q.dtype, device=q.device).masked_fill(
                ~mask, float('-inf'))
        if mask is not None:
            mask = mask.expand(q.shape[0], q.shape[1], q.shape[2], k.shape[2])
        grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad
                                                for t in (q, k, v, mask))
        try:
            return torch.ops.aten._scaled_dot_product_efficient_attention(
                q, k, v, mask, grad, a.get('dropout_p', 0.), a.get('is_causal', False),
                scale=a.get('scale'))[0]
        except (RuntimeError, TypeError, NotImplementedError):  # an older torch: math path
            return func(*args, **(kwargs or {}))


def count(model, shape, train: bool) -> OpCounter:
    """The ops of one forward (``train``: forward, sum loss, backward) on a meta input."""
    x = torch.empty(shape, device='meta')
    model.train(train)
    with FusedAttention(), OpCounter() as counter:
        with torch.set_grad_enabled(train):
            out = model(x)
            if train:
                outs = [out] if torch.is_tensor(out) else list(out)
                loss = outs[0].float().sum()
                for o in outs[1:]:
                    loss = loss + o.float().sum()
                loss.backward()
    return counter


CASES = (  # (name, our model on meta, note)
    ('Swin-T', lambda: SwinTransformer(drop_path_rate=0.), ''),
    ('SwinV2-T w16', lambda: SwinTransformerV2(arch='tiny', window_size=16, drop_path_rate=0.,
                                               pretrained_window_sizes=(16, 16, 16, 8)),
     'window 16; HF: Swinv2Backbone'),
    ('DINOv2-B', lambda: ViTAdapter(arch='dinov2-b', adapter=None),
     "trunk alone: ours ViTAdapter(arch='dinov2-b', adapter=None), HF Dinov2Model"),
)
IMPLS = ('ours', 'mmdet', 'timm', 'hf')
SIZES = ((288, 448), (800, 1216))


def _cell(impl: str, build, shape, train: bool):
    """The :class:`OpCounter` of one model, or why there is none. A peer whose constructor
    reads tensor values (mmdet's drop-path schedule calls ``.item()``) is built on the CPU and
    moved to meta (``moved``); its forward and backward still run on meta."""
    try:
        with torch.device('meta'):
            model = build() if impl == 'ours' else build_peer(impl, build(), load=False)
    except LookupError:
        return 'no such model'
    except Exception as exc:  # noqa: BLE001  (a package missing, a constructor reading values)
        try:
            model = build_peer(impl, build(), load=False).to('meta')
            model.moved = True
        except Exception:  # noqa: BLE001
            return f'not built: {type(exc).__name__}: {str(exc)[:80]}'.splitlines()[0]
    try:
        counter = count(model, shape, train)
    except Exception as exc:  # noqa: BLE001  (a data-dependent op: a host sync on a GPU)
        return f'fails on meta: {type(exc).__name__}: {str(exc)[:80]}'.splitlines()[0]
    counter.moved = getattr(model, 'moved', False)
    return counter


def count_kernels(batch: int = 2, sizes=SIZES, cases=CASES) -> dict:
    """``{(case, size, pass): {impl: OpCounter or reason}}`` for every case, size and pass."""
    table = {}
    for name, build, _ in cases:
        for size, train in [(s, t) for s in sizes for t in (False, True)]:
            key = (name, size, 'train step' if train else 'forward')
            table[key] = {i: _cell(i, build, (batch, 3) + tuple(size), train) for i in IMPLS}
            print(f'[kernels] {key}: ' + ', '.join(f'{i} {getattr(c, "kernels", c)}'
                                                    for i, c in table[key].items()),
                  file=sys.stderr, flush=True)
    return table


def render_kernels(table: dict, batch: int, cases=CASES) -> str:
    """Markdown: kernels (all ops) per model and pass, the peer with the fewest kernels, and
    whether ours has no more; where ours has more, the kernels that make the difference."""
    lines = [f'## Kernels per call on the meta device (batch {batch})', '',
             'kernels (all ops); a train step is forward, a sum loss and backward; fewest: the '
             'peer with the fewest kernels.', '',
             '| model | size | pass | ours | mmdet | timm | HF | fewest | ours <= it |',
             '|---|---|---|---|---|---|---|---|---|']
    notes, moved = [], set()
    for (name, size, what), cells in table.items():
        done = {i: c for i, c in cells.items() if isinstance(c, OpCounter)}
        moved |= {i for i, c in done.items() if c.moved}
        best = min((i for i in done if i != 'ours'), key=lambda i: done[i].kernels, default=None)
        verdict = '-' if best is None or 'ours' not in done else 'yes' if \
            done['ours'].kernels <= done[best].kernels else 'no'
        if verdict == 'no':
            diff = Counter(done['ours'].names)
            diff.subtract(done[best].names)
            notes.append(f'- {name} {size[0]}x{size[1]} {what}, ours - {best}: ' + ', '.join(
                f'{op} {n:+d}' for op, n in diff.most_common() if n))
        lines.append(f'| {name} | {size[0]}x{size[1]} | {what} | ' + ' | '.join(
            f'{c.kernels} ({c.ops})' if isinstance(c, OpCounter) else c
            for c in cells.values()) + f' | {best or "-"} | {verdict} |')
    lines += [''] + [f'- {name}: {note}' for name, _, note in cases if note] + notes
    if moved:
        lines.append(f'- built on the CPU, then moved to meta: {", ".join(sorted(moved))}')
    return '\n'.join(lines + [
        f'- {import_timm()[1]}', '- SDPA counted as one fused kernel each way (memory-efficient '
        'attention), views and allocations not counted (tools/bench/kernels.py).']) + '\n'
