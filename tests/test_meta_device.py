"""Every zoo backbone builds and runs on the ``meta`` device (issue 63, build item 4).

A meta tensor has a shape and a dtype but no data, so the forward and backward run every
shape computation and no arithmetic. An op whose result depends on the data (``nonzero``,
``.item()``, ``bool(tensor)``, boolean-mask indexing) cannot run there and raises: on a GPU it
would be a host sync. A branch taken only for the CPU (a device-type check that does not know
'meta') fails here too. What GPU work a model issues is counted on this device
(``tools/benchmark.py --count-kernels``), so every backbone has to run on it, in training
and in evaluation mode, forward and backward.
"""
import pytest
import torch
import torch.nn.functional as F

from mmvitswin.core.compat import torch_at_least
from zoo import ZOO, as_tuple, create_model, expected_shapes, params


def _build_on_meta(name: str) -> torch.nn.Module:
    """The zoo model ``name`` constructed under ``torch.device('meta')``: every parameter and
    buffer on the meta device, none ever materialised."""
    if not torch_at_least(2, 4):  # torch 2.1's meta trunc_normal_ asserts: built, then moved
        model = create_model(name).to('meta')
    else:
        with torch.device('meta'):
            model = create_model(name)
    for what, tensor in list(model.named_parameters()) + list(model.named_buffers()):
        assert tensor.is_meta, f'{what} was built on {tensor.device}, not on the meta device'
    return model


def _meta_has_embedding_bag_weights_backward() -> bool:
    """Whether this torch has a meta kernel for the backward of ``embedding_bag``'s
    per-sample weights (the deformable sampling's): torch 2.1 has none (CPU and CUDA do)."""
    table = torch.randn(3, 2, device='meta', requires_grad=True)
    weights = torch.randn(1, 2, device='meta', requires_grad=True)
    index = torch.zeros(1, 2, dtype=torch.long, device='meta')
    try:
        F.embedding_bag(index, table, mode='sum', per_sample_weights=weights).sum().backward()
    except NotImplementedError:
        return False
    return True


@pytest.mark.parametrize('mode', ['train', 'eval'])
@pytest.mark.parametrize('name', params('meta'))
def test_forward_and_backward_run_on_the_meta_device(name, mode):
    model = _build_on_meta(name).train(mode == 'train')
    x = torch.randn(2, 3, *ZOO[name].sizes[0], device='meta', requires_grad=True)
    outs = as_tuple(model(x))
    assert all(o.is_meta for o in outs)
    assert [tuple(o.shape) for o in outs] == expected_shapes(name, x.shape)
    try:
        sum(o.sum() for o in outs).backward()
    except NotImplementedError as e:  # only that missing kernel; a host sync still fails
        if ('_embedding_bag_per_sample_weights_backward' in str(e)
                and not _meta_has_embedding_bag_weights_backward()):
            pytest.skip(f'torch {torch.__version__} has no meta kernel for embedding_bag\'s '
                        f'per-sample-weights backward (CPU and CUDA have one)')
        raise
    assert x.grad is not None and x.grad.is_meta and x.grad.shape == x.shape
    missing = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
    assert not missing, f'no gradient reached {missing}'
    assert all(p.grad.shape == p.shape for p in model.parameters() if p.grad is not None)


def test_a_data_dependent_op_fails_on_the_meta_device():
    """The premise of the test above: each kind of host sync raises on meta tensors, so a
    backbone that used one could not pass it."""
    x = torch.randn(2, 5, device='meta')
    with pytest.raises((RuntimeError, NotImplementedError)):
        x.sum().item()
    with pytest.raises((RuntimeError, NotImplementedError)):
        bool((x > 0).any())
    with pytest.raises((RuntimeError, NotImplementedError)):
        torch.nonzero(x > 0)
    with pytest.raises((RuntimeError, NotImplementedError)):
        x[x > 0]
