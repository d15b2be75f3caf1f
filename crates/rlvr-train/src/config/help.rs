//! Help on a config key that is not one of ours: the peer's name it is ([`ALIASES`]: TRL's
//! `GRPOConfig`, peft's `LoraConfig` and verl's `ppo_trainer.yaml`, each mapped to our key with what differs), else the
//! nearest key by edit distance ("did you mean"), and the line of the file that wrote it.
//!
//! An alias is never accepted silently: the names of the peers mean slightly different things
//! (TRL's `per_device_train_batch_size` counts completions per GPU, ours prompts per step), so the
//! error says what to write instead and how the meanings differ.

/// A peer's name for one of our keys.
#[derive(Debug, Clone, Copy)]
pub struct Alias {
    /// The peer's key as its config writes it, dotted; it matches the trailing parts of the key
    /// the user wrote (`rollout.n` matches `actor_rollout_ref.rollout.n` and `rollout.n`).
    pub name: &'static str,
    /// Whose name it is: `TRL` (GRPOConfig, and its ModelConfig's LoRA flags), `peft` (LoraConfig,
    /// which GRPOTrainer takes as `peft_config`), `verl` (ppo_trainer.yaml) or `prime-rl` (its
    /// orchestrator config).
    pub peer: &'static str,
    /// Our key.
    pub ours: &'static str,
    /// What the peer's key means and how ours differs (or how to get the same effect).
    pub note: &'static str,
}

