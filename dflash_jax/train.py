"""The drafter trainer: ``dflash-jax train --config configs/NAME.py [key=value ...]``.

Read top to bottom: ``Trainer.__init__`` loads the frozen target, the data and the drafter config,
draws the held-out split, fixes the run's identity and restores the last checkpoint if there is
one; ``Trainer.run`` loops with a progress bar, logs JSONL metrics, validates, checkpoints (orbax,
atomic, keep-last-N) and writes the best drafter by ``eval.best_by`` (validation loss by default).
The config and the run identity live in ``train_config``, the optimiser and the jitted update in
``train_step``, the batches in ``pipeline``.

A killed run restarted with the same command continues from its last checkpoint with
bitwise-identical losses: the batch of step ``s`` is ``dataset[s]`` (random-access grain), the
anchors of step ``s`` come from ``fold_in(rng, s)``, and the parameters and optimiser state are
restored exactly.

Only the drafter's layers, ``fc`` and norms train; the target (and with it the shared embedding
and LM head) is frozen and stored once, in the target checkpoint.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from functools import partial
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils
from tqdm import tqdm

from dflash_jax import checkpoint, data, dflash_format, pipeline
from dflash_jax.decode import Decoder
from dflash_jax.distributed import is_main
from dflash_jax.drafter import DraftStep, grow_copy_bias, init_drafter_params
from dflash_jax.drafter_io import load_drafter, save_drafter
from dflash_jax.errors import CheckpointError, ConfigError, DataError
from dflash_jax.loss import LossSettings
from dflash_jax.sharding import make_mesh
from dflash_jax.speculation import make_plan
from dflash_jax.tokens import stop_ids
from dflash_jax.train_config import BEST_BY, TrainConfig, drafter_config, fingerprint, run_identity
from dflash_jax.train_step import eval_stats, make_optimizer, make_schedule, sharded_step, summarise
from dflash_jax.utils import atomic_write_text, differences, enable_compilation_cache, read_jsonl

SELECTOR_METRICS = ("selector_loss", "selector_acc", "topk_coverage")  # DFlash 2's, beside the block loss's


class Trainer:
    """A training run in ``c.out_dir``: ``ckpt/`` (orbax, last N states), ``metrics.jsonl``,
    ``best/`` (the best drafter by ``eval.best_by``: lowest validation loss by default),
    ``drafter/`` (final drafter), both in the dflash-jax drafter format that
    ``dflash-jax generate --drafter`` loads.

    Args (construction):
      c: the run's config (``train_config.load_config``; checked there).
      log: where progress lines go.

    Raises (on construction):
      ConfigError: the config does not fit the target or the mesh (block size, layer ids, mask
        token, batch layout).
      CheckpointError / DataError: unreadable target or data, data for another tokenizer, or a
        checkpoint in ``out_dir`` from another model, data or config (nothing is overwritten).
    """

    def __init__(self, c: TrainConfig, log=print):
        enable_compilation_cache()
        self.c, self.log = c, log
        t = c.train
        self.mesh = make_mesh(c.mesh)
        _check_batch_layout(c, self.mesh)  # a bad layout fails before anything is loaded
        self.out = Path(c.out_dir)
        if self.out.exists() and not self.out.is_dir():
            raise CheckpointError(f"out_dir {self.out} is a file; choose a folder")
        self.target = checkpoint.load_target(c.target, dtype=t.compute_dtype, mesh=self.mesh)
        self.tcfg = self.target.cfg
        tok = self.target.tokenizer()
        self.dcfg = drafter_config(c, self.tcfg, tok)
        self.stop_ids = stop_ids(tok)
        self._load_data()
        within = self._validation_range()
        self.train_idx, self.val_idx = pipeline.split_indices(len(self.ds), c.eval.val_size, seed=c.seed, within=within)
        if c.repeats:
            starts = np.cumsum([0] + [len(part) for part in self.ds.parts])
            self.train_idx = pipeline.repeat_parts(self.train_idx, starts, c.repeats)
        self.rows = pipeline.rows(self.ds, self.train_idx, max_len=t.max_len, seed=c.seed, features=self.features)
        self.batches = None
        buckets = None
        if t.length_buckets:
            buckets = pipeline.bucket_lengths(t.length_buckets, t.max_len)
            self.batches = pipeline.bucketed_batches(
                self.ds,
                self.train_idx,
                batch_size=t.batch_size,
                max_len=t.max_len,
                buckets=buckets,
                seed=c.seed,
                features=self.features,
            )
        self.identity = run_identity(
            c,
            target_identity=self.target.identity,
            data_identity=self.ds.identity,
            dcfg=self.dcfg,
            val_within=within,
            bucket_window=pipeline.BUCKET_WINDOW,
            bucket_lengths=buckets,
        )
        self.run_id = fingerprint(self.identity)

        self.opt, self.schedule = make_optimizer(t), make_schedule(t)
        kw = dict(tcfg=self.tcfg, dcfg=self.dcfg, num_anchors=t.num_anchors, loss=LossSettings.from_train(t))
        params = init_drafter_params(self.dcfg, seed=c.seed)
        if c.init_from:
            params = self._initial_weights(c.init_from, params)
        self._step, param_sh, self.batch_sh, opt_sh = sharded_step(
            self.mesh,
            params,
            self.target.params,
            opt=self.opt,
            **kw,
            stored_features=self.features is not None,
            selector_alpha=t.selector_alpha,
        )
        self._eval = jax.jit(partial(eval_stats, **kw))
        self.rng = jax.random.PRNGKey(c.seed)
        self.params = jax.device_put(params, param_sh)
        self.opt_state = jax.device_put(self.opt.init(params), opt_sh)
        self.step = 0
        self.best = math.inf
        self.ckpt = self._manager()
        self._restore()

    def _load_data(self) -> None:
        """The token dataset (complete, large enough, of this target's tokenizer) and, with
        ``train.stored_features``, its stored target features."""
        c = self.c
        self.ds = data.open_data(c.data, c.data_shards)
        for part in self.ds.parts:
            if not part.complete:
                raise DataError(
                    f"{part.folder} is incomplete ({len(part.shards)} shards so far): if prepare-data is still "
                    "running, wait for it; if it stopped, rerun its command (it resumes, and names a damaged "
                    "shard to delete); or set data_shards to train on its first shards (with several data folders, "
                    "one count each: data_shards=(0, N))"
                )
            want = part.meta.get("tokenizer_sha256")
            if want and want != self.target.identity["tokenizer_sha256"]:
                raise DataError(f"{part.folder} was tokenised with another tokenizer than the target {c.target}'s")
        if len(self.ds) <= c.eval.val_size:
            raise DataError(
                f"{' + '.join(c.folders)} has {len(self.ds)} sequences, too few for "
                f"eval.val_size={c.eval.val_size} plus training"
            )
        self.ds.check_vocab(self.tcfg.vocab_size)
        self.features = None  # stored target features (train.stored_features): the step skips the target forward
        self.features_width = len(self.dcfg.target_layer_ids) * self.tcfg.hidden_size
        if c.train.stored_features:
            who, layers = self.target.identity, self.dcfg.target_layer_ids
            self.features = data.FeatureStore(
                data.features_folder(self.ds.parts[0].folder, who, layers, c.train.compute_dtype),
                self.ds,
                self.features_width,
            )

    def _validation_range(self) -> int | None:
        """``within`` of ``pipeline.split_indices``: ``eval.val_within_shards`` keeps an earlier
        stage's held-out answers (None: drawn from all sequences)."""
        c = self.c
        k = c.eval.val_within_shards
        if not k:
            return None
        if k > len(self.ds.shards):
            raise ConfigError(
                f"eval.val_within_shards={k} but this run reads {len(self.ds.shards)} shard(s) of "
                f"{' + '.join(c.folders)}; ask for at most that many (0 = all)"
            )
        within = self.ds.shard_start(k)
        if c.eval.val_size >= within:
            raise ConfigError(
                f"eval.val_size={c.eval.val_size} needs more than the {within} sequences of the "
                f"first eval.val_within_shards={k} shard(s); raise val_within_shards"
            )
        return None if within == len(self.ds) else within  # the same split as drawing from all: the same run

    def _initial_weights(self, folder: str, params):
        """Weights of the drafter in ``folder`` (a fresh run continues from it: a new schedule and
        optimiser state); its config must be this run's."""
        loaded, cfg, _ = load_drafter(folder)
        # what fills the blocks is no parameter: a mask-token drafter may start an n-gram-input run
        # (a copy bias it lacks starts at the config's value); nor is how its trees are read (a trained
        # drafter's tree_temperature is 1 until tuned for it)
        d = self.dcfg
        inputs = dict(
            block_input=d.block_input,
            ngram_max=d.ngram_max,
            ngram_min=d.ngram_min,
            ngram_periodic=d.ngram_periodic,
            copy_bias=d.copy_bias,
            tree_temperature=d.tree_temperature,
        )
        upgrade = d.dflash2 and not cfg.dflash2  # a DFlash drafter starts a DFlash 2 run: its backbone
        if upgrade:  # the convolutions start as the identity and the selector at random (SPEC "DFlash 2")
            dflash2_fields = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")
            inputs |= {k: getattr(d, k) for k in dflash2_fields}
        grow = self.c.init_grow and cfg.num_layers < d.num_layers
        if grow:  # the added layers are this config's; its own are checked as usual
            inputs |= dict(num_layers=d.num_layers, layer_types=cfg.layer_types + d.layer_types[cfg.num_layers :])
        elif self.c.init_grow and cfg.num_layers > d.num_layers:
            raise ConfigError(
                f"init_from {folder}: init_grow adds layers, but its drafter has {cfg.num_layers} and this "
                f"config's drafter.num_layers is {d.num_layers}; set drafter.num_layers >= {cfg.num_layers}"
            )
        ours = dflash_format.config_json(self.dcfg)
        theirs = dflash_format.config_json(dataclasses.replace(cfg, **inputs))
        diff = sorted(k for k in ours.keys() | theirs.keys() if ours.get(k) != theirs.get(k))
        if diff:
            raise ConfigError(
                f"init_from {folder}: its drafter differs from this config's in {', '.join(diff)}; "
                "set the drafter.* fields to match it"
            )
        if upgrade:
            loaded = _with_missing(loaded, params)
        if grow:
            loaded = dict(loaded)
            for i in range(cfg.num_layers, d.num_layers):
                loaded[f"layers_{i}"] = _identity_layer(params[f"layers_{i}"])
        if d.copy_bias is not None and "copy_bias" not in loaded:
            loaded = dict(loaded, copy_bias=params["copy_bias"])
        if d.copy_bias is None and "copy_bias" in loaded:
            raise ConfigError(
                f"init_from {folder}: its drafter has a copy-bias table; set drafter.copy_bias (and "
                'drafter.block_input="ngram") to continue it, or start from a drafter without one'
            )
        have, want = np.shape(loaded.get("copy_bias")), np.shape(params.get("copy_bias"))
        if "copy_bias" in loaded and have != want:
            if have[0] > want[0]:  # its block size is this config's (checked above): the rows differ
                raise ConfigError(
                    f"init_from {folder}: its copy-bias table is {have}, this config's {want} (ngram_max, "
                    f"block_size - 1); set drafter.ngram_max to {have[0]} or more"
                )
            # a longer ngram_max: the rows of the longer matches start at the config's value, as a
            # table the drafter lacks does (its rows for the shorter ones are kept)
            loaded = dict(loaded, copy_bias=grow_copy_bias(loaded["copy_bias"], d.ngram_max, d.copy_bias))
        return jax.tree.map(lambda a, b: np.asarray(b, a.dtype), params, loaded)

    # -- checkpoints
    def _manager(self):
        opts = ocp.CheckpointManagerOptions(max_to_keep=self.c.ckpt.keep, create=True, enable_async_checkpointing=False)
        return ocp.CheckpointManager((self.out / "ckpt").resolve(), options=opts)

    def _state(self):
        return {
            "params": self.params,
            "opt_state": self.opt_state,
            "step": np.int64(self.step),
            "rng": np.asarray(self.rng),
        }  # a host array: orbax cannot save a single-device one across hosts

    def best_score(self, rec: dict) -> float:
        """The number ``best/`` minimises (``eval.best_by``, ``train_config.BEST_BY``): ``loss``, the
        objective trained (the block loss, plus DFlash 2's weighted selector loss); a tau, negated."""
        tau = BEST_BY[self.c.eval.best_by]
        if tau is None:
            return rec.get("val_loss", math.inf) + self.c.train.selector_alpha * rec.get("val_selector_loss", 0.0)
        return -rec.get(tau, -math.inf)

    def save(self):
        meta = {
            "run_id": self.run_id,
            "identity": self.identity,
            "step": self.step,
            "data_position": self.step,
            "best_val_loss": self.best,  # the best score (eval.best_by; the name from when it was the loss)
            "best_by": self.c.eval.best_by,
        }
        self.ckpt.save(
            self.step, args=ocp.args.Composite(state=ocp.args.StandardSave(self._state()), meta=ocp.args.JsonSave(meta))
        )
        self.ckpt.wait_until_finished()

    def _restore(self):
        """Continue from the newest checkpoint that restores; a damaged newer one (a kill or a full
        disk while it was written) is skipped with a line saying which and why, as orbax-based
        trainers do after preemption, and moved aside (``out_dir/ckpt.unrestorable-<step>``, never
        deleted: a transient read error must not cost a good checkpoint) once an older one has restored.

        Raises:
          CheckpointError: the checkpoints are another run's (nothing is changed), or none restores.
        """
        steps = sorted(self.ckpt.all_steps(), reverse=True)
        for k, step in enumerate(steps):
            try:
                meta = self.ckpt.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
                self._check_same_run(meta)
                self._restore_state(step, meta)
                for bad in steps[:k]:  # moved aside, not deleted: training past them saves those steps anew
                    aside = self.out / f"ckpt.unrestorable-{bad}"
                    os.replace(self.out / "ckpt" / str(bad), aside)
                    self.log(f"moved the checkpoint of step {bad}, which did not restore, to {aside}")
                self.ckpt.reload()
                return
            except CheckpointError:
                raise
            except Exception as e:  # orbax and tensorstore raise many types for a damaged checkpoint
                why = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
                if k + 1 == len(steps):
                    raise CheckpointError(
                        f"no checkpoint in {self.out / 'ckpt'} restores (step {step}: {why}); "
                        "move that folder away to start the run afresh"
                    ) from None
                self.log(
                    f"checkpoint step {step} in {self.out / 'ckpt'} does not restore ({why}); "
                    f"trying step {steps[k + 1]}"
                )

    def _check_same_run(self, meta: dict) -> None:
        if meta.get("run_id") != self.run_id:
            diff = differences(meta.get("identity", {}), json.loads(json.dumps(self.identity, default=str)))
            raise CheckpointError(
                f"{self.out / 'ckpt'} holds a run with another {diff[0].split('.')[0] if diff else 'setup'} "
                f"({'; '.join(diff[:4]) or 'unknown difference'}); a run cannot change its target, data, drafter "
                "or training settings (train.steps shapes the schedule): pass another out_dir to start a new run; "
                "nothing was changed"
            )

    def _restore_state(self, last: int, meta: dict) -> None:
        def spec(x):  # restore onto this run's mesh, whatever mesh wrote the checkpoint
            if isinstance(x, jax.Array):
                return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding)
            return jax.ShapeDtypeStruct(np.shape(x), np.asarray(x).dtype)

        abstract = jax.tree.map(spec, self._state())
        state = self.ckpt.restore(last, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract)))["state"]
        self.params, self.opt_state, self.rng = state["params"], state["opt_state"], state["rng"]
        self.step, self.best = int(state["step"]), float(meta.get("best_val_loss", math.inf))
        if meta.get("best_by", "loss") != self.c.eval.best_by:  # a new criterion: best/ starts over
            self.log(f"eval.best_by is now {self.c.eval.best_by!r}: the next validation writes best/")
            self.best = math.inf
        self.log(f"resumed {self.out} at step {self.step}")

    # -- metrics log: entries past the resumed step (written after the last checkpoint) are dropped
    def _open_log(self):
        path = self.out / "metrics.jsonl"
        rows = read_jsonl(path)[0] if path.exists() else []  # a line cut by a kill is dropped
        keep = [r for r in rows if r.get("step", 0) <= self.step]
        atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in keep))
        return open(path, "a")

    # -- input
    def global_batch(self, step: int) -> dict:
        """The batch of ``step`` as global arrays ``[accum, micro, T]`` split over data x fsdp.

        Without ``train.length_buckets``: row ``j`` of step ``s`` is element ``s * batch_size + j`` of
        the shuffled, repeated grain dataset (so a restart at step ``s`` sees exactly the same data),
        and each process reads only the rows its own devices hold (per-host data sharding). With
        them: the step's batch is ``pipeline.bucketed_batches[s]`` (the same rows regrouped by length
        within windows; ``T`` = its bucket), read whole by every process (its length must agree
        everywhere), and the step is compiled once per bucket (``step_s`` then includes that
        first compile).
        """
        t = self.c.train
        accum, micro = t.grad_accum, t.batch_size // t.grad_accum
        if self.batches is not None:  # length buckets: the whole batch at once, padded to its bucket
            whole = self.batches[step]
            return pipeline.global_batch(
                lambda j: {k: v[j] for k, v in whole.items()},
                (accum, micro, whole["tokens"].shape[1]),
                self.batch_sh,
                self.features_width,
            )
        return pipeline.global_batch(
            lambda j: self.rows[step * t.batch_size + j], (accum, micro, t.max_len), self.batch_sh, self.features_width
        )

    # -- validation
    def validate(self) -> dict:
        """Loss and per-offset accuracy over the held-out sequences (and a real decode's tau)."""
        c = self.c
        src = pipeline.PaddedSource(self.ds, self.val_idx, c.train.max_len, features=self.features)
        total = None
        b = c.train.batch_size // c.train.grad_accum
        empty = {"tokens": np.zeros(c.train.max_len, np.int32), "loss_mask": np.zeros(c.train.max_len, bool)}
        if self.features is not None:
            empty["features"] = np.zeros((c.train.max_len, self.features_width), np.float32)
        for i in range(0, len(src), b):  # the last batch is padded with rows that carry no loss
            batch = pipeline.global_batch(
                lambda j: src[i + j] if i + j < len(src) else empty,
                (1, b, c.train.max_len),
                self.batch_sh,
                self.features_width,
            )
            s = self._eval(self.params, self.target.params, batch, jax.random.PRNGKey(c.seed + 1))
            total = s if total is None else jax.tree.map(jnp.add, total, s)
        out = {f"val_{k}": v for k, v in summarise(total, self.dcfg.dflash2).items()} if total is not None else {}
        if c.eval.decode_prompts and jax.process_count() == 1:  # a real decode runs on one host
            out["val_decode_tau"] = self.decode_tau(c.eval.decode_prompts, c.eval.decode_max_new_tokens)
        return out

    def decode_tau(self, n: int, max_new: int) -> float:
        """Real speculative decoding of ``n`` validation prompts (prompt = tokens before the response)."""
        if not hasattr(self, "_decoder"):
            plan = make_plan(DraftStep(self.dcfg, self.tcfg), self.params, label="the drafter in training")
            self._decoder = Decoder(self.target.params, self.tcfg, plan)
        self._decoder.drafter_params = self.params
        lengths = []
        for j in self.val_idx[:n]:
            tok, mask = self.ds[int(j)]
            first = int(np.argmax(mask)) if mask.any() else len(tok)
            if first == 0:
                continue
            r = self._decoder.generate([tok[:first].tolist()], max_new, self.stop_ids)[0]
            lengths += r.acceptance_lengths
        return float(np.mean(lengths)) if lengths else float("nan")

    def export(self, name: str):
        """Write the current drafter as ``out_dir/name`` (process 0; all processes gather it)."""
        params = multihost_utils.process_allgather(self.params, tiled=True) if jax.process_count() > 1 else self.params
        if is_main():
            save_drafter(
                params,
                self.dcfg,
                self.out / name,
                target_identity=self.target.identity,
                overwrite=True,
                extra_meta={"step": self.step, "run_id": self.run_id},
            )
        return self.out / name

    # -- the loop
    def run(self, stop_after: int | None = None):
        """Train until ``train.steps`` (or ``stop_after`` more steps); returns the last metrics."""
        c, t = self.c, self.c.train
        main = is_main()
        self.out.mkdir(parents=True, exist_ok=True)
        if main:
            (self.out / "config.json").write_text(json.dumps(c.to_dict(), indent=2))
        end = t.steps if stop_after is None else min(t.steps, self.step + stop_after)
        logf = self._open_log() if main else open(os.devnull, "w")
        last: dict = {}
        bar = tqdm(
            total=t.steps,
            initial=self.step,
            desc="train",
            unit="step",
            dynamic_ncols=True,
            **({} if main else {"disable": True}),
        )
        while self.step < end:
            batch = self.global_batch(self.step)
            t0 = time.perf_counter()
            self.params, self.opt_state, m = self._step(
                self.params, self.opt_state, self.target.params, batch, jax.random.fold_in(self.rng, self.step)
            )
            m = jax.device_get(m)
            dt = time.perf_counter() - t0
            self.step += 1
            rec = {
                "step": self.step,
                "loss": float(m["loss"]),
                "grad_norm": float(m["grad_norm"]),
                "tau_est": float(m["tau_est"]),
                "tau_blocks": float(m["tau_blocks"]),
                "acc": [float(x) for x in m["acc"][1:]],
                "lr": float(self.schedule(self.step - 1)),
                "step_s": dt,
            }
            rec |= {k: float(m[k]) for k in SELECTOR_METRICS if k in m}  # DFlash 2
            if self.step % c.eval.every == 0 or self.step == t.steps:
                val = self.validate()
                rec |= {k: (float(v) if np.ndim(v) == 0 else [float(x) for x in v[1:]]) for k, v in val.items()}
                score = self.best_score(rec)
                if score < self.best:
                    self.best = score
                    self.export("best")
            logf.write(json.dumps(rec) + "\n")
            logf.flush()
            shown = {"sel": f"{rec['selector_acc']:.2f}"} if "selector_acc" in rec else {}  # DFlash 2
            tau = f"{rec['tau_est']:.2f}"
            bar.set_postfix(loss=f"{rec['loss']:.3f}", acc1=f"{rec['acc'][0]:.2f}", tau=tau, **shown)
            bar.update(1)
            if self.step % c.ckpt.every == 0 or self.step == t.steps:
                self.save()
            last = rec
        bar.close()
        logf.close()
        if self.step == t.steps:
            self.log(f"wrote final drafter {self.export('drafter')}")
        return last


