"""What each night ran: the sglang release of every variant (resolved, never ``latest``) and the
state of each of its patches on that release, and what a change of release between nights
coincides with.

- :func:`rows_of_run`: the builds of a finished run folder (its typed manifest: ``builds`` and
  ``patches``); a patch the run applied is ``applies`` and verified (the overlay checked it).
- :func:`check_patches`: before a night runs, the state of every variant's named patches on the
  release that variant will run (:func:`patchbench.patches.state.patch_state`); a variant with a
  patch that conflicts or is already contained cannot run as configured (:func:`blocked`).
- :func:`without_variants`: the config a night runs when some variants cannot (a copy).
- :func:`likely_causes`: "sglang 0.5.22 -> 0.5.23 on 2026-11-30 coincides with the -6.0 % step
  in serving.output_throughput_tok_s (baseline)" for each step or red gate that starts on the
  night whose release changed.

The rows go to the history's ``night_builds`` table (:func:`patchbench.nightly.history.
record_night_builds`) and to nightly.json / nightly.md.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from patchbench.nightly.history import Night
from patchbench.runfolder import RunFolderError, read_manifest

#: states a variant cannot run with (its patch would not apply as configured)
BLOCKING = ("conflicts", "contained")


@dataclass
class BuildRow:
    """One patch of one variant on one night (a row of ``night_builds``).

    variant; sglang_release: the release its server ran (resolved); patch: the patch's name, ""
    for a variant without patches; state: ``applies``, ``contained`` (already upstream),
    ``conflicts``, ``unavailable`` (not checked), "" without a patch; detail: what was found
    (for a conflict, the file and hunk); ran: False when the variant did not run tonight.
    """

    variant: str
    sglang_release: str | None
    patch: str = ""
    state: str = ""
    detail: str = ""
    ran: bool = True

    def to_json(self) -> dict[str, Any]:
        """The row as a dict (the ``night_builds`` columns but ``run_id``, plus ``ran``)."""
        return asdict(self)

    @property
    def summary(self) -> str:
        """``stock``, ``mrope-sync-free applies``, ``p conflicts (FILE hunk 2)``."""
        if not self.patch:
            return "stock"
        words = {"contained": "already upstream", "unavailable": "not checked"}
        text = f"{self.patch} {words.get(self.state, self.state)}"
        return f"{text} ({self.detail})" if self.detail and self.state == "conflicts" else text


def rows_of_run(run_dir: str | os.PathLike) -> list[BuildRow]:
    """The builds of a run folder, one row per (variant, patch) (a variant without patches: one
    row with patch ""). The release is the variant's resolved build (manifest ``builds``), else
    the run's sglang. [] when the manifest cannot be read."""
    try:
        m = read_manifest(Path(run_dir))
    except RunFolderError:
        return []
    cfg_release = m.config.sglang if m.config is not None else None
    default = m.sglang_version or (cfg_release if isinstance(cfg_release, str) else None)
    rows: list[BuildRow] = []
    variants = list(m.patches) or list(m.builds)
    for v in variants:
        release = (m.builds.get(v) or {}).get("release") or default
        patches = m.patches.get(v, [])
        if not patches:
            rows.append(BuildRow(v, release))
        for p in patches:
            sha = f" (diff sha256 {p.sha256[:12]})" if p.sha256 else ""
            rows.append(
                BuildRow(v, release, p.name, "applies", f"verified: applied in the run{sha}")
            )
    return rows