/// TRL's (`trl.GRPOConfig`, `trl.ModelConfig`'s LoRA flags), peft's (`peft.LoraConfig`), verl's
/// (`verl/trainer/config/ppo_trainer.yaml`) and prime-rl's (its orchestrator config) names of our
/// keys.
pub const ALIASES: &[Alias] = &[
    // TRL GRPOConfig.
    Alias {
        name: "num_generations",
        peer: "TRL",
        ours: "rollout.group_size",
        note: "K, completions per prompt",
    },
    Alias {
        name: "beta",
        peer: "TRL",
        ours: "algorithm.kl_coef",
        note: "β, the coefficient of the KL-to-reference term (0 = no reference model)",
    },
    Alias {
        name: "max_completion_length",
        peer: "TRL",
        ours: "rollout.max_new_tokens",
        note: "the most generated tokens per completion",
    },
    Alias {
        name: "max_prompt_length",
        peer: "TRL",
        ours: "data.max_prompt_len",
        note: "TRL truncates longer prompts (verl truncates or errors); rlvr drops them",
    },
    Alias {
        name: "learning_rate",
        peer: "TRL",
        ours: "train.lr",
        note: "the peak learning rate",
    },
    Alias {
        name: "per_device_train_batch_size",
        peer: "TRL",
        ours: "train.micro_batch_size",
        note: "TRL's counts completions per device per forward; rlvr's micro-batch is rows \
               (completions) per forward, and the prompts per step are data.prompts_per_step",
    },
    Alias {
        name: "gradient_accumulation_steps",
        peer: "TRL",
        ours: "train.micro_batch_size",
        note: "rlvr splits each update into micro-batches of train.micro_batch_size rows (or \
               train.micro_batch_tokens) and sums their gradients; the update size is the step's \
               batch divided by train.mini_batches",
    },
    Alias {
        name: "num_iterations",
        peer: "TRL",
        ours: "train.epochs",
        note: "μ, passes over each step's batch",
    },
    Alias {
        name: "epsilon",
        peer: "TRL",
        ours: "algorithm.clip_low",
        note: "ε, the lower clip range (TRL's epsilon is both sides unless epsilon_high is set: \
               set algorithm.clip_high too)",
    },
    Alias {
        name: "epsilon_high",
        peer: "TRL",
        ours: "algorithm.clip_high",
        note: "ε_high, the upper clip range (DAPO's clip-higher); with loss_type=\"cispo\" TRL's \
               epsilon_high is the cap itself: clip_high = epsilon_high − 1 (TRL's recommended 5.0 \
               is clip_high = 4)",
    },
    Alias {
        name: "delta",
        peer: "TRL",
        ours: "algorithm.dual_clip",
        note:
            "TRL's delta caps the ratio of two-sided GRPO (INTELLECT-2); the nearest rlvr knob is \
               the dual-clip constant c, or algorithm.is_cap for a truncated ratio",
    },
    Alias {
        name: "loss_type",
        peer: "TRL",
        ours: "algorithm.preset",
        note: "TRL's loss types are presets: \"dapo\" (TRL's default) is preset \"grpo_trl\" \
               (token mean over the update, zero-variance groups counted, std + 1e-4); \"grpo\" \
               is preset \"grpo\" (seq-mean-token-mean, but std + 1e-6 and zero-variance groups \
               out of the normaliser: set algorithm.std_eps = 1e-4 and exclude_zero_std = false \
               for TRL's); \"bnpo\" is preset \"bnpo\" (token mean per update, not per \
               micro-batch); \"dr_grpo\" is preset \"dr_grpo\" (aggregation constant); \
               \"cispo\" is preset \"cispo\"; sapo, luspo and vespo have no rlvr counterpart; \
               rlvr's preset \"dapo\" is the DAPO paper's recipe (dynamic sampling, overlong \
               penalty), not TRL's loss_type",
    },
    Alias {
        name: "scale_rewards",
        peer: "TRL",
        ours: "algorithm.std_level",
        note: "\"group\" (TRL's default, or true) is algorithm.std_norm = \"sample\" with \
               std_level = \"group\"; \"batch\" is std_level = \"batch\" (group mean, batch \
               std); \"none\" (or false) is std_norm = \"none\"; TRL divides by std + 1e-4 \
               (algorithm.std_eps = 1e-4, as preset grpo_trl)",
    },
    Alias {
        name: "mask_truncated_completions",
        peer: "TRL",
        ours: "algorithm.overlong",
        note: "write algorithm.overlong = \"mask\"",
    },
    Alias {
        name: "importance_sampling_level",
        peer: "TRL",
        ours: "algorithm.loss",
        note: "sequence-level ratios are algorithm.loss = \"gspo\"",
    },
    Alias {
        name: "off_policy_mask_threshold",
        peer: "TRL",
        ours: "algorithm.opsm_delta",
        note: "δ of off-policy sequence masking",
    },
    Alias {
        name: "vllm_importance_sampling_cap",
        peer: "TRL",
        ours: "algorithm.mismatch_cap",
        note: "C of the sampler/trainer mismatch correction (algorithm.mismatch_correction)",
    },
    Alias {
        name: "max_steps",
        peer: "TRL",
        ours: "train.steps",
        note: "trainer steps",
    },
    Alias {
        name: "max_grad_norm",
        peer: "TRL",
        ours: "train.grad_clip",
        note: "the global gradient-norm clip",
    },
    Alias {
        name: "lr_scheduler_type",
        peer: "TRL",
        ours: "train.schedule",
        note: "constant, linear or cosine",
    },
    Alias {
        name: "adam_beta1",
        peer: "TRL",
        ours: "train.beta1",
        note: "AdamW β₁",
    },
    Alias {
        name: "adam_beta2",
        peer: "TRL",
        ours: "train.beta2",
        note: "AdamW β₂",
    },
    Alias {
        name: "adam_epsilon",
        peer: "TRL",
        ours: "train.adam_eps",
        note: "AdamW ε",
    },
    Alias {
        name: "save_steps",
        peer: "TRL",
        ours: "train.save_every",
        note: "a checkpoint every this many steps",
    },
    Alias {
        name: "save_only_model",
        peer: "TRL",
        ours: "train.save_optimizer",
        note: "inverted: save_only_model = true is train.save_optimizer = false (a resume from \
               such a checkpoint needs train.resume_without_optimizer)",
    },
    Alias {
        name: "eval_steps",
        peer: "TRL",
        ours: "train.eval_every",
        note: "a held-out evaluation every this many steps",
    },
    Alias {
        name: "output_dir",
        peer: "TRL",
        ours: "output.dir",
        note: "the run directory",
    },
    Alias {
        name: "model_name_or_path",
        peer: "TRL",
        ours: "model.path",
        note: "a local HF checkpoint directory (rlvr downloads nothing)",
    },
    Alias {
        name: "use_vllm",
        peer: "TRL",
        ours: "rollout.backend",
        note: "write rollout.backend = \"vllm\" and rollout.servers",
    },
    Alias {
        name: "logging_steps",
        peer: "TRL",
        ours: "output.log_every",
        note: "a console line every this many steps (off a terminal or with --no-progress); \
               metrics.jsonl and TensorBoard get every step",
    },
    Alias {
        name: "log_completions",
        peer: "TRL",
        ours: "train.log_rollouts",
        note: "completions per step written to RUN_DIR/rollouts.jsonl (0 = none; default 4)",
    },
    Alias {
        name: "num_train_epochs",
        peer: "TRL",
        ours: "train.steps",
        note: "TRL counts passes over the dataset; rlvr counts trainer steps, each taking \
               data.prompts_per_step prompts: one pass is the rows ÷ data.prompts_per_step steps",
    },
    Alias {
        name: "generation_batch_size",
        peer: "TRL",
        ours: "data.prompts_per_step",
        note: "TRL counts the completions generated at once; rlvr the prompts per step, each \
               sampled rollout.group_size times: generation_batch_size ÷ num_generations",
    },
    Alias {
        name: "steps_per_generation",
        peer: "TRL",
        ours: "train.mini_batches",
        note: "optimizer updates per generated batch: the step's groups are split into this many \
               updates",
    },
    Alias {
        name: "bf16",
        peer: "TRL",
        ours: "model.dtype",
        note: "write model.dtype = \"bf16\"; the default \"auto\" is bf16 (f32 master weights) \
               on a GPU and f32 on the CPU",
    },
    Alias {
        name: "fp16",
        peer: "TRL",
        ours: "model.dtype",
        note: "rlvr trains in \"bf16\" or \"f32\" (f16 has no loss scaling here, so it is \
               refused for training); the default \"auto\" is bf16 on a GPU",
    },
    Alias {
        name: "report_to",
        peer: "TRL",
        ours: "output.tensorboard",
        note: "every run writes TensorBoard event files (default true); W&B reads them with \
               `wandb sync --sync-tensorboard RUN_DIR/tensorboard` (docs/runs.md)",
    },
    // TRL's ModelConfig (its `--use_peft --lora_r ...` flags) and peft's LoraConfig, which
    // GRPOTrainer takes as `peft_config`: rlvr's LoRA keys are in [model].
    Alias {
        name: "peft_config",
        peer: "TRL",
        ours: "model.lora_rank",
        note: "peft_config=LoraConfig(r, lora_alpha, target_modules, lora_dropout) is \
               model.lora_rank, lora_alpha, lora_targets and lora_dropout in [model]",
    },
    Alias {
        name: "use_peft",
        peer: "TRL",
        ours: "model.lora_rank",
        note: "LoRA is on when model.lora_rank ≥ 1 (0, the default, is full fine-tuning)",
    },
    Alias {
        name: "lora_r",
        peer: "TRL",
        ours: "model.lora_rank",
        note: "the LoRA rank r",
    },
    Alias {
        name: "lora_target_modules",
        peer: "TRL",
        ours: "model.lora_targets",
        note: "a list of q, k, v, o, gate, up, down (or q_proj … down_proj), or \"all-linear\"; \
               the default is all seven",
    },
    Alias {
        name: "r",
        peer: "peft",
        ours: "model.lora_rank",
        note: "LoraConfig's r, the LoRA rank (0 = no LoRA)",
    },
    Alias {
        name: "target_modules",
        peer: "peft",
        ours: "model.lora_targets",
        note: "a list of q, k, v, o, gate, up, down (or q_proj … down_proj), or \"all-linear\"; \
               the default is all seven",
    },
    // verl ppo_trainer.yaml (actor_rollout_ref.*, data.*, algorithm.*, trainer.*).
    Alias {
        name: "rollout.n",
        peer: "verl",
        ours: "rollout.group_size",
        note: "K, completions per prompt",
    },
    Alias {
        name: "kl_loss_coef",
        peer: "verl",
        ours: "algorithm.kl_coef",
        note: "β of the KL loss term (verl also needs use_kl_loss; rlvr's is on when β ≠ 0)",
    },
    Alias {
        name: "use_kl_loss",
        peer: "verl",
        ours: "algorithm.kl_coef",
        note: "the KL term is on when algorithm.kl_coef ≠ 0",
    },
    Alias {
        name: "kl_loss_type",
        peer: "verl",
        ours: "algorithm.kl_estimator",
        note: "k1, k2 or k3 (verl's low_var_kl is k3)",
    },
    Alias {
        name: "kl_ctrl.kl_coef",
        peer: "verl",
        ours: "algorithm.kl_coef",
        note: "rlvr has no KL penalty in the reward; the KL-to-reference term is in the loss",
    },
    Alias {
        name: "optim.lr",
        peer: "verl",
        ours: "train.lr",
        note: "the peak learning rate",
    },
    Alias {
        name: "optim.weight_decay",
        peer: "verl",
        ours: "train.weight_decay",
        note: "AdamW decoupled weight decay",
    },
    Alias {
        name: "optim.lr_warmup_steps",
        peer: "verl",
        ours: "train.warmup_steps",
        note: "linear warm-up steps",
    },
    Alias {
        name: "optim.lr_warmup_steps_ratio",
        peer: "verl",
        ours: "train.warmup_steps",
        note: "verl gives a fraction of the training steps; rlvr gives steps: ratio × train.steps",
    },
    Alias {
        name: "warmup_ratio",
        peer: "TRL",
        ours: "train.warmup_steps",
        note: "TRL gives a fraction of the training steps; rlvr gives steps: ratio × train.steps",
    },
    Alias {
        name: "ppo_mini_batch_size",
        peer: "verl",
        ours: "train.mini_batches",
        note: "verl gives the prompts per optimizer update; rlvr gives the number of updates per \
               epoch: data.prompts_per_step / ppo_mini_batch_size",
    },
    Alias {
        name: "ppo_micro_batch_size_per_gpu",
        peer: "verl",
        ours: "train.micro_batch_size",
        note: "rows (completions) per forward",
    },
    Alias {
        name: "ppo_epochs",
        peer: "verl",
        ours: "train.epochs",
        note: "μ, passes over each step's batch",
    },
    Alias {
        name: "clip_ratio",
        peer: "verl",
        ours: "algorithm.clip_low",
        note: "ε of both sides: set algorithm.clip_low and algorithm.clip_high",
    },
    Alias {
        name: "clip_ratio_low",
        peer: "verl",
        ours: "algorithm.clip_low",
        note: "ε_low, the lower clip range",
    },
    Alias {
        name: "clip_ratio_high",
        peer: "verl",
        ours: "algorithm.clip_high",
        note: "ε_high, the upper clip range",
    },
    Alias {
        name: "clip_ratio_c",
        peer: "verl",
        ours: "algorithm.dual_clip",
        note: "the dual-clip constant c",
    },
    Alias {
        name: "loss_agg_mode",
        peer: "verl",
        ours: "algorithm.aggregation",
        note: "token-mean, seq-mean-token-mean, seq-mean-token-sum, or constant (verl's \
               seq-mean-token-sum-norm)",
    },
    Alias {
        name: "entropy_coeff",
        peer: "verl",
        ours: "algorithm.entropy_coef",
        note: "the entropy bonus coefficient",
    },
    Alias {
        name: "adv_estimator",
        peer: "verl",
        ours: "algorithm.preset",
        note: "verl's grpo with its default loss (token mean over every row, zero-variance \
               groups kept, dual clip 3) is preset grpo_verl; preset grpo is DeepSeekMath's \
               per-sequence mean; rloo is algorithm.baseline = \"leave-one-out\" (`rlvr \
               algorithms` lists the presets)",
    },
    Alias {
        name: "norm_adv_by_std_in_grpo",
        peer: "verl",
        ours: "algorithm.std_norm",
        note: "false is algorithm.std_norm = \"none\" (Dr. GRPO)",
    },
    Alias {
        name: "train_batch_size",
        peer: "verl",
        ours: "data.prompts_per_step",
        note: "B, prompts per trainer step",
    },
    Alias {
        name: "max_response_length",
        peer: "verl",
        ours: "rollout.max_new_tokens",
        note: "the most generated tokens per completion",
    },
    Alias {
        name: "response_length",
        peer: "verl",
        ours: "rollout.max_new_tokens",
        note: "the most generated tokens per completion",
    },
    Alias {
        name: "train_files",
        peer: "verl",
        ours: "data.train",
        note: "one JSONL or Parquet file",
    },
    Alias {
        name: "val_files",
        peer: "verl",
        ours: "data.test",
        note: "one JSONL or Parquet file",
    },
    Alias {
        name: "prompt_key",
        peer: "verl",
        ours: "data.question_field",
        note: "the column holding the question: text rlvr renders with data.template, or verl's \
               list of chat messages, rendered as it is with data.style = \"chat\" (a nested \
               column is a dotted path: data.answer_field = \"reward_model.ground_truth\")",
    },
    Alias {
        name: "total_training_steps",
        peer: "verl",
        ours: "train.steps",
        note: "trainer steps",
    },
    Alias {
        name: "save_freq",
        peer: "verl",
        ours: "train.save_every",
        note: "a checkpoint every this many steps",
    },
    Alias {
        name: "test_freq",
        peer: "verl",
        ours: "train.eval_every",
        note: "a held-out evaluation every this many steps",
    },
    Alias {
        name: "rollout_correction",
        peer: "verl",
        ours: "algorithm.mismatch_correction",
        note: "the sampler/trainer mismatch correction: verl's token or sequence IS and \
               rejection sampling are rlvr's truncations and masks, the threshold \
               algorithm.mismatch_cap (docs/corrections.md)",
    },
    Alias {
        name: "default_local_dir",
        peer: "verl",
        ours: "output.dir",
        note: "the run directory",
    },
    Alias {
        name: "custom_reward_function.path",
        peer: "verl",
        ours: "data.verifier.function",
        note: "verl's reward function runs unchanged: data.verifier = { kind = \"verl\", \
               function = \"PATH:NAME\" } (or a [[reward.components]] verifier); NAME defaults \
               to compute_score, as verl's",
    },
    Alias {
        name: "custom_reward_function.name",
        peer: "verl",
        ours: "data.verifier.function",
        note: "the NAME of data.verifier = { kind = \"verl\", function = \"PATH:NAME\" }; \
               compute_score when only PATH is given, as verl's default",
    },
    // prime-rl's orchestrator config (`prime_rl/orchestrator/config.py`).
    Alias {
        name: "orchestrator.env",
        peer: "prime-rl",
        ours: "env.verifiers",
        note: "a verifiers environment runs unchanged: [env] verifiers = \"ID\" (its id) and \
               env_args = { ... } (its args), with env.python the interpreter that has \
               verifiers (0.3.1 or 0.4.0) and the environment installed; one environment per \
               run \
               (docs/coming-from-prime-rl.md)",
    },
    Alias {
        name: "env.id",
        peer: "prime-rl",
        ours: "env.verifiers",
        note: "the verifiers environment's id, which rlvr runs with the adapter it carries",
    },
    Alias {
        name: "env.args",
        peer: "prime-rl",
        ours: "env.env_args",
        note: "the keyword arguments of the verifiers environment's load_environment (0.4.0: \
               its taskset's config)",
    },
    Alias {
        name: "rollouts_per_example",
        peer: "prime-rl",
        ours: "rollout.group_size",
        note: "K, episodes per prompt",
    },
    Alias {
        name: "orchestrator.batch_size",
        peer: "prime-rl",
        ours: "data.prompts_per_step",
        note: "prime-rl's counts rollouts per step; rlvr's counts prompts, each sampled \
               rollout.group_size times (batch_size / rollouts_per_example)",
    },
    Alias {
        name: "sampling.max_tokens",
        peer: "prime-rl",
        ours: "rollout.max_new_tokens",
        note: "the most tokens of one turn (env.max_episode_tokens bounds a whole episode)",
    },
    Alias {
        name: "custom_reward_function.reward_kwargs",
        peer: "verl",
        ours: "data.verifier.kwargs",
        note: "keyword arguments passed to the function on every call: data.verifier = { kind \
               = \"verl\", function = \"PATH:NAME\", kwargs = { format_score = 0.1 } } (TOML \
               values, which reach Python as the same values)",
    },
];

