#!/bin/bash
# T0-style multitask prompted finetuning of a pretrained GPT with DeepSpeed; DECODER=causal (default)
# or DECODER=non-causal (--prefix-lm). Called by finetune_t0_causal_decoder.sh and
# finetune_t0_non_causal_decoder.sh:
#
#   PRETRAINED=checkpoints/gpt-6b3 TRAIN_DATA=data/p3_train VALID_SPLITS_FILE=valid_splits.txt \
#       bash examples/finetune_t0/finetune_t0_causal_decoder.sh
#
# --prefix-lm (non-causal): each segment's input tokens attend to each other bidirectionally,
# targets attend causally (the "non-causal decoder" of the BigScience MTF study); the loss stays on
# targets only. A restart resumes from $SAVE when it holds a checkpoint; otherwise the run starts
# from the PRETRAINED weights (--finetune: weights only).
#
# Data: tools/preprocess_data.py --json-keys inputs targets --append-eod writes
# PREFIX_inputs_document / PREFIX_targets_document; TRAIN_DATA is that PREFIX.
# VALID_SPLITS_FILE (optional) holds one validation group per line (or BigScience's quoted
# one-line form), e.g.  "P3_VALID_A: 1 0:1 data/p3_valid_a"  -- each group is evaluated and
# logged under its own name. Using T0's own validation data this way (rather than carving 5% off
# the training set) is what the BigScience discussion settled on.
#
# Hyper-parameters (all overridable from the environment), sources:
#  * Optimizer Adafactor, constant LR, no warmup, no weight decay: BigScience Megatron-DeepSpeed
#    "Add t0 scripts" discussion (Muennighoff / thomasw21): T0 & FLAN use Adafactor, whose relative
#    step size makes schedules less needed; "keeping a constant conservative LR of 1e-5"; "no warmup
#    as you have constant learning rate"; "no weight decay". (T0 itself, Sanh et al. 2021, used
#    Adafactor with lr 1e-3 on T5, an encoder-decoder; 1e-5 is the value settled on for the
#    decoder-only GPT models.)
#  * Batch of 1024 packed sequences, dropout 0.1, 12,200 steps: T0 paper (Sanh et al. 2021,
#    "Multitask Prompted Training Enables Zero-Shot Task Generalization", training details).
#  * Model shape: the BigScience 6B3 config the discussion checked against (30 layers, 4096 hidden,
#    32 heads, 2048 tokens) -- it must match the PRETRAINED checkpoint.
#  * --norm-target-loss: each target counts equally (BigScience MTF finetuning).
set -euo pipefail
cd "$(dirname "$0")/../.."

NUM_GPUS=${NUM_GPUS:-8}
PRETRAINED=${PRETRAINED:?set PRETRAINED to the pretrained checkpoint directory (--finetune --load)}
TRAIN_DATA=${TRAIN_DATA:?set TRAIN_DATA to the preprocessed MTF prefix}
VALID_SPLITS_FILE=${VALID_SPLITS_FILE:-}
DECODER=${DECODER:-causal}
case "$DECODER" in
    causal) DECODER_ARGS=() ;;
    non-causal) DECODER_ARGS=(--prefix-lm) ;;
    *) echo "DECODER=$DECODER: expected causal or non-causal" >&2; exit 2 ;;
esac
SAVE=${SAVE:-checkpoints/t0-$DECODER-decoder}
NLAYERS=${NLAYERS:-30}; NHIDDEN=${NHIDDEN:-4096}; NHEADS=${NHEADS:-32}; SEQ_LEN=${SEQ_LEN:-2048}
MICRO_BATCH_SIZE=${MICRO_BATCH_SIZE:-1}
GLOBAL_BATCH_SIZE=${GLOBAL_BATCH_SIZE:-1024}
TRAIN_ITERS=${TRAIN_ITERS:-12200}
LR=${LR:-1e-5}
TOKENIZER_ARGS=${TOKENIZER_ARGS:---tokenizer-type HuggingFaceTokenizer --tokenizer-model ${TOKENIZER_MODEL:-tokenizer/tokenizer.json}}  # the pretraining tokenizer

if [ -f "$SAVE/latest_checkpointed_iteration.txt" ]; then
    LOAD_ARGS=(--load "$SAVE")                      # resume this finetuning run
else
    LOAD_ARGS=(--finetune --load "$PRETRAINED")     # start from the pretrained weights
fi
VALID_ARGS=()
if [ -n "$VALID_SPLITS_FILE" ]; then
    VALID_ARGS=(--valid-weighted-split-paths-path "$VALID_SPLITS_FILE")
fi

deepspeed --num_gpus "$NUM_GPUS" finetune_t0.py \
    --num-layers "$NLAYERS" --hidden-size "$NHIDDEN" --num-attention-heads "$NHEADS" \
    --seq-length "$SEQ_LEN" --max-position-embeddings "$SEQ_LEN" \
    --micro-batch-size "$MICRO_BATCH_SIZE" --global-batch-size "$GLOBAL_BATCH_SIZE" \
    --train-iters "$TRAIN_ITERS" \
    --optimizer adafactor --lr "$LR" --lr-decay-style constant --lr-warmup-iters 0 \
    --weight-decay 0 --clip-grad 1.0 \
    --hidden-dropout 0.1 --attention-dropout 0.1 \
    --bf16 --zero-stage 1 \
    $TOKENIZER_ARGS \
    --train-weighted-split-paths "TRAIN: 1 0:1 $TRAIN_DATA" \
    "${VALID_ARGS[@]}" \
    "${DECODER_ARGS[@]}" --loss-on-targets-only --norm-target-loss \
    "${LOAD_ARGS[@]}" --save "$SAVE" --save-interval 500 \
    --log-interval 10 --eval-interval 250 --eval-iters 10 \
    --metrics-jsonl "$SAVE/metrics.jsonl" --tensorboard-dir "$SAVE/tensorboard" \
    "$@"
