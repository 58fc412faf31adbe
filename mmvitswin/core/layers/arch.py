"""Configuration helpers shared by every backbone: presets, output indices, stage checks.

- :func:`resolve_arch`: a preset name (or alias) or a dict -> the preset dict.
- :func:`resolve_indices`: ``out_indices`` (an int or a sequence) -> a tuple of indices into
  stages, blocks or pyramid levels, with one error wording for all of them.
- :func:`linear_drop_path`: the linearly increasing stochastic-depth rates of one run of
  blocks (``drop_path_schedule`` in :mod:`.ffn` splits the same ramp per stage).
- :func:`validate_stages`: the checks of a hierarchical (Swin-like) stage layout.

Errors are :mod:`..validate`'s classes: a ``ValueError``/``TypeError`` that is also an
``AssertionError`` (and an ``IndexError`` for an index or a count out of range), as the
references they stand in for raise at the same arguments.
"""
from typing import Dict, Mapping, Optional, Sequence, Tuple

from ..validate import (ArgumentIndexError, ArgumentTypeError, ArgumentValueError, check_int,
                        check_int_sequence, check_positive_int)
from .ffn import drop_path_schedule

__all__ = ['resolve_arch', 'resolve_indices', 'linear_drop_path', 'validate_stages']


def resolve_arch(arch, zoo: Mapping[str, dict], aliases: Mapping[str, str],
                 required: Sequence[str], exact: bool = False) -> dict:
    """``arch`` as a preset of ``zoo`` (case-insensitive, ``aliases`` allowed) or a dict that
    holds at least the ``required`` keys (``exact``: those keys and no other, as mmaction2's
    video Swin asserts: a misspelt key is not silently ignored). ArgumentValueError /
    ArgumentTypeError naming ``arch`` otherwise."""
    if isinstance(arch, dict):
        missing = set(required) - set(arch)
        if missing:
            raise ArgumentValueError(f'arch dict is missing {sorted(missing)} (needs the keys '
                                     f'{list(required)})')
        unknown = set(arch) - set(required)
        if exact and unknown:
            raise ArgumentValueError(f'arch dict has unknown keys {sorted(unknown)}: it takes '
                                     f'exactly {list(required)}')
        return arch
    if not isinstance(arch, str):
        raise ArgumentTypeError(f'arch must be a str or dict, got {type(arch).__name__}')
    name = aliases.get(arch.lower(), arch.lower())
    if name not in zoo:
        raise ArgumentValueError(f'arch must be one of {sorted(zoo)} (or a dict), got {arch!r}')
    return zoo[name]


def resolve_indices(value, count: int, what: str = 'stage indices',
                    allow_negative: bool = False, allow_empty: bool = False,
                    note: str = '', name: str = 'out_indices',
                    allow_int: bool = True) -> Tuple[int, ...]:
    """An int (``allow_int``) or a list/tuple of ints, each in ``[0, count)`` (also
    ``[-count, 0)`` with ``allow_negative``, returned modulo ``count``). ``what`` names the
    indexed things in the error (``'stage indices'``, ``'block indices'``, ``'pyramid
    levels'``); ``note`` is added to it. Wrong type -> ArgumentTypeError, an index out of
    range -> ArgumentIndexError (an IndexError, as the reference classes raise there)."""
    if allow_int and isinstance(value, int) and not isinstance(value, bool):
        value = (value, )
    if not isinstance(value, (list, tuple)):
        kinds = 'an int, list or tuple' if allow_int else 'a list or tuple of ints'
        raise ArgumentTypeError(f'{name} must be {kinds}, got {value!r}')
    if not value and not allow_empty:
        raise ArgumentValueError(f'{name} must name at least one of the {what}, got ()')
    low = -count if allow_negative else 0
    for i in value:
        if isinstance(i, bool) or not isinstance(i, int):
            raise ArgumentTypeError(f'{name} must be {what} (ints) in [{low}, {count - 1}]'
                                    f'{note}, got {tuple(value)}')
        if not low <= i < count:
            raise ArgumentIndexError(f'{name} must be {what} in [{low}, {count - 1}]{note}, '
                                     f'got {tuple(value)}')
    return tuple(i % count for i in value)


def linear_drop_path(drop_path_rate: float, num_blocks: int) -> list:
    """Stochastic-depth rates rising linearly from 0 to ``drop_path_rate`` over the blocks."""
    return drop_path_schedule(drop_path_rate, [num_blocks])[0]


def validate_stages(embed_dims, depths, num_heads, frozen_stages: int,
                    max_stages: Optional[int] = None) -> Dict[str, tuple]:
    """Checks of a hierarchical stage layout (stage ``i`` has ``embed_dims * 2**i`` channels):
    ``depths`` and ``num_heads`` one entry per stage (at most ``max_stages``), every width
    divisible by its heads, ``frozen_stages`` an int ``<= num_stages`` (any negative value
    freezes nothing, as in the references). Returns the normalised ``depths``/``num_heads``.
    """
    check_positive_int('embed_dims', embed_dims)
    depths = check_int_sequence('depths', depths, low=0)
    num_heads = check_int_sequence('num_heads', num_heads, low=1)
    if len(depths) != len(num_heads):
        raise ArgumentIndexError(f'depths ({len(depths)} stages: {tuple(depths)}) and num_heads '
                                 f'({len(num_heads)} stages: {tuple(num_heads)}) must have the '
                                 'same length')
    if max_stages is not None and len(depths) > max_stages:
        raise ArgumentValueError(f'depths must have 1 to {max_stages} stages, got {len(depths)}: '
                                 f'{tuple(depths)}')
    for i, heads in enumerate(num_heads):
        dims = embed_dims * 2**i
        if dims % heads != 0:
            raise ArgumentValueError(f'embed_dims of stage {i} ({dims} = embed_dims * 2**{i}) '
                                     f'must be divisible by num_heads[{i}] ({heads})')
    check_int('frozen_stages', frozen_stages)
    if frozen_stages > len(depths):
        raise ArgumentIndexError(f'frozen_stages must be an int in [-1, {len(depths)}] (the '
                                 f'number of stages; negative: none frozen), got '
                                 f'{frozen_stages!r}')
    return dict(depths=depths, num_heads=num_heads)
