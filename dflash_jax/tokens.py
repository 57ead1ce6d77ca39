"""Token-level rules shared by every job: chat encoding, stop ids, the mask token, loop detection.

A prompt always becomes token ids the same way for decoding, training data and benchmarks
(``chat_ids``: the target tokenizer's chat template with the generation prompt appended,
``shared/data/README.md``), and decoding always stops at the same ids (``stop_ids``).
"""

from __future__ import annotations

from collections.abc import Sequence

from dflash_jax.errors import ConfigError

# SmolLM2's vocabulary has no spare row, so the mask token must be an existing token that chat
# text never contains: <empty_output> (id 16) is a code-pretraining marker unused in chat.
# Qwen2/3 have <|fim_pad|>; Llama 3 has reserved special tokens that are never produced.
MASK_TOKEN_CANDIDATES = (
    "<empty_output>",
    "<|mask|>",
    "<mask>",
    "<|fim_pad|>",
    "<|reserved_special_token_0|>",
    "<|endoftext|>",
)


def chat_ids(tok, messages: Sequence[dict]) -> list[int]:
    """Token ids of a conversation (``[{"role", "content"}, ...]``) through the tokenizer's chat
    template, generation prompt appended."""
    ids = tok.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def encode(tok, text: str, chat: bool) -> list[int]:
    """Token ids of ``text``; with ``chat``, as one user turn (``chat_ids``), else the bare text."""
    if chat:
        return chat_ids(tok, [{"role": "user", "content": text}])
    return tok.encode(text, add_special_tokens=False)


def stop_ids(tok) -> list[int]:
    """End-of-turn / end-of-sequence ids of a tokenizer (``<|im_end|>`` for SmolLM2 and Qwen)."""
    ids = {tok.eos_token_id} if tok.eos_token_id is not None else set()
    for t in ("<|im_end|>", "<|eot_id|>", "<|endoftext|>"):
        i = tok.convert_tokens_to_ids(t)
        if isinstance(i, int) and i != tok.unk_token_id and t in tok.get_vocab():
            ids.add(i)
    return sorted(ids)


def mask_token_id(tok) -> int:
    """An existing, unused special token of the target's tokenizer to serve as the mask token.

    Raises:
      ConfigError: the tokenizer has none of ``MASK_TOKEN_CANDIDATES``.
    """
    vocab = tok.get_vocab()
    for t in MASK_TOKEN_CANDIDATES:
        if t in vocab:
            return vocab[t]
    raise ConfigError(
        f"the tokenizer has none of the mask token candidates {MASK_TOKEN_CANDIDATES}: set "
        "drafter.mask_token_id to an unused token id in the training config (or use a trained drafter)"
    )


def loops(response: Sequence[int], n: int = 8, repeats: int = 3) -> bool:
    """True if some ``n``-gram occurs at least ``repeats`` times: a looping answer (loops make
    drafting easy and inflate tau, so data and benchmarks count them apart)."""
    seen: dict[tuple, int] = {}
    for i in range(len(response) - n + 1):
        g = tuple(response[i : i + n])
        seen[g] = seen.get(g, 0) + 1
        if seen[g] >= repeats:
            return True
    return False
