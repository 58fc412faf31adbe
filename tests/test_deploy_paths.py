"""The paths users train and ship with, for every backbone (small widths):

- AMP: forward under CPU autocast (bf16 and fp16), ``backward()`` outside it, as MMEngine's
  ``AmpOptimWrapper`` does; finite gradients, bf16 close to fp32;
- ONNX export with dynamic batch/H/W, run in onnxruntime at another odd size;
- no state kept between calls: the memory a backbone holds does not depend on the batch size
  or on how many input sizes it has seen.

``torch.compile(dynamic=True, fullgraph=True)`` of every backbone, forward and backward at two
odd sizes without a recompilation, is tests/test_eager_traced.py.
"""
import pytest
import torch
import torch.nn.functional as F

from mmvitswin.core.compat import CPU_AUTOCAST_FP16, HAS_DYNAMO_ONNX_EXPORT
from conftest import max_rel_err
from zoo import ZOO, create_model, example_input, params

# every backbone: the zoo (tests/zoo.py); its two odd sizes per backbone need padding at every
# stage (ONNX: exported at the first, run at the second)


def build(name: str, seed: int = 0) -> torch.nn.Module:
    return create_model(name, seed)


def inputs(name: str, which: int, batch: int = 2) -> torch.Tensor:
    return example_input(name, which, batch)


# ------------------------------------------------------------------------------------ AMP
@pytest.mark.slow(reason='training steps in fp32 and bf16 for every backbone')
@pytest.mark.parametrize('dtype', [
    torch.bfloat16,
    pytest.param(torch.float16, marks=pytest.mark.skipif(
        not CPU_AUTOCAST_FP16, reason='fp16 autocast on CPU needs a newer torch'))])
@pytest.mark.parametrize('name', params('amp'))
def test_amp_train_step_has_finite_grads_and_bf16_is_close_to_fp32(name, dtype):
    model = build(name).eval()
    x = inputs(name, 0)
    if dtype == torch.float16 and getattr(model, 'rope_theta', None) is not None:
        # DINOv3 is not supported in fp16 (FP16_REFUSAL in backbones/vit.py): refused, naming bf16
        with pytest.raises(ValueError, match='bfloat16'), torch.autocast('cpu', dtype=dtype):
            model(x)
        return
    if dtype == torch.bfloat16:  # eval first: a train step would move BatchNorm statistics
        with torch.no_grad():
            ref = model(x)
            with torch.autocast('cpu', dtype=dtype):
                low = model(x)
        for a, b in zip(low, ref):
            assert a.shape == b.shape
            assert max_rel_err(a.float(), b) < 5e-2
    model.train()
    with torch.autocast('cpu', dtype=dtype):
        outs = model(x)
        loss = sum(o.float().square().mean() for o in outs)
    loss.backward()  # outside autocast, as AmpOptimWrapper
    assert torch.isfinite(loss)
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    missing = [n for n, p in params if p.grad is None]
    assert not missing, f'no gradient for {missing[:5]}'
    bad = [n for n, p in params if not torch.isfinite(p.grad).all()]
    assert not bad, f'non-finite gradients in {bad[:5]}'
    assert all(p.grad.dtype == p.dtype for _, p in params)


def test_model_cast_to_bf16_runs_inference():
    model = build('swin').eval()
    x = inputs('swin', 0)
    with torch.no_grad():
        ref = model(x)
        low = model.to(torch.bfloat16)(x.to(torch.bfloat16))
    for a, b in zip(low, ref):
        assert a.dtype == torch.bfloat16
        assert max_rel_err(a.float(), b) < 5e-2


# ----------------------------------------------------------------------------------- ONNX
@pytest.mark.slow
@pytest.mark.skipif(not HAS_DYNAMO_ONNX_EXPORT,
                    reason='torch.onnx.export(dynamo=True) needs torch >= 2.5')
@pytest.mark.parametrize('name', params('onnx'))
def test_onnx_export_with_dynamic_size_runs_at_another_size(name, tmp_path):
    pytest.importorskip('onnxruntime')
    pytest.importorskip('onnxscript')
    from mmvitswin.core.deploy import compare_onnx, export_onnx
    model = build(name).eval()
    path = str(tmp_path / f'{name}.onnx')
    export_onnx(model, inputs(name, 0), path)
    errors = compare_onnx(model, path, inputs(name, 1, batch=3))
    assert max(errors) < 1e-4, errors


