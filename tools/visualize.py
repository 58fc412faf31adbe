"""Draw a model's predictions and its per-stage backbone feature maps as PNGs.

    python tools/visualize.py CONFIG [CHECKPOINT] IMAGE [--out-dir DIR] [--score-thr 0.3]

Works for mmdet detectors and mmseg segmentors alike (the config's ``default_scope`` decides).
Writes ``DIR/<image>_pred.png`` (drawn by mmdet's DetLocalVisualizer or mmseg's
SegLocalVisualizer) and ``DIR/<image>_features.png``: one panel per backbone output, the mean
over channels normalised to [0, 1] and colour-mapped, labelled with the stage and its stride.
Without a checkpoint the model keeps its random initialisation (a warning says so).
"""
import argparse
import copy
import os
import os.path as osp
import sys
import uuid
import warnings
from typing import Dict, List, Optional, Sequence

import cv2
import numpy as np
import torch

sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))

from mmengine.config import Config, DictAction  # noqa: E402
from mmengine.dataset import Compose, pseudo_collate  # noqa: E402
from mmengine.registry import init_default_scope  # noqa: E402

PANEL_HEIGHT = 160  # feature panels are resized to this height (nearest, so tokens stay visible)


# ----------------------------------------------------------------------------- pure helpers
def feature_panel(feature: torch.Tensor, height: int = PANEL_HEIGHT) -> np.ndarray:
    """One colour-mapped panel ``(height, w, 3)`` uint8 BGR from a feature map ``(C, H, W)``.

    The map is the mean over channels, min-max normalised (a constant map becomes 0).
    """
    if feature.dim() != 3:
        raise ValueError(f'feature must be (C, H, W), got shape {tuple(feature.shape)}')
    fmap = feature.detach().float().mean(0).cpu().numpy()
    span = float(fmap.max() - fmap.min())
    fmap = (fmap - fmap.min()) / span if span > 0 else np.zeros_like(fmap)
    width = max(1, round(height * fmap.shape[1] / fmap.shape[0]))
    fmap = cv2.resize(fmap, (width, height), interpolation=cv2.INTER_NEAREST)
    return cv2.applyColorMap((fmap * 255).astype(np.uint8), cv2.COLORMAP_VIRIDIS)


def feature_grid(features: Sequence[torch.Tensor], input_hw: Sequence[int],
                 height: int = PANEL_HEIGHT) -> np.ndarray:
    """Panels of every stage side by side ``(height + 20, W, 3)`` BGR, each captioned
    ``stage i  s<stride>  CxHxW``; ``features`` are ``(C, H, W)`` maps of one image."""
    panels = []
    for i, feat in enumerate(features):
        panel = feature_panel(feat, height)
        stride = round(input_hw[0] / feat.shape[1])
        caption = np.full((20, max(panel.shape[1], 150), 3), 255, np.uint8)
        text = f'stage {i}  s{stride}  {feat.shape[0]}x{feat.shape[1]}x{feat.shape[2]}'
        cv2.putText(caption, text, (3, 14), cv2.FONT_HERSHEY_SIMPLEX, 0.4, (0, 0, 0), 1,
                    cv2.LINE_AA)
        body = np.full((height, caption.shape[1], 3), 255, np.uint8)
        body[:, :panel.shape[1]] = panel
        panels.append(np.vstack([caption, body]))
        panels.append(np.full((height + 20, 4, 3), 255, np.uint8))
    return np.hstack(panels[:-1])


def test_pipeline_cfg(cfg: Config) -> List[dict]:
    """The test pipeline of ``cfg`` without annotation loading (images need no labels)."""
    dataloader = cfg.get('test_dataloader') or cfg.get('val_dataloader')
    if dataloader is None:
        raise ValueError('the config has neither test_dataloader nor val_dataloader; cannot '
                         'tell how to preprocess an image')
    dataset = dataloader['dataset']
    while 'pipeline' not in dataset and 'dataset' in dataset:  # dataset wrappers
        dataset = dataset['dataset']
    return [dict(t) for t in dataset['pipeline'] if not t['type'].endswith('LoadAnnotations')]


