"""``import mmvitswin`` registers our modules and changes nothing of MMEngine, MMDetection,
MMSegmentation or mmcv (issue 24): every attribute an earlier mmvitswin replaced is the same
object after the import (and after building our CPU bf16 optim wrapper), torch's weights-only
allow-list is untouched, and MMEngine's own functions raise their own errors.

One fresh interpreter: what an import changes is process-global, and this process has long
imported mmvitswin.
"""
import json
import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.slow(
    reason='a fresh interpreter imports mmvitswin (and builds the CPU AMP wrapper)')

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PROBE = textwrap.dedent('''
    import importlib, inspect, json, sys
    import torch
    import mmcv.ops
    import mmengine.hooks.checkpoint_hook as hook_module
    import mmengine.registry
    import mmengine.runner
    import mmengine.runner.checkpoint as ckpt_module
    import mmengine.runner.runner as runner_module
    import mmengine.runner._flexible_runner as flexible_module
    from mmengine.fileio import LocalBackend
    from mmengine.hooks import CheckpointHook
    from mmengine.runner import CheckpointLoader, Runner
    import mmdet.registry, mmseg.registry
    from mmdet.engine.hooks.checkloss_hook import CheckInvalidLossHook

    def mmcv_functions():
        """Every forward/backward of every autograd.Function defined in mmcv.ops."""
        found = {}
        for name, module in sorted(sys.modules.items()):
            if not name.startswith('mmcv.ops.') or module is None:
                continue
            for obj in vars(module).values():
                if (inspect.isclass(obj) and issubclass(obj, torch.autograd.Function)
                        and obj.__module__ == name):
                    for attr in ('forward', 'backward'):
                        found[f'{obj.__module__}.{obj.__qualname__}.{attr}'] = \\
                            vars(obj).get(attr)
        return found

    def host_registries():
        return {f'{host.__name__}.{name}': reg for host in (mmdet.registry, mmseg.registry)
                for name, reg in vars(host).items() if isinstance(reg, mmengine.registry.Registry)}

    def snapshot():
        """name -> object, for everything an earlier mmvitswin patched (and its neighbours)."""
        objs = {
            'mmengine.runner.checkpoint.save_checkpoint': ckpt_module.save_checkpoint,
            'mmengine.runner.checkpoint.find_latest_checkpoint':
                ckpt_module.find_latest_checkpoint,
            'mmengine.runner.checkpoint._load_checkpoint': ckpt_module._load_checkpoint,
            'mmengine.runner.save_checkpoint': mmengine.runner.save_checkpoint,
            'mmengine.runner.find_latest_checkpoint': mmengine.runner.find_latest_checkpoint,
            'mmengine.runner.runner.save_checkpoint': runner_module.save_checkpoint,
            'mmengine.runner.runner.find_latest_checkpoint': runner_module.find_latest_checkpoint,
            'mmengine.runner.runner._load_checkpoint': runner_module._load_checkpoint,
            'mmengine.runner._flexible_runner.find_latest_checkpoint':
                flexible_module.find_latest_checkpoint,
            'mmengine.fileio.LocalBackend.put': vars(LocalBackend)['put'],
            'mmengine.Registry.import_from_location':
                vars(mmengine.registry.Registry)['import_from_location'],
            'mmdet.CheckInvalidLossHook': CheckInvalidLossHook,
            'mmcv.ops.nms': mmcv.ops.nms, 'mmcv.ops.batched_nms': mmcv.ops.batched_nms,
        }
        for prefix, namespace in (('checkpoint_hook module', vars(hook_module)),
                                  ('CheckpointHook', vars(CheckpointHook)),
                                  ('Runner', vars(Runner)),
                                  ('CheckInvalidLossHook', vars(CheckInvalidLossHook)),
                                  ('CheckpointLoader._schemes', CheckpointLoader._schemes)):
            for key, value in namespace.items():
                objs[f'{prefix}: {key}'] = value
        objs.update(mmcv_functions())
        return objs

    before = snapshot()
    flags_before = {name: reg._imported for name, reg in host_registries().items()}
    # torch's weights-only allow-list (torch >= 2.4; older torch has no list to change)
    get_safe_globals = getattr(torch.serialization, 'get_safe_globals', lambda: [])
    safe_globals_before = list(get_safe_globals())

    import mmvitswin  # noqa: F401
    # ... and neither does our CPU bf16 optim wrapper, on a model with an mmcv op
    from mmvitswin.openmmlab.engine.amp import CPUAmpOptimWrapper
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), mmcv.ops.RoIAlign((2, 2)))
    wrapper = CPUAmpOptimWrapper(optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    with wrapper.optim_context(model):
        pass

    after = snapshot()
    report = dict(
        n_checked=len(before),
        n_mmcv_functions=len(mmcv_functions()),
        changed=sorted(k for k in set(before) | set(after)
                       if k not in before or k not in after or before[k] is not after[k]),
        safe_globals_changed=list(get_safe_globals()) != safe_globals_before,
    )
    # A host registry may only be marked imported by its own import_from_location, i.e. with
    # the modules it names imported (mmvitswin asks for that before registering, never sets
    # the flag itself).
    unbacked = []
    for name, reg in host_registries().items():
        if reg._imported and not flags_before[name]:
            locations = reg._locations or [f'{reg.scope}.utils']
            if not all(loc in sys.modules for loc in locations):
                unbacked.append(name)
    report['flags_set_without_import'] = unbacked
    report['flags_set'] = sorted(n for n, r in host_registries().items()
                                 if r._imported and not flags_before[n])

    # MMEngine's own loader keeps its own behaviour: an unreachable URL is urllib's error
    from mmengine.runner.checkpoint import _load_checkpoint
    from mmvitswin.core.checkpoint import CheckpointError
    try:
        _load_checkpoint('https://127.0.0.1:9/swin_tiny.pth', map_location='cpu')
    except BaseException as exc:
        report['url_error'] = [type(exc).__module__ + '.' + type(exc).__name__,
                               isinstance(exc, OSError), isinstance(exc, CheckpointError)]
    print('REPORT ' + json.dumps(report))
''')


def test_import_mmvitswin_changes_nothing_of_the_hosts(tmp_path):
    env = dict(os.environ, PYTHONPATH=ROOT, TORCH_HOME=str(tmp_path / 'torch_home'),
               OMP_NUM_THREADS='1')
    proc = subprocess.run([sys.executable, '-c', PROBE], cwd=str(tmp_path), env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith('REPORT '))
    report = json.loads(line[len('REPORT '):])
    assert report['n_mmcv_functions'] > 20  # the probe did see mmcv's autograd functions
    assert report['n_checked'] > 100
    assert report['changed'] == []
    assert report['safe_globals_changed'] is False
    assert report['flags_set_without_import'] == []
    assert 'mmdet.registry.MODELS' in report['flags_set']  # the bridge did run
    # URLError (an OSError), raised by urllib through MMEngine, not our CheckpointError
    name, is_os_error, is_ours = report['url_error']
    assert is_os_error and not is_ours, name
