"""The jobs that make training data: ``prepare`` (``dflash-jax prepare-data``: the target's own
answers to prompt files, SPEC "Training" 1) and ``write_features`` (``dflash-jax prepare-features``:
the frozen target's tapped features, stored beside the tokens). Both are resumable.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

import jax
import numpy as np
from tqdm import tqdm

from dflash_jax import tokens
from dflash_jax.conversations import Conversation
from dflash_jax.conversations import tokenize as conv_tokenize
from dflash_jax.data import FEATURES_FORMAT, SHARDED_FORMAT, Shard, TokenDataset, features_folder, write_dataset
from dflash_jax.decode import Decoder
from dflash_jax.errors import DataError
from dflash_jax.loss import target_features
from dflash_jax.prompts import Prompt
from dflash_jax.tokens import encode, loops
from dflash_jax.utils import atomic_write_text, differences_text, json_sha256, log


def regenerate(
    decoder,
    prompts: Sequence[Sequence[int]],
    *,
    max_new_tokens: int,
    batch_size: int,
    stop_ids: Sequence[int] = (),
    progress: bool = True,
):
    """The target's own greedy responses to token-id ``prompts`` (SPEC "Training" 1), decoded on
    ``batch_size`` rows refilled as their answers finish (``Decoder.as_completed``); greedy, so each
    answer is the one the prompt gets alone, whatever the batching.

    Returns:
      ``(sequences, loss_masks)``: prompt + response token ids, and True exactly on the response
      (the stop token, when produced, is part of the response).
    """
    seqs: list = [None] * len(prompts)
    bar = tqdm(total=len(prompts), desc="regenerate", unit="seq", disable=not progress, leave=False)
    for j, r in decoder.as_completed(prompts, max_new_tokens, stop_ids, batch_size=batch_size):  # rows refilled
        seqs[j] = (list(prompts[j]), r.token_ids)
        bar.update(1)
    bar.close()
    return [p + r for p, r in seqs], [[False] * len(p) + [True] * len(r) for p, r in seqs]


_SAME_SETTINGS = "choose another --out, or rerun with the settings it was made with"


def _check_finished_shards(out: Path, names: Sequence[str], settings: dict, indexed: Sequence[str]) -> None:
    """Every shard already in ``out`` must be intact and made with ``settings``.

    A shard records the hash of the settings it was made with (a newer one the settings too, so that
    a refusal names what differs); one written before shards recorded the hash is taken only when an
    index with these settings lists it.

    Raises:
      DataError: a damaged shard or one made with other settings (or another target), naming it,
        the settings that differ (old -> new) where the shard records them, and the fix; nothing has
        been written yet.
    """
    key = json_sha256(settings)
    for name in names:
        if not (out / name).exists():
            continue
        try:
            shard = Shard(out / name)
        except DataError as e:
            raise DataError(f"{e}; delete {out / name} and rerun this command (it remakes only that shard)") from None
        made_with = shard.meta.get("settings_sha256")
        if made_with != key and not (made_with is None and name in indexed):
            old = shard.meta.get("settings")
            if isinstance(old, dict):
                diff = differences_text(old, settings)
            elif shard.meta.get("target", settings["target"]) != settings["target"]:
                diff = differences_text({"target": shard.meta["target"]}, {"target": settings["target"]})
            else:  # an older shard records only the hash of its settings
                diff = "it records their hash only, not which differ"
            raise DataError(
                f"{out / name} was made with other settings ({diff}); {_SAME_SETTINGS} (or delete {out} to start over)"
            )


class ShardFolder:
    """A ``prepare-data`` folder being made, shard by shard (resumable).

    The ``num_items`` items are shuffled with ``settings["seed"]`` and cut into shards of
    ``settings["shard_size"]`` (``shard(k)``: the items of shard ``k``). On opening, what is there is
    checked against ``settings`` (the index and every finished shard: ``_check_finished_shards``)
    before anything is written; ``todo`` lists the shards still missing; ``write`` (or
    ``write_masked``) adds one atomically and rewrites the index (``meta.json``: the shards, their
    summed stats, the settings, the sources).

    Raises (on opening):
      DataError: the folder (or a shard in it) was made with other settings (the settings that
        differ named, old -> new), or its index is not a ``prepare-data`` index.
    """

    def __init__(self, ck, out: str | Path, settings: dict, num_items: int, sources: Sequence[str], legacy=None):
        self.ck, self.out, self.settings, self.sources = ck, Path(out), settings, sorted(set(sources))
        self.index_path = self.out / "meta.json"
        indexed: list = []  # shards an index with these very settings lists
        if self.index_path.exists():
            try:
                old = json.loads(self.index_path.read_text())
            except (OSError, json.JSONDecodeError, UnicodeDecodeError):
                raise DataError(
                    f"{self.index_path} exists but is not a dflash-jax data index; choose another --out"
                ) from None
            if legacy is not None and isinstance(old, dict) and old.get("settings") == legacy:
                self.settings = legacy  # written before prompts were hashed as a list
            elif not isinstance(old, dict) or not isinstance(old.get("settings"), dict):
                raise DataError(f"{self.index_path} is not the index of a prepare-data folder; choose another --out")
            elif old["settings"] != settings:
                same = legacy is not None and old["settings"].get("prompts_sha256") == legacy["prompts_sha256"]
                diff = differences_text(old["settings"], legacy if same else settings)
                raise DataError(f"{self.out} holds data prepared with other settings ({diff}); {_SAME_SETTINGS}")
            indexed = old.get("shards") or []
        self.key = json_sha256(self.settings)
        self.order = np.random.RandomState(settings["seed"]).permutation(num_items)
        self.names = [f"shard_{k:05d}" for k in range(-(-num_items // settings["shard_size"]))]
        _check_finished_shards(self.out, self.names, self.settings, indexed)  # before anything is written
        self.out.mkdir(parents=True, exist_ok=True)
        self.done = [name for name in self.names if (self.out / name).exists()]
        self.write_index()

    @property
    def todo(self) -> list[int]:
        """The numbers of the shards still to make."""
        return [k for k, name in enumerate(self.names) if name not in self.done]

    def shard(self, k: int) -> list[int]:
        """The items (indices into the inputs) of shard ``k``."""
        size = self.settings["shard_size"]
        return [int(i) for i in self.order[k * size : (k + 1) * size]]

    @property
    def made(self) -> int:
        """How many items the finished shards hold (a progress bar's start)."""
        return len(self.order) - sum(len(self.shard(k)) for k in self.todo)

    def write_masked(self, k: int, rows, wheres: Sequence[str], hit_cap: int = 0) -> None:
        """Write shard ``k`` of templated conversations: ``rows`` ``(ids, loss_mask)`` with their
        sources ``wheres``; a row with fewer than 2 trained tokens holds no anchor and is dropped
        (counted); ``hit_cap``: its answers cut at a length cap."""
        keep = [j for j, (_, m) in enumerate(rows) if sum(m) >= 2]
        answers = [[t for t, m in zip(*rows[j]) if m] for j in keep]
        stats = {
            "sequences": len(keep),
            "tokens": int(sum(len(rows[j][0]) for j in keep)),
            "hit_cap": hit_cap,
            "looping": sum(loops(a) for a in answers),
            "dropped": len(rows) - len(keep),
        }
        self.write(k, [rows[j][0] for j in keep], [rows[j][1] for j in keep], [wheres[j] for j in keep], stats)

    def write(self, k: int, seqs: Sequence[Sequence[int]], masks: Sequence[Sequence[bool]], wheres, stats: dict):
        """Write shard ``k`` (its sequences, loss masks, their sources and ``stats``), then the index."""
        write_dataset(
            self.out / self.names[k],
            seqs,
            masks,
            meta={
                "tokenizer_sha256": self.ck.identity["tokenizer_sha256"],
                "stats": stats,
                "settings_sha256": self.key,
                "settings": self.settings,
                "target": self.ck.identity,
                "prompts": list(wheres),
            },
        )
        self.done.append(self.names[k])
        self.write_index()

    def write_index(self) -> None:
        done = [name for name in self.names if name in self.done]
        stats = {"sequences": 0, "tokens": 0, "hit_cap": 0, "looping": 0}
        for name in done:
            m = json.loads((self.out / name / "meta.json").read_text())
            for k in stats:
                stats[k] += m["stats"][k]
        meta = {
            "format": SHARDED_FORMAT,
            "format_version": 1,
            "shards": done,
            "complete": len(done) == len(self.names),
            "settings": self.settings,
            "stats": stats,
            "tokenizer_sha256": self.ck.identity["tokenizer_sha256"],
            "num_sequences": stats["sequences"],
            "num_tokens": stats["tokens"],
            "source": self.sources,
            "content_sha256": {name: Shard(self.out / name).content_sha256 for name in done},
        }
        atomic_write_text(self.index_path, json.dumps(meta, indent=2))

    def meta(self) -> dict:
        return json.loads(self.index_path.read_text())


def prepare(
    ck,
    tokenizer,
    prompts: Sequence[Prompt],
    out: str | Path,
    *,
    max_new_tokens: int = 384,
    batch_size: int = 16,
    shard_size: int = 256,
    seed: int = 0,
    window: int = 8,
    progress: bool = True,
) -> dict:
    """Regenerate responses with the target and write them as shards under ``out`` (resumable).

    The prompts are shuffled with ``seed`` and cut into shards of ``shard_size``; each shard is
    written atomically (``out/shard_00000`` ...), and a restart skips the shards already there
    (after checking them: ``ShardFolder``). The answers are greedy, decoded on ``batch_size`` rows
    refilled as they finish (``Decoder.as_completed``), ``window`` shards at a time: a window's rows
    stay busy until its last answers (the cache is sized for the window's longest prompt), and each
    shard is written as soon as its answers are in. ``out/meta.json`` indexes the shards and counts
    the answers that hit the cap or loop (``loops``), since looping answers inflate acceptance.

    Raises:
      DataError: a prompt too long for the target's context (named by file and line), a corrupt
        finished shard (named; the others are kept), or ``out`` (or a shard in it) prepared with
        other settings (the settings that differ named, old -> new).
    """
    ids = []
    for p in prompts:
        x = encode(tokenizer, p.text, chat=True)
        if len(x) + max_new_tokens > ck.cfg.max_position_embeddings:
            raise DataError(
                f"{p.where}: the prompt has {len(x)} tokens; with {max_new_tokens} new tokens it exceeds "
                f"the target's context of {ck.cfg.max_position_embeddings}; shorten or drop it"
            )
        ids.append(x)
    settings = {
        "max_new_tokens": max_new_tokens,
        "shard_size": shard_size,
        "seed": seed,
        "mode": "greedy",
        "chat": True,
        "num_prompts": len(prompts),
        "target": ck.identity,
        "prompts_sha256": json_sha256([p.text for p in prompts]),
    }
    legacy = {**settings, "prompts_sha256": hashlib.sha256("\n".join(p.text for p in prompts).encode()).hexdigest()}
    folder = ShardFolder(ck, out, settings, len(prompts), [p.where.rsplit(":", 1)[0] for p in prompts], legacy)
    decoder = Decoder(ck.params, ck.cfg)
    stops = tokens.stop_ids(tokenizer)
    shard = folder.shard

    def write_shard(k: int, answers: dict) -> None:
        idx = shard(k)
        keep = [i for i in idx if len(answers[i]) >= 2]  # a one-token answer holds no anchor
        if not keep:
            raise DataError(
                f"every answer of {folder.names[k]} has fewer than 2 tokens, so there is nothing to train on; "
                "raise --max-new-tokens"
            )
        responses = [answers[i] for i in idx]
        stats = {
            "sequences": len(keep),
            "tokens": int(sum(len(ids[i]) + len(answers[i]) for i in keep)),
            "hit_cap": sum(len(r) >= max_new_tokens and r[-1] not in stops for r in responses),
            "looping": sum(loops(r) for r in responses),
            "dropped": len(idx) - len(keep),
        }
        seqs = [ids[i] + answers[i] for i in keep]
        masks = [[False] * len(ids[i]) + [True] * len(answers[i]) for i in keep]
        folder.write(k, seqs, masks, [prompts[i].where for i in keep], stats)

    todo = folder.todo
    bar = tqdm(total=len(prompts), initial=folder.made, desc="prepare-data", unit="prompt", disable=not progress)
    for w in range(0, len(todo), window):  # a window of shards shares one refilled decode; each is written when whole
        requests = [(k, i) for k in todo[w : w + window] for i in shard(k)]
        answers: dict[int, dict] = {k: {} for k in todo[w : w + window]}
        stream = decoder.as_completed([ids[i] for _, i in requests], max_new_tokens, stops, batch_size=batch_size)
        for j, result in stream:
            k, i = requests[j]
            answers[k][i] = result.token_ids
            bar.update(1)
            if len(answers[k]) == len(shard(k)):
                write_shard(k, answers.pop(k))
    bar.close()
    return folder.meta()


# Second turns in the manner of MT-Bench's (a follow-up that asks the assistant to rework its answer),
# written here, never taken from MT-Bench, so that training never sees a benchmark turn.
FOLLOW_UPS = (
    "Can you make your answer shorter, in at most three sentences?",
    "Explain the most important step of your answer in more detail.",
    "Rewrite your answer so that a ten-year-old could follow it.",
    "Give one more example of the same idea.",
    "What could go wrong with your answer? Point out one weakness and fix it.",
    "Summarize your answer as a bulleted list.",
    "Now solve it or answer it in a different way.",
    "Check your answer again. If anything is wrong, correct it.",
    "Turn the main point of your answer into a short poem.",
    "Give your answer a title and a one-paragraph abstract.",
    "Write a question a curious reader might ask next, and answer it.",
    "Make your answer more formal, as if for a report.",
    "Which part of your answer are you least sure about, and why?",
    "Give a real-world application of your answer.",
    "Condense your answer into a single sentence.",
    "If your answer has code, add comments and a test; if not, add a concrete example with numbers.",
)


def prepare_follow_ups(
    ck,
    tokenizer,
    prompts: Sequence[Prompt],
    out: str | Path,
    *,
    max_new_tokens: int = 384,
    batch_size: int = 16,
    shard_size: int = 256,
    seed: int = 0,
    window: int = 8,
    progress: bool = True,
) -> dict:
    """Two-turn conversations of the target's own answers (issue 38's multi-turn source): each prompt
    answered (greedy), then a follow-up turn (one of ``FOLLOW_UPS``, chosen with ``seed``) answered
    given the first answer; written as ``prepare`` writes shards, the loss on both assistant turns
    (``conversations.tokenize``; an answer cut at ``max_new_tokens`` is not taught to end). Each turn
    of a window of shards is one refilled decode (``Decoder.as_completed``).

    Raises:
      DataError: as ``prepare``.
    """
    follow = np.random.RandomState(seed + 1).randint(len(FOLLOW_UPS), size=len(prompts))
    settings = {
        "max_new_tokens": max_new_tokens,
        "shard_size": shard_size,
        "seed": seed,
        "mode": "greedy, a follow-up turn",
        "chat": True,
        "num_prompts": len(prompts),
        "target": ck.identity,
        "prompts_sha256": json_sha256([p.text for p in prompts]),
        "follow_ups_sha256": json_sha256(FOLLOW_UPS),
    }
    folder = ShardFolder(ck, out, settings, len(prompts), [p.where.rsplit(":", 1)[0] for p in prompts])
    decoder, stops = Decoder(ck.params, ck.cfg), tokens.stop_ids(tokenizer)

    def answer(conversations: list[list[dict]]) -> list[tuple[str, bool]]:
        """The greedy answer to each conversation: (text, cut at the cap)."""
        ids = [tokens.chat_ids(tokenizer, c) for c in conversations]
        for x in ids:
            if len(x) + max_new_tokens > ck.cfg.max_position_embeddings:
                raise DataError(f"a conversation of {len(x)} tokens + {max_new_tokens} exceeds the target's context")
        out: list = [None] * len(ids)
        for j, r in decoder.as_completed(ids, max_new_tokens, stops, batch_size=batch_size):
            ended = bool(r.token_ids) and r.token_ids[-1] in stops
            out[j] = (tokenizer.decode(r.token_ids[:-1] if ended else r.token_ids, skip_special_tokens=True), not ended)
            bar.update(0.5)
        return out

    todo = folder.todo
    shown = dict(desc="prepare-data (2 turns)", unit="prompt", disable=not progress)
    bar = tqdm(total=len(prompts), initial=folder.made, **shown)
    for w in range(0, len(todo), window):
        idx = [i for k in todo[w : w + window] for i in folder.shard(k)]
        turns = [[{"role": "user", "content": prompts[i].text}] for i in idx]
        for c, (text, cut) in zip(turns, answer(turns)):
            c += [{"role": "assistant", "content": text, "cut": cut}]
        for c, i in zip(turns, idx):
            c.append({"role": "user", "content": FOLLOW_UPS[follow[i]]})
        plain = [[{"role": m["role"], "content": m["content"]} for m in c] for c in turns]
        for c, (text, cut) in zip(turns, answer(plain)):
            c.append({"role": "assistant", "content": text, "cut": cut})
        rows = {}
        for c, i in zip(turns, idx):
            messages = tuple({"role": m["role"], "content": m["content"]} for m in c)
            cut = [j for j, m in enumerate(c) if m.get("cut")]
            rows[i] = (conv_tokenize(tokenizer, Conversation(messages, prompts[i].where), stops, cut), len(cut))
        for k in todo[w : w + window]:
            shard = folder.shard(k)
            hit_cap = sum(rows[i][1] for i in shard)
            folder.write_masked(k, [rows[i][0] for i in shard], [prompts[i].where for i in shard], hit_cap)
    bar.close()
    return folder.meta()


def prepare_conversations(
    ck, tokenizer, convs: Sequence[Conversation], out: str | Path, *, shard_size: int = 256, seed: int = 0
) -> dict:
    """Conversations another engine made (``conversations.read_conversations``) as training shards
    under ``out``, as ``prepare`` writes them (the same format, index and checks; resumable): each
    through the target's chat template, the loss on its assistant turns (``conversations.tokenize``).
    A conversation with fewer than 2 assistant tokens is dropped (counted in the shard's stats).

    Raises:
      DataError: as ``prepare``; or a conversation the chat template cannot mask (named).
    """
    settings = {
        "shard_size": shard_size,
        "seed": seed,
        "mode": "conversations",
        "chat": True,
        "num_conversations": len(convs),
        "target": ck.identity,
        "conversations_sha256": json_sha256([c.messages for c in convs]),
    }
    folder = ShardFolder(ck, out, settings, len(convs), [c.where.rsplit(":", 1)[0] for c in convs])
    stops = tokens.stop_ids(tokenizer)
    for k in folder.todo:  # made elsewhere: no cap known (hit_cap 0)
        idx = folder.shard(k)
        folder.write_masked(k, [conv_tokenize(tokenizer, convs[i], stops) for i in idx], [convs[i].where for i in idx])
    return folder.meta()


def prepare_with_server(
    ck,
    tokenizer,
    convs: Sequence[Conversation],
    out: str | Path,
    client,
    *,
    max_new_tokens: int = 384,
    shard_size: int = 256,
    seed: int = 0,
    concurrency: int = 8,
    progress: bool = True,
) -> dict:
    """Training shards of answers an OpenAI-compatible server serving the target makes (vLLM,
    SGLang, ``dflash-jax serve``), the way SpecForge regenerates data: every assistant turn of each
    conversation is asked for again, greedy, given the turns before it with the earlier answers
    replaced by the server's (a conversation that ends with a user turn gets an answer to it), then
    the conversation goes through the target's chat template with the loss on the server's answers
    (``conversations.tokenize``; an answer cut at ``max_new_tokens`` is not taught to end). Written as
    ``prepare`` writes shards (format, index, checks; resumable by shard), ``concurrency`` requests
    in flight (``client``: ``client.ChatClient``).

    Raises:
      DataError: as ``prepare_conversations``; or a request that failed after its retries.
    """
    settings = {
        "max_new_tokens": max_new_tokens,
        "shard_size": shard_size,
        "seed": seed,
        "mode": "server greedy",
        "chat": True,
        "server_model": client.model,
        "num_conversations": len(convs),
        "target": ck.identity,
        "conversations_sha256": json_sha256([c.messages for c in convs]),
    }
    folder = ShardFolder(ck, out, settings, len(convs), [c.where.rsplit(":", 1)[0] for c in convs])
    stops = tokens.stop_ids(tokenizer)

    def regenerate_one(conv: Conversation):
        messages, cut = [], []
        turns = list(conv.messages) + (
            [{"role": "assistant", "content": ""}] * (conv.messages[-1]["role"] != "assistant")
        )
        for j, m in enumerate(turns):
            if m["role"] == "assistant":
                text, finish = client.chat(messages, max_new_tokens)
                m = {"role": "assistant", "content": text}
                if finish == "length":
                    cut.append(j)
            messages.append(m)
        return conv_tokenize(tokenizer, Conversation(tuple(messages), conv.where), stops, cut), len(cut)

    bar = tqdm(total=len(convs), initial=folder.made, desc="prepare-data", unit="conversation", disable=not progress)
    with ThreadPoolExecutor(concurrency) as pool:
        for k in folder.todo:
            idx = folder.shard(k)
            rows = []
            for row in pool.map(regenerate_one, [convs[i] for i in idx]):
                rows.append(row)
                bar.update(1)
            hit_cap = sum(cut for _, cut in rows)
            folder.write_masked(k, [r for r, _ in rows], [convs[i].where for i in idx], hit_cap)
    bar.close()
    return folder.meta()


def write_features(
    ds: TokenDataset, ck, layer_ids: Sequence[int], *, dtype: str, batch_size: int = 4, progress: bool = True, log=log
) -> Path:
    """Run the frozen target once over every sequence of ``ds`` and store its tapped features
    (``FeatureStore`` layout, under ``features_folder``), so that training skips the target's
    forward pass (``train.stored_features``). Resumable: a shard file is written atomically
    (a temporary name, then a rename) and a restart skips the shard files already there.

    Sequences are taken ``batch_size`` at a time in length order, each batch padded to a multiple of
    128 tokens (one compile per padded length); padding sits after the tokens, so, the target being
    causal, it does not change their features.

    Args:
      ck: the target (``checkpoint.load_target(..., dtype=dtype)``): the features are computed in
        its dtype and stored as float32 (exact for bfloat16).
      layer_ids: the drafter's ``target_layer_ids``; dtype: ``"float32"`` or ``"bfloat16"``.
    Returns:
      the features folder.
    Raises:
      DataError: the folder holds features made with other settings, its ``meta.json`` is
        damaged, or another ``prepare-features`` is writing it (an exclusive lock on
        ``<folder>/.lock`` guards the writes).
    """
    folder = features_folder(ds.folder, ck.identity, layer_ids, dtype)
    width = len(layer_ids) * ck.cfg.hidden_size
    meta = {
        "format": FEATURES_FORMAT,
        "format_version": 1,
        "feature_size": width,
        "layers": [int(x) for x in layer_ids],
        "dtype": dtype,
        "target": ck.identity,
    }
    folder.mkdir(parents=True, exist_ok=True)
    lock = open(folder / ".lock", "w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        raise DataError(f"another prepare-features is writing {folder}; wait for it to finish (or stop it)") from None
    try:
        _write_features(ds, ck, layer_ids, folder, meta, batch_size, progress, log)
    finally:
        lock.close()  # releases the lock
    return folder


def _write_features(ds, ck, layer_ids, folder: Path, meta: dict, batch_size: int, progress: bool, log) -> None:
    """``write_features`` under its lock."""
    width = meta["feature_size"]
    if (folder / "meta.json").exists():
        try:
            old = json.loads((folder / "meta.json").read_text())
        except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
            raise DataError(f"{folder}/meta.json is damaged ({e}); delete {folder} and rerun") from None
        if old != meta:
            raise DataError(f"{folder} holds features made with other settings; delete it and rerun")
    else:
        atomic_write_text(folder / "meta.json", json.dumps(meta, indent=2))
    for stale in folder.glob("*.npy.partial"):  # left by a killed run (we hold the lock: nobody else writes)
        stale.unlink()

    taps = jax.jit(partial(target_features, tcfg=ck.cfg, layer_ids=tuple(layer_ids)))
    todo = []
    for sh in ds.shards:
        path = folder / f"{sh.folder.name}.npy"
        if path.exists() and _intact(path, (len(sh.tokens), width)):
            continue
        if path.exists():  # cut or overwritten since it was written: made again
            log(f"{path} is damaged (not float32 x {(len(sh.tokens), width)}); computing it again")
            path.unlink()
        todo.append(sh)
    bar = tqdm(total=sum(len(sh) for sh in todo), desc="prepare-features", unit="seq", disable=not progress)
    for sh in todo:
        path = folder / f"{sh.folder.name}.npy"
        unfinished = folder / f"{sh.folder.name}.npy.partial"
        out = np.lib.format.open_memmap(unfinished, mode="w+", dtype=np.float32, shape=(len(sh.tokens), width))
        off = np.asarray(sh.offsets)
        lens = np.diff(off)
        order = np.argsort(lens, kind="stable")
        for i in range(0, len(order), batch_size):
            idx = order[i : i + batch_size]
            length = -(-int(lens[idx].max()) // 128) * 128
            tokens = np.zeros((batch_size, length), np.int32)  # a short last batch is padded with empty rows
            for r, j in enumerate(idx):
                tokens[r, : lens[j]] = sh.tokens[off[j] : off[j + 1]]
            f = np.asarray(taps(ck.params, tokens), np.float32)
            for r, j in enumerate(idx):
                out[off[j] : off[j + 1]] = f[r, : lens[j]]
            bar.update(len(idx))
        out.flush()
        del out
        os.replace(unfinished, path)
    bar.close()


def _intact(path: Path, shape: tuple[int, int]) -> bool:
    """Whether a stored-features file reads as float32 ``shape`` in full (a cut file does not map)."""
    try:
        a = np.load(path, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError):
        return False
    return a.dtype == np.float32 and a.shape == shape
