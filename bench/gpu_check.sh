#!/usr/bin/env bash
# The prepared GPU run: the CUDA build checked against the CPU on the same machine, then timed
# against transformers/PyTorch, in one invocation with a deadline. Every part has its own timeout
# and writes what it measured as it goes, so a part that fails or hangs costs only itself.
#
#   bench/gpu_check.sh [OUT_DIR]        (on the GPU machine, from the repository root)
#
# ---------------------------------------------------------------------------------------------
# RUNBOOK for the next session that is lent a GPU (about 15 min of device time in all, the
# machine's start included; nothing on it reaches the internet)
# 1. Before the GPU (here, no GPU needed): the binaries, carried as git-ignored files.
#      scripts/cuda-build.sh --bin rlvr --features nccl && strip -o /tmp/rlvr-cuda-nccl target-cuda/release/rlvr \
#        && gzip -c /tmp/rlvr-cuda-nccl > bench/rlvr-cuda-nccl.gz        (cold 10 min on 2 cores, 2026-12-07)
#      scripts/cuda-build.sh --bin rlvr && strip -o /tmp/rlvr-cuda target-cuda/release/rlvr \
#        && gzip -c /tmp/rlvr-cuda > bench/rlvr-cuda.gz                   (the fallback without NCCL)
#    Build them from the commit whose working tree goes to the GPU: the kernels part replays the
#    binary's records with the cubins of this tree's kernels/build/ (a kernel changed in between
#    fails its replay). Then the dry run of this script on the CPU (the two commands at the end
#    of this header), which must end with every part's `rc 0`. `status` must say
#    can_start_another: true.
# 2. On the GPU, one call (the run tool: timeout_s 595, carry ["bench/rlvr-cuda-nccl.gz",
#    "bench/rlvr-cuda.gz"]):
#      PARTS="kernels logprobs offline nccl speed sampling" BUDGET=560 bench/gpu_check.sh $OUT
#    Parts run in that order (most important first); each has its own limit (LIMIT below),
#    capped by what is left of BUDGET, so a slow or hung part costs only itself and the last
#    parts. Expected ~7 min when all goes well. Everything comes back under $OUT: gpu_check.log
#    (the whole log), summary.txt (the PASS/FAIL/INFO/SKIP lines and part headers), *.jsonl (the
#    numbers), kernels_timing.txt, speed.txt, sampling.txt (tables), logs/ (every run's log and
#    stderr: the error messages of a failure).
# 3. If device time is left (status: budget_left_s > 120 and the machine still warm: it goes
#    back after ~30 s idle, so decide at once), a second call on the warm machine, e.g. the
#    extras, or a failed part again with KERNELS_OFF:
#      PARTS="breakdown shared" BUDGET=200 bench/gpu_check.sh $OUT             (timeout_s 230)
#    then give_back. $OUT is a fresh folder each call: pass what the first call learnt explicitly.
# When a part fails:
# - `the binary does not start` (exit 3; the missing libraries are listed): the fallback
#   rlvr-cuda.gz was tried too; nothing else can run. Note it and give the machine back.
# - kernels: FAIL lines name the variants (kernels_failed.txt); the later parts of the same call
#   already run with those ops off (a `KERNELS_OFF:` line says which). In a later call, give
#   them explicitly: KERNELS_OFF=attention,rms_norm (op names as `--fused` takes them). A
#   kernel that hangs is cut after 10 s and the replay goes on in a fresh process.
# - logprobs/offline/speed fail only with the fused kernels (`--fused all`): the op is in the
#   stderr under logs/ (lp_*.err, gpu_fused_*.log); a rerun with KERNELS_OFF=<op> isolates it.
# - sampling: graphs on/off differ or the graph replay fails: rerun PARTS=sampling
#   KERNELS_OFF=cuda_graphs; the fused step fails: KERNELS_OFF=decode (the candle path and
#   transformers are still measured).
# - `## part: rc 124 ... (TIMED OUT)`: the part hit its limit; its logs are under logs/.
# - An error that names an unrelated operation or "a CUDA error pending from an earlier
#   operation": launches are asynchronous. Rerun the part with RLVR_CUDA_SYNC=1 (exported for
#   every rlvr command: each Triton launch and fused-step GEMM then waits and names itself,
#   with its grid and buffers, when it fails; slow, so for finding the launch only).
# What goes into BENCHMARKS.md (a new section, dated, with the machine line from the top of
# gpu_check.log: GPU, driver, memory; the command and the UTC times of the `##` headers):
# - issue 44: kernels.jsonl's pass count and worst `ratio` per family, every FAIL; the group
#   table of kernels_timing.txt (attention / head / layer / AdamW ms per step against 10 / 25 /
#   15 / 6 ms); logprobs and offline PASS lines (max diffs, bit-identity) with and without the
#   fused kernels; speed.txt's training block per shape (tok/s, TFLOP/s, peak MiB, plan MiB, the
#   ratio to PyTorch: targets >= 0.8x at 16 x 512 and peak memory <= PyTorch's; 4 x 4096).
# - issue 50: sampling.txt (tok/s, x generate, ms/step, host/wait, Triton launches per step, the
#   decode path per batch 64/256; targets <= 2 ms/step at batch 64, >= 5x generate at 256); the
#   graphs on/off and graph-rerun bit-identity lines; the fused-vs-candle parity lines (batch 1,
#   64, 256; f32 and bf16); the staleness-0 kl_behaviour in f32 and bf16.
# - every FAIL and SKIP as it is, and what was not run. A number not measured is not written.
# ---------------------------------------------------------------------------------------------
#
# Parts (each prints a `## part` header and PASS/FAIL lines; results in OUT_DIR/*.jsonl, log in
# OUT_DIR/gpu_check.log):
#   0. kernels   issue 44's Triton kernels from the committed cubins (kernels/replay_gpu.py, numpy and
#                the driver by ctypes). `rlvr kernels record --shape small` writes every variant's
#                launch at a small shape with the CPU results (the log-prob head's `_softcap`
#                variants, Gemma 2's final cap, included); each is replayed on the GPU: f32 within
#                1e-5 of the output's scale, bf16 within a bf16 rounding (normwise where terms
#                cancel), the max error reported. Results per record in kernels.jsonl; the failing
#                variants, one a line, in kernels_failed.txt (to switch them off), the rest still
#                run. Then `rlvr kernels record --shape qwen2.5-0.5b` (one training step's launches
#                at 16 x 512 tokens in bf16, random inputs, 1.5 GB written on this machine) and
#                `replay_gpu.py --time`: the median of each launch x its launches per step, summed
#                per op group against the budgets (attention 10 ms, head 25 ms, other layer ops 15
#                ms, AdamW 6 ms, the last scaled from one tensor); kernels_timing.jsonl/.txt.
#                kernels_list.txt: `rlvr kernels list`. Not yet run on a GPU (prepared 2026-12-06).
#   1. logprobs  `rlvr logprobs` of one chat completion on a random Qwen2 model (hidden 256, 4 layers,
#                GQA 4/2, the Qwen2.5 tokenizer's vocabulary): cuda f32 vs cpu f32 within 1e-5 absolute;
#                cuda bf16 and cpu bf16 against cpu f32, the max difference reported (bound 0.1 nats);
#                the same on cuda with every fused kernel (`--fused all`, issue 44), same bounds.
#   2. offline   10 steps of GRPO from one offline experiences file (written by `rlvr generate` on the
#                CPU, rewards set by a fixed rule so groups have variance): every per-step metric of
#                cuda f32 equals cpu f32 within 1e-5 relative at step 1 and 1e-4 relative over all
#                10 steps (differences under 1e-6 absolute count as equal: a step's GRPO loss is ~0); two cuda f32 runs bit-identical (metrics and checkpoint files; else the
#                first differing step and key are named); cuda bf16 against cpu f32 reported. Then the
#                same with every training kernel of issue 44 on (`kernels.attention`, `rms_norm`,
#                `rotary`, `swiglu`, `logprob_head`, `adamw` = "on"): fused cuda f32 against cpu f32
#                with the same bounds, two fused runs bit-identical, fused bf16 reported. Between the
#                two (after the candle runs), the explorer on its own thread (online AsymRE, sync.offset 1, interval 2, 6 steps on
#                GSM8K prompts) twice in f32: metrics bit-identical (the two threads' hand-off on the
#                GPU's one stream).
#   2b. sampling issue 50's decode path (`[kernels]` decode and cuda_graphs, `--fused`): (a) a seeded
#                `rlvr generate` of the small model on DEVICE in f32 and bf16 with graphs on and off
#                (`--fused decode,cuda_graphs` vs `--fused decode`): token ids and behaviour
#                log-probs bit-identical; (b) `rlvr bench sample` at batch 64 and 256 (128-token
#                prompts, 256 new tokens, Qwen2.5-0.5B shape, bf16) on the candle path
#                (`--fused none`) and the fused path with graphs, against transformers `generate`
#                (bench/gpu_torch.py) in the same part: tok/s, ms per decode step (host dispatch /
#                device wait), Triton launches per step and the `decode_path` that actually ran
#                (sampling.jsonl, sampling.txt); (c) the train/sample mismatch at staleness 0:
#                the completions of (a) scored by one training step on DEVICE in the same dtype,
#                `kl_behaviour` of step 1 (f32 bound 1e-5); (d) the fused step against the candle
#                step at batch 1, 64 and 256 (1, 16, 64 prompts x 1/4/4 samples, 32 new tokens,
#                the small model): `--fused decode` and `--fused decode,cuda_graphs` vs `--fused
#                none`, f32: every token id equal and behaviour log-probs within 1e-4 nats; bf16:
#                log-probs within 0.1 nats up to each completion's first differing token (the
#                share of identical completions reported); and a second graphs run bit-identical
#                to the first (sampling_parity.jsonl). `decode_path` in (b) is what the switches
#                resolve to for the model and device; a step that fell back (a shape the fused
#                step refuses, a failed capture) says so on stderr (printed, and kept in
#                logs/sampling/bench_*.err). The fused step is also measured without graphs, for
#                its launches per step. (a''') multi-turn episodes (examples/env_guess_number.py,
#                the small model with turns made to end early, kept turns): `--fused
#                attention,decode` against `--fused none` in f32 (close.py) and graphs on/off
#                bit-identical. The steps run in the order (a), (c), (b), (d): the long
#                parity runs last, where a timeout costs only themselves.
#                SAMPLING_SHAPE=small: tiny shapes, (d) at batch 1, 4, 8 (checking the script on a CPU, where every
#                path is the candle step). Prepared and dry-run on a CPU on 2026-12-06 (rc 0 in
#                214 s), and on 2026-12-07 with the GPU machines' torch 2.11.0 and transformers
#                5.17.0 (their `generate` included; `sampling speed`: rc 0 in 158 s; the
#                multi-turn check: rc 0 in 152 s); not yet run on a GPU (the RUNBOOK above runs it).
#   3. speed     bench/gpu.sh (its sampling rows only with SPEED_SAMPLE=1: part 2b measures them; the
#                training step at 16 x 512 tokens with `--fused none` and `--fused all`, at 4 x 4096 with `--fused all`,
#                against PyTorch eager: tok/s, TFLOP/s, the GPU's peak memory on both sides and
#                `rlvr plan`'s estimate beside rlvr's), Qwen2.5-0.5B shape in bf16.
#   3b. breakdown the training step of part 3 as forward, backward and optimizer, with the head's
#                chunk at the GPU and the CPU size, with a small vocabulary, and in f32.
#   4. shared    bench/share_prompt.sh on the GPU (bf16): the training step with each group's prompt
#                computed once against every row computing it.
#   5. nccl      a world-size-1 data-parallel step over NCCL, when the binary has the `nccl` feature.
# Environment: RLVR (binary; default bench/rlvr-cuda-nccl.gz unpacked when it starts, else
# bench/rlvr-cuda.gz, else target-cuda/release/rlvr), DEVICE (cuda:0), BUDGET (seconds for the
# whole script, default 540), PARTS (the parts to run, in the order given; default "kernels
# logprobs offline nccl speed sampling breakdown shared"; an unknown name stops the script before
# anything runs), LIMIT_<part> (a part's own limit in seconds; defaults: kernels 120, logprobs 60,
# offline 150, sampling 300, speed 240, nccl 40, breakdown 120, shared 110), KERNELS_OFF (fused
# ops to leave off in every part, comma-separated `--fused` names; the kernels part adds the ops
# whose kernels failed), PY (the python with numpy; default the torch venv's when present, else
# python3), KERNEL_ITERS (timed launches per record, default 20), REPLAY_LAUNCH_TIMEOUT (seconds
# before a replayed kernel counts as hung, default 10), SAMPLING_STEP_TIMEOUT (seconds per
# command of the sampling part, default 60), STEP_TIMEOUT (per measurement of the speed part,
# default 90), SPEED_SAMPLE=1 (bench/gpu.sh's own sampling rows too).
# On a CPU-only machine, to check the script itself (the kernels part then dry-runs: records
# written for both targets, resolved and packed, and the timing table says "no GPU"):
#   RLVR=target/release/rlvr DEVICE=cpu PARTS="kernels logprobs offline" bench/gpu_check.sh /tmp/gc
#   RLVR=target/release/rlvr DEVICE=cpu PARTS="sampling speed" SAMPLING_SHAPE=small SMALL=1 \
#     DTYPE=f32 PY=<python with torch> bench/gpu_check.sh /tmp/gc
# (on a loaded 2-core machine the offline part needs LIMIT_offline=600 BUDGET=900 there).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
OUTD=${1:-${OUT:-/tmp/gpu_check}}
mkdir -p "$OUTD"
# Everything from here on is in the log, the binary's absence included.
LOG=$OUTD/gpu_check.log
exec > >(tee -a "$LOG") 2>&1
DEVICE=${DEVICE:-cuda:0}
BUDGET=${BUDGET:-540}
PARTS=${PARTS:-kernels logprobs offline nccl speed sampling breakdown shared}
# Each part's own limit (seconds; LIMIT_<part> overrides), capped by what is left of BUDGET.
declare -A LIMIT=([kernels]=120 [logprobs]=60 [offline]=150 [sampling]=300 [nccl]=40 [speed]=240
  [breakdown]=120 [shared]=110)
