"""The optimiser and the jitted update of the drafter trainer.

``train_step`` is one optimiser update over ``accum`` micro-batches; the anchors of every
micro-batch are drawn first, so the loss is normalised by the weight sum of the whole global
batch (SPEC "Training" 6). ``sharded_step`` jits it with explicit shardings over a mesh, laid out
by the logical-axis table (``sharding``).
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import optax

from dflash_jax import loss as loss_lib
from dflash_jax.drafter import drafter_logical_specs
from dflash_jax.sharding import axis_rules, batch_shardings, logical_to_sharding, named_sharding


def make_schedule(t) -> optax.Schedule:
    """Learning rate: linear warmup over ``warmup_frac * steps``, then cosine decay to 0 at ``steps``.

    ``t``: the ``train`` settings (``train_config.TrainSettings``: ``lr``, ``warmup_frac``, ``steps``)."""
    warmup = max(1, int(round(t.warmup_frac * t.steps)))
    return optax.warmup_cosine_decay_schedule(
        0.0, t.lr, warmup_steps=warmup, decay_steps=max(t.steps, warmup + 1), end_value=0.0
    )


def make_optimizer(t) -> optax.GradientTransformation:
    """AdamW on the warmup-cosine schedule, after global-norm clipping (SPEC "Training" 7).

    With ``t.copy_bias_lr`` (> 0) the drafter's copy-bias table (``drafter.copy_prior``, logit
    units, where Adam's steps of about ``lr`` would take thousands of updates to move it by one)
    has its own peak learning rate on the same schedule (its AdamW updates scaled by
    ``copy_bias_lr / lr``).

    ``t``: the ``train`` settings (``train_config.TrainSettings``; every field but the loss's read)."""
    parts = [
        optax.clip_by_global_norm(t.grad_clip),
        optax.adamw(make_schedule(t), b1=t.b1, b2=t.b2, weight_decay=t.weight_decay),
    ]
    if t.copy_bias_lr:
        ratio = t.copy_bias_lr / t.lr
        parts.append(optax.stateless(lambda u, params=None: {**u, "copy_bias": u["copy_bias"] * ratio}))
    return optax.chain(*parts)


def train_step(
    params,
    opt_state,
    target_params,
    batch,
    rng,
    *,
    tcfg,
    dcfg,
    opt,
    num_anchors: int,
    loss: loss_lib.LossSettings,
    selector_alpha: float = 1.0,
):
    """One optimiser update over ``accum`` micro-batches.

    The loss is the block loss (``loss``: its settings, ``loss.LossSettings``), plus for a DFlash 2
    drafter ``selector_alpha`` times its selector loss (``loss_lib.selector_loss``; with
    ``loss.selector_stop_grad`` it trains the selector alone), both normalised by the global weight
    sum. ``num_anchors`` anchors are drawn per sequence of every micro-batch.

    Args:
      batch: ``{"tokens": int32 [accum, b, T], "loss_mask": bool [accum, b, T]}``, and
        ``"features"`` float32 ``[accum, b, T, F]`` with stored target features
        (``train.stored_features``; else the target computes them).
      rng: the step's key (``fold_in(run_key, step)``).
    Returns:
      ``(params, opt_state, metrics)``; metrics are float32 scalars / ``[B]`` arrays.
    """
    accum = batch["tokens"].shape[0]
    keys = jax.random.split(rng, accum)
    anchors = jax.vmap(loss_lib.sample_anchors, (0, 0, None))(keys, batch["loss_mask"], num_anchors)
    w = loss_lib.offset_weights(dcfg.block_size, loss.gamma, loss.loss_offsets)
    _, use = jax.vmap(loss_lib.block_labels, (0, 0, 0, None))(
        batch["tokens"], batch["loss_mask"], anchors, dcfg.block_size
    )
    total_weight = jnp.maximum(jnp.sum(use * w), 1e-6)  # the whole global batch, every micro-batch

    def micro(carry, xs):
        grads, stats = carry
        tokens, mask, anc, feats = xs

        def loss_of(p):
            s = loss_lib.block_loss(
                p, target_params, tokens, mask, anc, tcfg=tcfg, cfg=dcfg, feats=feats, **loss.kwargs()
            )
            return (s.loss + selector_alpha * s.selector_loss) / total_weight, s

        (_, s), g = jax.value_and_grad(loss_of, has_aux=True)(params)
        return (jax.tree.map(jnp.add, grads, g), jax.tree.map(jnp.add, stats, s)), None

    zeros = jax.tree.map(jnp.zeros_like, params)
    stats0 = loss_lib.BlockStats.zeros(dcfg.block_size)
    xs = (batch["tokens"], batch["loss_mask"], anchors, batch.get("features"))
    (grads, stats), _ = jax.lax.scan(micro, (zeros, stats0), xs)
    updates, opt_state = opt.update(grads, opt_state, params)
    params = optax.apply_updates(params, updates)
    return params, opt_state, summarise(stats, dcfg.dflash2) | {"grad_norm": optax.tree.norm(grads)}


def sharded_step(
    mesh,
    params,
    target_params,
    *,
    tcfg,
    dcfg,
    opt,
    num_anchors: int,
    loss: loss_lib.LossSettings,
    stored_features: bool = False,
    selector_alpha: float = 1.0,
):
    """``train_step`` jitted with explicit shardings over ``mesh`` (the old ``pjit``).

    Parameters of the drafter and the frozen target are laid out by the logical-axis table
    (``dflash_jax.sharding``); the batch ``[accum, b, T]`` is split over ``data`` x ``fsdp`` along
    ``b``; the optimiser state follows the parameters; metrics are replicated. With
    ``stored_features`` the batch also carries ``"features"`` ``[accum, b, T, F]``, split the same way.

    Returns:
      ``(step_fn, param_shardings, batch_shardings, opt_shardings)``: ``batch_shardings`` is
      ``sharding.batch_shardings`` (a dict by batch key); ``step_fn(params, opt_state, target_params,
      batch, rng)`` donates ``params`` and ``opt_state``.
    """
    param_sh = logical_to_sharding(drafter_logical_specs(dcfg), mesh)
    target_sh = jax.tree.map(lambda x: x.sharding, target_params)
    rep = named_sharding(mesh)
    # the optimiser moments mirror the parameter tree: each takes its parameter's sharding; the rest
    # (step counts) is replicated
    opt_sh = optax.tree_map_params(
        opt, lambda _, sh: sh, jax.eval_shape(opt.init, params), param_sh, transform_non_params=lambda _: rep
    )
    batch_sh = batch_shardings(mesh, stored_features)
    step = partial(
        train_step, tcfg=tcfg, dcfg=dcfg, opt=opt, num_anchors=num_anchors, loss=loss, selector_alpha=selector_alpha
    )
    jitted = jax.jit(
        step,
        in_shardings=(param_sh, opt_sh, target_sh, batch_sh, rep),
        out_shardings=(param_sh, opt_sh, rep),
        donate_argnums=(0, 1),
    )

    def run(*args):
        with axis_rules(), jax.set_mesh(mesh):
            return jitted(*args)

    run.jitted = jitted  # for ahead-of-time lowering (experiments/memory_plan.py)
    return run, param_sh, batch_sh, opt_sh


def summarise(s: loss_lib.BlockStats, dflash2: bool = False) -> dict:
    """Loss, per-offset accuracy and two acceptance-length estimates from summed ``BlockStats``;
    with ``dflash2`` also the selector's loss (same normalisation as ``loss``), its teacher-forced
    accuracy and the head's top-k coverage of the gold token (fractions of counted labels)."""
    acc = s.correct / jnp.maximum(s.count, 1.0)
    out = {
        "loss": s.loss / jnp.maximum(s.weight, 1e-6),
        "acc": acc,
        "tau_est": loss_lib.tau_estimate(s.count, s.correct),
        "tau_blocks": 1.0 + s.prefix / jnp.maximum(s.blocks, 1.0),
    }
    if dflash2:
        labels = jnp.maximum(s.count.sum(), 1.0)
        out |= {
            "selector_loss": s.selector_loss / jnp.maximum(s.weight, 1e-6),
            "selector_acc": s.selector_correct / labels,
            "topk_coverage": s.covered / labels,
        }
    return out


def eval_stats(params, target_params, batch, rng, *, tcfg, dcfg, num_anchors: int, loss: loss_lib.LossSettings):
    """Summed ``BlockStats`` of a validation batch laid out like a training batch with one
    micro-batch (``[1, b, T]``, ``pipeline.global_batch``); anchors from ``rng``; the loss is the
    training ``objective``'s."""
    batch = jax.tree.map(lambda x: x[0], batch)
    anchors = loss_lib.sample_anchors(rng, batch["loss_mask"], num_anchors)
    tokens, mask, feats = batch["tokens"], batch["loss_mask"], batch.get("features")
    return loss_lib.block_loss(
        params, target_params, tokens, mask, anchors, tcfg=tcfg, cfg=dcfg, feats=feats, **loss.kwargs()
    )
