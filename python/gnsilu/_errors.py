"""The exceptions of the package, one per gnsilu_status code of the C API (include/gnsilu/gnsilu.h)."""


class Error(Exception):
    """Base of every gnsilu error. `status` is the gnsilu_status code (None where no C call was involved)."""

    status = None


class InvalidArgumentError(Error, ValueError):
    """An argument gnsilu does not take; the message names it. Nothing was written."""

    status = 1


class NoDriverError(Error):
    """No usable CUDA driver (libcuda.so.1 missing, the toolkit's stub, or too old)."""

    status = 2


class NoDeviceError(Error):
    """No CUDA device, or none usable."""

    status = 3


class UnsupportedDeviceError(Error):
    """The device's compute capability is below 7.5."""

    status = 4


class CudaError(Error):
    """A CUDA driver call failed; the message names it and its CUresult."""

    status = 5


class CompileError(Error):
    """NVRTC could not compile a kernel; the message holds its log."""

    status = 6


class OutOfMemoryError(Error, MemoryError):
    """Device memory for gnsilu's internal workspace ran out."""

    status = 7


class InternalError(Error):
    """A bug in gnsilu (please report it with the message)."""

    status = 8


class LibraryNotFoundError(Error, OSError):
    """libgnsilu.so could not be found or loaded; the message lists where it looked and how to fix it."""


_BY_STATUS = {cls.status: cls for cls in (InvalidArgumentError, NoDriverError, NoDeviceError, UnsupportedDeviceError,
                                          CudaError, CompileError, OutOfMemoryError, InternalError)}


def error_for_status(status, message):
    """The exception for a failed C call: its class from the status code, its text from gnsilu_last_error()."""
    cls = _BY_STATUS.get(status)
    if cls is None:
        error = Error(f"gnsilu: unknown status {status}: {message}")
        error.status = status
        return error
    return cls(message)


def invalid_argument(name, problem):
    """An InvalidArgumentError worded like the C library's: "gnsilu: invalid argument 'name': problem"."""
    return InvalidArgumentError(f"gnsilu: invalid argument '{name}': {problem}")