/// A peer's value for one of our enum keys: (our key, the value as the peer writes it, what to
/// write instead). TRL writes its loss types and `scale_rewards` values where rlvr has an
/// aggregation or a std normalisation; verl writes `loss_agg_mode` values.
pub const PEER_VALUES: &[(&str, &str, &str)] = &[
    (
        "algorithm.aggregation",
        "dr_grpo",
        "TRL's loss_type = \"dr_grpo\" is aggregation = \"constant\" (preset \"dr_grpo\" also \
         drops the std, as Dr. GRPO does)",
    ),
    (
        "algorithm.aggregation",
        "dapo",
        "TRL's loss_type = \"dapo\" (its default) is aggregation = \"token-mean\" (preset \
         \"grpo_trl\" is GRPOTrainer's defaults)",
    ),
    (
        "algorithm.aggregation",
        "grpo",
        "TRL's loss_type = \"grpo\" is aggregation = \"seq-mean-token-mean\" (preset \"grpo\")",
    ),
    (
        "algorithm.aggregation",
        "bnpo",
        "TRL's loss_type = \"bnpo\" is aggregation = \"token-mean\", the mean per update (preset \
         \"bnpo\")",
    ),
    (
        "algorithm.aggregation",
        "seq-mean-token-sum-norm",
        "verl's loss_agg_mode = \"seq-mean-token-sum-norm\" (Dr. GRPO) is aggregation = \
         \"constant\"",
    ),
    (
        "algorithm.std_norm",
        "group",
        "TRL's scale_rewards = \"group\" is std_norm = \"sample\" (std_level = \"group\", the \
         default)",
    ),
    (
        "algorithm.std_norm",
        "batch",
        "TRL's scale_rewards = \"batch\" is std_norm = \"sample\" with std_level = \"batch\"",
    ),
];

