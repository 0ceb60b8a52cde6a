"""cpkit's one exception class, and the translation of the C++ library's errors into it."""

from __future__ import annotations

import functools
from typing import Any, Callable, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


class CPError(ValueError):
    """An argument cpkit rejected. The message names the argument and the values, e.g.
    ``cpkit: argument 'labels': value 70 at [0, 3] is outside the vocabulary [0, 64)``.
    Raised on every rank when ranks disagree (counts that differ across ranks), never a hang.
    """


def raise_error(argument: str, detail: str) -> None:
    """Raises CPError in the C++ library's format."""
    raise CPError(f"cpkit: argument '{argument}': {detail}")


def translate(function: F) -> F:
    """Re-raises the C++ library's errors (ValueError from torch.ops.cpkit.*) as CPError."""

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return function(*args, **kwargs)
        except CPError:
            raise
        except ValueError as error:
            message = str(error)
            if message.startswith("cpkit: argument"):
                raise CPError(message.split("\nException raised from")[0]) from None
            raise

    return wrapper  # type: ignore[return-value]
