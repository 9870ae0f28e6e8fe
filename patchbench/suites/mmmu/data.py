"""MMMU questions: subjects, domains (sglang's ``benchmark/mmmu`` order) and loading the dataset
from the hub or a local copy (docs/mmmu.md); :class:`DatasetUnavailable` says how to provide one.
"""

from __future__ import annotations

import ast
import contextlib
import itertools
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from patchbench.suite import SuiteError

DOMAINS: dict[str, list[str]] = {
    "Art and Design": ["Art", "Art_Theory", "Design", "Music"],
    "Business": ["Accounting", "Economics", "Finance", "Manage", "Marketing"],
    "Science": ["Biology", "Chemistry", "Geography", "Math", "Physics"],
    "Health and Medicine": [
        "Basic_Medical_Science",
        "Clinical_Medicine",
        "Diagnostics_and_Laboratory_Medicine",
        "Pharmacy",
        "Public_Health",
    ],
    "Humanities and Social Science": ["History", "Literature", "Sociology", "Psychology"],
    "Tech and Engineering": [
        "Agriculture",
        "Architecture_and_Engineering",
        "Computer_Science",
        "Electronics",
        "Energy_and_Power",
        "Materials",
        "Mechanical_Engineering",
    ],
}
#: the 30 subjects, in domain order
SUBJECTS: list[str] = [s for subs in DOMAINS.values() for s in subs]
SUBJECT_DOMAIN: dict[str, str] = {s: d for d, subs in DOMAINS.items() for s in subs}
MAX_IMAGES = 7
IMAGE_TAG = re.compile(r"<image (\d+)>")

_ID = re.compile(r"^(?:dev|validation|test)_(?P<subject>.+)_(?P<n>\d+)$")


class DatasetUnavailable(SuiteError):
    """The questions could not be loaded (no network, no local copy, bad folder)."""


def subject_of(qid: str) -> str:
    """``"validation_Art_Theory_12"`` -> ``"Art_Theory"``; ValueError naming a malformed id."""
    m = _ID.match(qid)
    if not m or m.group("subject") not in SUBJECT_DOMAIN:
        raise ValueError(
            f"MMMU id {qid!r}: expected '<dev|validation|test>_<Subject>_<n>' with "
            f"one of the 30 subjects"
        )
    return m.group("subject")


def domain_metric(domain: str) -> str:
    """``"Art and Design"`` -> ``"mmmu_art_and_design_acc"``."""
    return "mmmu_" + domain.lower().replace(" ", "_") + "_acc"


def parse_options(raw: Any, qid: str = "?") -> list[str]:
    """The options from HF MMMU's list literal string (``"['$6', '$7']"``) or a list;
    ValueError naming the question id when it is neither."""
    if isinstance(raw, (list, tuple)):
        return [str(x) for x in raw]
    if isinstance(raw, str):
        try:
            val = ast.literal_eval(raw) if raw.strip() else []
        except (ValueError, SyntaxError) as e:
            raise ValueError(
                f"question {qid}: options {raw[:80]!r} is not a list literal: {e}"
            ) from None
        if not isinstance(val, (list, tuple)):
            raise ValueError(f"question {qid}: options {raw[:80]!r} is not a list")
        return [str(x) for x in val]
    raise ValueError(
        f"question {qid}: options of type {type(raw).__name__}, expected a list literal string"
    )


@dataclass
class Question:
    """One MMMU question. images: ``{n: PIL.Image}`` of the set ``image_n`` (1..7); answer: the
    gold letter, or an open question's gold string(s)."""

    id: str
    subject: str
    question: str
    options: list[str]
    answer: Any
    question_type: str
    images: dict[int, Any] = field(default_factory=dict)

    @property
    def is_open(self) -> bool:
        return self.question_type != "multiple-choice"

    @property
    def all_choices(self) -> list[str]:
        return [chr(ord("A") + i) for i in range(len(self.options))]

    @property
    def index2ans(self) -> dict[str, str]:
        return dict(zip(self.all_choices, self.options, strict=True))


def question_from_row(row: dict) -> Question:
    """A :class:`Question` from one HF MMMU row; ValueError naming the id and a missing or
    malformed field."""
    qid = row.get("id")
    if not qid:
        raise ValueError(f"MMMU row without an 'id': keys {sorted(row)}")
    for key in ("question", "options", "answer", "question_type"):
        if key not in row:
            raise ValueError(f"question {qid}: field '{key}' missing")
    qtype = row["question_type"]
    if qtype not in ("multiple-choice", "open"):
        raise ValueError(
            f"question {qid}: question_type {qtype!r}, expected 'multiple-choice' or 'open'"
        )
    images = {
        n: row[f"image_{n}"] for n in range(1, MAX_IMAGES + 1) if row.get(f"image_{n}") is not None
    }
    answer = row["answer"]
    if qtype == "open" and isinstance(answer, str) and answer.startswith("["):
        try:  # a few open golds are list literals, e.g. "['24/7', '3.429']"
            lit = ast.literal_eval(answer)
            if isinstance(lit, list):
                answer = [str(x) for x in lit]
        except (ValueError, SyntaxError):
            pass
    return Question(
        id=qid,
        subject=subject_of(qid),
        question=row["question"] or "",
        options=parse_options(row["options"], qid),
        answer=answer,
        question_type=qtype,
        images=images,
    )


