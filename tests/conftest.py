import os
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


def max_rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| / max |b| (0 for two zero tensors)."""
    scale = b.abs().max().clamp_min(1e-12)
    return float((a - b).abs().max() / scale)


# --------------------------------------------------------------------- torch version floors
# Tests of features that an old torch lacks skip there with a reason, e.g.
#   @requires_torch((2, 5), 'torch.onnx.export(dynamo=True)')
#   def test_onnx_dynamo_export(): ...
# or, as a marker (no import needed): @pytest.mark.requires_torch((2, 5), 'torch.onnx.export...')
# Feature flags for finer conditions live in mmvitswin.compat (COMPILE_DYNAMIC_OK, ...).
def requires_torch(version, feature: str):
    """A ``skipif`` mark: skip unless torch >= ``version`` (a tuple such as ``(2, 5)``)."""
    from mmvitswin.compat import TORCH_VERSION, torch_at_least
    version = tuple(version)
    return pytest.mark.skipif(
        not torch_at_least(*version),
        reason=(f'needs torch >= {".".join(map(str, version))} for {feature} '
                f'(installed: {".".join(map(str, TORCH_VERSION))})'))


def pytest_configure(config):
    config.addinivalue_line(
        'markers', 'requires_torch(version, feature): skip unless torch >= version '
        '(a tuple such as (2, 5)); feature names what the test needs')


def pytest_runtest_setup(item):
    for mark in item.iter_markers(name='requires_torch'):
        skip = requires_torch(*mark.args, **mark.kwargs)
        if skip.args[0]:
            pytest.skip(skip.kwargs['reason'])
