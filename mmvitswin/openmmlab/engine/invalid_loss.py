"""A NaN/Inf loss stops training with a message that says where.

MMDetection 3.3's ``CheckInvalidLossHook`` asserts ``torch.isfinite(loss)`` with no message (it
logs 'loss become infinite or NaN!' and raises a bare ``AssertionError``); MMSegmentation 1.2
and MMEngine 0.10.7 ship no such check. Our configs use :class:`FiniteLossHook` instead (same
check, same ``interval`` argument, any scope), whose error names the iteration, the epoch and
the loss terms::

    AssertionError: FiniteLossHook: the loss is nan at iteration 3 (epoch 1):
    loss_cls=0.71, loss_bbox=nan, ... -- training stopped. ...

It stays an ``AssertionError``, as mmdet's, so code that catches that one catches this one.
"""
from typing import Optional

import torch
from mmengine.hooks import Hook

from ..registry import HOOKS
from ...core.validate import check_positive_int


def describe_losses(outputs: Optional[dict]) -> str:
    """``'loss_cls=0.71, loss_bbox=nan'``: every scalar entry of the train step's outputs."""
    parts = []
    for key, value in (outputs or {}).items():
        try:
            number = float(value)
        except (TypeError, ValueError, RuntimeError):  # not a scalar
            continue
        parts.append(f'{key}={number:.4g}')
    return ', '.join(parts)


@HOOKS.register_module()
class FiniteLossHook(Hook):
    """Stop training at the first non-finite total loss (``outputs['loss']``), checked every
    ``interval`` iterations, with an ``AssertionError`` naming the iteration (1-based, as the
    log counts), the epoch and every loss term. Config::

        custom_hooks = [dict(type='mmvitswin.FiniteLossHook', interval=1)]
    """

    def __init__(self, interval: int = 50) -> None:
        self.interval = check_positive_int('interval', interval)

    def after_train_iter(self, runner, batch_idx: int, data_batch=None,
                         outputs: Optional[dict] = None) -> None:
        if not self.every_n_train_iters(runner, self.interval):
            return
        loss = (outputs or {}).get('loss')
        if loss is None or bool(torch.isfinite(torch.as_tensor(loss)).all()):
            return
        value = float(torch.as_tensor(loss).float().sum())
        epoch = getattr(runner, 'epoch', None)
        where = f' (epoch {epoch + 1})' if epoch is not None else ''
        raise AssertionError(
            f'FiniteLossHook: the loss is {value} at iteration {runner.iter + 1}{where}: '
            f'{describe_losses(outputs)} -- training stopped. Lower the learning rate, enable '
            f'gradient clipping (optim_wrapper.clip_grad) or check the data of this iteration.')
