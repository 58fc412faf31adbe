"""SwinTransformerV2 against timm's own ``SwinTransformerV2`` (timm >= 1.0) as the oracle.

timm's ``swinv2_*`` files (``layers.*`` with each patch merging at the start of the next stage,
Microsoft's merging order, neither the zero key bias nor the coordinate tables: timm keeps both
out of its state dict) are one of the layouts we load. tests/test_swin_v2.py writes that layout
from HF's keys; here timm's module, with random weights, saves the file (safetensors, as the hub
ships it) and computes the stage maps ours must reproduce. timm is imported as
tools/benchmark.py imports it (with a torchvision stub where torchvision is missing: its Swin V2
does not use it).

Where the semantics meet: timm rolls a stage's map and then pads it to whole windows, and, as
Microsoft's original, along an axis where the map (at the ``img_size`` it was built for) is not
larger than the window it shrinks the window to the map and drops the shift; ours (as mmdet's
Swin) pads first and always shifts full windows. Both give the same maps where every stage's
map is a multiple of the window and larger than it, the sizes compared here.
"""
import warnings

import pytest
import torch

from conftest import max_rel_err, norm_inputs
from mmvitswin.core.backbones.swin_v2 import SwinTransformerV2
from mmvitswin.core.checkpoint import load_pretrained
from test_benchmark_tool import _load_tool
from zoo import perturb_like_trained

NARROW = dict(embed_dims=16, depths=[2, 2, 2, 2], num_heads=[1, 2, 4, 8])


@pytest.fixture(scope='module')
def timm_swinv2():
    """timm's ``SwinTransformerV2`` class (``make install`` installs timm)."""
    timm, note = _load_tool().import_timm()
    assert timm is not None, note
    from timm.models.swin_transformer_v2 import SwinTransformerV2 as TimmSwinV2
    return TimmSwinV2


def timm_model(cls, size, window, pretrained=(0, 0, 0, 0)):
    """timm's Swin V2 of the narrow arch for inputs of ``size`` (its masks are built for it)."""
    return cls(img_size=size, patch_size=4, window_size=window, embed_dim=NARROW['embed_dims'],
               depths=NARROW['depths'], num_heads=NARROW['num_heads'],
               pretrained_window_sizes=pretrained, num_classes=10, drop_path_rate=0.).eval()


def timm_stage_maps(model, x):
    with torch.no_grad():
        return model.forward_intermediates(x, indices=4, norm=False, intermediates_only=True)


def our_stage_maps(model, x):
    """The maps our forward hands to ``norm{i}`` (NCHW)."""
    return [r.permute(0, 3, 1, 2) for r in norm_inputs(model, x, range(4))[0]]


@pytest.mark.parametrize('window, pretrained', [(4, (0, 0, 0, 0)), (8, (4, 4, 4, 2))])
def test_timm_file_reproduces_timm(timm_swinv2, tmp_path, window, pretrained):
    """A timm safetensors file of timm's module (random weights moved off their init) loads
    into ours with the same windows (timm's files carry no tables: the pretrained windows are
    the user's to state, as timm's model names state them) and gives timm's stage maps within
    1e-5, at three sizes (one non-square each way)."""
    from safetensors.torch import save_file
    unit = 32 * window  # every stage's map a multiple of the window ...
    sizes = [(2 * unit, 2 * unit), (2 * unit, 3 * unit), (3 * unit, 2 * unit)]  # ... and larger
    torch.manual_seed(0)
    source = perturb_like_trained(timm_model(timm_swinv2, sizes[0], window, pretrained)).eval()
    state = source.state_dict()
    path = str(tmp_path / 'timm_swinv2.safetensors')
    save_file({k: v.contiguous() for k, v in state.items()}, path)
    ours = SwinTransformerV2(**NARROW, window_size=window, pretrained_window_sizes=pretrained,
                             drop_path_rate=0.).eval()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        load_pretrained(ours, path)
    # timm's classifier head and final norm are not ours; our output norms are not in the file
    messages = ' '.join(str(w.message) for w in caught)
    assert 'norm0.weight' in messages and 'head.fc.weight' in messages
    assert 'attn.' not in messages and 'downsample' not in messages
    for size in sizes:
        theirs = timm_model(timm_swinv2, size, window, pretrained)
        theirs.load_state_dict(state)
        x = torch.randn(2, 3, *size)
        for i, (a, b) in enumerate(zip(our_stage_maps(ours, x), timm_stage_maps(theirs, x))):
            assert a.shape == b.shape, (size, i)
            assert max_rel_err(a, b) < 1e-5, (size, i)


def test_test_side_timm_writer_gives_timms_keys(timm_swinv2):
    """tests/test_swin_v2.py writes the timm layout from HF's keys for its HF parity tests: the
    keys and shapes of timm's own module, plus a zero ``k_bias`` per block (timm keeps it out
    of its state dict; a file that holds it, zero, loads the same), with a stand-in classifier
    (``norm.weight``, ``head.weight``: unused by our backbone) where timm has its final norm
    and ``head.fc``."""
    pytest.importorskip('transformers')
    import test_swin_v2 as hf_tests
    hf = hf_tests.Swinv2Backbone(hf_tests.hf_config(**NARROW, window=4))
    written = {k: tuple(v.shape) for k, v in hf_tests.hf_to_timm_layout(hf).items()}
    theirs = {k: tuple(v.shape) for k, v in
              timm_model(timm_swinv2, (256, 256), 4).state_dict().items()}
    heads = {k for k in written if k.startswith(('norm.', 'head.'))}
    assert heads == {'norm.weight', 'head.weight'}
    extra = {k for k in theirs if k.startswith(('norm.', 'head.'))}
    assert extra == {'norm.weight', 'norm.bias', 'head.fc.weight', 'head.fc.bias'}
    key_biases = {k for k in written if k.endswith('attn.k_bias')}
    assert len(key_biases) == sum(NARROW['depths'])
    assert {k: v for k, v in written.items() if k not in key_biases | heads} == \
        {k: v for k, v in theirs.items() if k not in extra}
