"""Build a tiny, randomly initialised Qwen2.5-VL checkpoint entirely offline (what sglang serves
in tests and the CPU demo; its shape: docs/FACTS.md section 5).

The tokenizer class written to tokenizer_config.json depends on the installed transformers:
4.x's Qwen2_5_VLProcessor insists on ``Qwen2TokenizerFast``; 5.x loads ``PreTrainedTokenizerFast``.
A model folder is therefore built per environment (see :func:`default_model_dir`).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from patchbench.inputs import CACHE_DIR

SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
]

#: Qwen2-VL's chat template (image/video placeholders as Qwen2.5-VL's processor expects them)
CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}"
    "{% if add_vision_id %}Picture {{ image_count.value }}: {% endif %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}"
    "{% set video_count.value = video_count.value + 1 %}"
    "{% if add_vision_id %}Video {{ video_count.value }}: {% endif %}"
    "<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

_CORPUS = [
    "The quick brown fox jumps over the lazy dog. " * 4,
    "You are a helpful assistant. Describe this image in detail.",
    "What is in the picture? A red square on a white background.",
    "Question: Which option is correct? Answer with the option's letter from the given choices "
    "directly. (A) red (B) blue (C) green (D) yellow",
    "Answer the question using a single word or phrase. The answer is 0.5, 1,000 or hepatitis.",
    "Hello world, this is a tiny tokenizer for testing sglang on CPU.",
    "system user assistant 0123456789 , . ! ? : ; ' \" ( ) [ ] { } - _ + = / \\ \n",
]

#: BPE vocabulary size. Large on purpose: sglang.bench_serving's random and random-image datasets
#: sample prompt tokens from ``tokenizer.get_vocab()``, special tokens included, and a prompt that
#: contains ``<|image_pad|>`` or ``<|video_pad|>`` makes the Qwen2.5-VL processor fail (a real
#: 151k vocabulary makes that rare; a 600-token one made 98% of 24-prompt runs hit it).
VOCAB_SIZE = 16000


def _corpus(seed: int) -> list[str]:
    """The fixed sentences plus seeded pseudo-words, enough for VOCAB_SIZE BPE merges."""
    import random

    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz0123456789"
    words = ["".join(rng.choice(letters) for _ in range(rng.randint(2, 9))) for _ in range(120000)]
    lines = [" ".join(words[i : i + 20]) for i in range(0, len(words), 20)]
    return _CORPUS + lines


#: files that make a model folder complete
REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")
#: the image processor's config: transformers 4.x writes the first, 5.x the second
PROCESSOR_FILES = ("preprocessor_config.json", "processor_config.json")


def default_model_dir() -> Path:
    """Where the tiny model of this environment lives: ``.cache/models/tiny-qwen25vl-tf<major>``
    of the repository, one per transformers major version."""
    import transformers

    return CACHE_DIR / "models" / f"tiny-qwen25vl-tf{transformers.__version__.split('.')[0]}"


def is_built(out: str | os.PathLike) -> bool:
    """True when ``out`` holds every file of a built model."""
    out = Path(out)
    return all((out / f).is_file() for f in REQUIRED_FILES) and any(
        (out / f).is_file() for f in PROCESSOR_FILES
    )


def build_tiny_qwen25vl(out: str | os.PathLike, *, seed: int = 0, force: bool = False) -> Path:
    """Build the tiny Qwen2.5-VL into folder ``out`` (atomically: built in a temp folder, renamed).

    Returns ``out``. Does nothing when the folder is already complete unless ``force``.
    Raises ImportError when torch/transformers/tokenizers are missing.
    """
    out = Path(out)
    if is_built(out) and not force:
        return out
    import torch

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        torch.manual_seed(seed)
        hf_tok, ids, vocab_size = _write_tokenizer(tmp, seed)
        _write_processor(tmp, hf_tok)
        _write_model(tmp, _model_config(ids, vocab_size), ids)
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _write_tokenizer(tmp: Path, seed: int) -> tuple[Any, dict[str, int], int]:
    """Train the byte-level BPE tokenizer on :func:`_corpus`, add Qwen's special tokens and chat
    template, write it into ``tmp`` (tokenizer_config.json naming the class this transformers
    major version loads) and load it back. Returns (the loaded tokenizer, {special token: id},
    the BPE vocabulary size with the special tokens)."""
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=1,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    tok.train_from_iterator(_corpus(seed), trainer=trainer)
    tok.add_special_tokens(SPECIAL_TOKENS)
    ids = {t: tok.token_to_id(t) for t in SPECIAL_TOKENS}
    vocab_size = tok.get_vocab_size()

    hf_tok = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        additional_special_tokens=SPECIAL_TOKENS[1:],
        model_max_length=32768,
        clean_up_tokenization_spaces=False,
    )
    hf_tok.chat_template = CHAT_TEMPLATE
    hf_tok.save_pretrained(tmp)
    cfg_path = tmp / "tokenizer_config.json"
    tcfg = json.loads(cfg_path.read_text())
    major = int(transformers.__version__.split(".")[0])
    # transformers 4.x: Qwen2_5_VLProcessor insists on a Qwen2 tokenizer class
    tcfg["tokenizer_class"] = "Qwen2TokenizerFast" if major < 5 else "PreTrainedTokenizerFast"
    tcfg["chat_template"] = CHAT_TEMPLATE
    cfg_path.write_text(json.dumps(tcfg, indent=2))
    return AutoTokenizer.from_pretrained(tmp), ids, vocab_size


def _write_processor(tmp: Path, hf_tok: Any) -> None:
    """Write the Qwen2.5-VL processor (image processor; a video processor on transformers 5)
    around ``hf_tok`` into ``tmp``."""
    from transformers import Qwen2_5_VLProcessor, Qwen2VLImageProcessor

    pix = dict(
        min_pixels=56 * 56,
        max_pixels=28 * 28 * 64,
        patch_size=14,
        temporal_patch_size=2,
        merge_size=2,
    )
    img_proc = Qwen2VLImageProcessor(
        image_mean=[0.48145466, 0.4578275, 0.40821073],
        image_std=[0.26862954, 0.26130258, 0.27577711],
        **pix,
    )
    kw = {}
    try:
        from transformers import Qwen2VLVideoProcessor

        kw["video_processor"] = Qwen2VLVideoProcessor(**pix)
    except ImportError:  # transformers 4.x
        pass
    proc = Qwen2_5_VLProcessor(
        image_processor=img_proc, tokenizer=hf_tok, chat_template=CHAT_TEMPLATE, **kw
    )
    proc.save_pretrained(tmp)


def _model_config(ids: dict[str, int], vocab_size: int) -> Any:
    """The tiny ``Qwen2_5_VLConfig`` (see the module docstring) for a tokenizer with
    ``vocab_size`` tokens (rounded up to a multiple of 64) and special token ``ids``."""
    import torch
    from transformers import Qwen2_5_VLConfig

    hidden = 64
    text_cfg = dict(
        # transformers 4.57 reads a Qwen2.5-VL config's attributes from its text config first
        # (sglang 0.5.6 reads hf_config.architectures): name it there too
        architectures=["Qwen2_5_VLForConditionalGeneration"],
        vocab_size=((vocab_size + 63) // 64) * 64,
        hidden_size=hidden,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        rms_norm_eps=1e-6,
        hidden_act="silu",
        tie_word_embeddings=False,
        use_sliding_window=False,
        rope_theta=1000000.0,
        rope_scaling={"type": "mrope", "rope_type": "default", "mrope_section": [2, 3, 3]},
        bos_token_id=ids["<|endoftext|>"],
        eos_token_id=ids["<|im_end|>"],
    )
    vision_cfg = dict(
        depth=2,
        hidden_size=64,
        intermediate_size=128,
        num_heads=4,
        in_chans=3,
        out_hidden_size=hidden,
        patch_size=14,
        spatial_merge_size=2,
        temporal_patch_size=2,
        window_size=112,
        fullatt_block_indexes=[1],
        tokens_per_second=2,
        hidden_act="silu",
    )
    config = Qwen2_5_VLConfig(
        text_config=text_cfg,
        vision_config=vision_cfg,
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        vision_token_id=ids["<|vision_pad|>"],
        bos_token_id=ids["<|endoftext|>"],
        eos_token_id=ids["<|im_end|>"],
        tie_word_embeddings=False,
    )
    for k, v in text_cfg.items():  # old-style flat keys (some loaders read the top level)
        if not hasattr(config, k):
            try:
                setattr(config, k, v)
            except Exception:  # noqa: BLE001 - read-only properties on some versions
                pass
    config.torch_dtype = torch.bfloat16
    return config


def _write_model(tmp: Path, config: Any, ids: dict[str, int]) -> None:
    """Initialise the model of ``config`` randomly (torch's global generator, seeded by the
    caller) in bfloat16 and write its weights, config and generation config into ``tmp``."""
    import torch
    import transformers
    from transformers import Qwen2_5_VLForConditionalGeneration

    model = Qwen2_5_VLForConditionalGeneration(config).to(torch.bfloat16)
    model.save_pretrained(tmp, safe_serialization=True)
    path = tmp / "config.json"
    saved = json.loads(path.read_text())
    if transformers.__version__.startswith("4.") and "text_config" in saved:
        # transformers 4.57 reads the text config's attributes first: its model_type
        # ("qwen2_5_vl_text") would hide the model's, which sglang 0.5.6 dispatches on
        saved["text_config"].pop("model_type", None)
        path.write_text(json.dumps(saved, indent=2))
    if model.generation_config is not None:
        model.generation_config.eos_token_id = [ids["<|im_end|>"], ids["<|endoftext|>"]]
        model.generation_config.save_pretrained(tmp)
