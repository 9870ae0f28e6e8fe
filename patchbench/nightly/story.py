"""Red that tells its story (docs/nightly.md, "A red night's story"): for every gate that failed
tonight, since when it is red and whether it is new tonight; for the night, whether the cause is
the same as yesterday's; and, while the noise is learned, "learning (k of n nights)" ("learning on
this machine" while a history gate's nights on tonight's machine are too few).

- A gate's **streak** is the run of nights, ending tonight, on which the same (gate, kind,
  variant, suite, metric) failed; **since** is its first night. The failing gates of every night
  are stored in the history (``red_gates``), so the story survives a deleted run folder.
- A failure is **new tonight** when it did not fail yesterday (another metric, another variant,
  another kind), or when it **moved further**: tonight's level is worse than the streak's red
  level (its level on the streak's last new night) by more than the larger of the gate's
  threshold and the noise band of a difference of two nights' levels (``z_0.975 sqrt(2)`` times
  one night's sigma, the learned night-to-night and run noise: the two-sided 95 % band of the
  difference of two independent normal means; that night becomes the red level for the next
  "further"). The level is the variant's ratio to the baseline tonight (same_run) or its median
  (history).
- **Same cause as yesterday**: tonight's failing gates are exactly yesterday's, none new.

A night with a new failure is red (exit 1) whatever else is red: it is never folded into an
older cause, and its lines come first.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from patchbench.nightly.gates import GateResult
from patchbench.nightly.history import Night

#: z_{0.975}: the two-sided 95 % band of the difference of two nights' levels
Z_BAND = 1.959963984540054

GateKey = tuple[str, str, str, str, str]


def gate_key(r: GateResult | dict) -> GateKey:
    """(gate, kind, variant, suite, metric) of a result or a stored row."""
    get = r.get if isinstance(r, dict) else (lambda k: getattr(r, k))
    return (get("gate"), get("kind"), get("variant"), get("suite"), get("metric"))


def level_of(r: GateResult) -> float | None:
    """The level a streak is followed on: same_run the variant's ratio to the baseline tonight
    (``1 + change_pct / 100``), history tonight's median; None when unknown or not positive."""
    x = (
        (1.0 + r.change_pct / 100.0 if r.change_pct is not None else None)
        if r.kind == "same_run"
        else r.value
    )
    return x if x is not None and x > 0 else None


def band_pct(r: GateResult, night_cv_pct: float | None) -> float:
    """The noise band (%) of a difference of two nights' levels of ``r``: ``z_0.975 sqrt(2)``
    times one night's sigma, ``sqrt(night^2 + noise^2 / n)`` (``noise``: the result's own,
    one paired ratio for same_run, one run for history; ``night``: the learned night-to-night
    noise, history only); 0 when no noise is known."""
    noise = math.log1p(r.noise_cv_pct / 100.0) if r.noise_cv_pct else 0.0
    night = math.log1p(night_cv_pct / 100.0) if night_cv_pct and r.kind == "history" else 0.0
    sd = math.sqrt(night**2 + noise**2 / max(r.n, 1))
    return 100.0 * math.expm1(Z_BAND * math.sqrt(2.0) * sd)


@dataclass
class RedLine:
    """One failing gate tonight: ``since_run_id`` / ``since_utc`` the first night of its streak,
    ``nights`` the streak's length (tonight included), ``new`` (``why``: "new" or "further"),
    ``level`` (:func:`level_of`), ``moved_pct`` the change from the red level (further only),
    ``environment`` what changed in the variant's build since yesterday ("" when nothing)."""

    gate: str
    kind: str
    variant: str
    suite: str
    metric: str
    change_pct: float | None
    level: float | None
    since_run_id: str
    since_utc: str
    nights: int
    new: bool
    why: str = ""
    moved_pct: float | None = None
    environment: str = ""

    @property
    def what(self) -> str:
        return f"{self.suite}.{self.metric} ({self.variant}, {self.kind.replace('_', '-')})"

    @property
    def text(self) -> str:
        chg = f" {self.change_pct:+.1f} %" if self.change_pct is not None else ""
        env = f", its environment changed ({self.environment})" if self.environment else ""
        if self.why == "further":
            return (
                f"new tonight: {self.what}{chg}, {self.moved_pct:+.1f} % further than its red "
                f"level (red since {self.since_utc[:10]}, {self.nights} nights){env}"
            )
        if self.new:
            return f"new tonight: {self.what}{chg}{env}"
        return f"{self.what}{chg}: red since {self.since_utc[:10]} ({self.nights} nights)"

    def row(self) -> dict[str, Any]:
        """The history's ``red_gates`` row (patchbench.nightly.history.RED_COLUMNS)."""
        return asdict(self)


