"""The README and docs/ as references: what they link and name exists, and they stay short
and free of commit hashes (fast tier; reads markdown only)."""
import glob
import itertools
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, 'README.md')
DOCS = os.path.join(ROOT, 'docs')

README_MAX_LINES = 159          # "under 160"
PERFORMANCE_MAX_LINES = 250

# [text](target): a relative target, its #anchor cut off; http(s)/mailto links are not files.
LINK = re.compile(r'\]\(([^)\s]+)\)')
# configs/... and tools/... named anywhere, code blocks included; brace lists and * globs allowed.
# Not preceded by a path character, so `mmdet/.mim/configs/...` (a host's files) is not ours.
REPO_PATH = re.compile(r'(?<![\w./-])((?:configs|tools)/[\w{},*./-]*[\w*}/])')
HEX_RUN = re.compile(r'\b[0-9a-f]{7,40}\b')
# A hex run inside a weight file's name (timm's `..._in21k-6f7c7740.pth`) is the file's own
# digest, not a commit: the only exclusion.
FILE_DIGEST = re.compile(r'-[0-9a-f]{7,40}\.(?:pth|pt|bin|safetensors|npz)\b')


def _markdown_files():
    return [README] + sorted(glob.glob(os.path.join(DOCS, '**', '*.md'), recursive=True))


def _read(path):
    with open(path, encoding='utf-8') as f:
        return f.read()


def _rel(path):
    return os.path.relpath(path, ROOT)


def _local_links(path):
    """(target file, line number) of every relative link in the markdown file ``path``."""
    for number, line in enumerate(_read(path).splitlines(), 1):
        for target in LINK.findall(line):
            target = target.split('#', 1)[0]
            if not target or re.match(r'[a-z][a-z0-9+.-]*:', target):
                continue
            yield os.path.normpath(os.path.join(os.path.dirname(path), target)), number


def _expand_braces(pattern):
    """``a_{t,s}_b`` -> ``['a_t_b', 'a_s_b']`` (every brace group, no nesting)."""
    parts = re.split(r'\{([^{}]*)\}', pattern)
    choices = [[p] if i % 2 == 0 else p.split(',') for i, p in enumerate(parts)]
    return [''.join(c) for c in itertools.product(*choices)]


def _missing_repo_paths(path):
    """``configs/...`` and ``tools/...`` paths named in ``path`` that match nothing."""
    missing = []
    for number, line in enumerate(_read(path).splitlines(), 1):
        for named in REPO_PATH.findall(line):
            for candidate in _expand_braces(named.rstrip('.')):
                full = os.path.join(ROOT, candidate)
                found = glob.glob(full) if '*' in candidate else os.path.exists(full)
                if not found:
                    missing.append(f'{_rel(path)}:{number}: {candidate}')
    return missing


def _commit_hashes(text):
    """Hex runs of 7-40 characters with at least one digit and one letter, outside a weight
    file's digest (``FILE_DIGEST``)."""
    text = FILE_DIGEST.sub('', text)
    return [h for h in HEX_RUN.findall(text)
            if re.search(r'[0-9]', h) and re.search(r'[a-f]', h)]


def test_every_doc_linked_from_the_readme_exists():
    links = list(_local_links(README))
    assert any(target.startswith(DOCS) for target, _ in links), 'README links no doc'
    missing = [f'README.md:{n}: {_rel(t)}' for t, n in links if not os.path.exists(t)]
    assert not missing, 'README links to missing files:\n' + '\n'.join(missing)


@pytest.mark.parametrize('path', _markdown_files(), ids=_rel)
def test_relative_links_of_each_doc_resolve(path):
    missing = [f'{_rel(path)}:{n}: {_rel(t)}' for t, n in _local_links(path)
               if not os.path.exists(t)]
    assert not missing, 'links to missing files:\n' + '\n'.join(missing)


@pytest.mark.parametrize('path', _markdown_files(), ids=_rel)
def test_configs_and_tools_named_exist(path):
    missing = _missing_repo_paths(path)
    assert not missing, 'configs / tools named but absent:\n' + '\n'.join(missing)


@pytest.mark.parametrize('path', _markdown_files(), ids=_rel)
def test_no_commit_hashes(path):
    found = [f'{_rel(path)}:{n}: {h}' for n, line in enumerate(_read(path).splitlines(), 1)
             for h in _commit_hashes(line)]
    assert not found, 'commit hashes (history belongs to git):\n' + '\n'.join(found)


def test_readme_is_short():
    lines = len(_read(README).splitlines())
    assert lines <= README_MAX_LINES, f'README.md has {lines} lines (under 160 wanted)'


def test_performance_doc_replaces_benchmarks():
    assert not os.path.exists(os.path.join(DOCS, 'benchmarks.md')), \
        'docs/benchmarks.md is back: docs/performance.md replaces it'
    lines = len(_read(os.path.join(DOCS, 'performance.md')).splitlines())
    assert lines <= PERFORMANCE_MAX_LINES, f'docs/performance.md has {lines} lines'


def test_the_checks_catch_what_they_are_for():
    """The helpers flag a hash, a missing config and a missing tool, and pass their opposites."""
    assert _commit_hashes('fixed in commit 1895f9a.') == ['1895f9a']
    assert _commit_hashes('deadbeef 20261203 jx_vit_base_resnet50_224_in21k-6f7c7740.pth') == []
    assert _expand_braces('configs/a_{t,s}_b.py') == ['configs/a_t_b.py', 'configs/a_s_b.py']
    assert REPO_PATH.findall('see `mmdet/.mim/configs/swin/x.py` and `tools/train.py`.') == \
        ['tools/train.py']