def check_patches(cfg: Any, release: str | None = None) -> list[BuildRow]:
    """The state of every named patch of every variant of ``cfg`` (a resolved
    :class:`patchbench.config.Config`: ``cfg.builds`` filled by
    :func:`patchbench.envs.builds.resolve_builds`) on the release the variant runs; ``release``: the
    one release every variant runs instead (a matrix unit's pin, resolved on its node). Diff-file
    patches and source builds are not checked. A patch whose state cannot be had (unknown patch,
    bad manifest) is ``unavailable`` with the reason."""
    from patchbench.patches import state as patch_states

    rows = []
    for v in cfg.variants:
        release_v = release or cfg.release_of(v)
        names = [p for p in cfg.patches_of(v) if isinstance(p, str)]
        if not names:
            rows.append(BuildRow(v, release_v))
        for name in names:
            if release_v is None:
                rows.append(BuildRow(v, None, name, "unavailable", "no release to check against"))
                continue
            try:
                st = patch_states.patch_state(name, release_v)
            except Exception as e:  # noqa: BLE001 (a state, never a crash of the night)
                rows.append(BuildRow(v, release_v, name, "unavailable", str(e).splitlines()[0]))
                continue
            detail = st.summary if st.state == "conflicts" else ""
            if st.detail:
                detail = f"{detail}: {st.detail}" if detail else st.detail
            rows.append(BuildRow(v, release_v, name, st.state, detail))
    return rows


def blocked(rows: Iterable[BuildRow]) -> list[BuildRow]:
    """The rows whose patch cannot run as configured (:data:`BLOCKING`), marked not run."""
    out = [r for r in rows if r.state in BLOCKING]
    for r in out:
        r.ran = False
    return out


def blocked_line(r: BuildRow) -> str:
    """``variant 'v' cannot run: patch 'p' conflicts on sglang 0.5.23 at FILE hunk 2 (...)``."""
    what = (
        "is already contained in"
        if r.state == "contained"
        else "no longer applies to"
        if r.state == "conflicts"
        else f"is {r.state} on"
    )
    return (
        f"variant '{r.variant}' cannot run: patch '{r.patch}' {what} sglang "
        f"{r.sglang_release}" + (f" ({r.detail})" if r.detail else "")
    )


def without_variants(cfg: Any, drop: Sequence[str]) -> Any:
    """A copy of the :class:`patchbench.config.Config` ``cfg`` without the variants ``drop`` (the
    baseline named explicitly), built in memory. Raises ValueError when the baseline would be
    dropped or no variant is left."""
    if cfg.baseline in drop:
        raise ValueError(f"the baseline '{cfg.baseline}' cannot run")
    variants = {k: v for k, v in cfg.variants.items() if k not in drop}
    if not variants:
        raise ValueError("no variant is left to run")
    return cfg.model_copy(update={"variants": variants})


# ---------------------------------------------------------------------------------------------
# releases across nights


def releases_by_night(
    nights: Sequence[Night], rows: Iterable[Mapping[str, Any]]
) -> dict[str, dict[str, str | None]]:
    """{run_id: {variant: release}} of ``nights`` from stored build rows (``night_builds``),
    each night's ``sglang_version`` for the variants it has no rows for."""
    stored: dict[str, dict[str, str | None]] = {}
    for r in rows:
        stored.setdefault(r["run_id"], {})[r["variant"]] = r["sglang_release"]
    out = {}
    for n in nights:
        got = dict(stored.get(n.run_id, {}))
        for v in n.variants:
            got.setdefault(v, n.sglang_version)
        out[n.run_id] = got
    return out


def release_changes(
    nights: Sequence[Night], releases: Mapping[str, Mapping[str, str | None]]
) -> list[dict[str, Any]]:
    """Each change of a variant's release between consecutive ``nights`` (oldest first):
    dicts with variant, old, new, run_id and night_utc of the first night on the new release."""
    out = []
    last: dict[str, str | None] = {}
    for n in nights:
        for v, rel in (releases.get(n.run_id) or {}).items():
            if rel and last.get(v) and last[v] != rel:
                out.append(
                    {"variant": v, "old": last[v], "new": rel, "run_id": n.run_id,
                     "night_utc": n.night_utc}
                )  # fmt: skip
            if rel:
                last[v] = rel
    return out