for p in $PARTS; do
  [ -n "${LIMIT[$p]:-}" ] || { echo "PARTS: no part $p (parts: ${!LIMIT[*]})"; exit 2; }
  v=LIMIT_$p; [ -n "${!v:-}" ] && LIMIT[$p]=${!v}
done
if [ -z "${PY:-}" ]; then
  PY=python3
  [ -x /opt/torch/.venv/bin/python ] && PY=/opt/torch/.venv/bin/python
fi
START=$(date +%s)
W=$(mktemp -d /tmp/gpu_check.XXXXXX)
# On exit: every log and stderr file of the runs (the error messages of a failure) kept under
# OUTD/logs, the results summarised in OUTD/summary.txt, then the scratch directory removed.
finish() {
  mkdir -p "$OUTD/logs"
  (cd "$W" && find . -maxdepth 3 -type f \( -name '*.log' -o -name '*.err' \) -size -2M -print0 |
    xargs -0 -r cp --parents -t "$OUTD/logs" 2>/dev/null)
  grep -aE '^(PASS|FAIL|INFO|SKIP|KERNELS_OFF)|^## |^# ' "$LOG" > "$OUTD/summary.txt" 2>/dev/null
  rm -rf "$W"
}
trap finish EXIT
# The CUDA 13 and NCCL libraries of the machine's torch venv (any python 3 minor version).
for d in /opt/torch/.venv/lib/python3*/site-packages/nvidia/cu13/lib \
  /opt/torch/.venv/lib/python3*/site-packages/nvidia/nccl/lib; do
  [ -d "$d" ] && export LD_LIBRARY_PATH=$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
