"""SwinTransformerV2 against mmpretrain 1.2's own ``SwinTransformerV2`` as the oracle.

mmpretrain's released Swin V2 checkpoints (its classifiers: ``backbone.stages.*``, ``w_msa``,
``ffn``, the merging in ``nn.Unfold``'s channel order, the derived tables saved) are one of the
layouts we load. tests/test_swin_v2.py writes that layout from HF's keys; here mmpretrain's module
itself, with random weights, saves the file and computes the features ours must reproduce.

mmpretrain's backbone module is imported alone: the package ``__init__`` files of ``mmpretrain``,
``mmpretrain.models`` and ``mmpretrain.models.backbones`` import its inference APIs, heads and
evaluation code (modelindex, torchvision, HF's multimodal models), none of which the backbone
uses. Its ``pad_small_map=True`` is the mode that pads each stage to whole windows before the
shift, as mmdet's Swin and ours do (with ``False`` it asserts that no map is smaller than the
window, and drops the shift where a map equals it).
"""
import functools
import importlib
import importlib.util
import os
import sys
import types
import warnings

import pytest
import torch

from conftest import max_rel_err, norm_inputs
from mmvitswin.core.backbones.swin_v2 import SwinTransformerV2
from mmvitswin.core.checkpoint import CheckpointError, load_pretrained
from zoo import perturb_like_trained

NARROW = dict(embed_dims=16, depths=[2, 2, 2, 2], num_heads=[1, 2, 4, 8])
# non-square, not multiples of 32, and one that pads every stage to a single window
SIZES = [(64, 96), (45, 77), (37, 53), (20, 20)]
_PACKAGES = ('mmpretrain', 'mmpretrain.models', 'mmpretrain.models.backbones')


@functools.lru_cache(maxsize=None)  # once per process (see the docstring)
def _import_mmpretrain_swinv2():
    """mmpretrain 1.2's ``SwinTransformerV2`` class (see the module docstring), imported once
    per process: its modules register mmpretrain's registries with MMEngine's, which a second
    import would refuse. The three package modules stand in as bare packages during the import
    only (what ``sys.modules`` held for them before is put back); the backbone's own modules
    stay loaded. mmdet's models are imported first: they look for mmpretrain themselves (and
    find none, as without this test), and must not find the stand-ins."""
    spec = importlib.util.find_spec('mmpretrain')
    assert spec is not None, 'mmpretrain is not installed (make install installs it)'
    import mmdet.models  # noqa: F401
    root = os.path.dirname(spec.origin)
    saved = {name: sys.modules.get(name) for name in _PACKAGES}
    try:
        for name in _PACKAGES:
            package = types.ModuleType(name)
            package.__path__ = [os.path.join(root, *name.split('.')[1:])]
            sys.modules[name] = package
        module = importlib.import_module('mmpretrain.models.backbones.swin_transformer_v2')
    finally:
        for name, before in saved.items():
            if before is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = before
    return module.SwinTransformerV2


@pytest.fixture(scope='module')
def mmpretrain_swinv2():
    return _import_mmpretrain_swinv2()


def mmpretrain_model(cls, window, pretrained=(0, 0, 0, 0), seed=0):
    """mmpretrain's backbone with the narrow arch, every parameter moved off its init."""
    torch.manual_seed(seed)
    model = cls(arch=dict(NARROW, extra_norm_every_n_blocks=0), window_size=[window] * 4,
                pretrained_window_sizes=list(pretrained), out_indices=(0, 1, 2, 3),
                pad_small_map=True, drop_path_rate=0.)
    perturb_like_trained(model, seed).eval()  # (its train() returns None)
    return model


def save_classifier(model, path) -> str:
    """What mmpretrain's ImageClassifier saves: ``state_dict`` with the backbone under
    ``backbone.``, a linear head beside it, and ``meta``."""
    state = {'backbone.' + k: v.detach().clone() for k, v in model.state_dict().items()}
    width = NARROW['embed_dims'] * 8
    state['head.fc.weight'], state['head.fc.bias'] = torch.randn(10, width), torch.zeros(10)
    torch.save({'meta': {'mmpretrain_version': '1.2.0'}, 'state_dict': state}, path)
    return str(path)


def stage_inputs_of_norms(model, x):
    """``(raw, outs)``: what each ``norm{i}`` receives, as ``(B, tokens, C)`` (mmpretrain hands
    it ``(B, L, C)``, ours ``(B, H, W, C)``), and the forward's outputs."""
    raw, outs = norm_inputs(model, x, range(4))
    return [r.flatten(1, -2) for r in raw], outs


