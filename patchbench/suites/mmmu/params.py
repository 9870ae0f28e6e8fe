"""Parameters of the MMMU suite (the ``suites: mmmu:`` block of a config)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from patchbench.suites.mmmu.data import SUBJECTS
from patchbench.suites.mmmu.prompts import (
    DEFAULT_MC_TEMPLATE,
    DEFAULT_OPEN_TEMPLATE,
    DEFAULT_OPTION_FORMAT,
)


class Params(BaseModel):
    """MMMU suite parameters, recorded in ``summary.json`` meta.

    dataset_path: a local copy (relative to the repository root); limit: at most this many
    questions, round-robin over subjects. protocol: ``patchbench`` or ``sglang-2025`` (the PR's
    script; its parser defaults to ``official``). seed: the official parser's random fallback;
    official_fallback ``unparsed`` counts a fallback wrong. retries: extra attempts when no byte
    of an answer arrived. extra_body: merged into every request body. concurrency: requests in
    flight, or a list: each its own pass over the same questions in the same cell, metrics
    named ``<metric>@c<N>`` (docs/mmmu.md, "Accuracy under load"). deterministic_control: each
    arm's correctness cell runs the highest concurrency once more with the pin's deterministic
    (batch-invariant) mode.
    """

    model_config = ConfigDict(extra="forbid")

    dataset: str = "MMMU/MMMU"
    dataset_path: str | None = None
    split: str = "validation"
    subjects: list[str] = Field(default_factory=lambda: list(SUBJECTS))
    limit: int | None = Field(None, ge=1)
    protocol: Literal["patchbench", "sglang-2025"] = "patchbench"
    parser: Literal["strict", "official"] | None = None
    seed: int = 42
    official_fallback: Literal["random", "unparsed"] = "random"
    temperature: float = Field(0.0, ge=0)
    max_tokens: int = Field(30, ge=1)
    concurrency: int | list[int] = 16
    deterministic_control: bool = False
    request_timeout_s: float = Field(300.0, gt=0)
    retries: int = Field(2, ge=0, le=10)
    mc_template: str = DEFAULT_MC_TEMPLATE
    open_template: str = DEFAULT_OPEN_TEMPLATE
    option_format: str = DEFAULT_OPTION_FORMAT
    extra_body: dict = Field(default_factory=dict)

    @field_validator("subjects")
    @classmethod
    def _subjects(cls, v: list[str]) -> list[str]:
        bad = [s for s in v if s not in SUBJECTS]
        if bad:
            raise ValueError(f"unknown subjects {bad}; allowed: {', '.join(SUBJECTS)}")
        if not v:
            raise ValueError("at least one subject")
        if len(set(v)) != len(v):
            raise ValueError("a subject is listed twice")
        return v

    @field_validator("concurrency")
    @classmethod
    def _concurrency(cls, v: int | list[int]) -> int | list[int]:
        vs = v if isinstance(v, list) else [v]
        if not vs or any(not 1 <= c <= 1024 for c in vs) or len(set(vs)) != len(vs):
            raise ValueError("concurrency: one or more distinct whole numbers from 1 to 1024")
        return v

    @property
    def concurrencies(self) -> list[int]:
        """The concurrencies, lowest first (one for a single value)."""
        return sorted(
            self.concurrency if isinstance(self.concurrency, list) else [self.concurrency]
        )

    @property
    def loads(self) -> list[str]:
        """The keys of the metric names, ``c<N>`` per concurrency, lowest first; [] for one
        concurrency (today's names)."""
        cs = self.concurrencies
        return [f"c{c}" for c in cs] if len(cs) > 1 else []

    @field_validator("mc_template")
    @classmethod
    def _mc(cls, v: str) -> str:
        if "{question}" not in v or "{options}" not in v:
            raise ValueError("mc_template needs {question} and {options}")
        return v

    @field_validator("open_template")
    @classmethod
    def _open(cls, v: str) -> str:
        if "{question}" not in v:
            raise ValueError("open_template needs {question}")
        return v

    @model_validator(mode="after")
    def _default_parser(self) -> Params:
        if self.parser is None:
            self.parser = "official" if self.protocol == "sglang-2025" else "strict"
        return self

    @property
    def sampling(self) -> dict:
        """The sampling settings two paired cells must share."""
        return {"temperature": self.temperature, "max_tokens": self.max_tokens, **self.extra_body}
