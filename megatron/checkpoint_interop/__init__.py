"""Checkpoints beyond the run that wrote them: the model flags they record (``model_args.py``),
the full (TP=1, PP=1) model state of a checkpoint of any layout (``full_state.py``), writing a
full state as a checkpoint of a given layout (``write_checkpoint.py``) and the Hugging Face
transformers mapping (``hf_families.py``)."""
