"""The FlashSpec lab: what measures the library, beside it and not shipped with it.

Benchmarks and their variants (`bench`, `bench_engine`, the honest PyTorch verify `baseline`), figures (`plots`),
the exactness harness (`exactness`), bandit simulation (`simulate`), the domain-switching workload (`switching`),
the offline corpora and model zoo with its training (`corpora`, `zoo`), the records' provenance (`provenance`),
and the verify kernels' launch structures the default path never takes (`flashspec_lab.kernels`, registered in
`flashspec.kernels.structures` on import).

Install it beside the library from a checkout: ``pip install -e lab`` (the README's set-up command does).
The drivers in ``experiments/`` are thin command lines over it.
"""
