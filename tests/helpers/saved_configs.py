"""config.json files as each family's published configuration class writes them: test data.

Each dict below is the ``config.json`` that the family's own configuration class wrote, run
outside this repository in a virtual environment with the transformers version its release
used: ``Cls.from_pretrained(folder).save_pretrained(out)`` on a folder holding the published
config.json at the test helpers' small sizes (``helpers/hub_folders.py``, ``moe_folders.py``,
``qwen_folders.py``), as a fine-tune or a re-save with the family's own code writes it. Only the
written key/values are kept here; none of the classes' code is. Each comment names the class's
repository, file and commit. Families whose class is not public: SDAR-MoE (hub only),
Fast-dLLM v2 (``configuration.py`` on the hub, no copy in the stored public material).
"""

#: RadicalNumerics/RND1 rnd/configuration_rnd.py at ed728557519452fe872aa6079f1e3164ca8b8705:
#: RND1Config.from_pretrained(a folder of rnd1_config()).save_pretrained(), transformers 4.57.1;
#: the class overwrites every size and flag with Qwen3-30B-A3B's (its CONFIG_DEFAULTS) whatever
#: config.json says, writing rope_scaling and sliding_window as false.
RND1 = {
    "architectures": ["RND1LM"], "attention_bias": False, "attention_dropout": 0.0,
    "auto_map": {
        "AutoConfig": "configuration_rnd.RND1Config",
        "AutoModel": "modeling_rnd.RND1Model",
        "AutoModelForMaskedLM": "modeling_rnd.RND1LM",
    },
    "decoder_sparse_step": 1, "dtype": "bfloat16", "eos_token_id": 151645, "head_dim": 128,
    "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02,
    "intermediate_size": 6144, "is_causal": False, "mask_token_id": 151669,
    "max_position_embeddings": 40960, "max_window_layers": 48, "mlp_only_layers": [],
    "model_type": "rnd1", "moe_backend": "hf", "moe_intermediate_size": 768,
    "norm_topk_prob": True, "num_attention_heads": 32, "num_diffusion_steps": 256,
    "num_experts": 128, "num_experts_per_tok": 8, "num_hidden_layers": 48,
    "num_key_value_heads": 4, "output_router_logits": False, "pad_token_id": 151643,
    "rms_norm_eps": 1e-06, "rope_scaling": False, "rope_theta": 1000000.0,
    "router_aux_loss_coef": 0.001, "sliding_window": False, "tie_word_embeddings": False,
    "transformers_version": "4.57.1", "use_cache": False, "use_sliding_window": False,
    "vocab_size": 151936,
}


#: JetAstra/SDAR training/model/SDAR-8B-Chat/configuration_sdar.py at
#: cdb2e049353137d3edd7da998a29508b7b83db88: SDARConfig.from_pretrained(a folder of
#: sdar_config()).save_pretrained(), transformers 4.52.4; attn_implementation is not written back
#: (transformers keeps it as _attn_implementation).
SDAR = {
    "architectures": ["SDARForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "auto_map": {
        "AutoConfig": "configuration_sdar.SDARConfig",
        "AutoModel": "modeling_sdar.SDARModel",
        "AutoModelForCausalLM": "modeling_sdar.SDARForCausalLM",
    },
    "block_size": 4, "bos_token_id": 151643, "debug": False, "eos_token_id": 151643, "ep_size": 1,
    "fuse_cross_entropy": True, "head_dim": 16, "hidden_act": "silu", "hidden_size": 32,
    "initializer_range": 0.02, "intermediate_size": 64, "mask_token_id": 151669,
    "max_position_embeddings": 32768, "max_window_layers": 36, "micro_forward": False,
    "model_type": "sdar", "num_attention_heads": 4, "num_hidden_layers": 2,
    "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000,
    "skip_checkpoint": False, "sliding_window": None, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "transformers_version": "4.52.4", "use_cache": False,
    "use_deepep": False, "use_sliding_window": False, "vocab_size": 151936,
}


#: NVlabs/Fast-dLLM dream/model/configuration_dream.py (the hub copy of Dream-
#: org/Dream-v0-Instruct-7B's) at a41dc544be6f02c857f8dfcd0b32bc1a674ab393:
#: DreamConfig.from_pretrained(a folder of dream_config()).save_pretrained(), transformers 4.46.3;
#: only transformers_version changes.
DREAM = {
    "architectures": ["DreamModel"], "attention_dropout": 0.0,
    "auto_map": {
        "AutoConfig": "configuration_dream.DreamConfig",
        "AutoModel": "modeling_dream.DreamModel",
    },
    "bos_token_id": 151643, "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 32,
    "initializer_range": 0.02, "intermediate_size": 64, "mask_token_id": 151666,
    "max_position_embeddings": 131072, "max_window_layers": 28, "model_type": "Dream",
    "num_attention_heads": 4, "num_hidden_layers": 2, "num_key_value_heads": 2,
    "pad_token_id": 151643, "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000.0,
    "sliding_window": None, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "transformers_version": "4.46.3", "use_cache": False, "use_sliding_window": False,
    "vocab_size": 152064,
}