@contextlib.contextmanager
def quiet_datasets():
    """Hide ``datasets``' own progress bars for the duration (restored afterwards)."""
    import datasets

    was_disabled = datasets.utils.are_progress_bars_disabled()
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        if not was_disabled:
            datasets.enable_progress_bars()


def _hint(dataset: str) -> str:
    return (
        f"provide a local copy of {dataset} with the suite parameter dataset_path: a folder "
        f"of parquet files in the hub layout (<Subject>/<split>-*.parquet, e.g. from "
        f"`huggingface-cli download {dataset} --repo-type dataset --local-dir DIR` on a "
        f"machine with network), a `datasets` save_to_disk folder, or a filled HF cache "
        f"folder; or run `python -m patchbench.suites.mmmu.demo_data DIR` for generated demo questions"
    )


def _load_subject_parquet(root: Path, subject: str, split: str):
    import datasets

    files = sorted((root / subject).glob(f"{split}-*.parquet"))
    if not files:
        return None
    return datasets.load_dataset(
        "parquet", data_files={split: [str(f) for f in files]}, split=split
    )


def _load_saved(root: Path, split: str):
    import datasets

    obj = datasets.load_from_disk(str(root))
    if isinstance(obj, datasets.DatasetDict):
        if split in obj:
            return obj[split]
        return datasets.concatenate_datasets(list(obj.values()))
    return obj


def _hub_unreachable(timeout_s: float = 3.0) -> str | None:
    """Why the HF hub cannot be reached, or None (it answers, or offline mode is set)."""
    import os
    import socket
    from urllib.parse import urlparse

    if os.environ.get("HF_DATASETS_OFFLINE") == "1" or os.environ.get("HF_HUB_OFFLINE") == "1":
        return None
    url = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    host, port = url.hostname or "huggingface.co", url.port or 443
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
        return None
    except OSError as e:
        return f"{host}:{port}: {e}"


def iter_rows(
    dataset: str, dataset_path: str | Path | None, split: str, subjects: Iterable[str]
) -> Iterable[dict]:
    """Rows (HF MMMU schema) of the subjects and split, subject by subject; DatasetUnavailable
    naming the dataset or folder, the subject and how to provide a local copy."""
    import datasets

    subjects = list(subjects)
    if dataset_path is not None:
        root = Path(dataset_path).expanduser()
        if not root.exists():
            raise DatasetUnavailable(f"dataset_path {root} does not exist; {_hint(dataset)}")
        if any((root / s).is_dir() for s in subjects):
            for s in subjects:
                ds = _load_subject_parquet(root, s, split)
                if ds is None:
                    continue  # a subject the local copy lacks: fewer questions, reported by count
                yield from ds
            return
        if (root / "dataset_dict.json").exists() or (root / "state.json").exists():
            ds = _load_saved(root, split)
            wanted = set(subjects)
            for row in ds:
                if subject_of(row["id"]) in wanted:
                    yield row
            return
        cache_dir: str | None = str(root)
    else:
        cache_dir = None
    why = _hub_unreachable()
    if why is not None:
        raise DatasetUnavailable(
            f"cannot load dataset {dataset!r}: the hub is unreachable ({why}) and "
            f"HF_DATASETS_OFFLINE/HF_HUB_OFFLINE are not set (set both to 1 to read a filled HF "
            f"cache); {_hint(dataset)}"
        )
    for s in subjects:
        try:
            ds = datasets.load_dataset(dataset, s, split=split, cache_dir=cache_dir)
        except Exception as e:
            where = f" (cache_dir {cache_dir})" if cache_dir else ""
            raise DatasetUnavailable(
                f"cannot load dataset {dataset!r}, subject {s!r}, split {split!r}{where}: "
                f"{type(e).__name__}: {str(e)[:300]}; {_hint(dataset)}"
            ) from e
        yield from ds


def load_questions(
    dataset: str,
    dataset_path: str | Path | None,
    split: str,
    subjects: Iterable[str],
    limit: int | None = None,
) -> list[Question]:
    """The questions of ``subjects`` (in that order, each in dataset order); ``limit`` n keeps n
    taken round-robin over the subjects. Raises DatasetUnavailable (also when nothing matched)
    and ValueError for an unknown subject or a malformed row."""
    subjects = list(subjects)
    unknown = [s for s in subjects if s not in SUBJECT_DOMAIN]
    if unknown:
        raise ValueError(f"unknown MMMU subjects {unknown}; known: {', '.join(SUBJECTS)}")
    if limit is not None and limit < 1:
        raise ValueError(f"limit {limit}: must be at least 1 (or None for all questions)")
    by_subject: dict[str, list[Question]] = {s: [] for s in subjects}
    with quiet_datasets():
        for row in iter_rows(dataset, dataset_path, split, subjects):
            q = question_from_row(dict(row))
            by_subject.setdefault(q.subject, []).append(q)
    if limit is not None:  # round-robin over the subjects
        turns = itertools.zip_longest(*(by_subject[s] for s in subjects))
        keep = {q.id for q in [q for turn in turns for q in turn if q is not None][:limit]}
        by_subject = {s: [q for q in qs if q.id in keep] for s, qs in by_subject.items()}
    out = [q for s in subjects for q in by_subject.get(s, [])]
    if not out:
        where = dataset_path if dataset_path is not None else dataset
        raise DatasetUnavailable(
            f"no {split!r} questions of subjects {subjects} in {where}; {_hint(dataset)}"
        )
    return out
