"""Launch structures of the verify step that the default plans never take: one fused launch (`fused_pass`), one
cooperative launch (`coop_pass`), one thread-block-cluster launch (`cluster_pass`), and the benchmark's
diagnostics (`chain_probe`: empty kernels timing a structure's dependency chain; `sass`: instruction counts).

Importing this package registers `fused`, `coop` and `cluster` in `flashspec.kernels.structures`, so a plan tuned
with their keys (`flashspec.kernels.plan.GPU_PLAN`) can name them.
"""
