#!/usr/bin/env bash
# SIGKILL / --resume audit of `rlvr train`.
#
#   RLVR=target/debug/rlvr nice -n 10 scripts/kill_audit/kill_audit.sh   (~90 s on 2 cores)
#
# Env: RLVR (required), WORK (scratch dir, default a new /tmp/kill_audit.XXXXXX), STEPS (default 12),
# SAVE_EVERY (2), KILLS_PER_REGIME (14: the plan below; more repeats it), SEED (bash $RANDOM seed, default 1),
# REGIMES (space-separated subset of: onpolicy offpolicy offset1 lora offset2v2).
#
# For each regime: one uninterrupted reference run, then one fresh run per kill moment, SIGKILLed
# at that moment, then `rlvr train --resume DIR` to the end, compared with the reference by
# compare.py (metrics.jsonl minus time keys per step, each step once; eval.jsonl; rollouts.jsonl;
# the final checkpoint's *.safetensors byte-equal). Every rlvr command runs under a 120 s limit.
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
RLVR=${RLVR:?set RLVR to an rlvr binary}
WORK=${WORK:-$(mktemp -d /tmp/kill_audit.XXXXXX)}
STEPS=${STEPS:-12}
SAVE_EVERY=${SAVE_EVERY:-2}
SEED=${SEED:-1}
REGIMES=${REGIMES:-"onpolicy offpolicy offset1 lora offset2v2"}
LIMIT=120
RANDOM=$SEED
T_START=$(date +%s)

rm -rf "$WORK"
mkdir -p "$WORK"

# The character tokenizer of crates/rlvr/tests/it/common.rs (tokenizer_json).
python3 - "$WORK/tokenizer.json" <<'EOF'
import json, sys
chars = "0123456789+-*= #\n"
vocab = {c: i for i, c in enumerate(chars)}
unk = len(chars)
vocab["<unk>"] = unk
vocab["<|endoftext|>"] = unk + 1
j = {"version": "1.0", "truncation": None, "padding": None,
     "added_tokens": [{"id": unk + 1, "content": "<|endoftext|>", "single_word": False,
                       "lstrip": False, "rstrip": False, "normalized": False, "special": True}],
     "normalizer": None,
     "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "(?s)."}, "behavior": "Isolated", "invert": False},
     "post_processor": None, "decoder": {"type": "Fuse"},
     "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"}}
open(sys.argv[1], "w").write(json.dumps(j))
EOF

MODEL=$WORK/model
if ! timeout $LIMIT "$RLVR" init --hidden 64 --layers 2 --heads 4 --kv-heads 2 --intermediate 128 \
    --max-position-embeddings 128 --tokenizer "$WORK/tokenizer.json" --out "$MODEL" \
    >"$WORK/init.out" 2>"$WORK/init.err"; then
    echo "rlvr init failed:"; cat "$WORK/init.err"; exit 1
fi

# The tests' `sets(...)` recipe (run_dir.rs), a little larger, with checkpoints and evaluations,
# and a deterministic persistent verifier (reward = digit fraction of the completion) so that the
# random model gets reward variance and nonzero gradients.
common_sets() { # RUN_DIR
    S=(--set "model.path=\"$MODEL\"" --set "output.dir=\"$1\""
       --set 'model.device="cpu"' --set 'model.dtype="f32"'
       --set 'data.task="arithmetic"' --set data.arithmetic.min_digits=1 --set data.arithmetic.max_digits=1
       --set data.arithmetic.train_size=64 --set data.arithmetic.test_size=8
       --set data.prompts_per_step=4 --set rollout.group_size=8 --set rollout.max_new_tokens=8
       --set train.lr=1e-2 --set train.eval_every=4 --set train.steps=$STEPS
       --set train.save_every=$SAVE_EVERY
       --set "data.verifier={ kind = \"external\", mode = \"persistent\", command = [\"python3\", \"$HERE/digit_reward.py\"] }")
}
regime_sets() { # REGIME
    case $1 in
        onpolicy)  R=(--set sync.interval=1 --set sync.offset=0) ;;
        offpolicy) R=(--set sync.interval=4 --set sync.offset=0) ;;
        offset1)   R=(--set sync.interval=1 --set sync.offset=1) ;;
        lora)      R=(--set model.lora_rank=4 --set sync.interval=1) ;;
        offset2v2) R=(--set sync.interval=2 --set sync.offset=2) ;;
        *) echo "unknown regime $1"; exit 2 ;;
    esac
}

