# The RL-step workload that bench/rl_step.sh and bench/backends.sh share, so that both time the same
# work. Sourced, not run; needs RLVR (an rlvr binary) and W (the work directory) set.
#
# Checkpoint: `rlvr init` qwen2, Qwen2.5 tokenizer, vocab 151936, hidden 256, 4 layers, 4 heads / 2 KV
# heads, intermediate 1024, tied, f32 (~43 M parameters, 39 M of them the embedding), in W/model.
# Prompts: the first 4 GSM8K training questions, in W/prompts.jsonl, plain (no template), 8
# completions each, exactly 32 new tokens (min = max new tokens: EOS never ends a completion), T = 1,
# top-p 1, top-k off; GRPO with beta 0, lr 1e-6, no evaluation.

# Writes W/model and W/prompts.jsonl from the data directory $1 (default data).
bench_workload_files() {
  local data=${1:-data}
  "$RLVR" init --arch qwen2 --hidden 256 --layers 4 --heads 4 --kv-heads 2 --intermediate 1024 \
    --vocab-size 151936 --tie-embeddings true --tokenizer "$data/tokenizers/qwen2.5/tokenizer.json" \
    --seed 0 --out "$W/model" >/dev/null
  head -n 4 "$data/gsm8k/train.jsonl" > "$W/prompts.jsonl"
}

# The `rlvr train --set`s of that work; the caller adds train.steps, train.skip_zero_gradient_rows,
# output.dir and what else it varies.
BENCH_WORKLOAD_SETS=(
  --set model.path="\"$W/model\"" --set model.dtype='"f32"' --set model.device='"cpu"'
  --set data.task='"gsm8k"' --set data.train="\"$W/prompts.jsonl\"" --set data.template='"{question}"'
  --set data.prompts_per_step=4 --set data.seed=0
  --set rollout.group_size=8 --set rollout.max_new_tokens=32 --set rollout.min_new_tokens=32
  --set rollout.temperature=1.0 --set rollout.top_p=1.0 --set rollout.top_k=0
  --set algorithm.preset='"grpo"' --set algorithm.kl_coef=0.0
  --set train.lr=1e-6 --set train.eval_every=0
)