#: NVlabs/Fast-dLLM llada/model/configuration_llada.py (the hub copy of GSAI-
#: ML/LLaDA-8B-Instruct's) at a41dc544be6f02c857f8dfcd0b32bc1a674ab393:
#: LLaDAConfig.from_pretrained(a folder of llada_config(691, tiny-llada's special
#: ids)).save_pretrained(), transformers 4.46.3; its ModelConfig's every field is written,
#: train_max_sequence_length (1024) among them.
LLADA = {
    "activation_type": "silu", "alibi": False, "alibi_bias_max": 8.0,
    "architectures": ["LLaDAModelLM"], "attention_dropout": 0.0, "attention_layer_norm": False,
    "attention_layer_norm_with_affine": True,
    "auto_map": {
        "AutoConfig": "configuration_llada.LLaDAConfig",
        "AutoModel": "modeling_llada.LLaDAModelLM",
        "AutoModelForCausalLM": "modeling_llada.LLaDAModelLM",
    },
    "bias_for_layer_norm": False, "block_group_size": 1, "block_type": "llama", "d_model": 64,
    "embedding_dropout": 0.0, "embedding_size": 691, "eos_token_id": 686, "flash_attention": False,
    "include_bias": False, "include_qkv_bias": False, "init_cutoff_factor": None,
    "init_device": "meta", "init_fn": "mitchell", "init_std": 0.02, "input_emb_norm": False,
    "layer_norm_type": "rms", "layer_norm_with_affine": True, "mask_token_id": 690,
    "max_sequence_length": 4096, "mlp_hidden_size": 96, "mlp_ratio": 4, "model_type": "llada",
    "multi_query_attention": None, "n_heads": 4, "n_kv_heads": 4, "n_layers": 2,
    "pad_token_id": 686, "precision": "amp_bf16", "residual_dropout": 0.0, "rms_norm_eps": 1e-05,
    "rope": True, "rope_full_precision": True, "rope_theta": 500000.0, "scale_logits": False,
    "torch_dtype": "bfloat16", "train_max_sequence_length": 1024, "transformers_version": "4.46.3",
    "use_cache": False, "vocab_size": 691, "weight_tying": False,
}


#: Gen-Verse/MMaDA models/modeling_mmada.py (MMadaConfig) at
#: e1ca9f84c42cbaec5e04f688c13976a4abc8cf68: MMadaConfig.from_pretrained(a folder of
#: make_mmada_folder's config).save_pretrained(), transformers 4.46.3; written back unchanged.
MMADA = {
    "activation_type": "silu", "alibi": False, "alibi_bias_max": 8.0,
    "architectures": ["MMadaModelLM"], "attention_dropout": 0.0, "attention_layer_norm": False,
    "attention_layer_norm_with_affine": True,
    "auto_map": {
        "AutoConfig": "modeling_mmada.MMadaConfig",
        "AutoModel": "modeling_mmada.MMadaModelLM",
    },
    "bias_for_layer_norm": False, "block_group_size": 1, "block_type": "llama",
    "codebook_size": 8192, "d_model": 64, "embedding_dropout": 0.0, "embedding_size": 691,
    "eos_token_id": 686, "flash_attention": False, "include_bias": False,
    "include_qkv_bias": False, "init_cutoff_factor": None, "init_device": "meta",
    "init_fn": "mitchell", "init_std": 0.02, "input_emb_norm": False, "layer_norm_type": "rms",
    "layer_norm_with_affine": True, "llm_vocab_size": 126464, "mask_token_id": 690,
    "max_sequence_length": 4096, "mlp_hidden_size": 96, "mlp_ratio": 4, "model_type": "mmada",
    "multi_query_attention": None, "n_heads": 4, "n_kv_heads": 4, "n_layers": 2,
    "new_vocab_size": 134656, "num_new_special_tokens": 0, "num_vq_tokens": 256,
    "pad_token_id": 686, "precision": "amp_bf16", "residual_dropout": 0.0, "rms_norm_eps": 1e-05,
    "rope": True, "rope_full_precision": True, "rope_theta": 500000.0, "scale_logits": False,
    "torch_dtype": "bfloat16", "transformers_version": "4.46.3", "use_cache": False,
    "vocab_size": 691, "weight_tying": False,
}


