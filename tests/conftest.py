import os
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

# MMVITSWIN_TEST_THREADS: intra-op threads for the tests (default up to 2). `make test-fast`
# sets 1: its tests run thousands of small ops, where thread hand-offs cost more than they
# gain (several times more on a machine whose cores are busy with other work).
# Under pytest-xdist (`make test`: one worker per core) each worker gets its share of the cores.
_WORKERS = int(os.environ.get('PYTEST_XDIST_WORKER_COUNT') or 1)
torch.set_num_threads(int(os.environ.get('MMVITSWIN_TEST_THREADS') or
                          max(1, min(2, (os.cpu_count() or 1) // _WORKERS))))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


@pytest.fixture(autouse=True)
def _no_leaked_default_scope():
    """MMEngine keeps every ``DefaultScope`` a Runner creates, and the latest one decides where
    a registry build looks: a test's Runner with ``default_scope='mmengine'`` would send later
    tests' builds in the same worker to mmengine's root registry. Drop what a test created."""
    try:
        from mmengine.registry import DefaultScope
    except ImportError:  # the torch-only core's tests run without OpenMMLab too
        yield
        return
    before = dict(DefaultScope._instance_dict)
    yield
    DefaultScope._instance_dict.clear()
    DefaultScope._instance_dict.update(before)


def max_rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| / max |b| (0 for two zero tensors)."""
    scale = b.abs().max().clamp_min(1e-12)
    return float((a - b).abs().max() / scale)


def norm_inputs(model: torch.nn.Module, x: torch.Tensor, indices):
    """``(inputs, outputs)`` of one no-grad forward of ``model`` on ``x``: what each of its
    output norms ``norm{i}`` (``i`` in ``indices``) received, as given (cloned), taken by
    forward pre-hooks, and the forward's outputs as a list. A backbone's stage maps before
    the norms: a LayerNorm would hide a per-token scale or shift of a stage's output."""
    received = {}

    def keep(i):
        return lambda module, args: received.__setitem__(i, args[0].clone())

    handles = [getattr(model, f'norm{i}').register_forward_pre_hook(keep(i)) for i in indices]
    try:
        with torch.no_grad():
            out = model(x)
    finally:
        for handle in handles:
            handle.remove()
    assert sorted(received) == sorted(indices), 'an output norm was not called'
    return [received[i] for i in indices], list(out) if isinstance(out, (list, tuple)) else [out]


# --------------------------------------------------------------------- torch version floors
# Tests of features that an old torch lacks skip there with a reason, e.g.
#   @requires_torch((2, 5), 'torch.onnx.export(dynamo=True)')
#   def test_onnx_dynamo_export(): ...
# or, as a marker (no import needed): @pytest.mark.requires_torch((2, 5), 'torch.onnx.export...')
# Feature flags for finer conditions live in mmvitswin.core.compat (COMPILE_DYNAMIC_OK, ...).
def requires_torch(version, feature: str):
    """A ``skipif`` mark: skip unless torch >= ``version`` (a tuple such as ``(2, 5)``)."""
    from mmvitswin.core.compat import TORCH_VERSION, torch_at_least
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


# ------------------------------------------------------------------------------ test tiers
# `make test` runs everything CI needs; `make test-fast` (pytest -m "not slow") is the
# sub-minute edit loop. A test is slow when it starts other processes (tools, training,
# distributed launches), runs the benchmark tool, trains, or builds a full-size reference
# model to compare against. Tests that only read structure build small widths instead.
# The tier is marked at the test itself, so that renaming a test cannot change its tier:
#   @pytest.mark.slow(reason='tools/train.py in a subprocess')   on a test function, or
#   pytestmark = pytest.mark.slow(reason='...')                   for a whole module.
# (The `slow` marker is registered in setup.cfg, so `--strict-markers` accepts it.)
#
# Per-test time limits (pytest-timeout): a hung test fails with its traceback instead of
# stalling the run. Every slow test gets SLOW_TIMEOUT_S unless it carries its own
# @pytest.mark.timeout(...) (beside its slow mark, or in the module's pytestmark). The limits
# (fixture setup included) are ~6-10x what a test takes alone on 2 cores, since a loaded
# machine stretches wall time that much: they catch hangs, not slowness. (The fast tier:
# setup.cfg's default `timeout`, if set.)
SLOW_TIMEOUT_S = 600


def pytest_collection_modifyitems(config, items):
    if not config.pluginmanager.hasplugin('timeout'):
        return
    for item in items:
        if (item.get_closest_marker('slow') is not None
                and item.get_closest_marker('timeout') is None):
            item.add_marker(pytest.mark.timeout(SLOW_TIMEOUT_S))
