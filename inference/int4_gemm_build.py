"""Builds the tiled int4 GEMM libraries (see `inference.int4_gemm`); runs in a child process of its own.

    python -m inference.int4_gemm_build OUT_DIR N K [N K ...]

For each weight shape [N, K] it exports `_weight_int4pack_mm_for_cpu(x, w, 32, scales_and_zeros)`
with the row count of x dynamic, compiles it ahead of time with inductor's C++ GEMM template
(max-autotune, C++ backend only) and writes the shared library to OUT_DIR/int4-NxK.so. Inductor
offers that template only for weights that are constants of a frozen graph; the one check that
says so is relaxed here, because the engine passes weights already laid out as the template
reads them (`inference.int4_gemm.tile`). Importing inductor costs this process ~120 MB, which is
why the server does not.
"""

from __future__ import annotations

import os
import sys
import tempfile
import zipfile
from pathlib import Path

import torch


def _allow_weights_as_inputs() -> None:
    import torch._inductor.lowering  # noqa: F401  (registers the lowerings the next module patches)
    import torch._inductor.quantized_lowerings as lowerings

    template_check = lowerings.use_cpp_gemm_template

    def relaxed(*args, **kwargs):  # type: ignore[no-untyped-def]
        if kwargs.get("is_woq_int4"):
            kwargs["require_constant_mat2"] = False
        return template_check(*args, **kwargs)

    lowerings.use_cpp_gemm_template = relaxed


class _Int4MatMul(torch.nn.Module):
    def forward(self, x: torch.Tensor, tiled: torch.Tensor, scales_and_zeros: torch.Tensor) -> torch.Tensor:
        return torch._weight_int4pack_mm_for_cpu(x, tiled, 32, scales_and_zeros)


def build(out_dir: Path, n: int, k: int) -> Path:
    x = torch.randn(64, k, dtype=torch.bfloat16)
    tiled = torch.randint(0, 255, (n, k // 2), dtype=torch.uint8)
    scales_and_zeros = torch.rand(k // 32, n, 2, dtype=torch.bfloat16)
    rows = torch.export.Dim("rows", min=2, max=1 << 16)
    program = torch.export.export(_Int4MatMul(), (x, tiled, scales_and_zeros), dynamic_shapes=({0: rows}, None, None))
    target = out_dir / f"int4-{n}x{k}.so"
    with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
        package = torch._inductor.aoti_compile_and_package(
            program,
            package_path=os.path.join(tmp, "gemm.pt2"),
            inductor_configs={"max_autotune": True, "max_autotune_gemm_backends": "CPP", "compile_threads": 1},
        )
        with zipfile.ZipFile(package) as archive:
            library = next(name for name in archive.namelist() if name.endswith(".so"))
            staged = Path(tmp) / "gemm.so"
            staged.write_bytes(archive.read(library))
        os.replace(staged, target)  # atomic: a crash never leaves a half-written library
    return target


def main(argv: list[str]) -> None:
    out_dir = Path(argv[0])
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(int(os.environ.get("ROUNDTRIP_BUILD_THREADS", torch.get_num_threads())))
    _allow_weights_as_inputs()
    shapes = [(int(argv[i]), int(argv[i + 1])) for i in range(1, len(argv), 2)]
    for n, k in shapes:
        print(f"built {build(out_dir, n, k)}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
