"""mmvitswin's registries and the bridge into MMDetection's and MMSegmentation's.

Our registries are children of MMEngine's roots with scope ``mmvitswin``, so
``type='mmvitswin.SwinTransformer'`` resolves from any scope. Users of mmdet/mmseg configs also
write the bare ``type='SwinTransformer'``; those scopes look in their own registry first, where
their own Swin lives. :func:`bridge_to_hosts` therefore registers every mmvitswin model into the
host registries with ``force=True``. The hosts import their modules lazily on the first build
and would then re-register their Swin (``force=False`` raises on a taken name, and would
otherwise shadow ours), so the bridge first lets each host registry import its own modules
through its public ``Registry.import_from_location()`` (which then marks itself imported: its
later lazy import is a no-op). Nothing else of the hosts is touched.
"""
import importlib
import warnings

from mmengine.registry import MODELS as MMENGINE_MODELS
from mmengine.registry import OPTIM_WRAPPER_CONSTRUCTORS as MMENGINE_OPTIM_WRAPPER_CONSTRUCTORS
from mmengine.registry import DATASETS as MMENGINE_DATASETS
from mmengine.registry import HOOKS as MMENGINE_HOOKS
from mmengine.registry import LOOPS as MMENGINE_LOOPS
from mmengine.registry import OPTIM_WRAPPERS as MMENGINE_OPTIM_WRAPPERS
from mmengine.registry import RUNNERS as MMENGINE_RUNNERS
from mmengine.registry import STRATEGIES as MMENGINE_STRATEGIES
from mmengine.registry import Registry

MODELS = Registry('model', parent=MMENGINE_MODELS, scope='mmvitswin',
                  locations=['mmvitswin.openmmlab.models'])
OPTIM_WRAPPER_CONSTRUCTORS = Registry(
    'optimizer wrapper constructor', parent=MMENGINE_OPTIM_WRAPPER_CONSTRUCTORS,
    scope='mmvitswin', locations=['mmvitswin.openmmlab.engine'])
DATASETS = Registry('dataset', parent=MMENGINE_DATASETS, scope='mmvitswin',
                    locations=['mmvitswin.openmmlab.datasets'])
HOOKS = Registry('hook', parent=MMENGINE_HOOKS, scope='mmvitswin', locations=['mmvitswin.openmmlab.engine'])
OPTIM_WRAPPERS = Registry('optim_wrapper', parent=MMENGINE_OPTIM_WRAPPERS, scope='mmvitswin',
                          locations=['mmvitswin.openmmlab.engine'])
LOOPS = Registry('loop', parent=MMENGINE_LOOPS, scope='mmvitswin', locations=['mmvitswin.openmmlab.engine'])
RUNNERS = Registry('runner', parent=MMENGINE_RUNNERS, scope='mmvitswin',
                   locations=['mmvitswin.openmmlab.engine'])
# FlexibleRunner's strategies (built from MMEngine's root registry: not bridged to the hosts)
STRATEGIES = Registry('strategy', parent=MMENGINE_STRATEGIES, scope='mmvitswin',
                      locations=['mmvitswin.openmmlab.engine'])

# (host package, registry attribute in host.registry, our registry)
_HOSTS = ('mmdet', 'mmseg', 'mmaction')
_BRIDGED = (('MODELS', MODELS), ('OPTIM_WRAPPER_CONSTRUCTORS', OPTIM_WRAPPER_CONSTRUCTORS),
            ('HOOKS', HOOKS), ('DATASETS', DATASETS), ('OPTIM_WRAPPERS', OPTIM_WRAPPERS),
            ('LOOPS', LOOPS), ('RUNNERS', RUNNERS))


def bridge_to_hosts(hosts=_HOSTS) -> list:
    """Register every mmvitswin module into each importable host's registries (force=True).

    Returns the hosts that were bridged. Safe to call more than once.
    """
    bridged = []
    for host in hosts:
        if host == 'mmaction':
            if bridge_to_mmaction():
                bridged.append(host)
            continue
        try:
            host_registry = importlib.import_module(f'{host}.registry')
        except ImportError:
            continue
        targets = [(getattr(host_registry, attr), ours) for attr, ours in _BRIDGED]
        try:
            # The host registers its own modules now, so its later lazy import is a no-op
            # and cannot clash with (or override) ours.
            for target, _ in targets:
                target.import_from_location()
        except ImportError as exc:  # pragma: no cover - a broken host install
            warnings.warn(f'mmvitswin: could not import {host}\'s modules ({exc}); '
                          f'type="SwinTransformer" in {host} configs may build {host}\'s own '
                          'class. Use type="mmvitswin.SwinTransformer".')
            continue
        for target, ours in targets:
            for name, cls in ours.module_dict.items():
                target.register_module(name=name, module=cls, force=True)
        bridged.append(host)
    return bridged


# mmaction2 is optional (not a dependency) and gets the video backbone only: force-registering
# every image model there could shadow mmaction2's own (it has a VisionTransformer too).
_MMACTION_MODELS = ('SwinTransformer3D', )


def bridge_to_mmaction(names=_MMACTION_MODELS) -> bool:
    """Register ``names`` into ``mmaction.registry.MODELS`` (force=True) when importable.

    ``MODELS.import_from_location()`` runs first, for the same reason as for mmdet/mmseg: the
    registry's lazy import would otherwise re-register mmaction2's ``SwinTransformer3D`` over
    ours (or raise). mmaction2 1.2.0's wheel cannot import ``mmaction.models`` (it lacks
    ``localizers/drn``); the registry then stays unimported (its lazy import armed), so an
    mmaction2-scope build reports that broken install instead of a missing name, and ours is
    registered anyway. Nothing mmaction2 raises may break ``import mmvitswin``. Returns
    whether anything was registered.
    """
    try:
        host_registry = importlib.import_module('mmaction.registry')
    except Exception:  # not installed, or installed without its dependencies
        return False
    try:
        host_registry.MODELS.import_from_location()
    except Exception:  # the broken wheel above: leave its error to an mmaction2 build
        pass
    for name in names:
        cls = MODELS.module_dict.get(name)
        if cls is not None:
            host_registry.MODELS.register_module(name=name, module=cls, force=True)
    return True
