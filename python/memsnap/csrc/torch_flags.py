"""Print how to build a C++ library against the installed torch (and
torch_npu), for python/meson.build.

Output: one ``key=value`` line per item, values separated by ``;``:

  torch=<version> | torch=none:<why>
  include=<dirs>        torch's header folders (torch.utils.cpp_extension)
  libdir=<dir>          torch/lib
  cxx_abi=0|1           torch._C._GLIBCXX_USE_CXX11_ABI
  cuda=<version>|none   torch.version.cuda
  cuda_include=<dirs>   CUDA runtime headers (CUDA_HOME, or the nvidia
                        wheels' include folders), empty when not found
  npu_include=<dirs>    torch_npu's headers, empty without torch_npu
  npu_libdir=<dir>      torch_npu/lib, empty without torch_npu

Exit status 0 in every case (meson decides what to build).
"""
from __future__ import annotations

import glob
import importlib.util
import os
import sys


def _cuda_include() -> list[str]:
    """Folders with the CUDA runtime headers: $CUDA_HOME/include, the
    include folders of the nvidia-* wheels torch depends on, or
    /usr/local/cuda/include; [] when cuda_runtime_api.h is in none."""
    dirs = []
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if home:
        dirs.append(os.path.join(home, "include"))
    spec = importlib.util.find_spec("nvidia")
    if spec is not None and spec.submodule_search_locations:
        for base in spec.submodule_search_locations:
            dirs += sorted(glob.glob(os.path.join(base, "*", "include")))
    dirs.append("/usr/local/cuda/include")
    dirs = [d for d in dirs if os.path.isdir(d)]
    if not any(os.path.exists(os.path.join(d, "cuda_runtime_api.h")) for d in dirs):
        return []
    return dirs


def main() -> int:
    try:
        import torch
        from torch.utils import cpp_extension
    except Exception as e:  # no torch, or a broken one: build without the shim
        print(f"torch=none:{type(e).__name__}: {e}".replace("\n", " "))
        return 0
    print(f"torch={torch.__version__}")
    print("include=" + ";".join(cpp_extension.include_paths()))
    print("libdir=" + os.path.join(os.path.dirname(torch.__file__), "lib"))
    print(f"cxx_abi={int(bool(torch._C._GLIBCXX_USE_CXX11_ABI))}")
    cuda = torch.version.cuda
    print(f"cuda={cuda or 'none'}")
    print("cuda_include=" + (";".join(_cuda_include()) if cuda else ""))
    npu_inc, npu_lib = [], ""
    spec = importlib.util.find_spec("torch_npu")
    if spec is not None and spec.origin:
        root = os.path.dirname(spec.origin)
        inc = os.path.join(root, "include")
        if os.path.isdir(inc):
            npu_inc = [inc, os.path.join(inc, "third_party", "acl", "inc")]
            npu_lib = os.path.join(root, "lib")
    print("npu_include=" + ";".join(npu_inc))
    print("npu_libdir=" + npu_lib)
    return 0


if __name__ == "__main__":
    sys.exit(main())