def assert_matches(ours, theirs, sizes=SIZES, tol=1e-5):
    """The stage maps before the output norms (a norm would hide a per-token scale or shift)
    and the NCHW outputs after them, at each size."""
    ours.eval()
    for size in sizes:
        x = torch.randn(2, 3, *size)
        raw, got = stage_inputs_of_norms(ours, x)
        raw_ref, want = stage_inputs_of_norms(theirs, x)
        for i in range(4):
            assert got[i].shape == want[i].shape, (size, i)
            assert max_rel_err(raw[i], raw_ref[i]) < tol, (size, i, 'before norm')
            assert max_rel_err(got[i], want[i]) < tol, (size, i, 'output')


@pytest.mark.parametrize('window, pretrained', [(4, (0, 0, 0, 0)), (8, (4, 4, 4, 2))])
def test_mmpretrain_checkpoint_reproduces_mmpretrain(mmpretrain_swinv2, tmp_path, window,
                                                     pretrained):
    """A classifier checkpoint saved from mmpretrain's module loads (no warning: its head is
    the classifier's) and gives mmpretrain's features; pretrained windows as the fine-tuned
    releases (e.g. 12 -> 16 with ``pretrained_window_sizes`` 12, 12, 12, 6) state them."""
    theirs = mmpretrain_model(mmpretrain_swinv2, window, pretrained)
    path = save_classifier(theirs, tmp_path / 'mmpretrain_swinv2.pth')
    ours = SwinTransformerV2(**NARROW, window_size=window, pretrained_window_sizes=pretrained,
                             drop_path_rate=0.)
    with warnings.catch_warnings():
        warnings.simplefilter('error')  # every key placed, none missing
        load_pretrained(ours, path)
    assert_matches(ours, theirs)


def test_mmpretrain_window_transfer_matches_mmpretrain(mmpretrain_swinv2, tmp_path):
    """A window-4 mmpretrain file run at window 8 with ``pretrained_window_sizes=4``, against
    mmpretrain's window-8 model with the same setting and the same weights (its derived
    tables rebuilt, as ours are); without the setting the file's tables are refused."""
    source = mmpretrain_model(mmpretrain_swinv2, 4)
    path = save_classifier(source, tmp_path / 'window4.pth')
    theirs = mmpretrain_model(mmpretrain_swinv2, 8, (4, 4, 4, 4), seed=1)
    weights = {k: v for k, v in source.state_dict().items()
               if not k.endswith(('relative_coords_table', 'relative_position_index'))}
    missing, unexpected = theirs.load_state_dict(weights, strict=False)
    assert not unexpected and missing and all(
        k.endswith(('relative_coords_table', 'relative_position_index')) for k in missing)
    ours = SwinTransformerV2(**NARROW, window_size=8, pretrained_window_sizes=4,
                             drop_path_rate=0.)
    load_pretrained(ours, path)
    assert_matches(ours, theirs)
    # the window matters: the window-4 model's stage-1 maps differ
    x = torch.randn(1, 3, 64, 96)
    with torch.no_grad():
        assert max_rel_err(theirs(x)[0], source(x)[0]) > 1e-2
    with pytest.raises(CheckpointError, match=r'pretrained_window_sizes\[0\]=4'):
        load_pretrained(SwinTransformerV2(**NARROW, window_size=8, drop_path_rate=0.), path)


def test_test_side_mmpretrain_writer_gives_mmpretrains_keys(mmpretrain_swinv2):
    """tests/test_swin_v2.py writes the mmpretrain layout from HF's keys for its HF parity
    tests: the same keys and shapes as mmpretrain's own module of the same config, but for
    the output norms (HF's backbone has none; the writer leaves them out)."""
    pytest.importorskip('transformers')
    import test_swin_v2 as hf_tests
    hf = hf_tests.Swinv2Backbone(hf_tests.hf_config(**NARROW, window=4))
    written = {k: tuple(v.shape) for k, v in hf_tests.hf_to_mmpretrain_layout(hf).items()}
    theirs = {k: tuple(v.shape) for k, v in mmpretrain_model(mmpretrain_swinv2, 4)
              .state_dict().items()}
    output_norms = {k for k in theirs if k.split('.')[0] in {f'norm{i}' for i in range(4)}}
    assert len(output_norms) == 8 and not output_norms & set(written)
    assert written == {k: v for k, v in theirs.items() if k not in output_norms}