/// What to write instead of a peer's `value` for our key `key` ([`PEER_VALUES`]).
pub fn peer_value(key: &str, value: &str) -> Option<&'static str> {
    PEER_VALUES
        .iter()
        .find(|(k, v, _)| *k == key && *v == value)
        .map(|(_, _, note)| *note)
}

/// The Markdown table of `peer`'s names (`"TRL"`, `"verl"` or `"prime-rl"`, as [`Alias::peer`]
/// writes it) in
/// [`ALIASES`]' order: `| PEER key | rlvr key | note |`, one row per name, ending in a newline;
/// docs/coming-from-verl.md holds verl's (kept current by the test `readme::verl_key_table_is_current`).
pub fn alias_table_markdown(peer: &str) -> String {
    let cell = |t: &str| t.replace('|', "\\|").replace('\n', " ");
    let mut out = format!("| {peer} key | rlvr key | note |\n|---|---|---|\n");
    for a in ALIASES.iter().filter(|a| a.peer == peer) {
        out.push_str(&format!(
            "| `{}` | `{}` | {} |\n",
            a.name,
            a.ours,
            cell(a.note)
        ));
    }
    out
}

/// The alias whose name matches the trailing parts of dotted `key`, or of one of its prefixes
/// (a key inside a peer's table: verl's `custom_reward_function.reward_kwargs.format_score`).
pub fn alias_for(key: &str) -> Option<&'static Alias> {
    let parts: Vec<&str> = key.split('.').collect();
    ALIASES.iter().find(|a| {
        let name: Vec<&str> = a.name.split('.').collect();
        (name.len()..=parts.len()).any(|end| parts[end - name.len()..end] == name[..])
    })
}