done
if [ -z "${RLVR:-}" ]; then
  # The binary with NCCL when it starts here (it needs libnccl.so.2), else the one without.
  for b in rlvr-cuda-nccl rlvr-cuda; do
    [ -f "bench/$b.gz" ] || continue
    gunzip -c "bench/$b.gz" > "$W/$b" && chmod +x "$W/$b"
    if "$W/$b" --version >/dev/null 2>&1; then RLVR=$W/$b; break; fi
    echo "bench/$b.gz does not start here: $("$W/$b" --version 2>&1 | head -1)"
  done
  [ -z "${RLVR:-}" ] && [ -x target-cuda/release/rlvr ] && RLVR=target-cuda/release/rlvr
  [ -z "${RLVR:-}" ] && { echo "no rlvr binary: set RLVR or build with scripts/cuda-build.sh" >&2; exit 2; }
fi
export RLVR
left() { echo $((BUDGET - ($(date +%s) - START))); }
# part NAME LIMIT CMD...: runs CMD under min(LIMIT, time left), reports its status and duration.
# Commands inside a part that have their own timeout use `timeout --foreground`, so that they
# stay in the part's process group and die with it when the part's limit kills the group; what
# survives SIGTERM is killed when the part ends.
part() {
  local name=$1 limit=$2; shift 2
  local l; l=$(left); [ "$l" -lt "$limit" ] && limit=$l
  if [ "$limit" -le 5 ]; then echo "## $name: SKIPPED (budget spent)"; return 0; fi
  echo "## $name (limit ${limit}s, $(date -u +%H:%M:%S))"
  local t0 tp rc; t0=$(date +%s)
  timeout -k 5 "$limit" bash -c "$*" &
  tp=$!; wait "$tp"; rc=$?
  echo "## $name: rc $rc in $(($(date +%s) - t0)) s$([ $rc = 124 ] && echo " (TIMED OUT: limit ${limit}s)")"
  # timeout ran the part in a process group of its own (its id is timeout's pid): what outlived
  # the part's end (`rlvr train` finishes its step on SIGTERM; a hung kernel never returns) is
  # killed now, before the next part starts.
  local alive; alive=$(ps -eo pgid=,stat= 2>/dev/null | awk -v g="$tp" '$1 == g && $2 !~ /^Z/' | wc -l)
  kill -KILL -- "-$tp" 2>/dev/null
  [ "${alive:-0}" -gt 0 ] && echo "## $name: killed $alive processes that outlived it"
  return 0
}
echo "# $(date -u +%Y-%m-%dT%H:%MZ) $(uname -n) device=$DEVICE binary=$RLVR"
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,compute_cap --format=csv,noheader | sed 's/^/# gpu: /'
else
  echo "# gpu: no nvidia-smi here"
fi
"$RLVR" --version || { echo "the binary does not start"; ldd "$RLVR" | grep -i "not found"; exit 3; }

# The small model and tokenizer of parts 1 and 2 (Qwen2.5's tokenizer and chat template).
mkdir -p "$W/tok"
cp data/tokenizers/qwen2.5/tokenizer.json "$W/tok/"
cp data/tokenizers/qwen2.5/tokenizer_config.source.json "$W/tok/tokenizer_config.json"
"$RLVR" init --arch qwen2 --hidden 256 --layers 4 --heads 4 --kv-heads 2 --intermediate 512 \
  --vocab-size 151936 --tie-embeddings true --tokenizer "$W/tok/tokenizer.json" --seed 0 \
  --out "$W/small" >/dev/null || exit 3

# The fused ops switched off for the parts after `kernels`: KERNELS_OFF (op names, comma or
# space separated: attention rms_norm rotary swiglu logprob_head adamw decode cuda_graphs) and
# the ops whose kernels failed the kernels part's replay (kernels_failed.txt, mapped by the
# family column of kernels_list.txt; the fused decode step launches the RMSNorm and SwiGLU
# kernels too, so their failure also turns `decode` off). Printed, sorted, space-separated.
kernels_off() {
  local off=${KERNELS_OFF:-} fam
  off=${off//,/ }
  if [ -s "$OUTD/kernels_failed.txt" ] && [ -s "$OUTD/kernels_list.txt" ]; then
    for fam in $(awk 'NR == FNR { bad[$1] = 1; next } ($1 in bad) { print $2 }' \
      "$OUTD/kernels_failed.txt" "$OUTD/kernels_list.txt" | sort -u); do
      case $fam in
        rmsnorm) off+=" rms_norm decode" ;;
        swiglu) off+=" swiglu decode" ;;
        *) off+=" $fam" ;;
      esac
    done
  fi
  [ -n "${off// /}" ] && printf '%s\n' $off | sort -u | tr '\n' ' ' | sed 's/ $//'
  return 0
}
# fused LIST: the ops of LIST (comma-separated, or `all`) that are not switched off, as the
# `--fused` argument (comma-separated; `none` when none is left).
fused() {
  local want=$1 off out="" op
  off=" $(kernels_off) "
  [ "$want" = all ] && want=attention,rms_norm,rotary,swiglu,logprob_head,adamw,decode,cuda_graphs
  for op in ${want//,/ }; do
    case "$off" in *" $op "*) ;; *) out+=${out:+,}$op ;; esac
  done
  echo "${out:-none}"
}
# Says which ops are off (once per part), when any is.
say_off() { local o; o=$(kernels_off); [ -z "$o" ] || echo "KERNELS_OFF: $o (these parts run without them)"; }

kernels() {
  # Issue 44's kernels: correctness per variant at a small shape, then per-op timing at the
  # benchmark shape. DEVICE=cpu: the same steps as a dry run (no launch).
  local K=$W/kernels dry="" tgt=sm90a t0
  if [ "${DEVICE%%:*}" = cpu ]; then
    dry=--dry-run; tgt=all
  else
    case "$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1)" in
      8.*) tgt=sm80 ;;
    esac
  fi
  "$RLVR" kernels list > "$OUTD/kernels_list.txt" || echo "FAIL kernels: rlvr kernels list: rc $?"
  tail -1 "$OUTD/kernels_list.txt"
  t0=$(date +%s)
  "$RLVR" kernels record --shape small --target $tgt --out "$K/small" > "$W/kernels_small.txt" \
    || { echo "FAIL kernels: rlvr kernels record --shape small"; tail -3 "$W/kernels_small.txt"; return 1; }
  cat "$W/kernels_small.txt"
  : > "$OUTD/kernels_failed.txt"
  # A hung launch ends replay_gpu.py (status 75) with the record to go on from: a fresh process
  # checks the rest, the hung variant listed as failed.
  local rargs=($dry --jsonl "$OUTD/kernels.jsonl" --failed "$OUTD/kernels_failed.txt" --resume "$K/resume")
  local rc start counts more=()
  while :; do
    rm -f "$K/resume"
    timeout --foreground -k 5 60 "$PY" kernels/replay_gpu.py "${rargs[@]}" "${more[@]}" "$K/small"; rc=$?
    [ "$rc" = 75 ] && [ -s "$K/resume" ] || break
    read -r start counts < "$K/resume"; more=(--start "$start" --counts "$counts")
  done
  [ "$rc" = 0 ] || echo "FAIL kernels: replay_gpu.py: rc $rc"
  echo "small shape done in $(($(date +%s) - t0)) s; failing variants: $(wc -l < "$OUTD/kernels_failed.txt")" \
    "$(tr '\n' ' ' < "$OUTD/kernels_failed.txt")(kernels_failed.txt)"
  rm -rf "$K/small"
  t0=$(date +%s)
  "$RLVR" kernels record --shape qwen2.5-0.5b --target ${tgt/all/sm90a} --out "$K/bench" > "$OUTD/kernels_records.txt" \
    || { echo "FAIL kernels: rlvr kernels record --shape qwen2.5-0.5b"; tail -3 "$OUTD/kernels_records.txt"; return 1; }
  tail -1 "$OUTD/kernels_records.txt"
  echo "benchmark-shape records: $(du -sm "$K/bench" | cut -f1) MB written in $(($(date +%s) - t0)) s"
  timeout --foreground -k 5 75 "$PY" kernels/replay_gpu.py $dry --time "${KERNEL_ITERS:-20}" --timing "$OUTD/kernels_timing.jsonl" \
    --skip-failed "$OUTD/kernels_failed.txt" "$K/bench" | tee "$OUTD/kernels_timing.txt"
  rm -rf "$K/bench"
}

