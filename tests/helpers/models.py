"""The model builders of a validated namespace: megatron/model/'s builders take the run's typed
configs (``args.run_config.transformer`` and ``.model``) and the vocabulary rows the tokenizer
set-up gives (``args.padded_vocab_size``, ``args.vocab_size``); these read them from ``args``,
with ``changes`` to the ``ModelConfig`` (e.g. another ``partition_method``) where a test asks."""
import dataclasses


def model_config(args, **changes):
    """``args.run_config.model`` with ``changes``."""
    return dataclasses.replace(args.run_config.model, **changes)


def gpt_model(args, **changes):
    """``build_gpt_model`` of ``args`` (``args.padded_vocab_size`` set)."""
    from megatron.model.gpt_model import build_gpt_model

    return build_gpt_model(args.run_config.transformer, model_config(args, **changes),
                           args.padded_vocab_size, getattr(args, "vocab_size", None))


def gpt_model_pipe(args, **changes):
    """``build_gpt_model_pipe`` of ``args`` (``args.padded_vocab_size`` set)."""
    from megatron.model.gpt_model_pipe import build_gpt_model_pipe

    return build_gpt_model_pipe(args.run_config.transformer, model_config(args, **changes),
                                args.padded_vocab_size, getattr(args, "vocab_size", None))


def model_for_layout(args):
    """``gpt_model_for_layout`` of ``args``: a model provider as the entry points'."""
    from megatron.model.gpt_model_pipe import gpt_model_for_layout

    return gpt_model_for_layout(args.run_config.transformer, args.run_config.model,
                                args.padded_vocab_size, getattr(args, "vocab_size", None))


def layer_spec(args, **changes):
    """``gpt_layer_spec`` of ``args`` (logs the backend and fusions, as building does)."""
    from megatron.model.gpt_model import gpt_layer_spec

    return gpt_layer_spec(model_config(args, **changes), args.run_config.transformer)
