"""gnsilu: y = silu(group_norm(x, num_groups, weight, bias, eps)) on NVIDIA GPUs, from Python.

    import gnsilu
    y = gnsilu.group_norm_silu(x, 32, weight, bias, eps=1e-6)   # x: a CUDA tensor, bfloat16/float16/float32

For PyTorch models, gnsilu.torch has GroupNormSiLU (nn.GroupNorm followed by SiLU, as one module) and
swap_group_norm_silu(model), which puts it in place of the GroupNorm+SiLU pairs it can prove.

The package is pure Python over the C API of libgnsilu.so (ctypes). The library is found on first use, not on
import: $GNSILU_LIBRARY, else next to this file, else the repository's build/ folder, else the system loader.
Errors are gnsilu.Error subclasses, one per status code of the C API, with the library's message.
"""
__version__ = "0.1.0"

from ._api import (check_device, group_norm_silu, library_path, release_workspaces, set_cache_paths,
                   set_tune_policy, version, workspace_size)
from ._errors import (CompileError, CudaError, Error, InternalError, InvalidArgumentError, LibraryNotFoundError,
                      NoDeviceError, NoDriverError, OutOfMemoryError, UnsupportedDeviceError)

__all__ = [
    "group_norm_silu", "workspace_size", "check_device", "release_workspaces", "set_tune_policy", "set_cache_paths",
    "version", "library_path",
    "Error", "InvalidArgumentError", "NoDriverError", "NoDeviceError", "UnsupportedDeviceError", "CudaError",
    "CompileError", "OutOfMemoryError", "InternalError", "LibraryNotFoundError",
]