sampling() {
  # Issue 50's decode path; see the header (0b).
  local S=$W/sampling dts="f32 bf16" shape batches plen=128 new=256 tdev=${DEVICE/cuda:*/cuda}
  local par=("1 1" "16 4" "64 4") pnew=32
  local tok=data/tokenizers/qwen2.5/tokenizer.json
  mkdir -p "$S"
  if [ "${SAMPLING_SHAPE:-}" = small ]; then
    shape=(--hidden 64 --layers 2 --heads 4 --kv-heads 2 --intermediate 128 --vocab-size 4096)
    batches=(--batch 4 --batch 8); plen=16; new=16; tok=$S/tok2.json; par=("1 1" "2 2" "2 4"); pnew=8
    "$PY" -c 'import sys; from tokenizers import Tokenizer, models; Tokenizer(models.WordLevel({"<unk>": 0, "<|endoftext|>": 1}, unk_token="<unk>")).save(sys.argv[1])' "$tok"
  else
    shape=(--hidden 896 --layers 24 --heads 14 --kv-heads 2 --intermediate 4864 --vocab-size 151936)
    batches=(--batch 64 --batch 256)
  fi
  # The fused paths that run: (a) compares graphs off with on; KERNELS_OFF (or a decode,
  # RMSNorm or SwiGLU kernel that failed the kernels part) takes graphs or the fused step out.
  local off fa=(decode decode,cuda_graphs) pd=(none decode decode,cuda_graphs decode,cuda_graphs) to=${SAMPLING_STEP_TIMEOUT:-60}
  off=" $(kernels_off) "; say_off
  case "$off" in *" cuda_graphs "*) fa=(decode); pd=(none decode) ;; esac
  case "$off" in *" decode "*) fa=(none); pd=() ;; esac
  local last=${fa[${#fa[@]}-1]}
  # (a) graphs on/off, bit-identical, and the experiences for (c): 8 prompts x 4 = 32 rows, one
  # wave. `--stop k` ends a row at a token holding a "k" (3.0% of Qwen2.5's vocabulary, so ~38%
  # of the random model's rows run all 32 tokens): rows finish at different steps, and once 16
  # are left the wave moves to the 16-row bucket (FUSED_MIN_BUCKET_ROWS), whose step is built
  # and captured anew.
  head -n 8 data/gsm8k/train.jsonl | "$PY" -c '
import json, sys
for l in sys.stdin: print(json.dumps({"prompt": json.loads(l)["question"]}))' > "$S/prompts.jsonl"
  for dt in $dts; do
    for f in "${fa[@]}"; do
      timeout --foreground -k 5 "$to" "$RLVR" generate --model "$W/small" --prompts "$S/prompts.jsonl" --chat -n 4 --top-p 1 --max-new-tokens 32 \
        --stop k --seed 7 --device "$DEVICE" --dtype $dt --fused $f --out "$S/exp_${dt}_${f/,/_}.jsonl" > /dev/null \
        2> "$S/generate_${dt}_${f/,/_}.err" || { echo "FAIL sampling: generate $dt --fused $f: rc $?"; tail -3 "$S/generate_${dt}_${f/,/_}.err"; }
    done
    if [ "${#fa[@]}" != 2 ]; then
      echo "SKIP sampling: graphs on/off $dt: only --fused ${fa[*]} runs (KERNELS_OFF)"
    elif cmp -s "$S/exp_${dt}_decode.jsonl" "$S/exp_${dt}_decode_cuda_graphs.jsonl" && [ -s "$S/exp_${dt}_decode.jsonl" ]; then
      echo "PASS sampling: graphs on/off $dt: $(wc -l < "$S/exp_${dt}_decode.jsonl") completions of $("$PY" -c 'import json, sys; print(len({len(json.loads(l)["completion_ids"]) for l in open(sys.argv[1])}))' "$S/exp_${dt}_decode.jsonl") lengths, token ids and behaviour log-probs bit-identical"
    else
      echo "FAIL sampling: graphs on/off $dt: the experiences differ"
    fi
    grep -h "kernels\." "$S"/generate_${dt}_*.err 2>/dev/null | sort -u | head -3
  done
  # (a') Qwen3 (its q/k norms in the fused step) and LoRA adapters (two more products per adapted
  # projection), f32: graphs on/off bit-identical, and the fused step against the candle step
  # (`--fused none`): the rows whose token ids agree and the largest |Δ log-prob| on them (float
  # rounding apart, the same tokens; a wrong head norm or adapter product moves every row).
  # Two experience files of the same generation, f32: the rows whose token ids agree (>= 90%)
  # and the largest |Δ log-prob| on them (<= 1e-3).
  cat > "$S/close.py" <<'PY'
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
same = [(x, y) for x, y in zip(a, b) if x["completion_ids"] == y["completion_ids"]]
d = max((abs(p - q) for x, y in same for p, q in zip(x["behaviour_logprobs"], y["behaviour_logprobs"])), default=float("nan"))
ok = len(a) == len(b) > 0 and len(same) >= 0.9 * len(a) and d <= 1e-3
print(f"{'PASS' if ok else 'FAIL'} sampling: {sys.argv[3]}: {len(same)} of {len(a)} rows with the same token ids, max |d log-prob| {d:.2e} on them (needs >= 90% and <= 1e-3)")
PY
  if [ "${#fa[@]}" = 2 ]; then
    "$RLVR" init --arch qwen3 --hidden 256 --layers 4 --heads 4 --kv-heads 2 --intermediate 512 \
      --vocab-size 151936 --tie-embeddings true --tokenizer "$W/tok/tokenizer.json" --seed 0 \
      --out "$W/small_qwen3" > /dev/null
    # PEFT's layout beside the base model's files: rank 8, α 16, q/v/down targeted, A and B random.
    rm -rf "$W/small_lora"; cp -r "$W/small" "$W/small_lora"
    "$PY" - "$W/small_lora" <<'PY'
import json, sys
import numpy as np
from safetensors.numpy import save_file
d = sys.argv[1]; r = 8; rng = np.random.default_rng(0)
shapes = {"self_attn.q_proj": (256, 256), "self_attn.v_proj": (128, 256), "mlp.down_proj": (256, 512)}
t = {}
for l in range(4):
    for p, (o, i) in shapes.items():
        n = f"base_model.model.model.layers.{l}.{p}"
        t[n + ".lora_A.weight"] = (rng.standard_normal((r, i)) / np.sqrt(i)).astype(np.float32)
        t[n + ".lora_B.weight"] = (0.1 * rng.standard_normal((o, r))).astype(np.float32)
save_file(t, d + "/adapter_model.safetensors")
json.dump({"peft_type": "LORA", "r": r, "lora_alpha": 16, "lora_dropout": 0.0,
           "target_modules": ["q_proj", "v_proj", "down_proj"]}, open(d + "/adapter_config.json", "w"))
PY
    for m in qwen3 lora; do
      for f in none "${fa[@]}"; do
        timeout --foreground -k 5 "$to" "$RLVR" generate --model "$W/small_$m" --prompts "$S/prompts.jsonl" --chat -n 4 --top-p 1 --max-new-tokens 32 \
          --stop k --seed 7 --device "$DEVICE" --dtype f32 --fused $f --out "$S/${m}_${f/,/_}.jsonl" > /dev/null \
          2> "$S/${m}_generate_${f/,/_}.err" || { echo "FAIL sampling: $m generate --fused $f: rc $?"; tail -3 "$S/${m}_generate_${f/,/_}.err"; }
      done
      if cmp -s "$S/${m}_decode.jsonl" "$S/${m}_decode_cuda_graphs.jsonl" && [ -s "$S/${m}_decode.jsonl" ]; then
        echo "PASS sampling: $m graphs on/off f32: bit-identical"
      else
        echo "FAIL sampling: $m graphs on/off f32: the experiences differ"
      fi
      "$PY" "$S/close.py" "$S/${m}_none.jsonl" "$S/${m}_decode.jsonl" "$m fused vs candle f32"
      grep -h "kernels\." "$S"/${m}_generate_*.err 2>/dev/null | sort -u | head -2
    done
  fi
  # (a'') The prompt prefill through the fused attention (`kernels.attention`) against (a)'s
  # candle prefill, both with the fused decode step, f32.
  case "$off" in
    *" attention "*|*" decode "*) echo "SKIP sampling: prefill by the fused attention (KERNELS_OFF)" ;;
    *)
      timeout --foreground -k 5 "$to" "$RLVR" generate --model "$W/small" --prompts "$S/prompts.jsonl" --chat -n 4 --top-p 1 --max-new-tokens 32 \
        --stop k --seed 7 --device "$DEVICE" --dtype f32 --fused attention,decode --out "$S/attn_prefill.jsonl" > /dev/null \
        2> "$S/attn_prefill.err" || { echo "FAIL sampling: generate --fused attention,decode: rc $?"; tail -3 "$S/attn_prefill.err"; }
      "$PY" "$S/close.py" "$S/exp_f32_decode.jsonl" "$S/attn_prefill.jsonl" "prefill by the fused attention vs candle f32" ;;
  esac
  # (a''') Multi-turn episodes (examples/env_guess_number.py, up to 4 turns of 24 tokens; the
  # turn cache on, as by default): later turns prefill their new ids after the kept keys (the
  # fused attention with the cache as key-only rows) and decode with the fused step over a cache
  # with a masked gap. The small model with its <|im_end|> embedding scaled by 240, so turns
  # end early and most episodes reach several turns. f32: `--fused attention,decode` against
  # `--fused none` (close.py), and with graphs bit-identical to without.
  case "$off" in
    *" attention "*|*" decode "*) echo "SKIP sampling: multi-turn episodes by the fused kernels (KERNELS_OFF)" ;;
    *)
      rm -rf "$W/small_eot"; cp -r "$W/small" "$W/small_eot"
      "$PY" - "$W/small_eot/model.safetensors" <<'PY'
