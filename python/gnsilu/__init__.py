"""gnsilu: y = silu(group_norm(x, num_groups, weight, bias, eps)) on NVIDIA GPUs, from Python.

    import gnsilu
    y = gnsilu.group_norm_silu(x, 32, weight, bias, eps=1e-6)   # x: a CUDA tensor, bfloat16/float16/float32
    y = gnsilu.group_norm(x, 32, weight, bias, activation=None)  # group_norm alone
    y = gnsilu.group_norm_silu(h, 32, weight, bias, input_bias=b)  # of h + b[c] (a conv's bias), in the same pass
    # x contiguous (channels-first) or channels-last (torch.channels_last, ...): y comes back in x's layout

For PyTorch models, gnsilu.torch has GroupNormSiLU (nn.GroupNorm followed by SiLU, as one module), GroupNorm (a
drop-in nn.GroupNorm) and swap_group_norm_silu(model), which puts GroupNormSiLU in place of the GroupNorm+SiLU
pairs it can prove and GroupNorm in place of the other nn.GroupNorms.

The package is pure Python over the C API of libgnsilu.so (ctypes). The library is found on first use, not on
import: $GNSILU_LIBRARY, else inside this package (where `pip install ./python` builds and puts it), else the
repository's build/ folder, else the system loader.
Errors are gnsilu.Error subclasses, one per status code of the C API, with the library's message.
"""
import os as _os


def _read_version():
    """The version from the VERSION file: inside the package where the wheel put it, else the checkout's."""
    here = _os.path.dirname(_os.path.abspath(__file__))
    for path in (_os.path.join(here, "VERSION"), _os.path.join(here, _os.pardir, _os.pardir, "VERSION")):
        try:
            with open(path) as f:
                return f.readline().strip()
        except OSError:
            continue
    return "unknown"


__version__ = _read_version()

from ._api import (STATS_WORDS, all_reduce_stats, check_device, group_norm, group_norm_apply, group_norm_silu, group_stats, layout_of,
                   library_path, merge_stats, release_workspaces, set_cache_paths, set_tune_policy, version,
                   workspace_size)
from ._errors import (CompileError, CudaError, Error, InternalError, InvalidArgumentError, LibraryNotFoundError,
                      NoDeviceError, NoDriverError, OutOfMemoryError, UnsupportedDeviceError)

__all__ = [
    "group_norm", "group_norm_silu", "group_stats", "merge_stats", "all_reduce_stats", "group_norm_apply", "STATS_WORDS", "layout_of",
    "workspace_size", "check_device", "release_workspaces",
    "set_tune_policy", "set_cache_paths", "version", "library_path",
    "Error", "InvalidArgumentError", "NoDriverError", "NoDeviceError", "UnsupportedDeviceError", "CudaError",
    "CompileError", "OutOfMemoryError", "InternalError", "LibraryNotFoundError",
]
