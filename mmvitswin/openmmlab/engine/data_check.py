"""Check, before anything is built, that the files a config's datasets name exist.

Without this a missing COCO/ADE20K surfaces as a FileNotFoundError from deep inside a dataset
after the model was built (or, for mmseg, as an empty dataset). The tools call
:func:`missing_data` and stop with :func:`missing_data_message` and exit status 2.
"""
import os
import os.path as osp
from typing import Iterable, Iterator, List, Optional, Tuple

from mmengine.config import Config

# evaluator keys that name an annotation file read at evaluation time (CocoMetric)
_EVALUATOR_FILE_KEYS = ('ann_file', )


def _is_remote(path: str) -> bool:
    return '://' in path or path.startswith(('s3:', 'petrel:'))


def _join(root: Optional[str], path: str) -> str:
    if not root or osp.isabs(path):
        return path
    return osp.join(root, path)


def _leaf_datasets(cfg: dict) -> Iterator[dict]:
    """Datasets inside wrappers (RepeatDataset, ConcatDataset, ClassBalancedDataset, ...)."""
    if 'datasets' in cfg and isinstance(cfg['datasets'], (list, tuple)):
        for sub in cfg['datasets']:
            yield from _leaf_datasets(sub)
    elif isinstance(cfg.get('dataset'), dict):
        yield from _leaf_datasets(cfg['dataset'])
    else:
        yield cfg


def dataset_paths(dataset: dict) -> List[Tuple[str, str]]:
    """``(kind, path)`` pairs a dataset config reads: its root, annotation file and folders."""
    root = dataset.get('data_root') or ''
    paths = []
    if root:
        paths.append(('data root', root))
    ann_file = dataset.get('ann_file')
    if isinstance(ann_file, str) and ann_file:
        paths.append(('annotation file', _join(root, ann_file)))
    prefix = dataset.get('data_prefix')
    if isinstance(prefix, dict):
        for key, value in prefix.items():
            if isinstance(value, str) and value:
                paths.append((f'{key} folder', _join(root, value)))
    return [(k, p) for k, p in paths if not _is_remote(p)]


def _evaluator_paths(evaluator) -> Iterable[Tuple[str, str]]:
    for ev in evaluator if isinstance(evaluator, (list, tuple)) else [evaluator]:
        if not isinstance(ev, dict):
            continue
        for key in _EVALUATOR_FILE_KEYS:
            value = ev.get(key)
            if isinstance(value, str) and value and not _is_remote(value):
                yield f'{ev.get("type", "evaluator")} {key}', value


def missing_data(cfg: Config, splits: Iterable[str] = ('train', )) -> List[str]:
    """Lines ``'<where>: <kind> <path>'`` for every path ``splits`` need that does not exist.

    ``splits``: any of 'train', 'val', 'test'; each covers its dataloader and its evaluator.
    """
    problems = []
    for split in splits:
        loader = cfg.get(f'{split}_dataloader')
        if not isinstance(loader, dict) or not isinstance(loader.get('dataset'), dict):
            continue
        for ds in _leaf_datasets(loader['dataset']):
            name = f'{split}_dataloader ({ds.get("type", "dataset")})'
            missing = [(kind, path) for kind, path in dataset_paths(ds) if not osp.exists(path)]
            if missing and missing[0][0] == 'data root':
                missing = missing[:1]  # everything under a missing root is missing too
            problems += [f'{name}: {kind} {path}' for kind, path in missing]
        for kind, path in _evaluator_paths(cfg.get(f'{split}_evaluator')):
            if not osp.exists(path):
                problems.append(f'{split}_evaluator: {kind} {path}')
    return problems


def missing_data_message(problems: List[str], config_path: str) -> str:
    """The message the tools print when :func:`missing_data` found something."""
    lines = [f'The data that {config_path} needs is not there '
             f'(paths relative to {os.getcwd()}):']
    lines += [f'  - {p}' for p in problems]
    lines += [
        'Get COCO / ADE20K and put them where the config expects them as described in '
        'docs/datasets.md, or point the config at your copy with --cfg-options (e.g. '
        'train_dataloader.dataset.data_root=/path/to/data).',
        'No data at hand? `make demo` generates its own synthetic "shapes" data and trains and '
        'evaluates Mask R-CNN on it without any download.',
    ]
    return '\n'.join(lines)
