"""Argument validators shared by every registered class (backbones, adapters, optimizer
constructor, data set).

Each ``check_*`` returns the (normalised) value or raises an error that names the argument, the
value it got and what is allowed::

    ValueError: drop_path_rate must be a probability in [0, 1), got 1.5
    TypeError: with_cp must be a bool (True or False), got 'yes'

Wrong *type* -> :class:`ArgumentTypeError` (a ``TypeError``); right type, value outside its
meaning -> :class:`ArgumentValueError` (a ``ValueError``); an index outside what it indexes, or a
sequence with the wrong number of entries -> :class:`ArgumentIndexError` (a ``ValueError`` and
an ``IndexError``). ``bool`` is never accepted where a number is expected (``True`` is an ``int``
to Python, not a size). ``owner`` (optional, e.g. ``'SwinTransformer'``) prefixes the message.

Every one of them is also an ``AssertionError`` (:class:`ArgumentError`): the OpenMMLab classes
our backbones stand in for (mmdet's and mmseg's ``SwinTransformer``, mmaction2's
``SwinTransformer3D``) ``assert`` most of these checks, so code written against them
(``except AssertionError``, ``pytest.raises(AssertionError)``) keeps working with ours, which
raise at the same arguments with a message that names the argument.
"""
import numbers
from typing import Any, Collection, Optional, Sequence, Tuple

__all__ = [
    'ArgumentError', 'ArgumentTypeError', 'ArgumentValueError', 'ArgumentIndexError',
    'check_int', 'check_positive_int', 'check_non_negative_int', 'check_number',
    'check_positive_number', 'check_probability', 'check_choice', 'check_bool', 'check_index',
    'check_int_sequence', 'check_optional_str', 'check_optional_dict', 'check_dict', 'int_tuple',
    'check_args'
]


class ArgumentError(AssertionError):
    """A bad constructor argument (base of the three below). An ``AssertionError`` because the
    reference classes assert these checks; catch it to catch any argument error of ours."""


class ArgumentTypeError(ArgumentError, TypeError):
    """An argument of the wrong type (``in_channels=3.0``, ``window_size='7'``)."""


class ArgumentValueError(ArgumentError, ValueError):
    """An argument of the right type with a value outside its meaning (``drop_rate=1.5``)."""


class ArgumentIndexError(ArgumentValueError, IndexError):
    """An index outside the sequence it indexes (``out_indices=(4,)`` for 4 stages,
    ``frozen_stages=5``) or a sequence with the wrong number of entries (``depths`` and
    ``num_heads`` of different lengths, a 3-entry ``pretrain_img_size``). Also an
    ``IndexError``: that is what mmdet's/mmseg's Swin and mmaction2's video Swin raise there
    when they do not assert."""


def _prefix(owner: Optional[str]) -> str:
    return f'{owner}: ' if owner else ''


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def check_int(name: str, value: Any, low: Optional[int] = None, high: Optional[int] = None,
              owner: Optional[str] = None) -> int:
    """An int in ``[low, high]`` (either bound optional)."""
    if not _is_int(value):
        raise ArgumentTypeError(f'{_prefix(owner)}{name} must be an int, got {value!r}')
    if (low is not None and value < low) or (high is not None and value > high):
        if high is None:
            allowed = f'>= {low}'
        elif low is None:
            allowed = f'<= {high}'
        else:
            allowed = f'in [{low}, {high}]'
        raise ArgumentValueError(f'{_prefix(owner)}{name} must be an int {allowed}, got '
                                 f'{value!r}')
    return int(value)


def _bounded_int(name: str, value: Any, low: int, kind: str, owner: Optional[str]) -> int:
    if not _is_int(value):
        raise ArgumentTypeError(f'{_prefix(owner)}{name} must be a {kind} int, got {value!r}')
    if value < low:
        raise ArgumentValueError(f'{_prefix(owner)}{name} must be a {kind} int (>= {low}), '
                                 f'got {value!r}')
    return int(value)


