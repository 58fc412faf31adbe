"""Numerical parity of the plain ViT trunk with mmseg 1.2's VisionTransformer, and of the
decomposed relative-position bias with the MViT reference (mmaction2, same math as ViTDet)."""
import ast
import os

import pytest
import torch
import torch.nn.functional as F

from conftest import max_rel_err
from mmvitswin.core.checkpoint import load_pretrained
from mmvitswin.core.backbones.vit import (ViTAdapter, ViTAttention, decomposed_rel_pos_bias)

pytestmark = pytest.mark.slow(reason='parity with mmseg ViT-B widths')


def _mmseg_pair(tmp_path, **kwargs):
    """mmseg's ViT with random weights and ours loaded from its saved state dict by init_cfg."""
    from mmseg.models.backbones.vit import VisionTransformer
    torch.manual_seed(0)
    ref = VisionTransformer(**kwargs)
    ref.init_weights()
    # non-trivial norms and biases so a key swap would show
    with torch.no_grad():
        for name, p in ref.named_parameters():
            if name.endswith(('ln1.weight', 'ln2.weight', '.bias')):
                p.add_(torch.randn_like(p) * 0.1)
    ref.eval()
    path = str(tmp_path / 'mmseg_vit.pth')
    torch.save({'state_dict': ref.state_dict(), 'meta': {}}, path)
    ours = ViTAdapter(
        arch=dict(embed_dims=kwargs['embed_dims'], num_layers=kwargs['num_layers'],
                  num_heads=kwargs['num_heads'], feedforward_channels=4 * kwargs['embed_dims']),
        img_size=kwargs.get('img_size', 224), out_indices=kwargs['out_indices'],
        final_norm=kwargs.get('final_norm', False), patch_bias=False,
        norm_cfg=dict(type='LN'), init_cfg=dict(type='Pretrained', checkpoint=path))
    ours.init_weights()
    ours.eval()
    return ours, ref


@pytest.fixture(scope='module')
def mmseg_pair(tmp_path_factory):
    return _mmseg_pair(tmp_path_factory.mktemp('ckpt'), embed_dims=192, num_layers=4,
                       num_heads=3, out_indices=(1, 3), final_norm=True, drop_path_rate=0.1)


@pytest.mark.parametrize('hw', [(224, 224), (512, 683), (97, 131)],
                         ids=['224x224', '512x683', '97x131'])