def _identity_layer(layer: dict) -> dict:
    """A drafter layer's freshly initialised parameters with its residual branches' output projections
    (attention ``o_proj`` and its bias, MLP ``down_proj``) zero: the layer maps its input to itself,
    whatever the rest holds (``TrainConfig.init_grow``). Its other weights stay random, so the zero
    projections get gradients at once and the layer grows out of the identity."""
    out = jax.tree.map(np.asarray, layer)
    for branch, names in (("self_attn", ("o_proj", "o_bias")), ("mlp", ("down_proj",))):
        out[branch] = {k: np.zeros_like(v) if k in names else v for k, v in out[branch].items()}
    return out


def _with_missing(tree: dict, fill: dict) -> dict:
    """``tree`` with the entries of ``fill`` it lacks (nested dicts merged key by key)."""
    out = dict(tree)
    for k, v in fill.items():
        if k not in out:
            out[k] = v
        elif isinstance(v, dict):
            out[k] = _with_missing(out[k], v)
    return out


def _check_batch_layout(c: TrainConfig, mesh) -> None:
    """The batch must split into ``grad_accum`` micro-batches, each over ``data`` x ``fsdp``, and
    the anchors into chunks.

    Raises:
      ConfigError: naming the fields and the numbers that do not divide.
    """
    t = c.train
    micro = t.batch_size // t.grad_accum
    if micro * t.grad_accum != t.batch_size:
        raise ConfigError(f"train.batch_size ({t.batch_size}) must be a multiple of train.grad_accum ({t.grad_accum})")
    if t.num_anchors % t.anchor_chunk:
        raise ConfigError(
            f"train.num_anchors ({t.num_anchors}) must be a multiple of train.anchor_chunk ({t.anchor_chunk})"
        )
    shards = mesh.shape["data"] * mesh.shape["fsdp"]
    if micro % shards:
        raise ConfigError(
            f"the micro-batch (train.batch_size / train.grad_accum = {micro}) must be a multiple "
            f"of data x fsdp = {shards} of mesh {c.mesh}"
        )
