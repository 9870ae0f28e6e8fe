"""Running a config (``patchbench bench``): :func:`patchbench.run.bench.run_bench` and
:class:`~patchbench.run.bench.BenchRun` (bench), what is checked first (preflight), the cells and
what each runs (plan), the manifest (manifest), sequential looks (looks), one cell (cell), one
server's life (server), its watchdogs (liveness: processes and stalls; activity: the progress
suites report), which server is ours and orphans (ports), signals and a closed output (signals),
the progress bar (progress), each variant's overlay and identity (variants), one writer per run
folder (lock), NVML (gpu) and the server log's counts (logscan).
"""
