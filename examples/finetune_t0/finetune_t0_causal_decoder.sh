#!/bin/bash
# T0 multitask finetuning, causal decoder. Settings, sources and usage: finetune_t0.sh.
DECODER=causal exec bash "$(dirname "$0")/finetune_t0.sh" "$@"
