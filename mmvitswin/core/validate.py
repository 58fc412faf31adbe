"""Argument validators shared by every registered class (backbones, adapters, optimizer
constructor, data set).

Each ``check_*`` returns the (normalised) value or raises an error that names the argument, the
value it got and what is allowed::

    ValueError: drop_path_rate must be a probability in [0, 1), got 1.5
    TypeError: with_cp must be a bool (True or False), got 'yes'

Wrong *type* -> ``TypeError``; right type, value outside its meaning -> ``ValueError``. ``bool``
is never accepted where a number is expected (``True`` is an ``int`` to Python, not a size).
``owner`` (optional, e.g. ``'SwinTransformer'``) prefixes the message.
"""
import numbers
from typing import Any, Collection, Optional, Sequence, Tuple

__all__ = [
    'check_int', 'check_positive_int', 'check_non_negative_int', 'check_number',
    'check_positive_number', 'check_probability', 'check_choice', 'check_bool', 'check_index',
    'check_int_sequence', 'check_optional_str', 'check_optional_dict', 'int_tuple', 'check_args'
]


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
        raise TypeError(f'{_prefix(owner)}{name} must be an int, got {value!r}')
    if (low is not None and value < low) or (high is not None and value > high):
        if high is None:
            allowed = f'>= {low}'
        elif low is None:
            allowed = f'<= {high}'
        else:
            allowed = f'in [{low}, {high}]'
        raise ValueError(f'{_prefix(owner)}{name} must be an int {allowed}, got {value!r}')
    return int(value)


def _bounded_int(name: str, value: Any, low: int, kind: str, owner: Optional[str]) -> int:
    if not _is_int(value):
        raise TypeError(f'{_prefix(owner)}{name} must be a {kind} int, got {value!r}')
    if value < low:
        raise ValueError(f'{_prefix(owner)}{name} must be a {kind} int (>= {low}), got {value!r}')
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
        raise TypeError(f'{_prefix(owner)}{name} must be a number, got {value!r}')
    if value != value or value in (float('inf'), float('-inf')):
        raise ValueError(f'{_prefix(owner)}{name} must be a finite number, got {value!r}')
    return float(value)


def check_positive_number(name: str, value: Any, owner: Optional[str] = None,
                          high: Optional[float] = None) -> float:
    """Ratios, scales, epsilons: a finite number > 0 (and <= ``high`` when given)."""
    if not _is_real(value):
        raise TypeError(f'{_prefix(owner)}{name} must be a positive number, got {value!r}')
    ok = value > 0 and value != float('inf') and (high is None or value <= high)
    if not ok:  # also catches NaN, for which every comparison is False
        allowed = f'in (0, {high}]' if high is not None else '> 0'
        raise ValueError(f'{_prefix(owner)}{name} must be a finite number {allowed}, got '
                         f'{value!r}')
    return float(value)


def check_probability(name: str, value: Any, owner: Optional[str] = None) -> float:
    """Drop / drop-path rates: a number in [0, 1) (1 would drop everything)."""
    if not _is_real(value):
        raise TypeError(f'{_prefix(owner)}{name} must be a probability in [0, 1), got '
                        f'{value!r}')
    if not 0. <= value < 1.:
        raise ValueError(f'{_prefix(owner)}{name} must be a probability in [0, 1), got '
                         f'{value!r}')
    return float(value)


def check_choice(name: str, value: Any, choices: Collection, owner: Optional[str] = None):
    """One of ``choices`` (compared with ``==``; ``None`` may be a choice)."""
    try:
        ok = value in choices
    except TypeError:  # unhashable value against a set
        ok = False
    if not ok:
        raise ValueError(f'{_prefix(owner)}{name} must be one of '
                         f'{", ".join(repr(c) for c in choices)}; got {value!r}')
    return value


def check_bool(name: str, value: Any, owner: Optional[str] = None) -> bool:
    """A switch: ``True`` or ``False`` (numpy bools too); not 0/1, not a string."""
    if isinstance(value, bool) or type(value).__name__ == 'bool_':
        return bool(value)
    raise TypeError(f'{_prefix(owner)}{name} must be a bool (True or False), got {value!r}')


def check_index(name: str, value: Any, length: int, allow_negative: bool = False,
                owner: Optional[str] = None) -> int:
    """An index into ``length`` items: ``[0, length)`` or also ``[-length, 0)``."""
    low = -length if allow_negative else 0
    if not _is_int(value):
        raise TypeError(f'{_prefix(owner)}{name} must be an int index in [{low}, {length - 1}]'
                        f', got {value!r}')
    if not low <= value < length:
        raise ValueError(f'{_prefix(owner)}{name} must be an index in [{low}, {length - 1}], '
                         f'got {value!r}')
    return int(value)


def check_int_sequence(name: str, value: Any, length: Optional[int] = None, low: int = 1,
                       allow_empty: bool = False, owner: Optional[str] = None) -> Tuple[int, ...]:
    """A list/tuple of ints, each ``>= low``, of ``length`` entries when given."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise TypeError(f'{_prefix(owner)}{name} must be a list or tuple of ints, got '
                        f'{value!r}')
    if length is not None and len(value) != length:
        raise ValueError(f'{_prefix(owner)}{name} must have {length} entries, got {value!r}')
    if not value and not allow_empty:
        raise ValueError(f'{_prefix(owner)}{name} must not be empty, got {value!r}')
    for i, v in enumerate(value):
        if not _is_int(v):
            raise TypeError(f'{_prefix(owner)}{name}[{i}] must be an int, got {v!r} (in '
                            f'{name}={value!r})')
        if v < low:
            raise ValueError(f'{_prefix(owner)}{name} entries must be ints >= {low}, got '
                             f'{value!r}')
    return tuple(int(v) for v in value)


def int_tuple(name: str, value: Any, ndim: int, low: int = 1,
              owner: Optional[str] = None) -> Tuple[int, ...]:
    """An int (repeated ``ndim`` times) or a sequence of ``ndim`` ints, each ``>= low``."""
    if _is_int(value):
        if value < low:
            raise ValueError(f'{_prefix(owner)}{name} must be >= {low}, got {value!r}')
        return (int(value), ) * ndim
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or \
            len(value) != ndim or not all(_is_int(v) for v in value):
        raise TypeError(f'{_prefix(owner)}{name} must be an int or a sequence of {ndim} ints, '
                        f'got {value!r}')
    if min(value) < low:
        raise ValueError(f'{_prefix(owner)}{name} must be >= {low}, got {value!r}')
    return tuple(int(v) for v in value)


def check_optional_str(name: str, value: Any, owner: Optional[str] = None) -> Optional[str]:
    """A string or None (paths, URLs)."""
    if value is not None and not isinstance(value, str):
        raise TypeError(f'{_prefix(owner)}{name} must be a str or None, got '
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
    raise TypeError(f'{_prefix(owner)}{name} must be {what}, got {type(value).__name__} '
                    f'{value!r}')


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
