"""What the CPU is: its model name and instruction-set flags, from ``/proc/cpuinfo``;
and the memory allocator settings a CPU figure was measured under.

torch has no public query of the bf16 matmul units (AVX512-BF16, AMX):
``torch.backends.cpu.get_cpu_capability`` names the vector width only.  The
kernel's flags are what oneDNN itself detects (CPUID), so mixed precision
(:func:`inline_mm.engine.amp.cpu_has_fast_bf16`) and the benchmarks' CPU
record read them here.
"""
import os
import platform
from typing import Dict, Optional, Set, Tuple

#: flags of the CPU units whose presence changes a figure (recorded by the benchmarks)
CPU_FLAGS = ('avx2', 'avx512f', 'avx512_bf16', 'amx_bf16', 'amx_tile')
#: flags of units that run bf16 matmuls natively (either is enough for torch's kernels)
BF16_UNIT_FLAGS = ('avx512_bf16', 'amx_bf16')


def read_cpuinfo(path: str = '/proc/cpuinfo') -> Tuple[Optional[str], Optional[Set[str]]]:
    """(model name, flags) of the first processor in ``path``; flags None without the file
    (not Linux), the model name then from :func:`platform.processor` if it has one."""
    try:
        with open(path) as f:
            text = f.read()
    except OSError:
        return platform.processor() or None, None
    model, flags = None, None
    for line in text.splitlines():
        key, _, value = line.partition(':')
        key = key.strip()
        if key == 'model name' and model is None:
            model = value.strip()
        elif key == 'flags' and flags is None:
            flags = set(value.split())
    return model, flags


def allocator_settings() -> Dict[str, object]:
    """The C library and the allocator environment of this process.

    glibc hands buffers of more than 32 MiB (a backbone's activations at 1333x800) back
    to the kernel when they are freed, so every pass faults their pages in again;
    ``MALLOC_MMAP_MAX_=0`` (or ``GLIBC_TUNABLES``, a preloaded jemalloc / tcmalloc)
    keeps them, which moves large-input CPU timings (docs/benchmarks.md), so a figure
    names what it ran under: the variables set that glibc, jemalloc or tcmalloc read,
    and ``LD_PRELOAD``.
    """
    env = {k: v for k, v in sorted(os.environ.items())
           if k.startswith(('MALLOC_', 'TCMALLOC_')) or k in ('GLIBC_TUNABLES', 'LD_PRELOAD')}
    libc, version = platform.libc_ver()
    return dict(libc=f'{libc} {version}'.strip() or None, env=env)