/// Our key that dotted `key` ends with, when `key` nests it deeper (verl's
/// `actor_rollout_ref.rollout.temperature` is our `rollout.temperature`).
pub fn nested_key<'a>(key: &str, known: &'a [String]) -> Option<&'a str> {
    known
        .iter()
        .map(String::as_str)
        .find(|k| key.len() > k.len() && key.ends_with(&format!(".{k}")))
}

/// The message for an alias: what the peer's key is and what to write instead.
pub fn alias_message(key: &str, a: &Alias) -> String {
    let (table, field) = a.ours.rsplit_once('.').unwrap_or(("", a.ours));
    format!(
        "`{key}` is {}'s name, not rlvr's: write `{field} = …` in [{table}] (or --set {}=…) for \
         {} ({}); rlvr does not accept the peers' names, so that each key has one meaning",
        a.peer, a.ours, a.ours, a.note
    )
}

/// The closest of `candidates` to `word` by edit distance, when close enough to be a slip
/// (at most a third of the word's length, and at least 1, edits away).
pub fn nearest<'a>(word: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    nearest_within(word, candidates, (word.chars().count() / 3).max(1))
}

/// The closest of `candidates` to `word` at most `limit` edits away.
pub fn nearest_within<'a>(
    word: &str,
    candidates: impl IntoIterator<Item = &'a str>,
    limit: usize,
) -> Option<&'a str> {
    candidates
        .into_iter()
        .map(|c| (strsim::damerau_levenshtein(word, c), c))
        .filter(|(d, _)| *d <= limit)
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c)
}

