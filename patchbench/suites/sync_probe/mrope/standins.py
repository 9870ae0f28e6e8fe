"""Stand-ins for what sglang's ``ForwardBatch`` mrope methods reference outside their own bodies.

The extracted methods (:mod:`.methods`) run against these instead of sglang's ``ForwardMode``,
``MultimodalInputs``, ``MRotaryEmbedding`` and helpers: :func:`stand_in_globals` is their
globals.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import torch


class StandInMode:
    """Stand-in for sglang's ``ForwardMode``: ``"decode"`` or ``"extend"``."""

    def __init__(self, name: str):
        if name not in ("decode", "extend"):
            raise ValueError(f"mode must be decode or extend, not {name!r}")
        self.name = name

    def is_decode(self) -> bool:
        return self.name == "decode"

    def is_extend(self, include_draft_extend_v2: bool = False) -> bool:
        return self.name == "extend"

    def __repr__(self) -> str:
        return f"ForwardMode.{self.name.upper()}"


@dataclass
class StandInMultimodalInputs:
    """The fields of sglang's ``MultimodalInputs`` that the mrope methods read.

    mrope_position_delta: CPU int64 tensor, usually ``[1, 1]`` (k values -> k decode columns on
    0.5.1.post3, an error on 0.5.23). mrope_positions: ``[3, prompt_len]`` positions of the prompt,
    or None. mrope_position_delta_repeated_cache: a cache 0.5.23 fills.
    """

    mrope_position_delta: torch.Tensor
    mrope_positions: torch.Tensor | None = None
    mrope_position_delta_repeated_cache: torch.Tensor | None = None


class _StandInMRotaryEmbedding:
    @staticmethod
    def get_next_input_positions(
        mrope_position_delta: int, context_len: int, seq_len: int
    ) -> torch.Tensor:
        """As sglang 0.5.1.post3's ``MRotaryEmbedding.get_next_input_positions`` defines it:
        int64 ``[3, seq_len - context_len]``, every row ``context_len + delta .. seq_len + delta - 1``."""
        row = torch.arange(
            context_len + mrope_position_delta, seq_len + mrope_position_delta, dtype=torch.int64
        )
        return row.unsqueeze(0).repeat(3, 1)


def _flatten_nested_list(value: Any) -> list:
    """Depth-first flattening of nested lists (sglang.srt.utils.flatten_nested_list's contract)."""
    if isinstance(value, list):
        return [leaf for item in value for leaf in _flatten_nested_list(item)]
    return [value]


def stand_in_globals(state: SimpleNamespace) -> dict[str, Any]:
    """The names the extracted methods may reference, besides builtins and their own locals:
    ``typing``'s names and the stand-ins. ``state.rl_on_policy_target`` is what
    ``get_exec().deterministic.rl_on_policy_target`` returns at call time (0.5.23 reads it)."""
    import typing

    names: dict[str, Any] = {name: getattr(typing, name) for name in typing.__all__}
    names.update(
        torch=torch,
        MRotaryEmbedding=_StandInMRotaryEmbedding,
        flatten_nested_list=_flatten_nested_list,
        get_exec=lambda: SimpleNamespace(
            deterministic=SimpleNamespace(rl_on_policy_target=state.rl_on_policy_target)
        ),
        is_pin_memory_available=lambda: torch.cuda.is_available(),
        ForwardMode=StandInMode,
        MultimodalInputs=StandInMultimodalInputs,
    )
    return names