def check_positive_int(name: str, value: Any, owner: Optional[str] = None) -> int:
    """Sizes and counts: an int >= 1."""
    return _bounded_int(name, value, 1, 'positive', owner)


def check_non_negative_int(name: str, value: Any, owner: Optional[str] = None) -> int:
    """Counts that may be zero: an int >= 0."""
    return _bounded_int(name, value, 0, 'non-negative', owner)


def check_number(name: str, value: Any, owner: Optional[str] = None) -> float:
    """Any finite real number."""
    if not _is_real(value):
        raise ArgumentTypeError(f'{_prefix(owner)}{name} must be a number, got {value!r}')
    if value != value or value in (float('inf'), float('-inf')):
        raise ArgumentValueError(f'{_prefix(owner)}{name} must be a finite number, got '
                                 f'{value!r}')
    return float(value)


def check_positive_number(name: str, value: Any, owner: Optional[str] = None,
                          high: Optional[float] = None) -> float:
    """Ratios, scales, epsilons: a finite number > 0 (and <= ``high`` when given)."""
    if not _is_real(value):
        raise ArgumentTypeError(f'{_prefix(owner)}{name} must be a positive number, got '
                                f'{value!r}')
    ok = value > 0 and value != float('inf') and (high is None or value <= high)
    if not ok:  # also catches NaN, for which every comparison is False
        allowed = f'in (0, {high}]' if high is not None else '> 0'
        raise ArgumentValueError(f'{_prefix(owner)}{name} must be a finite number {allowed}, got '
                                 f'{value!r}')
    return float(value)


def check_probability(name: str, value: Any, owner: Optional[str] = None) -> float:
    """Drop / drop-path rates: a number in [0, 1) (1 would drop everything)."""
    if not _is_real(value):
        raise ArgumentTypeError(f'{_prefix(owner)}{name} must be a probability in [0, 1), got '
                                f'{value!r}')
    if not 0. <= value < 1.:
        raise ArgumentValueError(f'{_prefix(owner)}{name} must be a probability in [0, 1), got '
                                 f'{value!r}')
    return float(value)


def check_choice(name: str, value: Any, choices: Collection, owner: Optional[str] = None):
    """One of ``choices`` (compared with ``==``; ``None`` may be a choice)."""
    try:
        ok = value in choices
    except TypeError:  # unhashable value against a set
        ok = False
    if not ok:
        raise ArgumentValueError(f'{_prefix(owner)}{name} must be one of '
                                 f'{", ".join(repr(c) for c in choices)}; got {value!r}')
    return value


def check_bool(name: str, value: Any, owner: Optional[str] = None) -> bool:
    """A switch: ``True`` or ``False`` (numpy bools too); not 0/1, not a string."""
    if isinstance(value, bool) or type(value).__name__ == 'bool_':
        return bool(value)
    raise ArgumentTypeError(f'{_prefix(owner)}{name} must be a bool (True or False), got '
                            f'{value!r}')


def check_index(name: str, value: Any, length: int, allow_negative: bool = False,
                owner: Optional[str] = None) -> int:
    """An index into ``length`` items: ``[0, length)`` or also ``[-length, 0)``."""
    low = -length if allow_negative else 0
    if not _is_int(value):
        raise ArgumentTypeError(f'{_prefix(owner)}{name} must be an int index in '
                                f'[{low}, {length - 1}], got {value!r}')
    if not low <= value < length:
        raise ArgumentIndexError(f'{_prefix(owner)}{name} must be an index in '
                                 f'[{low}, {length - 1}], got {value!r}')
    return int(value)


