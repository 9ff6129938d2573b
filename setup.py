"""The optional C extensions (the data path's copy engine, the standing PUTs' counter poller); everything
else is in pyproject.toml.

setuptools' pyproject table for extensions ([tool.setuptools.ext-modules]) is still experimental
and warns at every install; an Extension here is the stable way. optional=True: without a C
compiler, or off x86-64 (the copy engine) or Linux (the poller), the install goes on, and hostmem.dma
uses numpy and smartnic.standing polls from Python instead.
"""
from setuptools import Extension, setup

setup(ext_modules=[
    Extension("hostmem._dma", ["hostmem/_dma.c"], extra_compile_args=["-O3"], optional=True),
    Extension("smartnic._poller", ["smartnic/_poller.c"], extra_compile_args=["-O2"], optional=True),
])
