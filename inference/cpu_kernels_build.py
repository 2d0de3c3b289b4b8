"""Compiles Roundtrip's CPU kernels (see `inference.cpu_kernels`); runs in a child process of its own.

    python -m inference.cpu_kernels_build LIBRARY_PATH ISA

torch's C++ extension builder compiles `inference/kernels/*.cpp` against this torch's headers in a scratch folder;
the library is then moved into place whole, so a build that dies half-way leaves nothing to load.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

from torch.utils.cpp_extension import load

from inference.cpu_kernels import COMMON_FLAGS, ISAS, SOURCES


def main(target: Path, isa: str) -> None:
    flags = COMMON_FLAGS + next(candidate for candidate in ISAS if candidate.name == isa).compiler_flags
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
        built = load(
            name="roundtrip_cpu_kernels",
            sources=[str(source) for source in SOURCES],
            extra_cflags=list(flags),
            build_directory=scratch,
            is_python_module=False,
            verbose=False,
        )
        staged = target.with_suffix(f".{os.getpid()}.tmp")
        shutil.copyfile(str(built), staged)
        os.replace(staged, target)


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