now_ms() { echo $(( $(date +%s%N) / 1000000 )); }
last_step() { # DIR -> last step of metrics.jsonl (-1 when none)
    local s
    s=$(tail -n 1 "$1/metrics.jsonl" 2>/dev/null | grep -o '^{"step":[0-9]*' | cut -d: -f2)
    echo "${s:--1}"
}
latest_of() { cat "$1/checkpoints/latest" 2>/dev/null | tr -d '\n' || true; }
alive() { kill -0 "$1" 2>/dev/null; }
msleep() { sleep "$(awk -v m="$1" 'BEGIN{printf "%.3f", m/1000}')"; }

# The reference: also measures the time to the first metrics line (start-up) and the total.
run_ref() { # REGIME
    local d=$WORK/$1/ref t0 pid first=-1
    mkdir -p "$WORK/$1"
    common_sets "$d"; regime_sets "$1"
    t0=$(now_ms)
    "$RLVR" train --no-progress "${S[@]}" "${R[@]}" >"$d.out" 2>"$d.err" &
    pid=$!
    while alive $pid; do
        if [ $first -lt 0 ] && [ -s "$d/metrics.jsonl" ]; then first=$(( $(now_ms) - t0 )); fi
        if [ $(( $(now_ms) - t0 )) -gt $((LIMIT * 1000)) ]; then kill -9 $pid; echo "reference $1 hung"; exit 1; fi
        sleep 0.005
    done
    wait $pid; local rc=$?
    REF_MS=$(( $(now_ms) - t0 ))
    REF_FIRST_MS=$first
    if [ $rc -ne 0 ] || [ "$(last_step "$d")" != "$STEPS" ]; then
        echo "reference $1 failed (rc $rc):"; tail -5 "$d.err"; exit 1
    fi
}

# Waits until CONDITION (a shell snippet over $d) holds, or the run exits, or the limit passes.
# Sets WAIT_RESULT to met / exited / hung.
wait_until() { # PID T0 CONDITION
    local pid=$1 t0=$2 cond=$3
    while :; do
        if eval "$cond"; then WAIT_RESULT=met; return; fi
        if ! alive "$pid"; then WAIT_RESULT=exited; return; fi
        if [ $(( $(now_ms) - t0 )) -gt $((LIMIT * 1000)) ]; then WAIT_RESULT=hung; return; fi
        sleep 0.002
    done
}

TRIED=0; EXACT=0; DIFFER=0; ERRORS=0; HANGS=0; PANICS=0; MISSED=0; STARTOVER=0; REFUSED_EMPTY=0
NONEXACT=()

kill_one() { # REGIME INDEX MOMENT (kind:arg:arg)
    local reg=$1 i=$2 moment=$3 d=$WORK/$1/k$2 t0 pid kind a b cond killed_at reached ck note=""
    common_sets "$d"; regime_sets "$reg"
    IFS=: read -r kind a b <<<"$moment"
    t0=$(now_ms)
    "$RLVR" train --no-progress "${S[@]}" "${R[@]}" >"$d.out" 2>"$d.err" &
    pid=$!
    case $kind in
        startup|delay) msleep "$a"; WAIT_RESULT=met; alive $pid || WAIT_RESULT=exited ;;
        metrics)  wait_until $pid $t0 "[ \$(last_step $d) -ge $a ]"
                  [ "$WAIT_RESULT" = met ] && [ "${b:-0}" -gt 0 ] && msleep "$b" ;;
        ckpt_tmp) wait_until $pid $t0 "[ -e $d/checkpoints/.tmp-step-$a ]" ;;
        ckpt_dir) wait_until $pid $t0 "[ -e $d/checkpoints/step-$a ]" ;;
        latest)   wait_until $pid $t0 "[ \"\$(latest_of $d)\" = step-$a ]" ;;
        final)    wait_until $pid $t0 "[ \$(last_step $d) -ge $STEPS ]" ;;
    esac
    killed_at=$(( $(now_ms) - t0 ))
    if alive $pid; then kill -KILL $pid 2>/dev/null; else note="(run had already exited: kill missed) "; MISSED=$((MISSED + 1)); fi
    wait $pid 2>/dev/null; local krc=$?
    [ "$WAIT_RESULT" = hung ] && note="${note}(first run hung before the moment) "
    reached=$(last_step "$d"); ck=$(latest_of "$d"); [ -n "$ck" ] || ck=none
    local tmps; tmps=$(ls -a "$d/checkpoints" 2>/dev/null | grep '^\.tmp' | tr '\n' ' ')
    [ -n "$tmps" ] && note="${note}(left ${tmps% }) "
    TRIED=$((TRIED + 1))
    local cfg=yes; [ -e "$d/config.toml" ] || cfg=no

    local rrc outcome
    timeout $LIMIT "$RLVR" train --no-progress --resume "$d" >"$d.resume.out" 2>"$d.resume.err"
    rrc=$?
    if grep -q panicked "$d.err" "$d.resume.err"; then PANICS=$((PANICS + 1)); note="${note}(PANIC) "; fi
    grep -q "starts the run over" "$d.resume.err" && { note="${note}(resume started over) "; STARTOVER=$((STARTOVER + 1)); }
    if [ $rrc -eq 124 ] || [ $rrc -eq 137 ]; then
        HANGS=$((HANGS + 1)); outcome="HANG (resume ran past ${LIMIT}s)"
    elif [ $rrc -ne 0 ]; then
        local msg; msg=$(grep -m1 -i "error" "$d.resume.err" || tail -n1 "$d.resume.err")
        if [ $cfg = no ] && [ "$reached" = -1 ] && [ "$ck" = none ]; then
            REFUSED_EMPTY=$((REFUSED_EMPTY + 1)); outcome="resume refused (nothing saved yet, no config.toml): rc $rrc: $msg"
        else
            outcome="resume error rc $rrc: $msg"
        fi
        ERRORS=$((ERRORS + 1))
    else
        outcome=$(python3 "$HERE/compare.py" "$WORK/$reg/ref" "$d")
        if [ "${outcome%%:*}" = differs ]; then DIFFER=$((DIFFER + 1)); else EXACT=$((EXACT + 1)); fi
    fi
    local line
    line=$(printf '%-9s k%-2s %-14s killed@%5sms (first run rc %s) reached step %s, latest %s, config.toml %s %s-> %s' \
        "$reg" "$i" "$moment" "$killed_at" "$krc" "$reached" "$ck" "$cfg" "$note" "$outcome")
    echo "$line"
    case $outcome in exact*) ;; *) NONEXACT+=("$line") ;; esac
}

