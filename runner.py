#!/usr/bin/env python3
"""patchbench command line: a thin dispatcher over the patchbench package.

    runner.py bench CONFIG [--dry-run] [--resume RUN_DIR] [--results DIR] [--port N]
                                                             run a config, write results/<run>/
    runner.py report RUN_DIR                                re-render compare.json, report.md, plots
    runner.py compare RUN_A RUN_B [--variant NAME]          baseline of A vs a variant of B
    runner.py nightly CONFIG                                 run + history + regression gates
    runner.py check-patch [--sglang VERSION] [--patch NAME]  apply every patch to a pristine release
    runner.py score-mmmu RESPONSES --answer-key FILE         re-score saved MMMU responses
    runner.py make-tiny-model [OUT]                          build the tiny random Qwen2.5-VL
    runner.py doctor [CONFIG]                                what this environment is and lacks

Exit codes: 0 done, 1 regression found (nightly), 2 bad usage or config, 3 environment not
ready, 4 a run failed.
"""
import importlib
import sys
import warnings

# torch.cuda imports the deprecated pynvml shim that sglang's dependencies install: not ours to fix
warnings.filterwarnings("ignore", message="The pynvml package is deprecated", category=FutureWarning)

COMMANDS = {
    "bench": ("patchbench.bench", "cli"),
    "report": ("patchbench.report", "cli_report"),
    "compare": ("patchbench.report", "cli_compare"),
    "nightly": ("patchbench.nightly", "cli"),
    "check-patch": ("patchbench.patchset", "cli"),
    "score-mmmu": ("patchbench.suites.mmmu", "cli"),
    "make-tiny-model": ("patchbench.tinymodel", "cli"),
    "doctor": ("patchbench.doctor", "cli"),
}


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(__doc__)
        return 0 if argv else 2
    cmd, rest = argv[0], argv[1:]
    if cmd not in COMMANDS:
        print(f"runner.py: unknown command '{cmd}'; commands: {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    modname, fn = COMMANDS[cmd]
    return int(getattr(importlib.import_module(modname), fn)(rest) or 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
