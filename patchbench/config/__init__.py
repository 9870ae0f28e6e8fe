"""The experiment config: a YAML file validated by pydantic models.

Shape (every key documented in configs/demo-cpu.yaml)::

    name: demo-cpu                      # names the run folder
    sglang: 0.5.1.post3                 # a release with an environment here (.venv, .venv-*),
                                        # latest, {wheel: FILE} or {git: CHECKOUT, ref: REF}
                                        # (patchbench.envs.builds); a variant may name its own
    model:
      path: .cache/models/tiny-qwen25vl # relative paths resolve against the repo root
      tiny: true                        # build the tiny random Qwen2.5-VL there when missing
      tokenizer: null                   # defaults to path
    server:
      host: 127.0.0.1
      port: 30100
      args: ["--device", "cpu", ...]    # passed to sglang.launch_server for every variant
      env: {SGLANG_USE_CPU_ENGINE: "1"}
      cpu_stand_ins: [sgl_kernel, vllm] # stand-ins from patchbench/shims/cpu (CPU configs only)
      ready_timeout_s: 300
      stop_grace_s: 20
      flush_retries: 5
      flush_pause_s: 1.0
      stall_timeout_s: 60                 # no heartbeat/reply/flush answer this long: a stall
    variants:                           # name -> what differs from the plain server
      baseline: []                      # short form: a list of patches
      mrope-sync-free: [mrope-sync-free]
      no-overlap:                       # long form
        patches: [mrope-sync-free, {diff: path/to/change.diff}]
        server_args: [--disable-overlap-schedule]   # appended to server.args
        env: {SGLANG_X: "1"}                        # added to server.env
        sglang: "0.5.23"                            # this variant's own build
    baseline: baseline                  # defaults to the first variant
    schedule:
      repeats: 2                        # or {min: 4, max: 12, step: 2}: sequential repeats
      order: interleaved                # interleaved (ABBA...) | sequential
    suites:                             # run in this order in every cell; params per suite
      sync_probe: {}
      mmmu: {rounds: first, ...}        # rounds (core key): all | first | [0, 2]
      serving: {...}
    compare: {...}                      # patchbench.analysis.comparison.CompareSettings
    nightly: {...}                      # patchbench.nightly.gates.NightlySettings (gates)

A patch entry is the name of a folder in ``patches/`` or ``{diff: FILE}``: a unified diff (paths
``a/python/sglang/...`` as ``git diff`` in an sglang checkout writes them, or ``a/sglang/...``;
relative FILE paths resolve against the repo root). Such a diff is checked when the config is
loaded (files under ``sglang/`` only, no renames, new files, deletions, mode changes, symlinks or
binary parts) and turned into a patch with hashes for the config's release at run time
(:meth:`Config.overlay_patches`); the runner copies the file into the run folder
(:meth:`Config.files_to_copy`).

Validation beyond the models: duplicate keys are refused naming both lines; the file must be
UTF-8, at most ``patchbench.inputs.MAX_CONFIG_BYTES``, with at most ``MAX_YAML_ALIASES`` aliases
and ``MAX_YAML_NODES`` nodes once aliases are expanded; numbers and booleans are not converted into
each other (``repeats: true`` is refused); server arguments that the harness owns
(:data:`patchbench.config.args.HARNESS_ARGS`) are refused in any spelling (``--port=1``, ``'--port 1'`` as one item, an
abbreviation argparse would accept); a flag given both in ``server.args`` and a variant's
``server_args`` (or an environment variable in both ``env``) is refused; environment names must be
POSIX names and values strings without NUL.

Errors: :class:`patchbench.errors.ConfigError` (exit 2), whose message names the file, the key
path, the line where the YAML parser knows it, what was found and what is allowed. A local model folder that does not
exist is :class:`patchbench.errors.EnvironmentNotReady` (exit 3) from :meth:`Config.require_model`.

The package: :mod:`~patchbench.config.schema` (:class:`Config`, the model and server),
:mod:`~patchbench.config.variant` (a variant: name, patches, sglang build),
:mod:`~patchbench.config.schedule` (repeats and order), :mod:`~patchbench.config.load`
(:func:`load_config` and its messages), :mod:`~patchbench.config.args` (server arguments and
environment checks). Reading YAML and the repository's paths live in :mod:`patchbench.inputs`.
Callers import the names below from ``patchbench.config``.
"""

from patchbench.config.load import load_config
from patchbench.config.schedule import ScheduleSpec, SequentialRepeats
from patchbench.config.schema import SECTIONS, Config, ModelSpec, ServerSpec
from patchbench.config.variant import (
    DiffPatch,
    GitSource,
    PatchEntry,
    VariantSpec,
    WheelSource,
    patch_label,
    sglang_label,
)

__all__ = [
    "SECTIONS",
    "Config",
    "DiffPatch",
    "GitSource",
    "ModelSpec",
    "PatchEntry",
    "ScheduleSpec",
    "SequentialRepeats",
    "ServerSpec",
    "VariantSpec",
    "WheelSource",
    "load_config",
    "patch_label",
    "sglang_label",
]