rand() { echo $(( RANDOM % ($1 > 0 ? $1 : 1) )); } # 0..N-1

for reg in $REGIMES; do
    run_ref "$reg"
    step_ms=$(( (REF_MS - REF_FIRST_MS) / STEPS )); [ $step_ms -gt 0 ] || step_ms=1
    echo "== $reg: reference ${REF_MS} ms, first metrics line at ${REF_FIRST_MS} ms, ~${step_ms} ms/step"
    ck_steps=(); for ((s = SAVE_EVERY; s < STEPS; s += SAVE_EVERY)); do ck_steps+=($s); done
    pick_ck() { echo "${ck_steps[$(rand ${#ck_steps[@]})]}"; }
    s1=$(( 1 + $(rand $((STEPS / 2))) ))            # early-half step
    s2=$(( STEPS / 2 + $(rand $((STEPS / 2 - 1))) ))  # late-half step (< STEPS)
    plan=(
        "startup:0"
        "startup:$(( 1 + $(rand 40) ))"
        "startup:$(( 5 + $(rand $(( REF_FIRST_MS > 10 ? REF_FIRST_MS - 5 : 5 ))) ))"
        "metrics:0:0"
        "metrics:$s1:$(rand $step_ms)"
        "metrics:$s2:$(rand $step_ms)"
        "ckpt_tmp:$(pick_ck)"
        "ckpt_dir:$(pick_ck)"
        "latest:$(pick_ck)"
        "delay:$(rand $(( REF_MS * 4 / 5 )))"
        "delay:$(rand $(( REF_MS * 4 / 5 )))"
        "delay:$(rand $(( REF_MS * 4 / 5 )))"
        "delay:$(rand $(( REF_MS * 4 / 5 )))"
        "final"
    )
    n=${KILLS_PER_REGIME:-${#plan[@]}}
    for ((i = 0; i < n; i++)); do
        kill_one "$reg" "$i" "${plan[$((i % ${#plan[@]}))]}"
    done
done

echo
echo "== tally: kills tried $TRIED (landed $((TRIED - MISSED))), resumes exact $EXACT, differing $DIFFER, errors $ERRORS" \
     "(of which refused with nothing saved: $REFUSED_EMPTY), hangs $HANGS, panics $PANICS;" \
     "kills that missed (run already done) $MISSED, resumes that started over $STARTOVER;" \
     "runtime $(( $(date +%s) - T_START )) s"
if [ ${#NONEXACT[@]} -gt 0 ]; then
    echo "== non-exact cases:"
    printf '%s\n' "${NONEXACT[@]}"
fi
