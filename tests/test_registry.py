"""`type='SwinTransformer'` builds OUR class from mmdet and mmseg scopes, in any import order.

Registration is process-global state, so the import order is set up in a fresh interpreter:
one where mmvitswin is imported before the hosts import their ``models`` packages, one where
the hosts' models come first. Inside each, the cases run in sequence, in an order in which
each still meets the state it is about (noted per group), and each reports on its own.
"""
import json
import subprocess
import sys
import textwrap

import pytest

# group -> (prelude, [(case, code)]): a case's code leaves the built backbone in `m`
GROUPS = {
    # mmvitswin first; mmdet.models is first imported by register_all_modules (so that case
    # runs first), mmseg.models lazily at the first mmseg build (the last case)
    'ours_first': ('', [
        ('mmdet_utils_register_all_after', """
            import mmvitswin
            from mmdet.utils import register_all_modules
            register_all_modules(init_default_scope=True)
            from mmdet.registry import MODELS
            m = MODELS.build(dict(type='SwinTransformer', depths=(1, 1, 1, 1)))
        """),
        ('mmdet_scope_after', """
            import mmvitswin
            from mmengine.registry import DefaultScope
            from mmdet.registry import MODELS
            with DefaultScope.overwrite_default_scope('mmdet'):
                m = MODELS.build(dict(type='SwinTransformer', depths=(1, 1, 1, 1)))
        """),
        ('scoped_name', """
            import mmvitswin
            from mmdet.registry import MODELS
            from mmengine.registry import DefaultScope
            with DefaultScope.overwrite_default_scope('mmdet'):
                m = MODELS.build(dict(type='mmvitswin.SwinTransformer', depths=(1, 1, 1, 1)))
        """),
        ('mmseg_scope_after', """
            import mmvitswin
            from mmseg.registry import MODELS
            from mmengine.registry import DefaultScope
            with DefaultScope.overwrite_default_scope('mmseg'):
                m = MODELS.build(dict(type='SwinTransformer', depths=(1, 1, 1, 1)))
        """),
    ]),
    # the hosts' models registered first (mmseg's here, mmdet's by register_all_modules), then
    # the config's custom_imports imports mmvitswin (the tools' path: that case runs first);
    # register_all_modules sets the default scope 'mmdet', so the mmseg case names its scope
    'hosts_first': ("""
        import mmseg.models  # mmseg registers its own Swin first
        """, [
        ('custom_imports_in_a_config', """
            from mmengine.config import Config
            from mmdet.utils import register_all_modules
            register_all_modules()
            import sys
            assert 'mmvitswin' not in sys.modules
            cfg = Config(dict(custom_imports=dict(imports=['mmvitswin'],
                                                  allow_failed_imports=False),
                              model=dict(type='SwinTransformer', depths=(1, 1, 1, 1))))
            from mmengine.utils import import_modules_from_strings
            import_modules_from_strings(**cfg.custom_imports)
            from mmdet.registry import MODELS
            m = MODELS.build(cfg.model)
        """),
        ('mmdet_models_imported_first', """
            import mmdet.models  # mmdet registered its own Swin first (register_all_modules)
            import mmdet.engine
            import mmvitswin
            from mmdet.registry import MODELS
            m = MODELS.build(dict(type='SwinTransformer', depths=(1, 1, 1, 1)))
        """),
        ('mmseg_models_imported_first', """
            import mmseg.models
            import mmvitswin
            from mmengine.registry import DefaultScope
            from mmseg.registry import MODELS
            with DefaultScope.overwrite_default_scope('mmseg'):
                m = MODELS.build(dict(type='SwinTransformer', depths=(1, 1, 1, 1)))
        """),
    ]),
}
CASES = {case: group for group, (_, cases) in GROUPS.items() for case, _ in cases}

RUNNER = """
import json, sys, textwrap, traceback
{prelude}
results = {{}}
for case, code in json.loads({cases!r}):
    scope = {{}}
    try:
        exec(textwrap.dedent(code), scope)
        from mmvitswin.openmmlab.models import SwinTransformer
        m = scope['m']
        assert type(m) is SwinTransformer, type(m)
        results[case] = 'OK ' + type(m).__module__
    except BaseException:
        results[case] = traceback.format_exc(limit=-3)
print(json.dumps(results))
"""


@pytest.fixture(scope='module')
def results():
    """case -> 'OK <module of the built class>' or the traceback; one interpreter per group,
    the groups side by side."""
    procs = {}
    for group, (prelude, cases) in GROUPS.items():
        code = RUNNER.format(prelude=textwrap.dedent(prelude), cases=json.dumps(cases))
        procs[group] = subprocess.Popen([sys.executable, '-c', code], stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, text=True)
    out = {}
    try:
        for group, proc in procs.items():
            stdout, stderr = proc.communicate(timeout=300)
            assert proc.returncode == 0, f'{group}: {stderr[-3000:]}'
            out.update(json.loads(stdout.strip().splitlines()[-1]))
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return out


@pytest.mark.slow(reason='two fresh interpreters (import orders) for the 7 cases')
@pytest.mark.parametrize('case', sorted(CASES))
def test_swin_type_builds_our_class(case, results):
    assert results[case] == 'OK mmvitswin.openmmlab.models.backbones', \
        f'{CASES[case]} group, case {case}:\n{results[case]}'
