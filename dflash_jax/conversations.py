"""Conversations another engine made, as training data: read, templated, masked.

``prepare-data --conversations`` reads JSONL (or a JSON list) of conversations in either common
form and turns each into token ids through the target's chat template, with the loss on the
assistant turns only (SPEC "Training" 1: the drafter learns the target's answers, never the user's):

- OpenAI ``messages``: ``{"messages": [{"role": "system" | "user" | "assistant", "content": str}, ...]}``;
- ShareGPT ``conversations``: ``{"conversations": [{"from": "system" | "human" | "gpt", "value": str}, ...]}``
  (``user`` / ``assistant`` / ``chatgpt`` / ``bard`` / ``model`` are read too).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

from dflash_jax.errors import DataError
from dflash_jax.prompts import read_rows

SHAREGPT_ROLES = {
    "system": "system",
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "chatgpt": "assistant",
    "bard": "assistant",
    "model": "assistant",
}


@dataclasses.dataclass(frozen=True)
class Conversation:
    messages: tuple[dict, ...]  # {"role": "system" | "user" | "assistant", "content": str}, in order
    where: str  # "file:line", for error messages and the shard's record


def _messages(row, where: str) -> tuple[dict, ...]:
    if isinstance(row, dict) and isinstance(row.get("messages"), list):
        turns = [(t.get("role"), t.get("content")) if isinstance(t, dict) else (None, None) for t in row["messages"]]
    elif isinstance(row, dict) and isinstance(row.get("conversations"), list):
        turns = [
            (SHAREGPT_ROLES.get(str(t.get("from")).lower()), t.get("value")) if isinstance(t, dict) else (None, None)
            for t in row["conversations"]
        ]
    else:
        raise DataError(f"{where}: expected a 'messages' list (OpenAI form) or a 'conversations' list (ShareGPT form)")
    out = []
    for k, (role, content) in enumerate(turns):
        if role not in ("system", "user", "assistant") or not isinstance(content, str):
            raise DataError(
                f"{where}: turn {k} is not a system, user or assistant turn with text "
                "(OpenAI: role + content; ShareGPT: from human / gpt / system + value)"
            )
        out.append({"role": role, "content": content})
    if not any(m["role"] == "assistant" and m["content"].strip() for m in out):
        raise DataError(f"{where}: no assistant turn with text: nothing to train on; drop the row")
    return tuple(out)


def read_conversations(path: str | Path, limit: int | None = None) -> list[Conversation]:
    """The conversations of a JSONL file or JSON list, in file order (the first ``limit``).

    Raises:
      DataError: unreadable file, a row in neither form, a turn without a known role or text, a
        conversation without an assistant turn (each naming the file and line), or no rows.
    """
    path = Path(path)
    out = [Conversation(_messages(row, f"{path}:{n}"), f"{path}:{n}") for n, row in read_rows(path)[:limit]]
    if not out:
        raise DataError(f"{path} has no conversations")
    return out


def _template(tok, messages: Sequence[dict], generation_prompt: bool) -> list[int]:
    ids = tok.apply_chat_template(list(messages), add_generation_prompt=generation_prompt, tokenize=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def tokenize(
    tok, conv: Conversation, stop_ids: Sequence[int], unfinished: Sequence[int] = ()
) -> tuple[list[int], list[bool]]:
    """``(ids, loss_mask)`` of a conversation through ``tok``'s chat template: True on every
    assistant turn's tokens, from after its generation prompt up to and including its first stop
    token (``tokens.stop_ids``; what the target's own answers end with in ``prepare-data``); for the
    turns numbered in ``unfinished`` (answers cut at a length cap) up to just before it, since the
    answer did not end there.

    Raises:
      DataError: the template renders a conversation's start differently once later turns follow
        (some templates drop earlier turns' reasoning), so the turns cannot be told apart; naming
        the conversation.
    """
    ids = _template(tok, conv.messages, False)
    mask = [False] * len(ids)
    stops = set(stop_ids)
    for j, m in enumerate(conv.messages):
        if m["role"] != "assistant":
            continue
        start = len(_template(tok, conv.messages[:j], True))
        upto = _template(tok, conv.messages[: j + 1], False)
        if ids[: len(upto)] != upto or upto[:start] != _template(tok, conv.messages[:j], True):
            raise DataError(
                f"{conv.where}: the chat template renders turn {j} differently when later turns follow, "
                "so the assistant's tokens cannot be masked; give one conversation per assistant turn"
            )
        end = len(upto)
        first_stop = next((k for k in range(start, end) if ids[k] in stops), end - 1)
        for k in range(start, first_stop + (j not in unfinished)):
            mask[k] = True
    return ids, mask