@dataclass
class Story:
    """A night's story: ``lines`` (new ones first, the newest problem first), ``same_as_yesterday``,
    ``yesterday`` (its run id, None for the first night), ``learning`` ({"nights", "needed",
    "machine"} while a gated metric's noise is learned, else None; "machine": tonight's, when
    the fewest nights are a history gate's on that machine), ``machine`` tonight's (None:
    unknown)."""

    lines: list[RedLine] = field(default_factory=list)
    same_as_yesterday: bool = False
    yesterday: str | None = None
    learning: dict[str, Any] | None = None
    machine: str | None = None

    @property
    def new(self) -> list[RedLine]:
        return [x for x in self.lines if x.new]

    @property
    def since_utc(self) -> str | None:
        """The first night of the oldest streak red tonight."""
        return min((x.since_utc for x in self.lines), default=None)

    def summary(self) -> str:
        """One line: the new failures first, then since when the night is red and whether the
        cause is yesterday's; "learning (k of n nights)" while learning; "" for a green night."""
        parts = [x.text for x in self.new]
        old = [x for x in self.lines if not x.new]
        if self.lines and self.since_utc:
            nights = max(x.nights for x in self.lines)
            cause = (
                "same cause as yesterday"
                if self.same_as_yesterday
                else "not the same cause as yesterday"
            )
            if old or not self.new:
                parts.append(f"red since {self.since_utc[:10]} ({nights} nights), {cause}")
            elif self.yesterday is not None and self.lines:
                parts.append(cause)
        if self.learning:
            where = " on this machine" if self.learning.get("machine") else ""
            parts.append(
                f"learning{where} ({self.learning['nights']} of {self.learning['needed']} nights)"
            )
        return "; ".join(parts)

    def to_json(self) -> dict[str, Any]:
        return {
            "summary": self.summary(),
            "red": "new" if self.new else ("persisting" if self.lines else None),
            "since_utc": self.since_utc,
            "same_as_yesterday": self.same_as_yesterday,
            "yesterday": self.yesterday,
            "learning": self.learning,
            "machine": self.machine,
            "lines": [x.row() | {"text": x.text} for x in self.lines],
        }


def _environment(variant: str, tonight: Sequence[dict], yesterday: Sequence[dict]) -> str:
    """What changed in ``variant``'s build since yesterday (release, patch state), "" when
    nothing or yesterday's is unknown."""

    def of(rows: Sequence[dict]) -> dict[str, tuple]:
        return {
            str(b.get("patch") or ""): (b.get("sglang_release"), b.get("state"))
            for b in rows
            if b.get("variant") == variant
        }

    now, then = of(tonight), of(yesterday)
    if not then or now == then:
        return ""
    rel_now = sorted({str(v[0]) for v in now.values()})
    rel_then = sorted({str(v[0]) for v in then.values()})
    if rel_now != rel_then:
        return f"sglang {'/'.join(rel_then)} -> {'/'.join(rel_now)}"
    changed = [
        f"{p or 'stock'} {then[p][1]} -> {now[p][1]}"
        for p in now
        if p in then and now[p] != then[p]
    ]
    return ", ".join(changed) or "its patches changed"


def tell(
    results: Sequence[GateResult],
    tonight: Night,
    prior: Sequence[Night],
    red: dict[str, list[dict]],
    *,
    night_cv_pct: dict[tuple[str, str], float | None] | None = None,
    builds: Sequence[dict] = (),
    builds_yesterday: Sequence[dict] = (),
    learn_min_nights: int = 7,
) -> Story:
    """The story of tonight's ``results`` (module docstring). ``prior``: the earlier nights,
    oldest first; ``red``: run id -> the failing gates stored for it
    (:func:`patchbench.nightly.history.read_red`); ``night_cv_pct``: (suite, metric) -> the
    learned night-to-night CV (the noise table's); ``builds`` / ``builds_yesterday``: the
    variants' builds tonight and yesterday (for "its environment changed")."""
    story = Story(yesterday=prior[-1].run_id if prior else None, machine=tonight.machine)
    held = [r for r in results if r.learning_nights is not None]
    if held:
        k = min(r.learning_nights or 0 for r in held)
        mine = any(r.kind == "history" and r.learning_nights == k for r in held)
        story.learning = {
            "nights": k,
            "needed": learn_min_nights,
            "machine": tonight.machine if mine else None,
        }
    failing = [r for r in results if r.status == "fail"]
    for r in failing:
        key, level = gate_key(r), level_of(r)
        streak: list[tuple[Night, dict]] = []  # newest first
        for n in reversed(prior):
            row = next((x for x in red.get(n.run_id, []) if gate_key(x) == key), None)
            if row is None:
                break
            streak.append((n, row))
        line = RedLine(
            *key, change_pct=r.change_pct, level=level, since_run_id=tonight.run_id,
            since_utc=tonight.night_utc, nights=1 + len(streak), new=not streak,
            why="" if streak else "new",
        )  # fmt: skip
        if streak:
            first = streak[-1]
            line.since_run_id = first[1].get("since_run_id") or first[0].run_id
            line.since_utc = first[1].get("since_utc") or first[0].night_utc
            ref = next((row for _n, row in streak if row.get("new")), first[1]).get("level")
            if level is not None and ref and ref > 0 and r.better in ("higher", "lower"):
                bad = -1 if r.better == "higher" else 1
                moved = bad * math.log(level / ref)
                limit = max(
                    r.threshold_pct or 0.0,
                    band_pct(r, (night_cv_pct or {}).get((r.suite, r.metric))),
                )
                if moved > math.log1p(limit / 100.0):
                    line.new, line.why = True, "further"
                    line.moved_pct = 100.0 * (level / ref - 1.0)
        if line.new:
            line.environment = _environment(r.variant, builds, builds_yesterday)
        story.lines.append(line)
    yesterday = {gate_key(x) for x in red.get(story.yesterday or "", [])}
    story.same_as_yesterday = (
        bool(failing) and not story.new and yesterday == {gate_key(r) for r in failing}
    )
    # the newest problem first: tonight's new lines, then the persisting ones, youngest first
    story.lines = story.new + sorted(
        (x for x in story.lines if not x.new), key=lambda x: x.since_utc, reverse=True
    )
    return story