@pytest.mark.skipif(not HAS_DYNAMO_ONNX_EXPORT,
                    reason='torch.onnx.export(dynamo=True) needs torch >= 2.5')
def test_onnx_embedding_bag_sums_any_bags(tmp_path):
    """Our translation of ``embedding_bag(mode='sum')`` (the deformable sampling's reads):
    equal bags of a 2-D input with weights, and unequal and empty bags with offsets, with and
    without ``include_last_offset``, at the traced size and another one."""
    pytest.importorskip('onnxruntime')
    pytest.importorskip('onnxscript')
    from mmvitswin.core.deploy import export_onnx, run_onnx

    class Bags(torch.nn.Module):
        def forward(self, x):
            table = torch.arange(60.).view(12, 5)
            flat = x.flatten()
            index = (flat * 12).long().clamp(0, 11)
            n = flat.shape[0]
            equal = F.embedding_bag(index.view(x.shape[0], -1), table, mode='sum',
                                    per_sample_weights=x.flatten(1))
            at = torch.arange(n + 1)  # bags: empty, [0, n/3), [n/3, n-1), [n-1, n), empty
            offsets = torch.cat((at[:1], at[:1], at[n // 3:n // 3 + 1], at[n - 1:]))
            unequal = F.embedding_bag(index, table, offsets, mode='sum', per_sample_weights=flat)
            last = F.embedding_bag(index, table, offsets[1:], mode='sum', include_last_offset=True)
            return equal, unequal, last

    model = Bags()
    path = str(tmp_path / 'bags.onnx')
    export_onnx(model, torch.rand(3, 1, 2, 4), path)
    for x in (torch.rand(3, 1, 2, 4), torch.rand(5, 1, 3, 3)):
        want = model(x)
        got = run_onnx(path, x)
        assert [g.shape for g in got] == [w.shape for w in want]
        for g, w in zip(got, want):
            assert torch.allclose(g, w, atol=1e-4)
        assert want[1][0].abs().sum() == 0 and want[1][4].abs().sum() == 0  # empty bags
    with pytest.raises(ValueError, match='opset must be >= 16'):
        export_onnx(model, torch.rand(3, 1, 2, 4), path, opset=15)


# ------------------------------------------------------------------------- bounded state
def _held_bytes(model: torch.nn.Module) -> int:
    """Bytes of every tensor the model holds: parameters, buffers, and any tensor attribute
    (also inside nested tuples, lists and dicts)."""
    total, seen = 0, set()

    def tensors_in(value):
        if isinstance(value, torch.Tensor):
            yield value
        elif isinstance(value, (tuple, list, dict)):
            for v in (value.values() if isinstance(value, dict) else value):
                yield from tensors_in(v)

    for module in model.modules():
        tensors = list(module._parameters.values()) + list(module._buffers.values())
        tensors += [t for value in vars(module).values() for t in tensors_in(value)]
        for t in tensors:
            if t is not None and id(t) not in seen:
                seen.add(id(t))
                total += t.numel() * t.element_size()
    return total


@pytest.mark.slow(reason='repeated training steps at several batch sizes')
@pytest.mark.parametrize('name', params('bounded_state'))
def test_held_memory_does_not_depend_on_batch_or_on_sizes_seen(name):
    model = build(name).eval()
    start = _held_bytes(model)
    video = ZOO[name].video
    # detection size for the Swins; the ViTs' global attention and video get smaller ones
    big = (4, 200, 336) if video else (800, 1344) if name.startswith('swin') else (256, 384)
    with torch.no_grad():
        model(torch.randn(1, 3, *big))
        after_b1 = _held_bytes(model)
        model(torch.randn(4, 3, *big))
        after_b4 = _held_bytes(model)
        gen = torch.Generator().manual_seed(0)
        for _ in range(300 if not video else 30):
            size = torch.randint(8, 97, (3 if video else 2, ), generator=gen).tolist()
            model(torch.randn(1, 3, *size))
    # nothing is kept between calls: the model holds its weights and buffers only
    assert after_b1 == after_b4 == start
    assert _held_bytes(model) == start
    if video:
        return
    with torch.no_grad(), torch.autocast('cpu', dtype=torch.bfloat16):
        for size in ((64, 96), (40, 72)):
            model(torch.randn(2, 3, *size))
    assert _held_bytes(model) == start