import sys
from safetensors.numpy import load_file, save_file
t = load_file(sys.argv[1]); e = t["model.embed_tokens.weight"].copy(); e[151645] *= 240.0
t["model.embed_tokens.weight"] = e; save_file(t, sys.argv[1], metadata={"format": "pt"})
PY
      for i in 1 2 3 4 5 6 7 8; do echo "{\"prompt\": \"game $i\"}"; done > "$S/games.jsonl"
      mt=(none attention,decode)
      case "$off" in *" cuda_graphs "*) ;; *) mt+=(attention,decode,cuda_graphs) ;; esac
      for f in "${mt[@]}"; do
        timeout --foreground -k 5 "$to" "$RLVR" generate --model "$W/small_eot" --env configs/guess_number_qwen2.5-0.5b.toml \
          --set env.max_turns=4 --prompts "$S/games.jsonl" -n 4 --max-new-tokens 24 --seed 7 --device "$DEVICE" --dtype f32 \
          --fused $f --env-log "$S/mt_${f//,/_}.env.log" > "$S/mt_${f//,/_}.jsonl" 2> "$S/mt_${f//,/_}.err" \
          || { echo "FAIL sampling: multi-turn generate --fused $f: rc $?"; tail -3 "$S/mt_${f//,/_}.err"; }
      done
      echo "INFO sampling: multi-turn episodes: $("$PY" -c 'import json, sys, collections; print(dict(sorted(collections.Counter(json.loads(l)["turns"] for l in open(sys.argv[1])).items())))' "$S/mt_none.jsonl" 2>/dev/null) (turns: episodes)"
      "$PY" "$S/close.py" "$S/mt_none.jsonl" "$S/mt_attention_decode.jsonl" "multi-turn (kept turns) fused vs candle f32"
      if [ "${#mt[@]}" = 3 ]; then
        if cmp -s "$S/mt_attention_decode.jsonl" "$S/mt_attention_decode_cuda_graphs.jsonl" && [ -s "$S/mt_attention_decode.jsonl" ]; then
          echo "PASS sampling: multi-turn graphs on/off f32: bit-identical"
        else
          echo "FAIL sampling: multi-turn graphs on/off f32: the episodes differ"
        fi
      fi ;;
  esac
  # (c) the mismatch at staleness 0: step 1 of a training run on those experiences (rewards by a
  # fixed rule of the ids, so groups have variance), same device, dtype and switches.
  for dt in $dts; do
    "$PY" - "$S/exp_${dt}_${last/,/_}.jsonl" "$S/exp_${dt}_r.jsonl" <<'PY'
import json, sys
with open(sys.argv[2], "w") as f:
    for l in open(sys.argv[1]):
        r = json.loads(l); r["reward"] = float(sum(r["completion_ids"]) % 2 == 0); f.write(json.dumps(r) + "\n")
PY
    timeout --foreground -k 5 "$to" "$RLVR" train --set model.path="\"$W/small\"" --set model.device="\"$DEVICE\"" --set model.dtype="\"$dt\"" \
      --set data.experiences="\"$S/exp_${dt}_r.jsonl\"" --set data.prompts_per_step=4 --set rollout.group_size=4 \
      --set algorithm.preset='"grpo"' --set train.steps=1 --set train.micro_batch_size=4 --set train.eval_every=0 \
      --set train.seed=0 --set output.dir="\"$S/train_$dt\"" --no-progress > "$S/train_$dt.log" 2>&1 \
      || { echo "FAIL sampling: train $dt: rc $?"; tail -5 "$S/train_$dt.log"; }
  done
  "$PY" - "$S" "$OUTD/sampling.jsonl" "$dts" <<'PY'
import json, os, sys
s, out, dts = sys.argv[1], sys.argv[2], sys.argv[3].split()
for dt in dts:
    p = f"{s}/train_{dt}/metrics.jsonl"
    if not os.path.exists(p):
        print(f"FAIL sampling: mismatch {dt}: no metrics"); continue
    kl = json.loads(open(p).readline()).get("kl_behaviour")
    ok = kl is not None and (dt != "f32" or abs(kl) <= 1e-5)
    open(out, "a").write(json.dumps({"check": "mismatch_staleness_0", "dtype": dt, "kl_behaviour": kl,
                                     "bound": 1e-5 if dt == "f32" else None, "pass": ok}) + "\n")
    print(("PASS" if ok else ("INFO" if dt != "f32" and kl is not None else "FAIL")),
          f"sampling: mismatch at staleness 0, {dt}: step-1 kl_behaviour {kl}" + (" (bound 1e-5)" if dt == "f32" else ""))
PY
  # (b) throughput: the candle path, the fused path with graphs, transformers, one model.
  "$RLVR" init --arch qwen2 "${shape[@]}" --tie-embeddings true --tokenizer "$tok" \
    --dtype bf16 --seed 0 --out "$S/model" > /dev/null || { echo "FAIL sampling: init"; }
  local b=(bench sample --model "$S/model" --device "$DEVICE" --dtype bf16 "${batches[@]}" --prompt-len $plen
    --new-tokens $new --runs 1)
  timeout --foreground -k 5 "$to" "$RLVR" "${b[@]}" --fused none >> "$S/bench.jsonl" \
    2> "$S/bench_candle.err" || { echo "FAIL sampling: bench sample --fused none: rc $?"; tail -3 "$S/bench_candle.err"; }
  # The fused step without graphs too (its Triton launches per step: replayed graph steps launch
  # nothing from the host), then with them.
  local f
  for f in "${fa[@]}"; do
    [ "$f" = none ] && continue
    timeout --foreground -k 5 "$to" "$RLVR" "${b[@]}" --fused "$f" >> "$S/bench.jsonl" \
      2> "$S/bench_${f/,/_}.err" || { echo "FAIL sampling: bench sample --fused $f: rc $?"; tail -3 "$S/bench_${f/,/_}.err"; }
  done
  grep -h "kernels\.\|fused decode" "$S"/bench_*.err 2>/dev/null | sort -u | head -5
  timeout --foreground -k 5 "$to" "$PY" bench/gpu_torch.py --model "$S/model" --device "$tdev" --dtype bf16 \
    sample "${batches[@]}" --prompt-len $plen --new-tokens $new --runs 1 >> "$S/bench.jsonl" \
    || echo "FAIL sampling: transformers generate: rc $?"
  cat "$S/bench.jsonl" >> "$OUTD/sampling.jsonl"
  "$PY" - "$S/bench.jsonl" <<'PY' | tee "$OUTD/sampling.txt"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
