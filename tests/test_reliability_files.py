"""Issue 13, files: a checkpoint that cannot be used gives one error naming the file and the
cause, runs no pickled code, and leaves the model exactly as it was."""
import os
import pickle
import zipfile

import numpy as np
import pytest
import torch

import mmvitswin  # noqa: F401
from mmvitswin.core.checkpoint import (CheckpointError, CheckpointNotFoundError,
                                  UntrustedCheckpointError, load_pretrained)
from mmvitswin.core.backbones.swin import SwinTransformer
from mmvitswin.core.backbones.vit import ViTAdapter

SWIN = dict(embed_dims=16, depths=(1, 1, 1, 1), num_heads=(1, 1, 1, 1), window_size=4)


def _payload(marker):
    class Payload:
        def __reduce__(self):
            return (os.system, (f'echo ran > {marker}', ))
    return Payload()


def _swin_file(tmp_path, **kw):
    torch.manual_seed(1)
    path = tmp_path / 'swin.pth'
    torch.save({'state_dict': SwinTransformer(**dict(SWIN, **kw)).state_dict()}, path)
    return path


def _write(tmp_path, name, data: bytes):
    path = tmp_path / name
    path.write_bytes(data)
    return path


def case_missing(tmp_path):
    return tmp_path / 'nope.pth', CheckpointNotFoundError, 'missing'


def case_empty(tmp_path):
    return _write(tmp_path, 'empty.pth', b''), CheckpointError, 'damaged'


