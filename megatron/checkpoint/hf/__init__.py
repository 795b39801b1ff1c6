"""The Hugging Face transformers families of this project's GPT model (GPT-2, Llama, BLOOM,
Mixtral), one state-dict adapter per family:

- ``adapter.py``: :class:`Family`, the interface each family implements (its ``config.json``
  from the model flags and back, its checks, each canonical tensor to and from its transformers
  tensors), the grouped QKV layout (``split_qkv``/``merge_qkv``) and shared helpers;
- ``gpt2.py``, ``llama.py``, ``bloom.py``, ``mixtral.py``: one adapter each (Mixtral's extends
  Llama's; ``mixtral.py`` also reads transformers' fused experts, ``per_expert_view``);
- ``families.py``: choosing the family (``family_of``, ``check_exportable``) and the functions
  the converters call (``to_hf``, ``hf_config``, ``from_hf``, ``flags_from_hf_config``,
  ``canonical_names``, ``canonical_shapes``, ``hf_sources``), delegating to the chosen adapter.

Import the submodules directly; this package imports nothing.
"""
