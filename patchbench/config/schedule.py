"""The config's ``schedule:`` models: :class:`ScheduleSpec` (repeats and order) and
:class:`SequentialRepeats` (``repeats: {min, max, step}``, group-sequential looks).

Which rounds a suite runs in (``suites.<name>.rounds``): :func:`parse_rounds`,
:func:`resolve_rounds`; the looks' boundaries are :mod:`patchbench.analysis.sequential`. A model
error is a ValueError (pydantic's ValidationError), which the loader turns into
:class:`patchbench.errors.ConfigError`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_serializer,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError


class _Strict(BaseModel):
    # strict: YAML's true is not 1, 1 is not "1" (quote environment values)
    model_config = ConfigDict(extra="forbid", strict=True)


class SequentialRepeats(_Strict):
    """``schedule.repeats: {min, max, step}``: group-sequential repeats (patchbench.analysis.sequential).

    The run looks at its primary metrics after ``min`` whole interleaved rounds, then after every
    ``step`` more, up to ``max``, and stops once every primary of every non-A/A variant is
    decided or futile (conditional power of deciding it by ``max`` below ``futility``;
    patchbench/analysis/sequential.py). ``boundary``: the group-sequential boundary (``pocock``: the same
    nominal level at every look; ``obrien-fleming``: strict early, near the fixed-sample level at
    the last look). ``futility``: the non-binding futility threshold (0.2 by default,
    ``patchbench.analysis.sequential.FUTILITY``; 0 turns the futility stop off; it never changes the
    chance of a false improved/regressed, only how long an undecidable run goes on).
    """

    min: int = Field(le=100)
    max: int = Field(le=100)
    step: int = Field(2, le=100)
    boundary: Literal["pocock", "obrien-fleming"] = "pocock"
    futility: float = Field(0.2, ge=0.0, lt=1.0)

    @model_validator(mode="after")
    def _looks(self) -> SequentialRepeats:
        # patchbench.analysis.sequential imports scipy.stats (seconds): only a sequential schedule pays it
        from patchbench.analysis.sequential import looks_from_schedule

        looks_from_schedule(self.min, self.max, self.step)  # ValueError naming the key
        return self

    @property
    def looks(self) -> tuple[int, ...]:
        """The repeat counts at which the run looks: ``min, min+step, ..., max``."""
        from patchbench.analysis.sequential import looks_from_schedule

        return looks_from_schedule(self.min, self.max, self.step)


class ScheduleSpec(_Strict):
    """Repeats of all variants; interleaved = ABBA, BAAB, ... (each variant once per round).

    ``repeats``: an integer (that many rounds, fixed) or a mapping ``{min, max, step, boundary}``
    (:class:`SequentialRepeats`: stop early once every primary is decided).
    ``unbalanced_reason``: why ``order: sequential`` (the same order every round) is wanted; a
    config with timed suites needs it for that order (the report's Methods repeat it, and a drift
    across rounds then makes the affected verdicts inconclusive).
    """

    repeats: int | SequentialRepeats = 1
    order: Literal["interleaved", "sequential"] = "interleaved"
    unbalanced_reason: str | None = None
    #: ``repeats: auto`` (a nightly config): ``patchbench nightly`` runs the repeats its gates
    #: need at the learned noise (patchbench.nightly.gates.planning); ``repeats`` holds the floor
    #: (``nightly.min_repeats``), what a plain ``bench`` of the config runs
    _auto: bool = PrivateAttr(False)

    @model_validator(mode="wrap")
    @classmethod
    def _auto_repeats(cls, data, handler):
        auto = isinstance(data, dict) and data.get("repeats") == "auto"
        if auto:
            data = {**data, "repeats": 1}
        m = handler(data)
        if auto:
            m._auto = True
        return m

    @property
    def auto(self) -> bool:
        """``repeats: auto``: the nightly computes the repeats (docs/nightly.md)."""
        return self._auto

    @field_validator("repeats", mode="plain")
    @classmethod
    def _repeats(cls, v):
        if isinstance(v, SequentialRepeats):
            return v
        if isinstance(v, dict):
            try:
                return SequentialRepeats.model_validate(v)
            except ValidationError as e:
                err = e.errors()[0]
                key = ".".join(str(x) for x in err["loc"])
                msg = err["msg"].removeprefix("Value error, ")
                where = f"{key}: " if key else ""
                raise ValueError(
                    f"{where}{msg} (a sequential schedule is {{min: 4, max: 12, step: 2}})"
                ) from None
        if isinstance(v, bool):
            raise PydanticCustomError("int_type", "Input should be a valid integer")
        if not isinstance(v, int):
            raise PydanticCustomError(
                "int_type",
                "Input should be a valid integer (a fixed number of repeats), a mapping "
                "{min: 4, max: 12, step: 2} (sequential repeats) or auto (a nightly config: "
                "the repeats its gates need)",
            )
        if not 1 <= v <= 100:
            raise ValueError(f"repeats must be between 1 and 100, got {v}")
        return v

    @field_serializer("repeats")
    def _dump_repeats(self, v):
        return v.model_dump(mode="json") if isinstance(v, SequentialRepeats) else v

    @model_validator(mode="after")
    def _order(self) -> ScheduleSpec:
        if self.sequential is not None and self.order != "interleaved":
            raise ValueError(
                "schedule.order: sequential repeats ({min, max, step}) look after whole "
                "interleaved rounds; use order: interleaved (or a fixed number of repeats)"
            )
        return self

    @property
    def sequential(self) -> SequentialRepeats | None:
        """The sequential design, or None for a fixed number of repeats."""
        return self.repeats if isinstance(self.repeats, SequentialRepeats) else None

    @property
    def max_repeats(self) -> int:
        """The most rounds the run may take (the fixed count, or ``max``)."""
        return self.repeats.max if self.sequential is not None else int(self.repeats)

    def describe(self) -> str:
        """``"3 repeat(s)"`` or ``"sequential 4..12 repeats, step 2 (pocock)"``."""
        s = self.sequential
        if self.auto:
            return (
                f"auto: patchbench nightly runs what its gates need at the learned noise "
                f"({self.repeats} repeat(s) outside the nightly)"
            )
        if s is None:
            return f"{self.repeats} repeat(s)"
        looks = ", ".join(str(n) for n in s.looks)
        return f"sequential {s.min}..{s.max} repeats, looks after {looks} ({s.boundary} boundary)"


#: the core key of a suite's section that is not one of the suite's own parameters
ROUNDS_KEY = "rounds"


def parse_rounds(
    value: Any, max_repeats: int, where: str, *, floor: int | None = None
) -> str | list[int]:
    """Check a ``suites.<name>.rounds`` value for a run of at most ``max_repeats`` rounds
    (``floor``: ``schedule.repeats: auto``'s ``nightly.min_repeats``, the rounds a night may
    have). Returns "all", "first" or the sorted 0-based round indices; raises ValueError naming
    ``where`` for anything else, an empty list, a repeated index or a round the run never reaches.
    """
    if value in ("all", "first"):
        return value
    if not isinstance(value, list) or any(
        isinstance(x, bool) or not isinstance(x, int) for x in value
    ):
        raise ValueError(
            f"{where}: {value!r} is not a round list; use all, first or a list of "
            f"round indices counted from 0 (e.g. [0, 2])"
        )
    if not value:
        raise ValueError(
            f"{where}: [] puts the suite in no round; use all, first or a "
            f"list of round indices from 0 to {max_repeats - 1}"
        )
    if len(set(value)) != len(value):
        raise ValueError(f"{where}: {value} lists a round twice")
    bad = [x for x in value if not 0 <= x < max_repeats]
    if bad and floor is not None:
        raise ValueError(
            f"{where}: round(s) {bad} with schedule.repeats: auto: a night may run only "
            f"nightly.min_repeats = {floor} round(s), indices 0 to {floor - 1}; list rounds "
            f"below {floor}, or use first or all"
        )
    if bad:
        raise ValueError(
            f"{where}: round(s) {bad} do not exist: this run has at most "
            f"{max_repeats} round(s), indices 0 to {max_repeats - 1}; a suite "
            "must run in at least one round that exists"
        )
    return sorted(value)


def resolve_rounds(value: Any, repeats: int) -> list[int]:
    """The 0-based rounds (``< repeats``) of a ``rounds`` value from :func:`parse_rounds` (None:
    "all")."""
    if value in (None, "all"):
        return list(range(repeats))
    if value == "first":
        return [0] if repeats > 0 else []
    return [int(x) for x in value if 0 <= int(x) < repeats]