def check_int_sequence(name: str, value: Any, length: Optional[int] = None, low: int = 1,
                       allow_empty: bool = False, owner: Optional[str] = None) -> Tuple[int, ...]:
    """A list/tuple of ints, each ``>= low``, of ``length`` entries when given."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise ArgumentTypeError(f'{_prefix(owner)}{name} must be a list or tuple of ints, got '
                                f'{value!r}')
    if length is not None and len(value) != length:
        raise ArgumentIndexError(f'{_prefix(owner)}{name} must have {length} entries, got '
                                 f'{value!r}')
    if not value and not allow_empty:
        raise ArgumentIndexError(f'{_prefix(owner)}{name} must not be empty, got {value!r}')
    for i, v in enumerate(value):
        if not _is_int(v):
            raise ArgumentTypeError(f'{_prefix(owner)}{name}[{i}] must be an int, got {v!r} (in '
                                    f'{name}={value!r})')
        if v < low:
            raise ArgumentValueError(f'{_prefix(owner)}{name} entries must be ints >= {low}, got '
                                     f'{value!r}')
    return tuple(int(v) for v in value)


def int_tuple(name: str, value: Any, ndim: int, low: int = 1,
              owner: Optional[str] = None) -> Tuple[int, ...]:
    """An int (repeated ``ndim`` times) or a sequence of ``ndim`` ints, each ``>= low``.
    Not a sequence of ints -> ArgumentTypeError; another number of entries ->
    ArgumentIndexError."""
    if _is_int(value):
        if value < low:
            raise ArgumentValueError(f'{_prefix(owner)}{name} must be >= {low}, got {value!r}')
        return (int(value), ) * ndim
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or \
            not all(_is_int(v) for v in value):
        raise ArgumentTypeError(f'{_prefix(owner)}{name} must be an int or a sequence of {ndim} '
                                f'ints, got {value!r}')
    if len(value) != ndim:
        raise ArgumentIndexError(f'{_prefix(owner)}{name} must be an int or a sequence of {ndim} '
                                 f'ints, got {len(value)} entries: {value!r}')
    if min(value) < low:
        raise ArgumentValueError(f'{_prefix(owner)}{name} must be >= {low}, got {value!r}')
    return tuple(int(v) for v in value)


def check_optional_str(name: str, value: Any, owner: Optional[str] = None) -> Optional[str]:
    """A string or None (paths, URLs)."""
    if value is not None and not isinstance(value, str):
        raise ArgumentTypeError(f'{_prefix(owner)}{name} must be a str or None, got '
                                f'{type(value).__name__} {value!r}')
    return value


def check_optional_dict(name: str, value: Any, owner: Optional[str] = None,
                        allow_list: bool = False):
    """A config dict or None (``init_cfg`` may also be a list of dicts)."""
    if value is None or isinstance(value, dict):
        return value
    if allow_list and isinstance(value, list) and all(isinstance(v, dict) for v in value):
        return value
    what = 'a dict, a list of dicts or None' if allow_list else 'a dict or None'
    raise ArgumentTypeError(f'{_prefix(owner)}{name} must be {what}, got {type(value).__name__} '
                            f'{value!r}')


def check_dict(name: str, value: Any, owner: Optional[str] = None) -> dict:
    """A config dict that must be given (``act_cfg``, ``norm_cfg``: the reference classes build
    a layer from it, so ``None`` is refused there too)."""
    if not isinstance(value, dict):
        raise ArgumentTypeError(f'{_prefix(owner)}{name} must be a dict, got '
                                f'{type(value).__name__} {value!r}')
    return value


def check_args(positive: Optional[dict] = None, optional_positive: Optional[dict] = None,
               probabilities: Optional[dict] = None, flags: Optional[dict] = None,
               cfgs: Optional[dict] = None, owner: Optional[str] = None) -> None:
    """The common constructor checks in one call, each a ``{name: value}`` dict: ``positive``
    numbers, ``optional_positive`` ones (``None`` allowed: no override), ``probabilities``,
    bool ``flags`` and optional config dicts ``cfgs`` (``init_cfg`` may also be a list)."""
    for name, value in (positive or {}).items():
        check_positive_number(name, value, owner)
    for name, value in (optional_positive or {}).items():
        if value is not None:
            check_positive_number(name, value, owner)
    for name, value in (probabilities or {}).items():
        check_probability(name, value, owner)
    for name, value in (flags or {}).items():
        check_bool(name, value, owner)
    for name, value in (cfgs or {}).items():
        check_optional_dict(name, value, owner, allow_list=name == 'init_cfg')
