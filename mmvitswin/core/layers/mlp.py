"""The shared :class:`~.ffn.FFN` under the timm / mmaction2 names ``fc1`` / ``fc2``.

Checkpoints of the video Swin (mmaction2, the Video Swin release) name the block MLP
``mlp.fc1`` / ``mlp.fc2``; mmcv's layout, which :class:`~.ffn.FFN` keeps, is ``layers.0.0`` /
``layers.1``. :class:`FcNamedFFN` is an ``FFN`` (its forward and fast path, unchanged) whose
sub-modules are registered as ``fc1``, ``act``, ``drop1``, ``fc2``, ``drop``: parameter names
and state-dict keys are mmaction2's, so those checkpoints and configs map 1:1.
"""
import torch.nn as nn

from .ffn import FFN

__all__ = ['FcNamedFFN']


class FcNamedFFN(FFN):
    """:class:`~.ffn.FFN` with its layers registered under flat timm/mmaction2 names.

    ``FFN.forward`` reads ``self.layers`` (``[(fc1, act, drop1), fc2, drop]``); here that is a
    view onto the same module objects, kept out of the module tree, so every parameter is
    named once (``fc1.weight``, ``fc2.bias``, ...) and ``train()``/``to()`` reach it as usual.
    """

    def __init__(self, embed_dims: int, hidden_dims: int, drop: float = 0.,
                 act_layer=nn.GELU):
        super().__init__(embed_dims, hidden_dims, drop=drop, act_layer=act_layer)
        view = self._modules.pop('layers')
        self.fc1, self.act, self.drop1 = view[0]
        self.fc2, self.drop = view[1], view[2]
        object.__setattr__(self, '_layers_view', view)  # not a child: no second name

    @property
    def layers(self) -> nn.Sequential:
        return self._layers_view
