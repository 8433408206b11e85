"""schemas/seed-config.schema.json as a Python literal (written by scripts/gen_schema_data.py; do
not edit: edit the JSON file and rerun the script).  inputs/seed_yaml.py loads it without ``json``."""

SEED_SCHEMA = {'$schema': 'https://json-schema.org/draft/2020-12/schema',
 '$id': 'https://github.com/megatron-estimator/megatron-estimator/schemas/seed-config.schema.json',
 'title': 'megatron-estimator seed configuration',
 'description': 'The YAML format of the seed tool (yzlnew/infra-skills megatron-memory-estimator; sections '
                'model, parallelism, training, precision, and world_size under training: or at the top '
                'level), read by megatron_estimator.inputs.seed_yaml. What a file does not say takes the '
                "seed's defaults: the guide's stated ones and the model the seed's scripts build (rotary "
                'positions, untied output layer, no linear biases, RMSNorm, SwiGLU, grouped-GEMM experts, '
                'expert tensor parallel 1, distributed optimizer, bf16); keys the file sets win. null means '
                "unset for every key. Keys marked 'Extension' are not in the seed's files.",
 'type': 'object',
 'properties': {'model': {'type': 'object',
                          'description': 'The model architecture.',
                          'properties': {'num_layers': {'type': 'integer',
                                                        'minimum': 1,
                                                        'description': 'Transformer layers (--num-layers). '
                                                                       'Required.'},
                                         'hidden_size': {'type': 'integer',
                                                         'minimum': 1,
                                                         'description': 'Hidden size (--hidden-size). '
                                                                        'Required; Megatron needs it '
                                                                        'divisible by num_attention_heads '
                                                                        'unless kv_channels is set.'},
                                         'num_attention_heads': {'type': 'integer',
                                                                 'minimum': 1,
                                                                 'description': 'Attention heads '
                                                                                '(--num-attention-heads). '
                                                                                'Required.'},
                                         'num_query_groups': {'type': ['integer', 'null'],
                                                              'minimum': 1,
                                                              'description': 'Query groups for grouped-query '
                                                                             'attention. Absent or null: one '
                                                                             'per head (plain multi-head '
                                                                             'attention). A value other than '
                                                                             'num_attention_heads becomes '
                                                                             '--group-query-attention '
                                                                             '--num-query-groups N.'},
                                         'ffn_hidden_size': {'type': ['integer', 'null'],
                                                             'minimum': 1,
                                                             'description': 'MLP hidden size '
                                                                            '(--ffn-hidden-size). The seed '
                                                                            'guide calls it required; '
                                                                            'Megatron derives it when absent '
                                                                            '(4 * hidden_size, or int(4 * '
                                                                            'hidden_size * 2 / 3 / 64) * 64 '
                                                                            'with swiglu; '
                                                                            'megatron/training/arguments.py '
                                                                            'validate_args) and so does this '
                                                                            'format. Real models rarely use '
                                                                            'the derived value, so set it.'},
                                         'num_experts': {'type': ['integer', 'null'],
                                                         'minimum': 1,
                                                         'description': 'Routed experts of each MoE layer '
                                                                        '(--num-experts). Absent or null: a '
                                                                        'dense model.'},
                                         'moe_router_topk': {'type': ['integer', 'null'],
                                                             'minimum': 1,
                                                             'description': 'Experts each token is routed to '
                                                                            '(--moe-router-topk, seed and '
                                                                            'Megatron default 2).'},
                                         'moe_ffn_hidden_size': {'type': ['integer', 'null'],
                                                                 'minimum': 1,
                                                                 'description': 'MLP hidden size of each '
                                                                                'expert '
                                                                                '(--moe-ffn-hidden-size). '
                                                                                'Absent or null: '
                                                                                'ffn_hidden_size.'},
                                         'moe_shared_expert_intermediate_size': {'type': ['integer', 'null'],
                                                                                 'minimum': 1,
                                                                                 'description': 'Total '
                                                                                                'hidden size '
                                                                                                'of the '
                                                                                                'shared '
                                                                                                'experts '
                                                                                                '(--moe-shared-expert-intermediate-size). '
                                                                                                'Absent or '
                                                                                                'null: no '
                                                                                                'shared '
                                                                                                'expert.'},
                                         'moe_grouped_gemm': {'type': ['boolean', 'null'],
                                                              'description': 'Extension, not in the seed '
                                                                             'guide. --moe-grouped-gemm. '
                                                                             'Seed default true for a MoE '
                                                                             "model (the seed's estimator "
                                                                             'builds grouped-GEMM experts); '
                                                                             "Megatron's flag default is "
                                                                             'false.'},
                                         'vocab_size': {'type': 'integer',
                                                        'minimum': 1,
                                                        'description': 'Tokenizer vocabulary size before '
                                                                       'padding (--vocab-size). Required. '
                                                                       'Megatron pads it to a multiple of '
                                                                       '128 * tensor_model_parallel_size.'},
                                         'max_position_embeddings': {'type': 'integer',
                                                                     'minimum': 1,
                                                                     'description': 'Maximum sequence length '
                                                                                    '(--max-position-embeddings). '
                                                                                    'Required; must be at '
                                                                                    'least seq_length.'},
                                         'normalization': {'enum': ['RMSNorm', 'LayerNorm', None],
                                                           'description': 'Normalization (--normalization). '
                                                                          "Seed default RMSNorm; Megatron's "
                                                                          'flag default is LayerNorm.'},
                                         'layernorm_epsilon': {'type': ['number', 'null'],
                                                               'exclusiveMinimum': 0,
                                                               'description': 'Normalization epsilon '
                                                                              '(--norm-epsilon, default '
                                                                              '1e-5). YAML 1.1 reads 1e-5 as '
                                                                              'a string: write 1.0e-5.'},
                                         'activation_func': {'enum': ['swiglu', 'gelu', 'squared_relu', None],
                                                             'description': 'MLP activation. Seed default '
                                                                            'swiglu (--swiglu); gelu is '
                                                                            "Megatron's default; "
                                                                            'squared_relu is '
                                                                            '--squared-relu.'},
                                         'gated_linear_unit': {'type': ['boolean', 'null'],
                                                               'description': 'Gated MLP. Follows '
                                                                              'activation_func when absent: '
                                                                              'true for swiglu, false '
                                                                              "otherwise. Megatron's flags "
                                                                              'make the MLP gated only '
                                                                              'through --swiglu, so true '
                                                                              'needs swiglu and false '
                                                                              'excludes it.'},
                                         'qk_layernorm': {'type': ['boolean', 'null'],
                                                          'description': 'Normalize queries and keys '
                                                                         '(--qk-layernorm, default false).'},
                                         'multi_latent_attention': {'type': ['boolean', 'null'],
                                                                    'description': 'Multi-latent attention '
                                                                                   '(--multi-latent-attention, '
                                                                                   'default false).'},
                                         'fp16_lm_cross_entropy': {'type': ['boolean', 'null'],
                                                                   'description': '--fp16-lm-cross-entropy: '
                                                                                  "the output layer's cross "
                                                                                  'entropy in fp16 (default '
                                                                                  'false; Megatron needs '
                                                                                  '--fp16 for it, that is '
                                                                                  'params_dtype: fp16).'},
                                         'position_embedding_type': {'enum': ['learned_absolute',
                                                                              'rope',
                                                                              'yarn',
                                                                              'mrope',
                                                                              'relative',
                                                                              'none',
                                                                              None],
                                                                     'description': 'Extension, not in the '
                                                                                    'seed guide. '
                                                                                    '--position-embedding-type. '
                                                                                    'Seed default rope (the '
                                                                                    "seed's model uses "
                                                                                    'rotary embeddings over '
                                                                                    'the whole head, '
                                                                                    'rotary_percent 1.0, '
                                                                                    "base 10000); Megatron's "
                                                                                    'flag default '
                                                                                    'learned_absolute adds a '
                                                                                    'max_position_embeddings '
                                                                                    'x hidden_size table.'},
                                         'untie_embeddings_and_output_weights': {'type': ['boolean', 'null'],
                                                                                 'description': 'Extension, '
                                                                                                'not in the '
                                                                                                'seed guide. '
                                                                                                '--untie-embeddings-and-output-weights. '
                                                                                                'Seed '
                                                                                                'default '
                                                                                                'true (the '
                                                                                                "seed's "
                                                                                                'model has '
                                                                                                'its own '
                                                                                                'output '
                                                                                                'layer); '
                                                                                                "Megatron's "
                                                                                                'flag '
                                                                                                'default '
                                                                                                'false ties '
                                                                                                'the output '
                                                                                                'layer to '
                                                                                                'the input '
                                                                                                'embedding.'},
                                         'add_bias_linear': {'type': ['boolean', 'null'],
                                                             'description': 'Extension, not in the seed '
                                                                            'guide. Biases in the linear '
                                                                            'layers. Seed default false (the '
                                                                            "seed's model has none: "
                                                                            '--disable-bias-linear); '
                                                                            "Megatron's flag default is "
                                                                            'true.'},
                                         'add_qkv_bias': {'type': ['boolean', 'null'],
                                                          'description': 'Extension, not in the seed guide. '
                                                                         '--add-qkv-bias (seed and Megatron '
                                                                         'default false).'},
                                         'hidden_dropout': {'type': ['number', 'null'],
                                                            'minimum': 0,
                                                            'maximum': 1,
                                                            'description': 'Extension, not in the seed '
                                                                           'guide. --hidden-dropout; '
                                                                           "Megatron's default 0.1, which "
                                                                           "the seed's model keeps too."},
                                         'attention_dropout': {'type': ['number', 'null'],
                                                               'minimum': 0,
                                                               'maximum': 1,
                                                               'description': 'Extension, not in the seed '
                                                                              'guide. --attention-dropout; '
                                                                              "Megatron's default 0.1, which "
                                                                              "the seed's model keeps too."},
                                         'kv_channels': {'type': ['integer', 'null'],
                                                         'minimum': 1,
                                                         'description': 'Extension, not in the seed guide. '
                                                                        '--kv-channels (head dimension). '
                                                                        'Absent or null: hidden_size / '
                                                                        'num_attention_heads.'},
                                         'moe_layer_freq': {'oneOf': [{'type': 'integer', 'minimum': 1},
                                                                      {'type': 'array',
                                                                       'minItems': 1,
                                                                       'items': {'enum': [0, 1]}},
                                                                      {'type': 'null'}],
                                                            'description': 'Extension, not in the seed '
                                                                           'guide. --moe-layer-freq: every '
                                                                           'k-th layer is MoE (an integer k, '
                                                                           'default 1), or one 0/1 per '
                                                                           'layer.'},
                                         'q_lora_rank': {'type': ['integer', 'null'],
                                                         'minimum': 1,
                                                         'description': 'Extension, not in the seed guide. '
                                                                        '--q-lora-rank for multi-latent '
                                                                        'attention. Absent or null: no query '
                                                                        'down-projection.'},
                                         'kv_lora_rank': {'type': ['integer', 'null'],
                                                          'minimum': 1,
                                                          'description': 'Extension, not in the seed guide. '
                                                                         '--kv-lora-rank for multi-latent '
                                                                         'attention (default 32).'},
                                         'qk_head_dim': {'type': ['integer', 'null'],
                                                         'minimum': 1,
                                                         'description': 'Extension, not in the seed guide. '
                                                                        '--qk-head-dim for multi-latent '
                                                                        'attention (default 128).'},
                                         'qk_pos_emb_head_dim': {'type': ['integer', 'null'],
                                                                 'minimum': 1,
                                                                 'description': 'Extension, not in the seed '
                                                                                'guide. '
                                                                                '--qk-pos-emb-head-dim for '
                                                                                'multi-latent attention '
                                                                                '(default 64).'},
                                         'v_head_dim': {'type': ['integer', 'null'],
                                                        'minimum': 1,
                                                        'description': 'Extension, not in the seed guide. '
                                                                       '--v-head-dim for multi-latent '
                                                                       'attention (default 128).'}},
                          'required': ['num_layers',
                                       'hidden_size',
                                       'num_attention_heads',
                                       'vocab_size',
                                       'max_position_embeddings'],
                          'additionalProperties': False},
                'parallelism': {'type': 'object',
                                'description': 'How the model is split over GPUs.',
                                'properties': {'tensor_model_parallel_size': {'type': 'integer',
                                                                              'minimum': 1,
                                                                              'description': 'Tensor '
                                                                                             'parallel size '
                                                                                             '(--tensor-model-parallel-size). '
                                                                                             'Required.'},
                                               'pipeline_model_parallel_size': {'type': 'integer',
                                                                                'minimum': 1,
                                                                                'description': 'Pipeline '
                                                                                               'parallel '
                                                                                               'size '
                                                                                               '(--pipeline-model-parallel-size). '
                                                                                               'Required.'},
                                               'num_layers_in_first_pipeline_stage': {'type': ['integer',
                                                                                               'null'],
                                                                                      'minimum': 1,
                                                                                      'description': 'Layers '
                                                                                                     'on the '
                                                                                                     'first '
                                                                                                     'pipeline '
                                                                                                     'stage '
                                                                                                     'when '
                                                                                                     'the '
                                                                                                     'split '
                                                                                                     'is '
                                                                                                     'uneven '
                                                                                                     '(--decoder-first-pipeline-num-layers).'},
                                               'num_layers_in_last_pipeline_stage': {'type': ['integer',
                                                                                              'null'],
                                                                                     'minimum': 1,
                                                                                     'description': 'Layers '
                                                                                                    'on the '
                                                                                                    'last '
                                                                                                    'pipeline '
                                                                                                    'stage '
                                                                                                    'when '
                                                                                                    'the '
                                                                                                    'split '
                                                                                                    'is '
                                                                                                    'uneven '
                                                                                                    '(--decoder-last-pipeline-num-layers).'},
                                               'expert_model_parallel_size': {'type': ['integer', 'null'],
                                                                              'minimum': 1,
                                                                              'description': 'Expert '
                                                                                             'parallel size '
                                                                                             '(--expert-model-parallel-size, '
                                                                                             'default 1).'},
                                               'expert_tensor_parallel_size': {'type': ['integer', 'null'],
                                                                               'minimum': 1,
                                                                               'description': 'Tensor '
                                                                                              'parallel size '
                                                                                              'inside each '
                                                                                              'expert '
                                                                                              '(--expert-tensor-parallel-size). '
                                                                                              'Seed default '
                                                                                              '1 for a MoE '
                                                                                              'model (the '
                                                                                              "guide's "
                                                                                              'default; the '
                                                                                              "seed's "
                                                                                              'scripts read '
                                                                                              '1 when it is '
                                                                                              'absent); '
                                                                                              "Megatron's "
                                                                                              'default when '
                                                                                              'the flag is '
                                                                                              'absent is '
                                                                                              'tensor_model_parallel_size.'},
                                               'context_parallel_size': {'type': ['integer', 'null'],
                                                                         'minimum': 1,
                                                                         'description': 'Context parallel '
                                                                                        'size '
                                                                                        '(--context-parallel-size, '
                                                                                        'default 1). '
                                                                                        'Megatron does not '
                                                                                        'require '
                                                                                        'sequence_parallel '
                                                                                        'for it (the seed '
                                                                                        'guide says it '
                                                                                        'does).'},
                                               'virtual_pipeline_model_parallel_size': {'type': ['integer',
                                                                                                 'null'],
                                                                                        'minimum': 1,
                                                                                        'description': 'Model '
                                                                                                       'chunks '
                                                                                                       'per '
                                                                                                       'pipeline '
                                                                                                       'rank '
                                                                                                       'for '
                                                                                                       'the '
                                                                                                       'interleaved '
                                                                                                       'schedule '
                                                                                                       '(--num-virtual-stages-per-pipeline-rank). '
                                                                                                       'Absent '
                                                                                                       'or '
                                                                                                       'null: '
                                                                                                       'no '
                                                                                                       'interleaving.'}},
                                'required': ['tensor_model_parallel_size', 'pipeline_model_parallel_size'],
                                'additionalProperties': False},
                'training': {'type': 'object',
                             'description': 'Batch, optimizer and recomputation settings.',
                             'properties': {'micro_batch_size': {'type': 'integer',
                                                                 'minimum': 1,
                                                                 'description': 'Micro-batch size '
                                                                                '(--micro-batch-size). '
                                                                                'Required.'},
                                            'seq_length': {'type': 'integer',
                                                           'minimum': 1,
                                                           'description': 'Training sequence length '
                                                                          '(--seq-length). Required; at most '
                                                                          'max_position_embeddings.'},
                                            'global_batch_size': {'type': ['integer', 'null'],
                                                                  'minimum': 1,
                                                                  'description': 'Extension, not in the seed '
                                                                                 'guide. '
                                                                                 '--global-batch-size. '
                                                                                 'Absent: micro_batch_size * '
                                                                                 'data-parallel size, '
                                                                                 "Megatron's default (one "
                                                                                 'microbatch per step, which '
                                                                                 'understates '
                                                                                 'pipeline-parallel '
                                                                                 'activation memory).'},
                                            'use_distributed_optimizer': {'type': ['boolean', 'null'],
                                                                          'description': 'Shard the '
                                                                                         'optimizer state '
                                                                                         'over data-parallel '
                                                                                         'ranks. Seed '
                                                                                         'default true '
                                                                                         '(--use-distributed-optimizer); '
                                                                                         "Megatron's flag "
                                                                                         'default is false.'},
                                            'sequence_parallel': {'type': ['boolean', 'null'],
                                                                  'description': 'Sequence parallelism '
                                                                                 '(--sequence-parallel, '
                                                                                 'default false). It shards '
                                                                                 'the norm, dropout and '
                                                                                 'residual activations over '
                                                                                 'tensor-parallel ranks; '
                                                                                 'Megatron drops it when '
                                                                                 'tensor_model_parallel_size '
                                                                                 'is 1.'},
                                            'recompute_granularity': {'enum': ['full', 'selective', None],
                                                                      'description': 'Activation '
                                                                                     'recomputation '
                                                                                     '(--recompute-granularity). '
                                                                                     'Absent or null: none.'},
                                            'recompute_method': {'enum': ['uniform', 'block', None],
                                                                 'description': 'With full recomputation, '
                                                                                'which layers '
                                                                                '(--recompute-method); '
                                                                                'required with full, '
                                                                                'forbidden with selective.'},
                                            'recompute_num_layers': {'type': ['integer', 'null'],
                                                                     'minimum': 0,
                                                                     'description': '--recompute-num-layers: '
                                                                                    'with uniform, the '
                                                                                    'number of layers in '
                                                                                    'each recomputed group '
                                                                                    '(at least 1); with '
                                                                                    'block, the number of '
                                                                                    'layers recomputed on '
                                                                                    'each pipeline stage, 0 '
                                                                                    'recomputing none (the '
                                                                                    "seed guide's 'layers "
                                                                                    "not to recompute' is "
                                                                                    'wrong). Seed default 0 '
                                                                                    'with full recompute '
                                                                                    "(the seed's scripts "
                                                                                    'read 0 when it is '
                                                                                    'absent); must not be '
                                                                                    'set with selective.'},
                                            'recompute_modules': {'type': ['array', 'null'],
                                                                  'minItems': 1,
                                                                  'uniqueItems': True,
                                                                  'items': {'enum': ['core_attn',
                                                                                     'moe_act',
                                                                                     'layernorm',
                                                                                     'mla_up_proj',
                                                                                     'mlp',
                                                                                     'moe',
                                                                                     'shared_experts',
                                                                                     'gdn_norm_out',
                                                                                     'gdp_in_proj',
                                                                                     'gdp_qkv',
                                                                                     'mhc']},
                                                                  'description': 'Extension, not in the seed '
                                                                                 'guide. --recompute-modules '
                                                                                 'for selective '
                                                                                 "recomputation (Megatron's "
                                                                                 'default [core_attn]; the '
                                                                                 'allowed modules are those '
                                                                                 'of '
                                                                                 'megatron/core/transformer/transformer_config.py).'},
                                            'world_size': {'type': ['integer', 'null'],
                                                           'minimum': 1,
                                                           'description': 'Total number of GPUs, where the '
                                                                          "seed's scripts read it. Give it "
                                                                          'here or at the top level (not '
                                                                          'both with different values); the '
                                                                          "command line's --world-size "
                                                                          'overrides it.'}},
                             'required': ['micro_batch_size', 'seq_length'],
                             'additionalProperties': False},
                'precision': {'type': 'object',
                              'description': 'Numeric formats.',
                              'properties': {'params_dtype': {'enum': ['bf16', 'fp16', 'fp32', None],
                                                              'description': 'Parameter dtype. Seed default '
                                                                             'bf16 (--bf16); fp16 is --fp16; '
                                                                             'fp32 (an extension) is '
                                                                             "Megatron's default."},
                                             'fp8': {'enum': [False, True, 'hybrid', 'e4m3', None],
                                                     'description': 'FP8 compute (--fp8-format). true means '
                                                                    "hybrid, the format Megatron's examples "
                                                                    'use; a string names the format. Default '
                                                                    'false.'}},
                              'required': [],
                              'additionalProperties': False},
                'world_size': {'type': ['integer', 'null'],
                               'minimum': 1,
                               'description': "Total number of GPUs; training.world_size (where the seed's "
                                              'scripts put it) is the same setting. Required unless the '
                                              'command line gives --world-size (which overrides it); tensor '
                                              '* pipeline * context parallel sizes must divide it.'}},
 'required': ['model', 'parallelism', 'training'],
 'additionalProperties': False}