pt = {r["batch"]: r for r in rows if r.get("impl") == "pytorch"}
print(f"{'batch':>6} {'path':<14}{'tok/s':>9}{'x generate':>11}{'ms/step':>9}{'host':>8}{'wait':>8}{'triton/step':>12}")
for r in rows:
    if r.get("impl") != "rlvr":
        continue
    s, p = r["step_ms"], pt.get(r["batch"])
    x = f"{r['tok_per_s'] / p['tok_per_s']:.2f}" if p else "-"
    print(f"{r['batch']:>6} {r['decode_path']:<14}{r['tok_per_s']:>9.0f}{x:>11}{s['total']:>9.2f}"
          f"{s['forward_host']:>8.2f}{s['forward_device_wait']:>8.2f}{r['triton_launches_per_step']:>12.1f}")
for b, p in sorted(pt.items()):
    print(f"{b:>6} {'transformers':<14}{p['tok_per_s']:>9.0f}{'1.00':>11}{p['step_ms']['total']:>9.2f}")
print("(decode_path: what the switches resolve to; a step that fell back says so above and in logs/sampling/bench_*.err."
      " triton/step with graphs counts only the eager warm-up and the capture: replays launch from the device)")
print("targets (issue 50): decode step <= 2 ms at batch 64; >= 5x transformers generate at batch 256")
PY
  # (d) the fused step against the candle step at batch 1, 64 and 256; graphs run twice.
  head -n 64 data/gsm8k/train.jsonl | "$PY" -c '
import json, sys
for l in sys.stdin: print(json.dumps({"prompt": json.loads(l)["question"]}))' > "$S/prompts64.jsonl"
  [ "${#pd[@]}" = 0 ] && echo "SKIP sampling: fused vs candle step: the fused decode step is off (KERNELS_OFF)"
  for dt in $dts; do
    for spec in "${par[@]}"; do
      [ "${#pd[@]}" = 0 ] && break
      set -- $spec
      local np=$1 k=$2 rows=$(($1 * $2))
      head -n "$np" "$S/prompts64.jsonl" > "$S/p_$rows.jsonl"
      for f in "${pd[@]}"; do
        local o=$S/par_${dt}_${rows}_${f/,/_}.jsonl
        [ -s "$o" ] && o=${o%.jsonl}_again.jsonl
        timeout --foreground -k 5 "$to" "$RLVR" generate --model "$W/small" --prompts "$S/p_$rows.jsonl" \
          --chat -n "$k" --top-p 1 --max-new-tokens $pnew --seed 3 --device "$DEVICE" --dtype $dt --fused $f \
          --max-batch-rows 256 --out "$o" > /dev/null 2> "${o%.jsonl}.err" \
          || { echo "FAIL sampling: parity generate $dt batch $rows --fused $f: rc $?"; tail -3 "${o%.jsonl}.err"; }
      done
    done
  done
  local rowsl fpaths; rowsl=$(for spec in "${par[@]}"; do set -- $spec; echo $(($1 * $2)); done)
  fpaths=$(printf '%s\n' "${pd[@]}" | grep -v '^none$' | sort -u | tr ',' '_' | tr '\n' ' ')
  [ "${#pd[@]}" = 0 ] || "$PY" - "$S" "$OUTD/sampling_parity.jsonl" "$dts" "$fpaths" $rowsl <<'PY'
import json, os, sys
s, out, dts, paths = sys.argv[1], sys.argv[2], sys.argv[3].split(), sys.argv[4].split()
batches = [int(x) for x in sys.argv[5:]]
def load(p):
    return [json.loads(l) for l in open(p)] if os.path.exists(p) and os.path.getsize(p) else None
for dt in dts:
    for rows in batches:
        base = load(f"{s}/par_{dt}_{rows}_none.jsonl")
        for f in paths:
            got = load(f"{s}/par_{dt}_{rows}_{f}.jsonl")
            if base is None or got is None or len(base) != len(got):
                print(f"FAIL sampling: parity {dt} batch {rows} {f}: missing or unequal outputs"); continue
            same, worst = 0, 0.0
            for a, b in zip(base, got):
                ia, ib = a["completion_ids"], b["completion_ids"]
                n = next((i for i, (x, y) in enumerate(zip(ia, ib)) if x != y), min(len(ia), len(ib)))
                same += ia == ib
                # log-probs up to the first differing token (the token there differs, so its does)
                la, lb = a["behaviour_logprobs"][:n], b["behaviour_logprobs"][:n]
                worst = max([worst] + [abs(x - y) for x, y in zip(la, lb)])
            bound = 1e-4 if dt == "f32" else 0.1
            ok = worst <= bound and (dt != "f32" or same == len(base))
            rec = {"check": "fused_vs_candle", "dtype": dt, "batch": rows, "path": f, "completions": len(base),
                   "identical": same, "max_abs_logprob_diff": worst, "bound": bound, "pass": ok}
            open(out, "a").write(json.dumps(rec) + "\n")
            print("PASS" if ok else "FAIL", f"sampling: {f} vs candle, {dt}, batch {rows}: {same}/{len(base)} "
                  f"completions identical, max |logprob diff| {worst:.3g} (bound {bound})")
        if "decode_cuda_graphs" not in paths:
            continue
        a, b = f"{s}/par_{dt}_{rows}_decode_cuda_graphs.jsonl", f"{s}/par_{dt}_{rows}_decode_cuda_graphs_again.jsonl"
        ok = load(a) is not None and open(a, "rb").read() == open(b, "rb").read() if os.path.exists(b) else False
        open(out, "a").write(json.dumps({"check": "graphs_rerun", "dtype": dt, "batch": rows, "pass": ok}) + "\n")
        print("PASS" if ok else "FAIL", f"sampling: graph replay, two runs, {dt}, batch {rows}: "
              + ("bit-identical" if ok else "differ or missing"))
PY
  grep -h "kernels\.\|fused decode" "$S"/par_*.err 2>/dev/null | sort -u | head -5
}

