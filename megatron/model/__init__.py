"""GPT model construction on megatron-core: layer specs, SDPA core attention, masks."""