# ----------------------------------------------------------------------------- model side
def build_model(cfg: Config, checkpoint: Optional[str] = None) -> torch.nn.Module:
    """The config's model in eval mode, with ``checkpoint`` loaded (or random init)."""
    import mmvitswin  # noqa: F401  (registers the backbones even without custom_imports)
    from mmengine.registry import MODELS
    from mmengine.runner import load_checkpoint

    init_default_scope(cfg.get('default_scope', 'mmdet'))
    model = MODELS.build(cfg.model)
    if checkpoint:
        meta = load_checkpoint(model, checkpoint, map_location='cpu')
        meta = meta.get('meta', {}) if isinstance(meta, dict) else {}
        if 'dataset_meta' in meta:
            model.dataset_meta = meta['dataset_meta']
    else:
        warnings.warn('no checkpoint given: the model is randomly initialised')
        model.init_weights()
    model.eval()
    return model


def dataset_meta_of(cfg: Config, model: torch.nn.Module) -> Dict:
    """Class names and palette: from the checkpoint, else the config's dataset."""
    meta = getattr(model, 'dataset_meta', None)
    if meta:
        return dict(meta)
    from mmengine.registry import DATASETS
    dataset = cfg.test_dataloader['dataset'] if 'test_dataloader' in cfg else \
        cfg.val_dataloader['dataset']
    metainfo = dict(dataset.get('metainfo') or {})
    with DATASETS.switch_scope_and_registry(cfg.get('default_scope')) as registry:
        cls = registry.get(dataset['type'])
    base = dict(getattr(cls, 'METAINFO', {}) or {})
    base.update(metainfo)
    if 'classes' in metainfo and 'palette' not in metainfo:
        base.pop('palette', None)  # the class's palette may not fit the overridden classes
    return base


@torch.no_grad()
def predict_with_features(model, cfg: Config, img_path: str):
    """Run one image through the test pipeline: ``(data_sample, features, input_hw)`` where
    ``features`` are the backbone outputs ``(C, H, W)`` for this image."""
    init_default_scope(cfg.get('default_scope', 'mmdet'))
    pipeline = Compose(test_pipeline_cfg(cfg))
    data = pseudo_collate([pipeline(dict(img_path=img_path, img_id=0))])
    sample = model.test_step(data)[0]
    inputs = model.data_preprocessor(data, False)['inputs']
    features = model.backbone(inputs)
    if isinstance(features, torch.Tensor):
        features = (features, )
    return sample, [f[0] for f in features], tuple(inputs.shape[-2:])


def _repeat(x, k: int):
    """Nearest-neighbour upscale of the last two dims by the integer ``k``."""
    if isinstance(x, torch.Tensor):
        return x.repeat_interleave(k, -2).repeat_interleave(k, -1)
    return np.repeat(np.repeat(x, k, -2), k, -1)


def upscale_sample(sample, k: int):
    """A copy of a det/seg data sample drawn ``k`` times larger: boxes scaled, masks and label
    maps repeated. Tiny images would otherwise be hidden under the visualizer's labels."""
    from mmengine.structures import PixelData
    sample = copy.deepcopy(sample)  # BaseDataElement.clone() shares nested elements
    for key in ('pred_instances', 'gt_instances'):
        inst = sample.get(key)
        if inst is None:
            continue
        if 'bboxes' in inst:
            boxes = inst.bboxes.tensor if hasattr(inst.bboxes, 'tensor') else inst.bboxes
            inst.bboxes = boxes * k
        if 'masks' in inst:
            masks = inst.masks
            masks = masks.to_ndarray() if hasattr(masks, 'to_ndarray') else masks
            inst.masks = _repeat(masks, k)
    for key in ('pred_sem_seg', 'gt_sem_seg'):
        seg = sample.get(key)
        if seg is not None:
            sample.set_field(PixelData(data=_repeat(seg.data, k)), key)
    if 'seg_logits' in sample:
        del sample.seg_logits
    return sample