logprobs() {
  local q="Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. How many clips did Natalia sell altogether in April and May?"
  local c=" In May she sold 48 / 2 = 24 clips, so 48 + 24 = 72 in all. #### 72<|im_end|>"
  say_off
  for spec in cpu:f32:none "$DEVICE":f32:none "$DEVICE":bf16:none cpu:bf16:none "$DEVICE":f32:all "$DEVICE":bf16:all; do
    local f=${spec##*:}; local rest=${spec%:*}; local dev=${rest%:*} dt=${rest##*:}
    local sfx=""; [ "$f" = all ] && { sfx=_fused; f=$(fused all); }
    local e=$W/lp_${dev/:/}_$dt$sfx.err
    "$RLVR" logprobs --model "$W/small" --prompt "$q" --completion "$c" --chat --device "$dev" --dtype "$dt" \
      --fused "$f" > "$W/lp_${dev/:/}_$dt$sfx.json" 2> "$e" || { echo "FAIL logprobs $dev $dt --fused $f: rc $?"; tail -3 "$e"; }
  done
  "$PY" - "$W" "${DEVICE/:/}" "$OUTD/logprobs.jsonl" <<'PY'
import json, os, sys
w, dev, out = sys.argv[1:]
load = lambda d, t: json.load(open(f"{w}/lp_{d}_{t}.json")) if os.path.getsize(f"{w}/lp_{d}_{t}.json") else None
ref = load("cpu", "f32")
# The candle path, then every fused kernel (`--fused all`, issue 44) on the device.
for d, t, bound in ((dev, "f32", 1e-5), (dev, "bf16", 0.1), ("cpu", "bf16", 0.1), (dev, "f32_fused", 1e-5), (dev, "bf16_fused", 0.1)):
    if not os.path.exists(f"{w}/lp_{d}_{t}.json"):
        print(f"FAIL logprobs {d} {t}: no output"); continue
    x = load(d, t)
    if x is None or ref is None:
        print(f"FAIL logprobs {d} {t}: no output"); continue
    same_tokens = x["tokens"] == ref["tokens"]
    diff = max(abs(a - b) for a, b in zip(x["logprobs"], ref["logprobs"]))
    ok = same_tokens and diff <= bound
    rec = {"check": "logprobs", "device": d, "dtype": t, "tokens": len(x["tokens"]), "max_abs_diff_vs_cpu_f32": diff,
           "bound": bound, "mean_logprob": sum(x["logprobs"]) / len(x["logprobs"]), "pass": ok}
    open(out, "a").write(json.dumps(rec) + "\n")
    print(("PASS" if ok else "FAIL"), f"logprobs {d} {t}: {len(x['tokens'])} tokens, max |diff| vs cpu f32 = {diff:.3g} (bound {bound:g})")
PY
}

offline() {
  head -n 4 data/gsm8k/train.jsonl | "$PY" -c '
import json, sys
for l in sys.stdin: print(json.dumps({"prompt": json.loads(l)["question"]}))' > "$W/prompts.jsonl"
  "$RLVR" generate --model "$W/small" --prompts "$W/prompts.jsonl" --chat -n 4 --top-p 1 --max-new-tokens 24 \
    --seed 0 --device cpu --out "$W/exp_raw.jsonl" >/dev/null || { echo "FAIL offline: generate"; return 1; }
  # Rewards by a fixed rule of the sampled ids (1 when their sum is even), so groups have variance.
  "$PY" - "$W/exp_raw.jsonl" "$W/exp.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
with open(sys.argv[2], "w") as f:
    for r in rows:
        r["reward"] = float(sum(r["completion_ids"]) % 2 == 0)
        f.write(json.dumps(r) + "\n")
print(f"{len(rows)} experiences, {sum(r['reward'] for r in rows):.0f} rewarded")
PY
  local ops; ops=$(fused attention,rms_norm,rotary,swiglu,logprob_head,adamw)
  train() { # $1 device, $2 dtype, $3 run dir, $4 "fused": every training kernel of issue 44 on
    local k=(); [ "${4:-}" = fused ] && for op in ${ops//,/ }; do
      k+=(--set "kernels.$op=\"on\""); done
    "$RLVR" train --set model.path="\"$W/small\"" --set model.device="\"$1\"" --set model.dtype="\"$2\"" "${k[@]}" \
      --set data.experiences="\"$W/exp.jsonl\"" --set data.prompts_per_step=2 \
      --set rollout.group_size=4 --set algorithm.preset='"grpo"' --set train.steps=10 --set train.lr=1e-3 \
      --set train.micro_batch_size=4 --set train.eval_every=0 --set train.save_every=10 --set train.seed=0 \
      --set output.dir="\"$3\"" --no-progress > "$3.log" 2>&1 || { echo "FAIL offline $1 $2: rc $?"; tail -5 "$3.log"; }
  }
  # The candle composition first, compared as soon as it ran; then the fused kernels.
  train cpu f32 "$W/cpu_f32"
  train "$DEVICE" f32 "$W/gpu_f32_a"
  train "$DEVICE" f32 "$W/gpu_f32_b"
  train "$DEVICE" bf16 "$W/gpu_bf16"
  offline_compare candle
  threaded
  say_off
  if [ "$ops" = none ]; then echo "SKIP offline fused: every training kernel is off"; return 0; fi
  echo "offline fused: kernels $ops on"
  train "$DEVICE" f32 "$W/gpu_fused_f32_a" fused
  train "$DEVICE" f32 "$W/gpu_fused_f32_b" fused
  train "$DEVICE" bf16 "$W/gpu_fused_bf16" fused
  grep -h "kernels\." "$W"/gpu_fused_*.log 2>/dev/null | sort -u | head -8
  offline_compare fused
}

threaded() {
  # The explorer on its own thread beside the trainer (sync.offset = 1, interval 2): online AsymRE
  # (its -0.1 log pi term moves the weights whatever the rewards) on 2 GSM8K prompts x 4 samples,
  # 6 steps, twice on DEVICE in f32: the metrics (outside timings) bit-identical. Both threads queue
  # on the GPU's one stream (rlvr-model's device); this checks the weight hand-off between them.
  th() {
    "$RLVR" train --set model.path="\"$W/small\"" --set model.device="\"$DEVICE\"" --set model.dtype='"f32"' \
      --set data.task='"gsm8k"' --set data.train="\"$PWD/data/gsm8k/train.jsonl\"" --set data.style='"chat"' \
      --set data.prompts_per_step=2 --set rollout.group_size=4 --set rollout.max_new_tokens=16 \
      --set algorithm.preset='"asymre"' --set sync.interval=2 --set sync.offset=1 --set train.steps=6 \
      --set train.lr=1e-3 --set train.eval_every=0 --set train.save_every=0 --set train.seed=0 \
      --set output.dir="\"$1\"" --no-progress > "$1.log" 2>&1 || { echo "FAIL threaded $1: rc $?"; tail -5 "$1.log"; }
  }
  th "$W/thr_a"; th "$W/thr_b"
  "$PY" - "$W" "$OUTD/offline.jsonl" <<'PY'
import json, os, sys
w, out = sys.argv[1:]
def metrics(run):
    p = f"{w}/{run}/metrics.jsonl"
    if not os.path.exists(p): return None
    return [{k: v for k, v in json.loads(l).items() if not k.startswith("time/") and "per_s" not in k and k != "elapsed_s"}
            for l in open(p)]
a, b = metrics("thr_a"), metrics("thr_b")
same = bool(a) and a == b
first = next(((s, k) for s, (x, y) in enumerate(zip(a or [], b or []), 1) for k in sorted(set(x) | set(y)) if x.get(k) != y.get(k)), None)
moved = bool(a) and len({json.dumps(r.get("grad_norm")) for r in a}) > 1
open(out, "a").write(json.dumps({"check": "threaded_explorer", "steps": len(a or []), "metrics_identical": same,
                                 "first_difference": str(first), "pass": same}) + "\n")
print("PASS" if same else "FAIL", f"threaded explorer (sync.offset 1, interval 2): two {len(a or [])}-step runs "
      f"identical {same} (first difference {first}); grad_norm varies over steps {moved}")
PY
}

offline_compare() { # $1: candle (the cuda runs without fused kernels) or fused
  "$PY" - "$W" "$OUTD/offline.jsonl" "$1" <<'PY'
import hashlib, json, math, os, sys
w, out, which = sys.argv[1:]
def metrics(run):
    p = f"{w}/{run}/metrics.jsonl"
    if not os.path.exists(p): return None
    rows = [json.loads(l) for l in open(p)]
    return [{k: v for k, v in r.items() if not k.startswith("time/") and "per_s" not in k and k != "elapsed_s"} for r in rows]
ATOL = 1e-6  # values near 0 (the GRPO loss of a step, a KL of 1e-6) are compared absolutely
def rel(a, b):
    """|a - b| / max(|a|, |b|), with differences below ATOL counted as 0; inf for a type or length mismatch."""
    if a is None or b is None or isinstance(a, (str, bool)) or isinstance(b, (str, bool)): return 0.0 if a == b else math.inf
    if isinstance(a, list) or isinstance(b, list):
        return max([rel(x, y) for x, y in zip(a, b)] or [0.0]) if isinstance(a, list) and isinstance(b, list) and len(a) == len(b) else math.inf
    return abs(a - b) / max(abs(a), abs(b)) if abs(a - b) > ATOL else 0.0
def compare(x, y):
    worst, where = 0.0, None
    for s, (a, b) in enumerate(zip(x, y), 1):
        for k in sorted(set(a) | set(b)):
            r = rel(a.get(k), b.get(k))
            if r > worst: worst, where = r, (s, k, a.get(k), b.get(k))
    return worst, where
ref = metrics("cpu_f32")
def record(**r):
    open(out, "a").write(json.dumps(r) + "\n")
if ref is None:
    print("FAIL offline: no cpu f32 metrics"); sys.exit()
if which == "candle":
    print(f"cpu f32: {len(ref)} steps; step 1 loss {ref[0].get('loss')}, grad_norm {ref[0].get('grad_norm')}")
runs = (("gpu_f32_a", 1e-4), ("gpu_bf16", None)) if which == "candle" else (("gpu_fused_f32_a", 1e-4), ("gpu_fused_bf16", None))
pairs = (("gpu_f32_a", "gpu_f32_b"),) if which == "candle" else (("gpu_fused_f32_a", "gpu_fused_f32_b"),)
for run, bound in runs:
    x = metrics(run)
    if x is None: print(f"FAIL offline {run}: no metrics"); continue
    s1, w1 = compare(x[:1], ref[:1]); worst, where = compare(x, ref)
    ok = bound is None or (len(x) == len(ref) and s1 <= 1e-5 and worst <= bound)
    record(check="offline", run=run, steps=len(x), step1_max_rel=s1, max_rel=worst, worst=str(where), pass_=ok)
    print(("INFO" if bound is None else ("PASS" if ok else "FAIL")),
          f"offline {run} vs cpu f32: step 1 max rel {s1:.3g}, 10 steps max rel {worst:.3g} at {where}")
for ra, rb in pairs:
  a, b = metrics(ra), metrics(rb)
  if a and b:
    same = a == b
    first = next(((s, k) for s, (x, y) in enumerate(zip(a, b), 1) for k in sorted(set(x) | set(y)) if x.get(k) != y.get(k)), None)
    def digests(run):
        d = f"{w}/{run}/checkpoints/step-10"
        return {f: hashlib.sha256(open(os.path.join(d, f), "rb").read()).hexdigest() for f in sorted(os.listdir(d))
                if f.endswith(".safetensors")} if os.path.isdir(d) else {}
        
    da, db = digests(ra), digests(rb)
    ck = bool(da) and da == db
    record(check="determinism", runs=[ra, rb], metrics_identical=same, first_difference=str(first), checkpoints_identical=ck, files=sorted(da))
    print(("PASS" if same and ck else "FAIL"), f"two {len(a)}-step cuda runs ({ra}, {rb}): metrics identical {same} (first difference {first}),"
          f" checkpoint files {sorted(da)} identical {ck}")
  else:
    record(check="determinism", runs=[ra, rb], metrics_identical=None, pass_=False)
    print(f"FAIL two cuda runs ({ra}, {rb}): a run has no metrics")
PY
}

speed() {
  # bench/gpu.sh's training rows (its sampling rows only with SPEED_SAMPLE=1: the sampling part
  # measures them, with the fused path); `--fused all` less the ops switched off.
  say_off
  RUNS=1 STEP_TIMEOUT=${STEP_TIMEOUT:-90} PYTHON=$PY SAMPLE=${SPEED_SAMPLE:-0} FUSED="none $(fused all)" \
    bench/gpu.sh | tee -a "$OUTD/speed.txt"
}

breakdown() {
  # The training step of part 3 (bf16, 16 x 512 tokens) split into forward, backward and optimizer,
  # and measured again with one stage changed, to place its time: the head's chunk at the CPU's
  # size; one layer instead of 24 (the head and embedding with one layer); a 256-entry vocabulary
  # (the decoder body alone; a two-token stand-in tokenizer); 64 x 128 tokens (the same tokens
  # with a quarter of the attention's quadratic part).
  local shape=(--arch qwen2 --hidden 896 --heads 14 --kv-heads 2 --intermediate 4864 --tie-embeddings true --seed 0 --dtype bf16)
  local tok=data/tokenizers/qwen2.5/tokenizer.json
  "$PY" -c 'import sys; from tokenizers import Tokenizer, models; Tokenizer(models.WordLevel({"<unk>": 0, "<|endoftext|>": 1}, unk_token="<unk>")).save(sys.argv[1])' "$W/tok2.json"
  "$RLVR" init "${shape[@]}" --layers 24 --vocab-size 151936 --tokenizer $tok --out "$W/b_full" >/dev/null
  "$RLVR" init "${shape[@]}" --layers 1 --vocab-size 151936 --tokenizer $tok --out "$W/b_one" >/dev/null
  "$RLVR" init "${shape[@]}" --layers 24 --vocab-size 256 --tokenizer "$W/tok2.json" --out "$W/b_body" >/dev/null
  local t=(bench train --device "$DEVICE" --dtype bf16 --steps 3)
  b() { local label=$1; shift; echo "{\"variant\": \"$label\", \"result\": $("$@" || echo null)}" | tee -a "$OUTD/breakdown.jsonl"; }
  b "full" "$RLVR" "${t[@]}" --rows 16 --seq-len 512 --model "$W/b_full"
  b "cpu chunk" env RLVR_HEAD_CHUNK_ELEMS=8388608 "$RLVR" "${t[@]}" --rows 16 --seq-len 512 --model "$W/b_full"
  b "1 layer" "$RLVR" "${t[@]}" --rows 16 --seq-len 512 --model "$W/b_one"
  b "vocab 256" "$RLVR" "${t[@]}" --rows 16 --seq-len 512 --model "$W/b_body"
  b "vocab 256, 64 x 128" "$RLVR" "${t[@]}" --rows 64 --seq-len 128 --model "$W/b_body"
}

shared() {
  DEVICE=$DEVICE DTYPE=bf16 STEPS=3 GROUP=16 NEW=128 bench/share_prompt.sh | tee -a "$OUTD/shared.jsonl"
}

nccl() {
  if ! ldd "$RLVR" | grep -q libnccl; then echo "SKIP nccl: the binary is not built with the nccl feature"; return 0; fi
  if [ ! -s "$W/gpu_f32_a/metrics.jsonl" ]; then
    echo "SKIP nccl: it compares with the offline part's cuda f32 run: put offline before it in PARTS"; return 0
  fi
  # World size 1 over NCCL: the same 10 steps as part 2's cuda f32 run (at one rank NCCL's
  # all-reduce copies), so the metrics must be identical.
  "$RLVR" train --set model.path="\"$W/small\"" --set model.device="\"$DEVICE\"" --set model.dtype='"f32"' \
    --set data.experiences="\"$W/exp.jsonl\"" --set data.prompts_per_step=2 --set rollout.group_size=4 \
    --set algorithm.preset='"grpo"' --set train.steps=10 --set train.lr=1e-3 --set train.micro_batch_size=4 \
    --set train.eval_every=0 --set train.seed=0 --set distributed.backend='"nccl"' \
    --set output.dir="\"$W/nccl\"" --no-progress > "$W/nccl.log" 2>&1 || { echo "FAIL nccl: rc $?"; tail -20 "$W/nccl.log"; return 1; }
  grep -i nccl "$W/nccl.log" | head -3
  "$PY" - "$W" "$OUTD/nccl.jsonl" <<'PY'
import json, sys
w, out = sys.argv[1:]
strip = lambda r: {k: v for k, v in r.items() if not k.startswith("time/") and "per_s" not in k and k != "elapsed_s"}
a = [strip(json.loads(l)) for l in open(f"{w}/nccl/metrics.jsonl")]
b = [strip(json.loads(l)) for l in open(f"{w}/gpu_f32_a/metrics.jsonl")][:len(a)]
diff = [(s, k, x.get(k), y.get(k)) for s, (x, y) in enumerate(zip(a, b), 1) for k in sorted(set(x) | set(y)) if x.get(k) != y.get(k)]
ok = len(a) == 10 and not diff
open(out, "a").write(json.dumps({"check": "nccl_world_size_1", "steps": len(a), "differences": [str(d) for d in diff[:5]], "pass": ok}) + "\n")
print(("PASS" if ok else "FAIL"), f"nccl world size 1: {len(a)} steps, metrics equal to the run without NCCL: {not diff}", diff[:3])
PY
}

export W OUTD DEVICE PY RLVR KERNELS_OFF=${KERNELS_OFF:-}
export -f kernels sampling logprobs offline offline_compare speed breakdown shared nccl kernels_off fused say_off
echo "# parts, in this order: $PARTS; budget ${BUDGET}s"
for p in $PARTS; do part "$p" "${LIMIT[$p]}" "$p"; done
echo "# done in $(($(date +%s) - START)) s"