/// The words in backticks after "expected" in a serde message (`expected one of `a`, `b``).
pub fn expected_words(message: &str) -> Vec<&str> {
    let Some((_, tail)) = message.split_once("expected") else {
        return Vec::new();
    };
    tail.split('`').skip(1).step_by(2).collect()
}

/// The first word in backticks of `message` after `prefix` (`unknown field `x``).
pub fn quoted_after<'a>(message: &'a str, prefix: &str) -> Option<&'a str> {
    let rest = &message[message.find(prefix)? + prefix.len()..];
    rest.trim_start().strip_prefix('`')?.split('`').next()
}

/// The help for unknown key `key` (dotted), whose table accepts `expected`: its alias, else the
/// nearest accepted key of that table, else a key of the same name in another table among `known`
/// (every documented key).
pub fn unknown_key_help(key: &str, expected: &[&str], known: &[String]) -> Option<String> {
    if let Some(a) = alias_for(key) {
        return Some(alias_message(key, a));
    }
    // A `[lora]` or `[peft]` table, as a peft user groups LoraConfig's fields.
    if matches!(key.split('.').next(), Some("lora" | "peft")) {
        return Some(
            "rlvr's LoRA keys are in [model]: lora_rank (peft's r), lora_alpha, lora_targets \
             (peft's target_modules) and lora_dropout (docs/lora.md)"
                .into(),
        );
    }
    if let Some(ours) = nested_key(key, known) {
        let outer = &key[..key.len() - ours.len() - 1];
        return Some(format!(
            "did you mean `{ours}`? (rlvr's tables are top-level, not under `{outer}`)"
        ));
    }
    let (table, field) = key.rsplit_once('.').unwrap_or(("", key));
    let full = |f: &str| match table {
        "" => f.to_string(),
        t => format!("{t}.{f}"),
    };
    if let Some(n) = nearest(field, expected.iter().copied()) {
        return Some(format!("did you mean `{}`?", full(n)));
    }
    let same_name: Vec<&String> = known
        .iter()
        .filter(|k| k.rsplit_once('.').map(|(_, f)| f) == Some(field) && k.as_str() != key)
        .collect();
    if let Some(k) = same_name.first() {
        return Some(format!(
            "did you mean `{k}`? (`{field}` is a key of another table)"
        ));
    }
    // A misspelt peer's name (`lerning_rate`): the alias it is near (at most 2 edits, a quarter
    // of the word), and our key.
    let peer_names = ALIASES
        .iter()
        .map(|a| a.name.rsplit('.').next().unwrap_or(a.name));
    if let Some(n) = nearest_within(field, peer_names, (field.chars().count() / 4).clamp(1, 2)) {
        if let Some(a) = ALIASES
            .iter()
            .find(|a| a.name.rsplit('.').next() == Some(n))
        {
            let (t, f) = a.ours.rsplit_once('.').unwrap_or(("", a.ours));
            return Some(format!(
                "did you mean `{n}`? That is {}'s name, not rlvr's: write `{f} = …` in [{t}] \
                 (or --set {}=…) for {} ({})",
                a.peer, a.ours, a.ours, a.note
            ));
        }
    }
    let fields = known
        .iter()
        .filter_map(|k| k.rsplit_once('.').map(|(_, f)| f));
    nearest(field, fields).and_then(|f| {
        known
            .iter()
            .find(|k| k.ends_with(&format!(".{f}")))
            .map(|k| format!("did you mean `{k}`?"))
    })
}

