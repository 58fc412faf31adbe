"""`type='SwinTransformer'` builds OUR class from mmdet and mmseg scopes, in any import order.

Each case runs in a fresh interpreter: registration order is process-global state.
"""
import subprocess
import sys
import textwrap

import pytest

CASES = {
    'mmdet_scope_after': """
        import mmvitswin
        from mmengine.registry import DefaultScope
        from mmdet.registry import MODELS
        with DefaultScope.overwrite_default_scope('mmdet'):
            m = MODELS.build(dict(type='SwinTransformer', depths=(1, 1, 1, 1)))
    """,
    'mmseg_scope_after': """
        import mmvitswin
        from mmseg.registry import MODELS
        from mmengine.registry import DefaultScope
        with DefaultScope.overwrite_default_scope('mmseg'):
            m = MODELS.build(dict(type='SwinTransformer', depths=(1, 1, 1, 1)))
    """,
    'mmdet_models_imported_first': """
        import mmdet.models  # mmdet registers its own Swin first
        import mmdet.engine
        import mmvitswin
        from mmdet.registry import MODELS
        m = MODELS.build(dict(type='SwinTransformer', depths=(1, 1, 1, 1)))
    """,
    'mmseg_models_imported_first': """
        import mmseg.models
        import mmvitswin
        from mmseg.registry import MODELS
        m = MODELS.build(dict(type='SwinTransformer', depths=(1, 1, 1, 1)))
    """,
    'mmdet_utils_register_all_after': """
        import mmvitswin
        from mmdet.utils import register_all_modules
        register_all_modules(init_default_scope=True)
        from mmdet.registry import MODELS
        m = MODELS.build(dict(type='SwinTransformer', depths=(1, 1, 1, 1)))
    """,
    'custom_imports_in_a_config': """
        from mmengine.config import Config
        from mmdet.utils import register_all_modules
        register_all_modules()
        cfg = Config(dict(custom_imports=dict(imports=['mmvitswin'], allow_failed_imports=False),
                          model=dict(type='SwinTransformer', depths=(1, 1, 1, 1))))
        from mmengine.utils import import_modules_from_strings
        import_modules_from_strings(**cfg.custom_imports)
        from mmdet.registry import MODELS
        m = MODELS.build(cfg.model)
    """,
    'scoped_name': """
        import mmvitswin
        from mmdet.registry import MODELS
        from mmengine.registry import DefaultScope
        with DefaultScope.overwrite_default_scope('mmdet'):
            m = MODELS.build(dict(type='mmvitswin.SwinTransformer', depths=(1, 1, 1, 1)))
    """,
}


@pytest.mark.parametrize('case', sorted(CASES))
def test_swin_type_builds_our_class(case):
    code = textwrap.dedent(CASES[case]) + textwrap.dedent("""
        from mmvitswin.openmmlab.models import SwinTransformer
        assert type(m) is SwinTransformer, type(m)
        # mmdet's own class is still reachable and the hosts still build their other models
        print('OK', type(m).__module__)
    """)
    out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert 'OK mmvitswin.openmmlab.models.backbones' in out.stdout
