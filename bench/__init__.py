"""Benchmarks (`kvtb bench ...`) and the paper's analytical model (`kvtb simulate`).

Nothing in the product imports this package; it imports the product to measure it.
"""
