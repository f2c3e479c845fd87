"""Launch structures of the verify step that the default plans never take: one fused launch (`fused_pass`), one
cooperative launch (`coop_pass`), one thread-block-cluster launch (`cluster_pass`), and the benchmark's
diagnostics (`chain_probe`: empty kernels timing a structure's dependency chain; `sass`: instruction counts).

Importing this package registers `fused`, `coop` and `cluster` in `flashspec.kernels.structures`, so a plan can
name them: `fused=True`, or their plan keys in `tuning` (each structure's `Structure.keys`, with their defaults).
"""
from flashspec.kernels import structures
from flashspec_lab.kernels import cluster_pass, coop_pass, fused_pass

for _structure in (fused_pass.STRUCTURE, cluster_pass.STRUCTURE, coop_pass.STRUCTURE):
    structures.register(_structure)
