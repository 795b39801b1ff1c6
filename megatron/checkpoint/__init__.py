"""Checkpoints: the one home of the on-disk format and of everything that reads or writes it.

- ``format.py``: directory names, the tracker, and the JSON records (``parallel_layout.json``,
  ``model_args.json``, ``param_index.json``), each read and written in one place;
- ``shards.py``: tensor-parallel merge/split and vocabulary rows;
- ``reader.py``: the one reader, full tensors by canonical name, of any layout;
- ``engine.py``: save/load through the DeepSpeed engine, with RNG states (``engine_index.py``:
  the live engine's parameter index; ``reshard.py``: a checkpoint of another layout written into
  this run's engine, ZeRO partitions included);
- ``writer.py``: the offline writer for any TP x PP;
- ``model_args.py``: the model flags a checkpoint records (the record is made, and
  ``--use-checkpoint-args`` applied, by megatron/config/checkpoint_args.py);
- ``hf/``: the Hugging Face transformers families, one adapter per family.

Parameter names (canonical, pipe, Transformer Engine) and the tensor-parallel split by name are
megatron/model/param_names.py. Import the submodules directly; this package imports nothing, so
reading a record does not pull in DeepSpeed.
"""
