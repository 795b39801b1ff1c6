"""Learning-rate and weight-decay scheduling of the optimizer's parameter groups.

Steps are counted in samples, as Megatron-LM does: iteration-based flags are multiplied by the global
batch size, and the loop advances the scheduler by the global batch of each iteration.
"""
from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler


def scheduler_steps_from_args(args) -> dict:
    """Warmup, decay, WSD-decay and weight-decay-increment spans in samples (Megatron-LM's rule)."""
    if args.train_samples is None:
        gbs = args.global_batch_size
        decay_iters = args.lr_decay_iters if args.lr_decay_iters is not None else args.train_iters
        decay = decay_iters * gbs
        warmup = (args.lr_warmup_fraction * decay if args.lr_warmup_fraction is not None
                  else args.lr_warmup_iters * gbs)
        wsd = args.lr_wsd_decay_iters * gbs if args.lr_wsd_decay_iters else None
        wd_incr = args.train_iters * gbs
    else:
        decay = args.lr_decay_samples if args.lr_decay_samples is not None else args.train_samples
        warmup = (args.lr_warmup_fraction * decay if args.lr_warmup_fraction is not None
                  else args.lr_warmup_samples)
        wsd = args.lr_wsd_decay_samples
        wd_incr = args.train_samples
    return {"lr_warmup_steps": warmup, "lr_decay_steps": decay, "wsd_decay_steps": wsd,
            "wd_incr_steps": wd_incr}


def build_opt_param_scheduler(args, optimizer) -> OptimizerParamScheduler:
    """The scheduler for ``optimizer``'s param groups from the LR/WD flags."""
    steps = scheduler_steps_from_args(args)
    if steps["lr_warmup_steps"] >= steps["lr_decay_steps"]:
        raise ValueError(f"warmup ({steps['lr_warmup_steps']} samples) must be shorter than the "
                         f"decay span ({steps['lr_decay_steps']} samples): check --lr-warmup-* "
                         "against --lr-decay-* / --train-*")
    return OptimizerParamScheduler(
        optimizer,
        init_lr=args.lr_warmup_init,
        max_lr=args.lr,
        min_lr=args.min_lr,
        lr_warmup_steps=steps["lr_warmup_steps"],
        lr_decay_steps=steps["lr_decay_steps"],
        lr_decay_style=args.lr_decay_style,
        start_wd=args.start_weight_decay,
        end_wd=args.end_weight_decay,
        wd_incr_steps=steps["wd_incr_steps"],
        wd_incr_style=args.weight_decay_incr_style,
        use_checkpoint_opt_param_scheduler=args.use_checkpoint_opt_param_scheduler,
        override_opt_param_scheduler=args.override_opt_param_scheduler,
        wsd_decay_steps=steps["wsd_decay_steps"],
        lr_wsd_decay_style=args.lr_wsd_decay_style,
    )