def likely_causes(
    changes: Sequence[Mapping[str, Any]],
    change_points: Sequence[Mapping[str, Any]],
    failing: Sequence[Any] = (),
    tonight_run_id: str | None = None,
) -> list[str]:
    """One sentence per step that starts on a night whose release changed: a change point
    (``run_id`` its first night) of the same variant, or tonight's failing gate (``failing``:
    :class:`patchbench.nightly.gates.GateResult`, tonight's run id ``tonight_run_id``) of any variant
    that changed tonight. A variant named ``*`` (a gate over every variant) matches any."""
    out: list[str] = []
    for c in changes:
        when = f"sglang {c['old']} -> {c['new']} on {str(c['night_utc'])[:10]}"
        for p in change_points:
            if p.get("run_id") != c["run_id"] or p.get("variant") not in (c["variant"], "*"):
                continue
            size = p.get("size_pct")
            pct = "" if size is None else f"{size:+.1f} % "
            out.append(
                f"{when} coincides with the {pct}step in {p['suite']}.{p['metric']} "
                f"({p['variant']})"
            )
        if c["run_id"] != tonight_run_id:
            continue
        for r in failing:
            if r.variant not in (c["variant"], "*"):
                continue
            pct = "" if r.change_pct is None else f"{r.change_pct:+.1f} % "
            out.append(
                f"{when} coincides with tonight's {pct}regression in {r.suite}.{r.metric} "
                f"({r.variant}, {r.kind.replace('_', '-')} gate)"
            )
    return list(dict.fromkeys(out))


def night_builds(
    rows: Sequence[BuildRow],
    tonight: Night,
    prior: Sequence[Night],
    results: Sequence[Any],
    points: Sequence[Mapping[str, Any]],
    hpath: Path | None,
    timeout_s: float,
    *,
    record: bool,
    problems: list[str],
) -> tuple[list[dict[str, Any]], list[str]]:
    """Tonight's build ``rows`` (:func:`rows_of_run` plus the blocked variants) stored in the
    history at ``hpath`` (``record``; None: the history is unavailable), and the release changes
    over ``prior`` and tonight that coincide with a change point (``points``) or a failing gate
    of ``results`` (:func:`likely_causes`); (rows as dicts, cause sentences). A history problem
    is added to ``problems``, never raised."""
    from patchbench.nightly.history import (
        History,
        HistoryError,
        read_night_builds,
        record_night_builds,
    )

    dicts = [r.to_json() for r in rows]
    if hpath is None:
        return dicts, []
    stored: list[dict[str, Any]] = []
    try:
        with History(hpath, timeout_s=timeout_s) as h:
            if record:
                record_night_builds(h, tonight.run_id, dicts)
            stored = read_night_builds(h, tonight.config_name)
    except HistoryError as e:
        problems.append(f"could not store or read the night's builds: {e}")
    if not any(r["run_id"] == tonight.run_id for r in stored):
        stored += [{"run_id": tonight.run_id, **r} for r in dicts if r["ran"]]
    nights = [*prior, tonight]
    changes = release_changes(nights, releases_by_night(nights, stored))
    failing = [r for r in results if r.status == "fail"]
    return dicts, likely_causes(changes, points, failing, tonight.run_id)


def blocked_exit(code: int, headline: str, rows: Sequence[BuildRow]) -> tuple[int, str]:
    """(exit code, headline) of a night with blocked variants (``rows``): 2, the code of a patch
    that does not apply (:class:`patchbench.errors.PatchError`: someone must port it), unless
    the night failed worse (4 or 3); the headline names each patch and release."""
    from patchbench.errors import EXIT_ENV, EXIT_RUN_FAILED, EXIT_USAGE

    if not rows:
        return code, headline
    names = ", ".join(f"'{r.patch}' on sglang {r.sglang_release}" for r in rows)
    if code in (EXIT_RUN_FAILED, EXIT_ENV):
        return code, f"{headline}; and patch {names} does not apply"
    return EXIT_USAGE, f"PATCH DOES NOT APPLY ({names}); stock: {headline}"
