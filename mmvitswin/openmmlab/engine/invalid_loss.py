"""A NaN/Inf loss stops training with a message that says where.

The configs in ``configs/`` enable MMDetection 3.3's own ``CheckInvalidLossHook`` (interval 1;
``mmdet.CheckInvalidLossHook`` from the mmseg scope: MMSegmentation 1.2 and MMEngine 0.10.7 ship
no such check). The hook asserts ``torch.isfinite(loss)``, but its assertion carries no message
(it logs 'loss become infinite or NaN!' and raises a bare ``AssertionError``).
:func:`install_invalid_loss_message` (run when :mod:`mmvitswin` is imported) keeps that check
as it is and only gives the ``AssertionError`` a message naming the iteration, the epoch and
the loss terms::

    AssertionError: CheckInvalidLossHook: the loss is nan at iteration 3 (epoch 1):
    loss_cls=0.71, loss_bbox=nan, ... -- training stopped.
"""
import math

_installed = False


def _describe(outputs) -> str:
    parts = []
    for key, value in (outputs or {}).items():
        try:
            number = float(value)
        except (TypeError, ValueError, RuntimeError):
            continue
        parts.append(f'{key}={number:.4g}')
    return ', '.join(parts)


def install_invalid_loss_message() -> None:
    """Wrap mmdet's ``CheckInvalidLossHook.after_train_iter`` (see module docstring)."""
    global _installed
    if _installed:
        return
    try:
        from mmdet.engine.hooks.checkloss_hook import CheckInvalidLossHook
    except ImportError:  # mmdet not installed: nothing to improve
        return
    original = CheckInvalidLossHook.after_train_iter

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
        try:
            original(self, runner, batch_idx, data_batch, outputs)
        except AssertionError as exc:
            if exc.args and exc.args[0]:
                raise
            loss = float((outputs or {}).get('loss', math.nan))
            epoch = f' (epoch {runner.epoch + 1})' if getattr(runner, 'epoch', None) is not None \
                else ''
            raise AssertionError(
                f'CheckInvalidLossHook: the loss is {loss} at iteration {runner.iter + 1}'
                f'{epoch}: {_describe(outputs)} -- training stopped. Lower the learning rate, '
                f'enable gradient clipping (optim_wrapper.clip_grad) or check the data of this '
                f'iteration.') from None

    after_train_iter.__wrapped__ = original
    after_train_iter.__doc__ = original.__doc__
    CheckInvalidLossHook.after_train_iter = after_train_iter
    _installed = True
