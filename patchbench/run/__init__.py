"""Running a config (``patchbench bench``): bench (run_bench, BenchRun), preflight, plan, manifest,
looks (sequential), cell, server, liveness and activity (its watchdogs), ports (ours, orphans),
signals, progress, variants, lock (one writer per folder), gpu (NVML), logscan.
"""