#: inclusionAI/dInfer tools/configuration_lladamoe.py (LLaDAConfig, model_type "llada") at
#: eecb2111d21ff33163f41e92d9381ce5b483ee26: LLaDAConfig.from_pretrained(a folder of
#: lladamoe_config(691, tiny-llada's special ids)).save_pretrained(), transformers 4.51.0; written
#: back unchanged.
LLADA_MOE = {
    "architectures": ["LLaDAMoEModelLM"], "attention_bias": False, "attention_dropout": 0.0,
    "auto_map": {
        "AutoConfig": "configuration_lladamoe.LLaDAMoEConfig",
        "AutoModel": "modeling_lladamoe.LLaDAMoEModelLM",
        "AutoModelForCausalLM": "modeling_lladamoe.LLaDAMoEModelLM",
    },
    "clip_qkv": None, "dense_intermediate_size": 48, "eos_token_id": 686,
    "expert_intermediate_size": 16, "hidden_act": "silu", "hidden_size": 32,
    "initializer_range": 0.02, "mask_token_id": 690, "max_position_embeddings": 8192,
    "model_type": "llada", "moe_layer_freq": [0, 1, 1], "moe_router_enable_expert_bias": False,
    "moe_router_score_function": "softmax", "norm_topk_prob": True, "num_attention_heads": 4,
    "num_experts": 8, "num_experts_per_tok": 2, "num_hidden_layers": 3, "num_key_value_heads": 2,
    "output_router_logits": False, "pad_token_id": 686, "partial_rotary_factor": 0.5,
    "qk_layernorm": True, "rms_norm_eps": 1e-05, "rope_scaling": None, "rope_theta": 50000,
    "routed_scaling_factor": 1, "router_aux_loss_coef": 0.01, "router_num_group": None,
    "router_topk_group": None, "shared_expert_intermediate_size": 24, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "transformers_version": "4.51.0", "use_cache": False,
    "vocab_size": 691,
}


#: inclusionAI/dInfer python/dinfer/model/configuration_llada2_moe.py at
#: 6a3d3ca73ec53e7050fede85cbd068063e6a38a8: LLaDA2MoeConfig.from_pretrained(a folder of
#: llada2_config(691, tiny-llada's special ids)).save_pretrained(), transformers 4.57.1;
#: torch_dtype becomes dtype; sliding_window 4096 (its default, unused without use_sliding_window)
#: is added.
LLADA2 = {
    "architectures": ["LLaDA2MoeModelLM"], "attention_dropout": 0.0,
    "auto_map": {
        "AutoConfig": "configuration_llada2_moe.LLaDA2MoeConfig",
        "AutoModel": "modeling_llada2_moe.LLaDA2MoeModel",
        "AutoModelForCausalLM": "modeling_llada2_moe.LLaDA2MoeModelLM",
    },
    "dtype": "bfloat16", "embedding_dropout": 0.0, "eos_token_id": 686, "first_k_dense_replace": 1,
    "head_dim": 16, "hidden_act": "silu", "hidden_size": 32, "initializer_range": 0.02,
    "intermediate_size": 48, "mask_token_id": 690, "max_position_embeddings": 16384,
    "max_window_layers": 28, "model_type": "llada2_moe", "moe_intermediate_size": 16,
    "moe_router_enable_expert_bias": True, "n_group": 4, "norm_head": False, "norm_softmax": False,
    "norm_topk_prob": True, "num_attention_heads": 4, "num_experts": 8, "num_experts_per_tok": 2,
    "num_hidden_layers": 3, "num_key_value_heads": 2, "num_shared_experts": 1,
    "output_dropout": 0.0, "output_router_logits": False, "pad_token_id": 686,
    "partial_rotary_factor": 0.5, "rms_norm_eps": 1e-06, "rope_scaling": None,
    "rope_theta": 600000, "rotary_dim": 8, "routed_scaling_factor": 2.5, "router_dtype": "fp32",
    "score_function": "sigmoid", "sliding_window": 4096, "tie_word_embeddings": False,
    "topk_group": 2, "transformers_version": "4.57.1", "use_bias": False, "use_cache": False,
    "use_qkv_bias": False, "use_rmsnorm": True, "use_sliding_window": False,
    "using_split_qkv_in_self_attention": False, "vocab_size": 691,
}
