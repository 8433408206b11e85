#!/bin/bash
#SBATCH --job-name=llama3-8b-pretrain
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1        # one torchrun per node
#SBATCH --gpus-per-node=8
#SBATCH --exclusive
#SBATCH --time=04:00:00

# LLaMA-3-8B pretraining on 2 nodes x 8 GPUs (H100 80GB): tensor parallel 2 with sequence
# parallelism, no pipeline parallelism, data parallel 8, bf16, distributed optimizer.
#
# Submit with `sbatch examples/llama3_8b_pretrain.sh`; the paths below can be overridden
# from the environment.  megatron-estimator reads this file as it is: the world size
# (2 nodes x 8 processes) comes from the torchrun options and the #SBATCH lines above.

set -euo pipefail

export CUDA_DEVICE_MAX_CONNECTIONS=1
export NVTE_FWD_LAYERNORM_SM_MARGIN=16
export NVTE_BWD_LAYERNORM_SM_MARGIN=16

MEGATRON_PATH=${MEGATRON_PATH:-/opt/megatron-lm}
DATA_PATH=${DATA_PATH:-/data/llama3/fineweb_text_document}
CHECKPOINT_PATH=${CHECKPOINT_PATH:-/checkpoints/llama3-8b}
TOKENIZER_MODEL=${TOKENIZER_MODEL:-meta-llama/Meta-Llama-3-8B}

GPUS_PER_NODE=8
NUM_NODES=${SLURM_NNODES:-2}
MASTER_ADDR=${MASTER_ADDR:-$(scontrol show hostnames "${SLURM_JOB_NODELIST:-localhost}" | head -n 1)}
MASTER_PORT=29500

TP=2
PP=1
MICRO_BATCH_SIZE=1
GLOBAL_BATCH_SIZE=128
SEQ_LENGTH=8192

DISTRIBUTED_ARGS=(
    --nproc_per_node $GPUS_PER_NODE
    --nnodes $NUM_NODES
    --rdzv-backend c10d
    --rdzv-endpoint "$MASTER_ADDR:$MASTER_PORT"
    --rdzv-id "${SLURM_JOB_ID:-llama3-8b}"
)

# The LLaMA-3-8B architecture (32 layers, grouped-query attention with 8 KV heads).
MODEL_ARGS=(
    --use-mcore-models
    --transformer-impl transformer_engine
    --num-layers 32
    --hidden-size 4096
    --ffn-hidden-size 14336
    --num-attention-heads 32
    --group-query-attention
    --num-query-groups 8
    --kv-channels 128
    --seq-length $SEQ_LENGTH
    --max-position-embeddings $SEQ_LENGTH
    --position-embedding-type rope
    --rotary-base 500000
    --rotary-percent 1.0
    --normalization RMSNorm
    --norm-epsilon 1e-5
    --swiglu
    --untie-embeddings-and-output-weights
    --disable-bias-linear
    --attention-dropout 0.0
    --hidden-dropout 0.0
    --init-method-std 0.02
)

TRAINING_ARGS=(
    --micro-batch-size $MICRO_BATCH_SIZE
    --global-batch-size $GLOBAL_BATCH_SIZE
    --train-iters 20000
    --lr 3.0e-4
    --min-lr 3.0e-5
    --lr-decay-style cosine
    --lr-warmup-iters 500
    --weight-decay 0.1
    --adam-beta1 0.9
    --adam-beta2 0.95
    --clip-grad 1.0
    --bf16
    --use-distributed-optimizer
    --overlap-grad-reduce
    --overlap-param-gather
)

MODEL_PARALLEL_ARGS=(
    --tensor-model-parallel-size $TP
    --pipeline-model-parallel-size $PP
    --sequence-parallel
)

DATA_ARGS=(
    --data-path "$DATA_PATH"
    --tokenizer-type HuggingFaceTokenizer
    --tokenizer-model "$TOKENIZER_MODEL"
    --vocab-size 128256
    --split 99,1,0
)

CHECKPOINT_AND_LOGGING_ARGS=(
    --save "$CHECKPOINT_PATH"
    --load "$CHECKPOINT_PATH"
    --ckpt-format torch_dist
    --save-interval 1000
    --eval-interval 1000
    --eval-iters 10
    --log-interval 10
    --log-throughput
)

srun --ntasks-per-node=1 torchrun "${DISTRIBUTED_ARGS[@]}" "${MEGATRON_PATH}/pretrain_gpt.py" \
    "${MODEL_ARGS[@]}" \
    "${TRAINING_ARGS[@]}" \
    "${MODEL_PARALLEL_ARGS[@]}" \
    "${DATA_ARGS[@]}" \
    "${CHECKPOINT_AND_LOGGING_ARGS[@]}"