def case_truncated_zip(tmp_path):
    data = _swin_file(tmp_path).read_bytes()
    return _write(tmp_path, 'cut.pth', data[:len(data) // 2]), CheckpointError, 'damaged'


def case_truncated_tail(tmp_path):
    data = _swin_file(tmp_path).read_bytes()
    return _write(tmp_path, 'cut_tail.pth', data[:-10]), CheckpointError, 'damaged'


def case_truncated_legacy(tmp_path):
    path = tmp_path / 'legacy.pth'
    torch.save({'state_dict': SwinTransformer(**SWIN).state_dict()}, path,
               _use_new_zipfile_serialization=False)
    data = path.read_bytes()
    return _write(tmp_path, 'legacy_cut.pth', data[:200]), CheckpointError, 'damaged'


def case_random_bytes(tmp_path):
    data = np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8).tobytes()
    return _write(tmp_path, 'random.pth', b'\x13' + data), CheckpointError, 'not a checkpoint'


def case_html_page(tmp_path):
    return (_write(tmp_path, 'page.pth', b'<!DOCTYPE html><html>Not Found</html>'),
            CheckpointError, 'not a checkpoint')


def case_foreign_zip(tmp_path):
    path = tmp_path / 'notes.pth'
    with zipfile.ZipFile(path, 'w') as z:
        z.writestr('notes.txt', 'hello')
    return path, CheckpointError, 'not a checkpoint'


def case_directory(tmp_path):
    (tmp_path / 'dir.pth').mkdir()
    return tmp_path / 'dir.pth', CheckpointError, 'not a checkpoint'


def case_list(tmp_path):
    path = tmp_path / 'list.pth'
    torch.save([torch.ones(2)], path)
    return path, CheckpointError, 'not a checkpoint'


def case_no_tensors(tmp_path):
    path = tmp_path / 'meta.pth'
    torch.save({'meta': {'epoch': 3}}, path)
    return path, CheckpointError, 'not a checkpoint'


def case_wrong_family(tmp_path):
    path = tmp_path / 'vit.pth'
    vit = ViTAdapter(arch='tiny', embed_dims=32, num_layers=1, num_heads=1, img_size=32)
    torch.save({'state_dict': vit.state_dict()}, path)
    return path, CheckpointError, 'other model'


def case_wrong_width(tmp_path):
    path = _swin_file(tmp_path, embed_dims=32, num_heads=(2, 2, 2, 2))
    return path, CheckpointError, 'other model'


def case_unrelated_tensors(tmp_path):
    path = tmp_path / 'other.pth'
    torch.save({'state_dict': {'encoder.conv.weight': torch.ones(3, 3)}}, path)
    return path, CheckpointError, 'other model'


def case_pickled_code(tmp_path):
    from mmvitswin.core.compat import HAS_SAFE_GLOBAL_ALIASES
    if not HAS_SAFE_GLOBAL_ALIASES:
        pytest.skip('torch < 2.6 loads checkpoints with full pickle, as MMEngine does there '
                    '(see mmvitswin.core.compat)')
    marker = tmp_path / 'ran'
    path = tmp_path / 'evil.pth'
    state = SwinTransformer(**SWIN).state_dict()
    torch.save({'state_dict': state, 'meta': _payload(marker)}, path)
    return path, UntrustedCheckpointError, 'Refusing'


FILE_CASES = [case_missing, case_empty, case_truncated_zip, case_truncated_tail,
              case_truncated_legacy, case_random_bytes, case_html_page, case_foreign_zip,
              case_directory, case_list, case_no_tensors, case_wrong_family, case_wrong_width,
              case_unrelated_tensors, case_pickled_code]


def _snapshot(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _unchanged(model, snap):
    state = model.state_dict()
    return state.keys() == snap.keys() and all(torch.equal(state[k], snap[k]) for k in snap)


@pytest.fixture(autouse=True)
def _untrusted(monkeypatch):
    monkeypatch.delenv('MMVITSWIN_TRUST_CHECKPOINTS', raising=False)


@pytest.mark.parametrize('make', FILE_CASES, ids=[f.__name__[5:] for f in FILE_CASES])
@pytest.mark.parametrize('route', ['load_pretrained', 'init_cfg'])
def test_bad_checkpoint_file_one_clear_error_model_untouched(make, route, tmp_path):
    path, exc, cause = make(tmp_path)
    torch.manual_seed(0)
    if route == 'init_cfg':
        model = SwinTransformer(**SWIN, init_cfg=dict(type='Pretrained', checkpoint=str(path)))
    else:
        model = SwinTransformer(**SWIN)
    snap = _snapshot(model)
    with pytest.raises(exc) as info:
        if route == 'init_cfg':
            model.init_weights()
        else:
            load_pretrained(model, str(path))
    msg = str(info.value)
    assert str(path) in msg, msg  # names the file ...
    assert cause in msg, msg  # ... and the cause
    if exc is not UntrustedCheckpointError:
        assert info.value.cause == cause
        assert 'Refusing' not in msg and 'untrusted' not in msg.lower()  # corrupt != untrusted
    assert _unchanged(model, snap)  # parameters exactly as before
    assert not (tmp_path / 'ran').exists()  # no pickled code ran
    if exc is CheckpointNotFoundError:
        assert isinstance(info.value, FileNotFoundError)


def test_good_file_still_loads(tmp_path):
    path = _swin_file(tmp_path)
    model = SwinTransformer(**SWIN)
    report = load_pretrained(model, str(path))
    assert report.missing == [] and report.unexpected == []
    src = torch.load(path)['state_dict']
    assert torch.equal(model.state_dict()['patch_embed.projection.weight'],
                       src['patch_embed.projection.weight'])


@pytest.mark.parametrize('make', [case_empty, case_truncated_zip, case_random_bytes])
def test_runner_loader_reports_damage_not_distrust(make, tmp_path):
    """Our runner's loader (load_from / --resume) goes through the same file check."""
    from mmvitswin.openmmlab.engine.safe_load import load_runner_checkpoint
    path, exc, cause = make(tmp_path)
    with pytest.raises(CheckpointError) as info:
        load_runner_checkpoint(str(path), map_location='cpu')
    assert info.value.cause == cause and str(path) in str(info.value)


# ----------------------------------------------------------------------- offline machines
def test_unreachable_url_says_where_and_how(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.hub, 'get_dir', lambda: str(tmp_path / 'hub'))
    url = 'http://127.0.0.1:9/swin_tiny_patch4_window7_224.pth'  # discard port: refused
    model = SwinTransformer(**SWIN, init_cfg=dict(type='Pretrained', checkpoint=url))
    snap = _snapshot(model)
    with pytest.raises(CheckpointError) as info:
        model.init_weights()
    msg = str(info.value)
    cache = str(tmp_path / 'hub' / 'checkpoints' / 'swin_tiny_patch4_window7_224.pth')
    assert info.value.cause == 'unreachable'
    assert url in msg and cache in msg
    assert '--cfg-options model.backbone.init_cfg.checkpoint=' in msg
    assert _unchanged(model, snap)
    assert not os.path.exists(cache)  # no partial download left behind
    # our runner's loader (load_from=URL) fetches the same way and gives the same answer
    from mmvitswin.openmmlab.engine.safe_load import load_runner_checkpoint
    with pytest.raises(CheckpointError, match='unreachable'):
        load_runner_checkpoint(url, map_location='cpu')
    # a copy placed where the message says is used without the network
    os.makedirs(os.path.dirname(cache), exist_ok=True)
    torch.save({'state_dict': SwinTransformer(**SWIN).state_dict()}, cache)
    report = load_pretrained(model, url)
    assert report.missing == []


def test_download_failure_is_wrapped(tmp_path, monkeypatch):
    """Any download error (DNS, HTTP 404, timeout) becomes the same explained error."""
    import urllib.error

    def fail(url, dst, *args, **kwargs):
        raise urllib.error.URLError('[Errno -3] Temporary failure in name resolution')

    monkeypatch.setattr(torch.hub, 'get_dir', lambda: str(tmp_path / 'hub'))
    monkeypatch.setattr(torch.hub, 'download_url_to_file', fail)
    url = 'https://example.org/weights/vit.pth'
    with pytest.raises(CheckpointError) as info:
        load_pretrained(SwinTransformer(**SWIN), url)
    assert 'name resolution' in str(info.value) and url in str(info.value)


def test_pickle_module_not_needed_for_refusal():
    # the refusal type is an UnpicklingError, so callers catching pickle errors still do
    assert issubclass(UntrustedCheckpointError, pickle.UnpicklingError)
    assert issubclass(CheckpointError, ValueError)
