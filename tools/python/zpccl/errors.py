"""Exceptions raised by zpccl.

Every failure of a C call raises :class:`ZpcclError` carrying the ``zpResult_t`` (``code``) and the library's
message from ``zpGetLastError`` (``message``), which names the C call and the argument at fault. Checks done in
Python before calling C (dtype, device, contiguity, sizes, a closed communicator) raise the same class, or one of
its subclasses that are also ``ValueError`` / ``TypeError``, with a message naming the Python method.
"""
from __future__ import annotations

from .enums import Result


class ZpcclError(RuntimeError):
    """A zpccl call failed.

    Attributes:
        code: the ``zpResult_t`` (a :class:`Result`, or a plain int for a value this package does not know).
        message: the library's message (``zpGetLastError``) or the Python check's, naming the call.
        call: the C function that failed, or the Python method whose check failed.
    """

    def __init__(self, code: int, message: str, call: str = "") -> None:
        try:
            self.code: Result | int = Result(code)
        except ValueError:
            self.code = int(code)
        self.message = message
        self.call = call
        super().__init__(message, self.code)

    def __str__(self) -> str:
        name = self.code.c_name if isinstance(self.code, Result) else f"result {self.code}"
        return f"{self.message} [{name}]"


class ZpcclValueError(ZpcclError, ValueError):
    """A bad argument value found in Python (wrong size, dtype, device, layout); code ``INVALID_ARGUMENT``."""

    def __init__(self, message: str, call: str = "") -> None:
        super().__init__(Result.INVALID_ARGUMENT, message, call)


class ZpcclTypeError(ZpcclError, TypeError):
    """An argument of the wrong Python type (not an array, not an int); code ``INVALID_ARGUMENT``."""

    def __init__(self, message: str, call: str = "") -> None:
        super().__init__(Result.INVALID_ARGUMENT, message, call)


class LibraryNotFoundError(OSError):
    """``libzpccl.so`` could not be loaded; the message lists every place tried and how to point at it."""
