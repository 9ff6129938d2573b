"""The optional C extensions (the data path's copy engine and its landing, the standing PUTs' counter poller,
the compute node's batched triggers, the compute node's attention kernel); everything else is in pyproject.toml.

setuptools' pyproject table for extensions ([tool.setuptools.ext-modules]) is still experimental
and warns at every install; an Extension here is the stable way. optional=True: without a C
compiler, or off x86-64 (the copy engine, the landing) or Linux (the poller), the install goes on, and
hostmem.dma uses numpy, smartnic.landing copies and hashes from Python, smartnic.standing polls from
Python, compute_node.offload writes descriptors from Python and compute_node.paged_attention gathers
for torch instead.
"""
import platform

from setuptools import Extension, setup

BLAKE3 = "hostmem/blake3/"  # the BLAKE3 team's C implementation, vendored (hostmem/blake3/README.md)
# gcc assembles the x86-64 SIMD kernels (.S) given as objects, as blake3-py's own C build does
BLAKE3_ASM = [f"{BLAKE3}blake3_{isa}_x86-64_unix.S" for isa in ("sse2", "sse41", "avx2", "avx512")]
X86_64 = platform.machine().lower() in ("x86_64", "amd64")

setup(ext_modules=[
    # both include kvtb/crc32c.h: the one C crc32c
    Extension("hostmem._dma", ["hostmem/_dma.c"], include_dirs=["kvtb"], depends=["kvtb/crc32c.h", "hostmem/dma_runs.h"],
              extra_compile_args=["-O3"], optional=True),
    Extension("hostmem._lander", ["hostmem/_lander.c", *(f"{BLAKE3}{name}.c" for name in ("blake3", "blake3_dispatch",
                                                                                           "blake3_portable"))],
              depends=["hostmem/dma_runs.h", f"{BLAKE3}blake3.h", f"{BLAKE3}blake3_impl.h", *BLAKE3_ASM],
              extra_objects=BLAKE3_ASM if X86_64 else [], extra_compile_args=["-O3"], optional=True),
    Extension("smartnic._poller", ["smartnic/_poller.c"], include_dirs=["kvtb"], depends=["kvtb/bounds.h", "kvtb/crc32c.h"],
              extra_compile_args=["-O2"], optional=True),
    Extension("hostmem._trigger", ["hostmem/_trigger.c"], include_dirs=["kvtb"], depends=["kvtb/bounds.h", "kvtb/crc32c.h"],
              extra_compile_args=["-O2"], optional=True),
    # OpenMP: imported after torch, the kernel runs on torch's own OpenMP threads (one runtime)
    Extension("compute_node._attention", ["compute_node/_attention.c"],
              extra_compile_args=["-O3", "-fopenmp", "-fno-math-errno"], extra_link_args=["-fopenmp"], optional=True),
])
