"""Test helpers: tiny Hugging Face models (random weights) written as real HF folders."""

from __future__ import annotations

from pathlib import Path

import numpy as np

TINY = dict(
    vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
    num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
    rms_norm_eps=1e-6,
)


def tiny_tokenizer(vocab_size: int):
    """A word-level tokenizer whose tokens are 't0'..'tN' plus chat specials, as a HF fast tokenizer."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<unk>", "<|im_start|>", "<|im_end|>", "<mask>"]
    vocab = {s: i for i, s in enumerate(specials)}
    for i in range(len(specials), vocab_size):
        vocab[f"t{i}"] = i
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="<unk>", eos_token="<|im_end|>",
                                  bos_token="<|im_start|>", pad_token="<|im_end|>")
    tok.chat_template = (
        "{% for m in messages %}<|im_start|> {{ m['role'] }} {{ m['content'] }} <|im_end|> {% endfor %}"
        "{% if add_generation_prompt %}<|im_start|> assistant {% endif %}"
    )
    return tok


def make_hf_model(family: str, folder: Path, seed: int = 0, **overrides):
    """Save a random tiny ``family`` model (llama/qwen2/qwen3) with a tokenizer to ``folder``.

    Weights are drawn with std 0.2 (not HF's 0.02) so logits are far from uniform and
    argmax ties are improbable. Returns the torch model (float32, eval mode).
    """
    import torch
    import transformers

    kw = dict(TINY, **overrides)
    cls = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config, "qwen3": transformers.Qwen3Config}[family]
    tie = kw.pop("tie_word_embeddings", False)
    config = cls(**kw, tie_word_embeddings=tie)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config).float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            else:
                p.copy_(0.2 * torch.randn_like(p))
    model.save_pretrained(folder, safe_serialization=True)
    tiny_tokenizer(kw["vocab_size"]).save_pretrained(folder)
    return model


def hf_logits(model, tokens: np.ndarray) -> np.ndarray:
    import torch

    with torch.no_grad():
        return model(torch.as_tensor(tokens, dtype=torch.long)).logits.float().numpy()
