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
# Marked here, by node-id prefix, so the tiers are reviewed in one place; a test may also
# carry @pytest.mark.slow itself.
SLOW_TESTS = {
    # subprocesses: tools, fresh interpreters, training and distributed runs
    'tests/test_benchmark_tool.py': 'runs tools/benchmark.py (the benchmark tool)',
    'tests/test_demo_tools.py': 'runs tools/demo.py, visualize.py, make_shapes.py',
    'tests/test_train_tools.py': 'trains/tests through tools/*.py, also two gloo processes',
    'tests/test_registry.py::test_swin_type_builds_our_class':
        'two fresh interpreters (import orders) for the 7 cases',
    'tests/test_core_standalone.py': 'a fresh interpreter without OpenMMLab builds the zoo',
    'tests/test_no_patches.py': 'a fresh interpreter imports mmvitswin (and builds the CPU AMP '
        'wrapper)',
    'tests/test_checkpoint_formats.py::test_swin_t_sized_hf_snapshot_matches':
        'Swin-T-sized HF SwinBackbone side by side',
    'tests/test_foundation_configs.py':
        'two bf16 training steps of each DINOv2/DINOv3/SAM Mask R-CNN and UPerNet config',
    'tests/test_swin_v2.py::test_config_trains_two_steps':
        'two training steps of Swin V2 Mask R-CNN and UPerNet configs (T, S, B), fp32 and bf16',
    'tests/test_dinov2.py::test_released_size_dinov2_s': 'a released-size DINOv2-S beside HF\'s',
    'tests/test_amp_runner.py::test_train_amp_on_cpu_runs_bf16_through_the_runner':
        'tools/train.py in a subprocess',
    'tests/test_amp_runner.py::test_test_amp_evaluates_in_bf16': 'tools/test.py in a subprocess',
    'tests/test_compat.py::test_import_in_fresh_interpreter_has_no_version_errors':
        'a fresh interpreter',
    'tests/test_foundation.py::test_check_script': 'tools/check_mmcv_ops.py in a subprocess',
    'tests/test_swin_checkpoint.py::test_convert_checkpoint_tool':
        'tools/convert_checkpoint.py in subprocesses',
    ('tests/test_layers.py::'
     'test_a_window_clamped_to_a_traced_size_keeps_the_size_arithmetic_constant'):
        'torch.compile (Dynamo) at two sizes',
    # training steps, memory probes, whole detectors
    'tests/test_deploy_paths.py::test_held_memory_does_not_depend_on_batch_or_on_sizes_seen':
        'repeated training steps at several batch sizes',
    'tests/test_deploy_paths.py::test_amp_train_step_has_finite_grads':
        'training steps in fp32 and bf16 for every backbone',
    'tests/test_vit_behaviour.py::test_demo_mask_rcnn_trains_one_step':
        'a training step of a whole Mask R-CNN',
    'tests/test_configs.py::test_config_builds_and_predicts':
        'builds and runs the whole detector/segmentor of every config',
    'tests/test_swin_detector.py': 'whole Mask R-CNN against mmdet',
    # reference parity at full size (mmdet, mmseg, mmaction2 models built side by side)
    'tests/test_swin_parity.py': 'full-size parity with mmdet/mmseg (forward and gradients)',
    'tests/test_vit_parity.py': 'parity with mmseg ViT-B widths',
    'tests/test_swin3d.py::test_outputs_match_mmaction2': 'Video Swin-T parity with mmaction2',
    'tests/test_swin_behaviour.py::test_frozen_stages_match_mmdet_definition':
        'mmdet Swin-T built side by side',
    'tests/test_swin_checkpoint.py::test_microsoft_format_matches_mmdet_converter':
        'full Swin-T files through mmdet\'s converter, outputs compared',
    'tests/test_swin_checkpoint.py::test_wrappers_and_timm_layout_load_exactly':
        'full Swin-T files in five wrappings, outputs compared with mmdet\'s',
    'tests/test_swin_checkpoint.py::test_window_7_to_12_resizes_tables':
        'full Swin-T files resized, outputs compared',
    'tests/test_swin_checkpoint.py::test_abs_pos_embed_resized_on_load': 'full Swin-T files',
    'tests/test_swin_checkpoint.py::test_equal_window_loading_changes_nothing':
        'full Swin-T files, outputs compared with mmdet\'s',
    # checkpointing / statelessness checks that need several full forward-backward passes
    'tests/test_swin_behaviour.py::test_with_cp_gives_the_same_gradients':
        'Swin-T forward-backward with and without activation checkpointing',
    'tests/test_swin_behaviour.py::test_no_state_is_kept_between_calls':
        'Swin-T at many sizes, twice',
    'tests/test_vit_adapter_modules.py::test_with_cp_gives_same_values_and_grads':
        'forward-backward with and without activation checkpointing',
}


# Per-test time limits (pytest-timeout): a hung test fails with its traceback instead of
# stalling the run. Every slow test gets SLOW_TIMEOUT_S, or the figure of the first prefix of
# SLOW_TIMEOUTS it matches; a test's own @pytest.mark.timeout(...) wins. The limits (fixture
# setup included) are ~6-10x what a test takes alone on 2 cores, since a loaded machine
# stretches wall time that much: they catch hangs, not slowness. (The fast tier: setup.cfg's
# default `timeout`, if set.)
SLOW_TIMEOUT_S = 600
SLOW_TIMEOUTS = {
    'tests/test_train_tools.py': 1200,
    'tests/test_demo_tools.py': 1200,
    'tests/test_benchmark_tool.py': 1200,
    'tests/test_amp_runner.py': 1200,
    'tests/test_reliability_training.py': 1200,
    'tests/test_configs.py::test_config_builds_and_predicts': 900,
    'tests/test_swin_detector.py': 900,
    'tests/test_deploy_paths.py::test_compile': 1200,  # the hybrid: ~100 CPU-s of tracing
}


def _prefixed(nodeid: str, table: dict):
    return next((value for prefix, value in table.items() if nodeid.startswith(prefix)), None)


def pytest_collection_modifyitems(config, items):
    with_timeouts = config.pluginmanager.hasplugin('timeout')
    for item in items:
        reason = _prefixed(item.nodeid, SLOW_TESTS)
        if reason is not None:
            item.add_marker(pytest.mark.slow(reason=reason))
        if (with_timeouts and item.get_closest_marker('slow') is not None
                and item.get_closest_marker('timeout') is None):
            item.add_marker(pytest.mark.timeout(_prefixed(item.nodeid, SLOW_TIMEOUTS)
                                                 or SLOW_TIMEOUT_S))
