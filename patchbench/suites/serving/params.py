"""Parameters of the serving suite and the release-specific spelling of bench_serving's flags."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from .capsearch import Capacity
from .sweep import Sweep

#: dataset names a config may use (the user's vocabulary). "image" and "random-image" are the same
#: synthetic image dataset, spelt "random-image" by sglang 0.5.1.post3 and "image" by 0.5.23; we pass
#: whichever the pinned release knows (see :mod:`patchbench.suites.serving.command`).
DatasetName = Literal["mmmu", "image", "random-image", "random", "random-ids"]

#: datasets whose requests carry images (the "images reached the model" check applies)
IMAGE_DATASETS = frozenset({"mmmu", "image", "random-image"})


class Params(BaseModel):
    """The serving suite's parameters (docs/serving.md, "Parameters", says what each does).

    Defaults are the PR's command (sglang PR #9460): ``--backend sglang --dataset-name mmmu
    --num-prompts 200 --max-concurrency 16`` with the tool's ``--request-rate inf
    --random-output-len 1024`` and ``ignore_eos``. Units are in the names where there is one.
    """

    model_config = ConfigDict(extra="forbid")

    backend: str = "sglang"
    dataset_name: DatasetName = "mmmu"
    dataset_path: str | None = None
    num_prompts: int = Field(200, ge=1)
    max_concurrency: int | None = Field(16, ge=1)
    request_rate: float = Field(float("inf"), gt=0)
    output_len: int = Field(1024, ge=1)
    random_input_len: int = Field(1024, ge=1)
    random_range_ratio: float = Field(0.0, ge=0.0, le=1.0)
    image_count: int = Field(1, ge=1)
    image_resolution: str = "1080p"
    seed: int | None = None
    warmup_requests: int = Field(1, ge=0)
    tokenizer: str | None = None
    apply_chat_template: bool | None = None
    disable_ignore_eos: bool = False
    disable_tqdm: bool = True
    extra_args: list[str] = Field(default_factory=list)
    timeout_s: float = Field(3600.0, gt=0)
    images_min_extra_tokens_per_image: int = Field(4, ge=1)
    images_min_prompt_token_ratio: float | None = Field(None, gt=1.0)
    recompute_rel_tol: float = Field(0.05, ge=0.0)
    recompute_abs_tol_ms: float = Field(5.0, ge=0.0)
    sweep: Sweep | None = None
    capacity: Capacity | None = None
    gpus: int = Field(1, ge=1)
    clients: int = Field(1, ge=1)

    @model_validator(mode="after")
    def _one_load_plan(self) -> Params:
        if self.sweep is not None and self.capacity is not None:
            raise ValueError("set either sweep or capacity, not both")
        n, sw, cap = self.clients, self.sweep, self.capacity
        if n == 1:
            return self
        if self.request_rate != float("inf") or (sw and sw.axis == "request_rate"):
            raise ValueError("clients > 1 share a concurrency: not with a request rate")
        lows = [self.num_prompts, self.max_concurrency or n]
        lows += [min(sw.points), sw.min_prompts] if sw else []
        lows += [cap.min, cap.min_prompts] if cap else []
        if min(lows) < n:
            raise ValueError(
                f"clients: {n} needs at least {n} prompts and a concurrency of at least {n} at "
                "every point (each process its share)"
            )
        return self
