"""Prove that the installed mmcv carries its compiled ops (exit 1 with a reason otherwise).

``make install`` runs this last: an mmcv built without ``MMCV_WITH_OPS=1`` (for example by
pip's build isolation) imports fine but fails much later inside Mask R-CNN on RoIAlign/nms.
"""
import sys


def main() -> int:
    try:
        import torch
        import mmcv
    except ImportError as exc:  # pragma: no cover - only on a broken venv
        print(f'check_mmcv_ops: cannot import torch/mmcv: {exc}', file=sys.stderr)
        return 1
    try:
        from mmcv.ops import RoIAlign, nms
    except (ImportError, ModuleNotFoundError) as exc:
        print(
            f'check_mmcv_ops: mmcv {mmcv.__version__} was installed WITHOUT its compiled ops '
            f'({exc}). Rebuild it with `make reinstall-mmcv` (MMCV_WITH_OPS=1, '
            '--no-build-isolation, against the torch in this venv).',
            file=sys.stderr)
        return 1
    boxes = torch.tensor([[0., 0., 10., 10.], [1., 1., 11., 11.], [50., 50., 60., 60.]])
    scores = torch.tensor([0.9, 0.8, 0.7])
    dets, keep = nms(boxes, scores, iou_threshold=0.5)
    if keep.tolist() != [0, 2]:
        print(f'check_mmcv_ops: mmcv nms returned {keep.tolist()}, expected [0, 2]', file=sys.stderr)
        return 1
    feats = torch.arange(16.).view(1, 1, 4, 4)
    rois = torch.tensor([[0., 0., 0., 3., 3.]])
    out = RoIAlign((2, 2), spatial_scale=1.0, sampling_ratio=2, aligned=True)(feats, rois)
    if out.shape != (1, 1, 2, 2):
        print(f'check_mmcv_ops: RoIAlign gave shape {tuple(out.shape)}', file=sys.stderr)
        return 1
    print(f'mmcv {mmcv.__version__} ops OK (torch {torch.__version__}): nms keep={keep.tolist()}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