def draw_prediction(cfg: Config, dataset_meta: Dict, img_path: str, sample, out_file: str,
                    score_thr: float = 0.3, draw_gt: bool = False, min_side: int = 384) -> str:
    """Draw ``sample``'s predictions on the image with the mmdet/mmseg visualizer; images
    smaller than ``min_side`` are drawn enlarged by an integer factor (nearest)."""
    import mmcv
    image = mmcv.imread(img_path, channel_order='rgb')
    k = max(1, -(-min_side // min(image.shape[:2])))
    if k > 1:
        image = np.ascontiguousarray(np.repeat(np.repeat(image, k, 0), k, 1))
        sample = upscale_sample(sample, k)
    name = f'mmvitswin_vis_{uuid.uuid4().hex[:8]}'  # visualizers are named singletons
    if cfg.get('default_scope') == 'mmseg':
        from mmseg.visualization import SegLocalVisualizer
        vis = SegLocalVisualizer(name=name, alpha=0.6)
        vis.dataset_meta = dataset_meta
        vis.add_datasample('pred', image, sample, draw_gt=draw_gt, out_file=out_file)
    else:
        from mmdet.visualization import DetLocalVisualizer
        vis = DetLocalVisualizer(name=name)
        vis.dataset_meta = dataset_meta
        vis.add_datasample('pred', image, sample, draw_gt=draw_gt, out_file=out_file,
                           pred_score_thr=score_thr)
    return out_file


def visualize(cfg: Config, model, img_path: str, out_dir: str, score_thr: float = 0.3,
              draw_gt_sample=None) -> Dict[str, str]:
    """Write ``<stem>_pred.png`` and ``<stem>_features.png`` under ``out_dir``; return paths.

    ``draw_gt_sample``: an optional data sample with ground truth for this image, drawn on the
    left of the prediction.
    """
    if not osp.isfile(img_path):
        raise FileNotFoundError(f'image not found: {img_path}')
    os.makedirs(out_dir, exist_ok=True)
    stem = osp.splitext(osp.basename(img_path))[0]
    sample, features, input_hw = predict_with_features(model, cfg, img_path)
    if draw_gt_sample is not None:
        for key in ('gt_instances', 'gt_sem_seg'):
            if key in draw_gt_sample:
                sample.set_field(getattr(draw_gt_sample, key), key)
        gt = sample.get('gt_instances')
        if gt is not None and hasattr(gt.get('bboxes'), 'tensor'):
            # the dataset packs box objects; mmdet's visualizer draws plain (N, 4) tensors
            gt.bboxes = gt.bboxes.tensor
    pred_png = draw_prediction(cfg, dataset_meta_of(cfg, model), img_path, sample,
                               osp.join(out_dir, f'{stem}_pred.png'), score_thr,
                               draw_gt=draw_gt_sample is not None)
    feat_png = osp.join(out_dir, f'{stem}_features.png')
    cv2.imwrite(feat_png, feature_grid(features, input_hw))
    return dict(prediction=pred_png, features=feat_png)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('config', help='mmdet or mmseg config file')
    parser.add_argument('paths', nargs='+', metavar='[CHECKPOINT] IMAGE',
                        help='optional checkpoint, then the image')
    parser.add_argument('--out-dir', default='vis_out', help='output folder (default vis_out)')
    parser.add_argument('--score-thr', type=float, default=0.3,
                        help='detections below this score are not drawn')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction,
                        help='override config entries, key=value')
    args = parser.parse_args(argv)
    if len(args.paths) > 2:
        parser.error('expected [CHECKPOINT] IMAGE')
    args.checkpoint = args.paths[0] if len(args.paths) == 2 else None
    args.image = args.paths[-1]
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    for what, path in (('config', args.config), ('checkpoint', args.checkpoint),
                       ('image', args.image)):
        if path is not None and not osp.isfile(path):
            print(f'visualize: {what} not found: {path}', file=sys.stderr)
            return 2
    cfg = Config.fromfile(args.config)
    if args.cfg_options:
        cfg.merge_from_dict(args.cfg_options)
    model = build_model(cfg, args.checkpoint)
    paths = visualize(cfg, model, args.image, args.out_dir, args.score_thr)
    for kind, path in paths.items():
        print(f'{kind}: {path}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