/// The 1-based line of config text `text` that writes dotted key `key` (a `k = v` line under its
/// table header, a dotted `a.b = v` line, or the header of a table at or under `key`).
pub fn locate(text: &str, key: &str) -> Option<usize> {
    let mut table = String::new();
    for (i, line) in text.lines().enumerate() {
        let l = line.trim();
        if l.starts_with('#') || l.is_empty() {
            continue;
        }
        if let Some(h) = l.strip_prefix('[') {
            let h = h.trim_start_matches('[');
            let name = h.split(']').next().unwrap_or("").trim();
            table = unquote_dotted(name);
            if table == key || table.starts_with(&format!("{key}.")) {
                return Some(i + 1);
            }
            continue;
        }
        let Some((k, _)) = l.split_once('=') else {
            continue;
        };
        let k = unquote_dotted(k.trim());
        let full = if table.is_empty() {
            k
        } else {
            format!("{table}.{k}")
        };
        if full == key
            || key.starts_with(&format!("{full}."))
            || full.starts_with(&format!("{key}."))
        {
            return Some(i + 1);
        }
    }
    None
}

/// A TOML dotted key with its parts unquoted and the spaces around dots removed.
fn unquote_dotted(k: &str) -> String {
    k.split('.')
        .map(|p| p.trim().trim_matches('"').trim_matches('\''))
        .collect::<Vec<_>>()
        .join(".")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aliases_match_trailing_parts() {
        assert_eq!(
            alias_for("actor_rollout_ref.rollout.n").unwrap().ours,
            "rollout.group_size"
        );
        assert_eq!(alias_for("train.learning_rate").unwrap().ours, "train.lr");
        assert!(alias_for("train.n").is_none());
        assert!(alias_for("train.lr").is_none());
        // A key inside a peer's table names the table's alias.
        assert_eq!(
            alias_for("custom_reward_function.reward_kwargs.format_score")
                .unwrap()
                .ours,
            "data.verifier.kwargs"
        );
    }

    #[test]
    fn lines_are_found_under_their_table() {
        let text =
            "# c\n[model]\npath = \"x\"\n\n[train]\nlr = 1\nlearning_rate = 2\n[a.b]\nc = 1\n";
        assert_eq!(locate(text, "train.learning_rate"), Some(7));
        assert_eq!(locate(text, "model.path"), Some(3));
        assert_eq!(locate(text, "a"), Some(8));
        assert_eq!(locate(text, "train.nothing"), None);
    }
}