def test_plain_trunk_equals_mmseg(mmseg_pair, hw):
    ours, ref = mmseg_pair
    x = torch.randn(1, 3, *hw)
    with torch.no_grad():
        got, want = ours(x), ref(x)
    assert len(got) == len(want) == 2
    for g, w in zip(got, want):
        assert g.shape == w.shape == (1, 192, -(-hw[0] // 16), -(-hw[1] // 16))
        assert max_rel_err(g, w) < 1e-5


def test_vit_b_width_equals_mmseg_at_224(tmp_path):
    """ViT-B width and heads (2 blocks to stay fast), default out_indices (last block)."""
    ours, ref = _mmseg_pair(tmp_path, embed_dims=768, num_layers=2, num_heads=12,
                            out_indices=-1)
    x = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        (got, ), (want, ) = ours(x), ref(x)
    assert got.shape == want.shape == (1, 768, 14, 14)
    assert max_rel_err(got, want) < 1e-5


def test_resized_pos_embed_matches_mmseg_resize(mmseg_pair):
    """The pos-embed added at 512x683 is mmseg's own bicubic resize of the 14x14 table."""
    ours, ref = mmseg_pair
    want = ref.resize_pos_embed(ref.pos_embed, (32, 43), (14, 14), 'bicubic')
    x = torch.zeros(1, 3, 512, 683)
    with torch.no_grad():
        seq, grid = ours.prepare_tokens(x)
        bias = ours.patch_embed.proj.bias
        assert bias is None  # zero image + no conv bias: the tokens are the pos-embed alone
        cls = ours.cls_token
    assert grid == (32, 43)
    assert torch.allclose(seq[:, 1:], want[:, 1:], atol=1e-6)
    assert torch.allclose(seq[:, :1], cls + want[:, :1], atol=1e-6)


def test_timm_layout_loads_and_matches(tmp_path):
    """A timm-named ViT state dict (mlp.fc1/fc2, head, fc_norm) gives the same outputs as
    the model it was written from; the leftover classifier keys are reported in one warning."""
    torch.manual_seed(0)
    src = ViTAdapter('tiny', num_layers=2, final_norm=True)
    timm_sd = {}
    for k, v in src.state_dict().items():
        k = k.replace('ffn.layers.0.0.', 'mlp.fc1.').replace('ffn.layers.1.', 'mlp.fc2.')
        timm_sd[k] = v.clone()
    timm_sd['head.weight'] = torch.randn(10, 192)
    timm_sd['head.bias'] = torch.zeros(10)
    path = str(tmp_path / 'timm.pth')
    torch.save({'model': timm_sd}, path)
    dst = ViTAdapter('tiny', num_layers=2, final_norm=True)
    with pytest.warns(UserWarning, match='unused') as record:
        report = load_pretrained(dst, path)
    assert len([r for r in record if 'unused' in str(r.message)]) == 1
    assert sorted(report.unexpected) == ['head.bias', 'head.weight'] and not report.missing
    src.eval(), dst.eval()
    x = torch.randn(2, 3, 80, 112)
    with torch.no_grad():
        assert torch.equal(src(x)[0], dst(x)[0])


# ------------------------------------------------------------------ decomposed rel-pos oracle
def _mvit_reference():
    """mmaction2's MViT decomposed rel-pos functions, taken from its source file (importing
    ``mmaction.models`` fails in mmaction2 1.2.0; the functions need only torch)."""
    import mmaction
    path = os.path.join(os.path.dirname(mmaction.__file__), 'models', 'backbones', 'mvit.py')
    tree = ast.parse(open(path).read())
    wanted = {'resize_decomposed_rel_pos', 'add_decomposed_rel_pos'}
    nodes = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in wanted]
    assert len(nodes) == 2
    namespace = {'torch': torch, 'F': F}
    from typing import Sequence
    namespace['Sequence'] = Sequence
    exec(compile(ast.Module(body=nodes, type_ignores=[]), path, 'exec'), namespace)
    return namespace['add_decomposed_rel_pos']


@pytest.mark.parametrize('table_len', [None, 9], ids=['native', 'resized'])
def test_decomposed_rel_pos_bias_equals_mvit(table_len):
    add_ref = _mvit_reference()
    b, heads, h, w, d = 2, 3, 5, 7, 8
    rel_h = torch.randn(table_len or 2 * h - 1, d)
    rel_w = torch.randn(table_len or 2 * w - 1, d)
    q = torch.randn(b, heads, 1 + h * w, d)  # a CLS query first
    want = add_ref(torch.zeros(b, heads, 1 + h * w, 1 + h * w), q, (1, h, w), (1, h, w),
                   rel_h, rel_w, torch.zeros(1, d), with_cls_token=True)
    got = F.pad(decomposed_rel_pos_bias(q[:, :, 1:], (h, w), rel_h, rel_w), (1, 0, 1, 0))
    assert torch.allclose(got, want, atol=1e-5)


def test_rel_pos_attention_equals_explicit_softmax():
    """ViTAttention (SDPA with the additive bias) == softmax(q k^T * scale + ref bias) v."""
    add_ref = _mvit_reference()
    attn = ViTAttention(48, 4, rel_pos_size=(4, 6))
    with torch.no_grad():
        attn.rel_pos_h.normal_()
        attn.rel_pos_w.normal_()
    h, w = 3, 5  # another grid than the tables were built for: they are resized
    x = torch.randn(2, 1 + h * w, 48)
    with torch.no_grad():
        q, k, v = attn.qkv(x).reshape(2, -1, 3, 4, 12).permute(2, 0, 3, 1, 4)
        logits = (q * attn.scale) @ k.transpose(-2, -1)
        logits = add_ref(logits, q, (1, h, w), (1, h, w), attn.rel_pos_h, attn.rel_pos_w,
                         torch.zeros(1, 12), with_cls_token=True)
        want = attn.proj((logits.softmax(-1) @ v).transpose(1, 2).reshape(2, -1, 48))
        got = attn(x, (h, w), num_prefix=1)
    assert max_rel_err(got, want) < 1e-5
