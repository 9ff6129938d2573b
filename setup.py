"""The optional C extensions (the data path's copy engine, the standing PUTs' counter poller, the compute
node's attention kernel); everything else is in pyproject.toml.

setuptools' pyproject table for extensions ([tool.setuptools.ext-modules]) is still experimental
and warns at every install; an Extension here is the stable way. optional=True: without a C
compiler, or off x86-64 (the copy engine) or Linux (the poller), the install goes on, and hostmem.dma
uses numpy, smartnic.standing polls from Python and compute_node.paged_attention gathers for torch instead.
"""
from setuptools import Extension, setup

setup(ext_modules=[
    # both include kvtb/crc32c.h: the one C crc32c
    Extension("hostmem._dma", ["hostmem/_dma.c"], include_dirs=["kvtb"], depends=["kvtb/crc32c.h"],
              extra_compile_args=["-O3"], optional=True),
    Extension("smartnic._poller", ["smartnic/_poller.c"], include_dirs=["kvtb"], depends=["kvtb/crc32c.h"],
              extra_compile_args=["-O2"], optional=True),
    # OpenMP: imported after torch, the kernel runs on torch's own OpenMP threads (one runtime)
    Extension("compute_node._attention", ["compute_node/_attention.c"],
              extra_compile_args=["-O3", "-fopenmp", "-fno-math-errno"], extra_link_args=["-fopenmp"], optional=True),
])
