#!/bin/bash
# T0 multitask finetuning, non-causal decoder (--prefix-lm). Settings, sources and usage: finetune_t0.sh.
DECODER=non-causal exec bash "$(dirname "$0")/finetune_t0.sh" "$@"
