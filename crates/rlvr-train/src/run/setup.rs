//! The composition root of `rlvr train`: builds every part of a run from the resolved config, in
//! dependency order (run directory, policy and optimizer state, reference, reward function, feed,
//! evaluator), each from those before it. The stages receive these parts and their own settings
//! ([`crate::config::settings`]); only this file and the loop see the whole config.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use rlvr_data::sampler::PromptSampler;
use rlvr_model::checkpoint::Policy;
use rlvr_model::{Model, TokenizerBundle};
use rlvr_rollout::{named_tensors, Rollout};

use super::preflight::{Online, Preflight};
use super::{Run, RunOptions};
use crate::config::settings;
use crate::config::{RawConfig, ResolvedConfig};
use crate::eval::{Best, Evaluator};
use crate::feed::backend::{self, BackendSettings, NativeWeights, ServerUse, Workload};
use crate::feed::explorer::{Explorer, TrainPrompts};
use crate::feed::offline::OfflineSource;
use crate::feed::Feed;
use crate::job::Job;
use crate::store::checkpoint::{self, non_finite_weight, SourceCursor, TrainerState};
use crate::store::experience::{check_against_model, check_lengths};
use crate::store::metrics::{append_line, truncate_after, MetricsLine};
use crate::store::state::Stateful;
use crate::store::tensorboard::Source;
use crate::update::{Trainer, TrainerRecord};

impl<'a> Run<'a> {
    /// Set-up: the run directory, the policy and optimizer state (from the latest checkpoint on
    /// resume), the reference policy, the feed and the evaluator; evaluates the initial policy on
    /// a fresh start.
    ///
    /// # Errors
    /// Config, data, model, checkpoint and I/O errors with context.
    pub(super) fn start(
        cfg: &'a ResolvedConfig,
        opts: &RunOptions,
        mut job: Job,
    ) -> anyhow::Result<Run<'a>> {
        let c = &cfg.raw;
        let run_dir = c.output.dir.clone();
        let writer = job.writer();
        // The device first: a GPU that does not open is the whole story, told before the run
        // directory's config.toml is written or the resolved `auto` values are printed.
        let device = c.model.open_device()?;
        let ckpt = pick_checkpoint(cfg, opts, &mut job)?;
        let dtype = c.model.dtype.dtype();
        let policy_dir = ckpt.clone().unwrap_or_else(|| c.model.path.clone());
        // Everything that needs no weights, checked before they load (issue 48, item 4).
        if let Some(dir) = &ckpt {
            refuse_model_only_resume(
                &checkpoint::load_state(dir)?,
                dir,
                c.train.resume_without_optimizer,
            )?;
        }
        // The environment program's stderr, in full: one file per rank, each with one writer.
        let env_log = match job.rank() {
            0 => run_dir.join("env.stderr"),
            r => run_dir.join("ranks").join(format!("rank-{r}.env.stderr")),
        };
        let mut pre = super::preflight::check(cfg, &policy_dir, Some(env_log))?;
        // A stop (the first Ctrl-C) ends the environment's restarts.
        if let super::preflight::Preflight::Online(o) = &mut pre {
            if let Some(r) = o.runner.as_mut() {
                r.watch_stop(opts.stop.clone());
            }
        }
        crate::log::phase(&format!(
            "loading the policy from {} ({} on {})",
            policy_dir.display(),
            c.model.dtype.name(),
            c.model.device
        ));
        // A resumed checkpoint was verified against its manifest by `resume_point`; `model.path`
        // is verified here when it is an rlvr checkpoint (a directory with a manifest).
        if ckpt.is_none() {
            crate::store::manifest::check_model_dir(&policy_dir, "load")?;
        }
        let mut policy = Policy::load(&policy_dir, dtype, &device)
            .with_context(|| format!("loading the policy from {}", policy_dir.display()))?;
        crate::lora::attach(&mut policy.model, c.model.lora(), &policy_dir, c.train.seed)?;
        refuse_non_finite_policy(&policy.model, &policy_dir)?;
        // o ≥ 1: the in-flight batches in the buffer are read by the feed (online_feed).
        let state = ckpt.as_deref().map(checkpoint::load_state).transpose()?;
        let start = state.as_ref().map(|s| s.step).unwrap_or(0);
        if writer {
            reset_logs(&run_dir, state.as_ref().map(|_| start))?;
        }
        note_world_size(state.as_ref(), job.world() as u64);
        let reference = load_reference(cfg, &policy.model, &policy_dir, &device)?;
        let tokenizer = policy.tokenizer;
        let settings = settings::trainer_settings(cfg, tokenizer.pad_id);
        let mut trainer = Trainer::new(policy.model, reference, settings)?;
        // The fused GPU kernels (`[kernels]`): resolved against the device, dtype and shapes.
        trainer.set_kernels(c.kernels);
        if let Some(r) = trainer.reference.as_mut() {
            r.set_kernels(c.kernels);
        }
        trainer = trainer.data_parallel_with(job.clone(), c.distributed.zero)?;
        if let (Some(st), Some(dir)) = (&state, &ckpt) {
            restore_trainer(&mut trainer, st, dir, &device)?;
        }
        let at = Resumed {
            state: state.as_ref(),
            ckpt: ckpt.as_deref(),
            policy_dir: &policy_dir,
        };
        let (feed, evaluator) = build_feed(cfg, pre, at, &trainer.model, &tokenizer, &job)?;
        let mut run = Run {
            cfg,
            run_dir,
            trainer,
            tokenizer,
            feed,
            evaluator,
            best: Best::default(),
            skipped_in_row: state.as_ref().map(|s| s.skipped_in_row).unwrap_or(0),
            last_ckpt: ckpt,
            start,
            tb: None,
            began: std::time::Instant::now(),
            no_signal: (0, 0),
            stop: (!job.is_parallel()).then(|| opts.stop.clone()),
            job,
        };
        run.best
            .load_state_dict(state.as_ref().and_then(|s| s.best))?;
        // A checkpoint of step t written before t's sync (a stop during its evaluation, a save
        // after an error) keeps the explorer of the sync before: the resume makes the sync the
        // uninterrupted run made after step t, so the explorer gets version t when it needs it.
        if state.as_ref().is_some_and(|s| s.explorer_version < start)
            && start.is_multiple_of(c.sync.interval)
        {
            crate::log::log_only(&format!(
                "resume: the checkpoint of step {start} was written before its sync; making it now"
            ));
            run.sync(start)?;
        }
        if c.output.tensorboard && writer {
            // A fresh event file from the JSONL files as cut back to the checkpoint.
            let toml = cfg.to_toml()?;
            run.tb = Some(crate::store::tensorboard::rebuild(&run.run_dir, &toml)?);
        }
        if start == 0 && run.evaluator.is_some() {
            run.evaluate_initial_policy()?;
        }
        Ok(run)
    }

    /// Step 0's evaluation of a fresh run: its metrics line (rank 0 writes it) and the log line.
    ///
    /// # Errors
    /// Evaluation and I/O errors.
    fn evaluate_initial_policy(&mut self) -> anyhow::Result<()> {
        let writer = self.job.writer();
        let mut line = MetricsLine::new(0);
        // Data parallel, every rank stops here when any rank's evaluation failed.
        let eval = self.evaluate(0, &mut line);
        self.agree_on_eval(0, eval)?.0?;
        if writer {
            append_line(&self.run_dir.join("metrics.jsonl"), &line.to_json())?;
            self.tensorboard(&[(Source::Metrics, &line.to_json())])?;
        }
        if let Some(e) = super::report::eval_text(0, &line) {
            crate::log::line(&e, writer);
        }
        Ok(())
    }
}

/// The checkpoint this run starts from: on `--resume`, rank 0 prepares the directory and picks
/// the latest checkpoint (saying its notes and manifest), then every rank takes that one
/// ([`agree_on_checkpoint`]); a fresh run prepares the directory and starts from `model.path`.
///
/// # Errors
/// Run-directory, checkpoint and collective errors.
fn pick_checkpoint(
    cfg: &ResolvedConfig,
    opts: &RunOptions,
    job: &mut Job,
) -> anyhow::Result<Option<PathBuf>> {
    let run_dir = &cfg.raw.output.dir;
    let writer = job.writer();
    let ckpt = if writer {
        prepare_run_dir(cfg, run_dir, opts.resume)?;
        if opts.resume {
            say_external_commands(cfg);
            let point = checkpoint::resume_point(run_dir)?;
            if let Some(note) = point.as_ref().and_then(|p| p.note.as_deref()) {
                crate::log::say(note);
            }
            if let Some(p) = &point {
                say_manifest(cfg, &p.dir);
            }
            point.map(|p| p.dir)
        } else {
            None
        }
    } else {
        None
    };
    let ckpt = agree_on_checkpoint(job, ckpt)?;
    if opts.resume && ckpt.is_none() && writer {
        crate::log::say(&format!(
            "note: {} holds no checkpoint yet: --resume starts the run over from step 0",
            run_dir.display()
        ));
    }
    Ok(ckpt)
}

/// Says (in the log only) that the checkpoint was written at another world size, which the
/// whole-batch normalisers make harmless.
fn note_world_size(state: Option<&TrainerState>, world: u64) {
    if let Some(st) = state.filter(|st| st.world_size != world) {
        crate::log::log_only(&format!(
            "note: the checkpoint of step {} was written at world size {}, this run has {world}: \
             the batch and its normalisers are the whole batch's at any world size, so the run \
             continues as it would have (within rounding)",
            st.step, st.world_size
        ));
    }
}

/// The reference policy when the algorithm needs one: under LoRA the policy's base with the
/// adapters off (sharing its weights), else `model.reference` or `model.path` loaded.
///
/// # Errors
/// Manifest and model-loading errors.
fn load_reference(
    cfg: &ResolvedConfig,
    policy: &Model,
    policy_dir: &Path,
    device: &candle_core::Device,
) -> anyhow::Result<Option<Model>> {
    if !cfg.algorithm.needs_reference() {
        return Ok(None);
    }
    let c = &cfg.raw;
    let p = c.model.reference.as_ref().unwrap_or(&c.model.path);
    // LoRA: the base with the adapters off, sharing the policy's base weights.
    let own = c.model.reference.is_some();
    Ok(Some(
        match crate::lora::shared_reference(policy, &c.model.path, own) {
            Some(m) => m,
            None => {
                // Verified above when it is the policy's own `model.path`.
                if *p != policy_dir {
                    crate::store::manifest::check_model_dir(p, "load")?;
                }
                Model::load(p, c.model.dtype.dtype(), device)
                    .with_context(|| format!("loading the reference model from {}", p.display()))?
            }
        },
    ))
}

/// The trainer's state from checkpoint `dir` (state `st`): the optimizer (bf16 weights resume
/// from their f32 masters) and LoRA's dropout round, or, when the checkpoint holds no optimizer
/// (`train.resume_without_optimizer`, checked before), a fresh AdamW with a note.
///
/// # Errors
/// Checkpoint reading errors and state that does not fit the model.
fn restore_trainer(
    trainer: &mut Trainer,
    st: &TrainerState,
    dir: &Path,
    device: &candle_core::Device,
) -> anyhow::Result<()> {
    let n = trainer.model.named_vars().len();
    if st.optimizer_saved {
        trainer
            .load_state_dict(TrainerRecord {
                optimizer_step: st.optimizer_step,
                optimizer: checkpoint::load_optimizer(dir, n, device)?,
                lora_dropout_round: st.lora_dropout_round,
            })
            .with_context(|| {
                format!(
                    "restoring {}: it does not fit the {n} trained tensors of the model as \
                     configured now; the checkpoint was written with other trained parameters \
                     (was model.lora_rank or model.lora_targets changed by a --set of this \
                     --resume?)",
                    dir.join("trainer_state/optimizer.safetensors").display()
                )
            })?;
    } else {
        trainer.model.set_lora_dropout_round(st.lora_dropout_round);
        crate::log::say(&format!(
            "note: {} holds no optimizer state (train.save_optimizer = false): the \
             optimizer starts afresh at step {} (train.resume_without_optimizer)",
            dir.display(),
            st.step
        ));
    }
    Ok(())
}

/// Where a run resumes: the checkpoint's state and folder (both `None` on a fresh start) and the
/// folder the policy loaded from.
#[derive(Clone, Copy)]
struct Resumed<'p> {
    state: Option<&'p TrainerState>,
    ckpt: Option<&'p Path>,
    policy_dir: &'p Path,
}

/// The feed the preflight chose (offline experiences at the checkpoint's cursor, or the online
/// explorer: [`online_feed`]) and, online, the evaluator.
///
/// # Errors
/// As [`online_feed`]; experience rows that do not fit the model.
fn build_feed(
    cfg: &ResolvedConfig,
    pre: Preflight,
    at: Resumed<'_>,
    policy: &Model,
    tokenizer: &TokenizerBundle,
    job: &Job,
) -> anyhow::Result<(Feed, Option<Evaluator>)> {
    let c = &cfg.raw;
    Ok(match (&c.data.experiences, pre) {
        (Some(path), Preflight::Offline { rows, checked }) => {
            let consumed = match at.state.map(|s| s.cursor) {
                Some(SourceCursor::Offline { groups }) => groups,
                _ => 0,
            };
            if !checked {
                let max_positions = policy.config().max_position_embeddings;
                check_lengths(&rows, path, max_positions)?;
                let vocab = policy.config().vocab_size;
                if let Some(w) = check_against_model(&rows, path, vocab)? {
                    crate::log::say(&format!("warning: {w}"));
                }
            }
            let source = OfflineSource::new(
                rows,
                path.clone(),
                consumed,
                c.data.prompts_per_step,
                Some(settings::load_tokenizer(at.policy_dir)?),
                c.train.log_rollouts,
            )?;
            (Feed::Offline(source), None)
        }
        (_, Preflight::Online(mut online)) => {
            let evaluator = online.evaluator.take();
            let feed = online_feed(cfg, at, policy, tokenizer, *online, job.clone())?;
            (feed, evaluator)
        }
        (None, Preflight::Offline { .. }) => {
            unreachable!("the preflight follows data.experiences")
        }
    })
}

/// The online feed at the checkpoint's cursor (`start`), the explorer starting from `model`'s
/// weights (version = completed steps) or, when the checkpoint holds them, its own: the train prompts, the reward function and the
/// episode runner as the preflight checks built them ([`Online`]), the backend `rollout.backend` names (the native engine over
/// its own copy of the policy, or vLLM servers), and the explorer with its starting weights
/// loaded through the [`rlvr_rollout::Rollout`] boundary, inline for o = 0 or on its own thread.
///
/// # Errors
/// Data, tokenizer, verifier, backend start-up and weight-loading errors.
fn online_feed(
    cfg: &ResolvedConfig,
    start: Resumed<'_>,
    model: &Model,
    tokenizer: &TokenizerBundle,
    online: Online,
    mut job: Job,
) -> anyhow::Result<Feed> {
    let c = &cfg.raw;
    let step = start.state.map(|s| s.step).unwrap_or(0);
    let Online {
        tokenizer: ex_tok,
        train: train_p,
        ids,
        reward,
        evaluator: _,
        runner,
    } = online;
    let sampler = prompt_sampler(c, &start, train_p.texts.len())?;
    // No prompt without room for its completion (checked before the model loaded when the policy
    // directory has a config.json; again here for one that has none, a PEFT adapter).
    let (room, room_key) = super::preflight::room(cfg);
    train_p
        .check_room(&ids, model.config().max_position_embeddings, room, room_key)
        .map_err(|e| anyhow::anyhow!("[data] Train split: {e:#}"))?;
    // With an environment a turn's context is the prompt plus up to env.max_episode_tokens of
    // turns and bridges, so vLLM's max_model_len must hold that much (DESIGN.md section 14).
    let work = Workload {
        longest_prompt: ids.iter().map(Vec::len).max().unwrap_or(0),
        max_new_tokens: room,
        room_key,
    };
    let rollout = explorer_rollout(c, model, &ex_tok, step, work, &job)?;
    let prompts = TrainPrompts {
        ids,
        texts: train_p.texts,
        references: train_p.references,
        rows: train_p.rows,
        columns: train_p.columns,
    };
    let mut explorer = Explorer::new(
        rollout,
        ex_tok,
        prompts,
        sampler,
        reward,
        settings::explorer_settings(cfg, &tokenizer.eos_ids),
    )?;
    if let Some(r) = runner {
        explorer = explorer.with_episodes(r, c.env.builtin.is_some());
    }
    if job.is_parallel() && c.rollout.backend == crate::config::RolloutBackend::Vllm {
        explorer = explorer.with_shared_servers();
    }
    let (v, o) = (c.sync.interval, c.sync.offset);
    // An explorer thread under v > 1 keeps its starting weights until the first sync.
    let keep = o > 0 && v > 1;
    let synced = load_starting_weights(&mut explorer, &start, model, step, keep)?;
    // Data parallel: no rank samples before every rank (rank 0's push to vLLM servers) loaded.
    job.barrier()?;
    let buffered = in_flight_batches(&start, o, &job, step)?;
    if start.ckpt.is_some() && job.writer() {
        let first = step + 1 + buffered.len() as u64;
        say_resampled(step, first, explorer.version(), (v, o), c.train.steps);
    }
    let gather = (job, c.train.log_rollouts);
    Feed::online(
        explorer,
        (step + 1, c.train.steps),
        v,
        o,
        gather,
        buffered,
        synced,
    )
}

/// The train split's prompt order: continued from the checkpoint's cursor on resume (an error
/// naming the state file when the cursor does not fit the split), else a fresh seeded order.
fn prompt_sampler(c: &RawConfig, start: &Resumed<'_>, n: usize) -> anyhow::Result<PromptSampler> {
    Ok(match start.state.map(|s| s.cursor) {
        Some(SourceCursor::Online { cursor }) => PromptSampler::resume(cursor, n).map_err(|e| {
            let state = start.ckpt.map_or_else(
                || "the checkpoint".to_string(),
                |d| d.join("trainer_state/state.json").display().to_string(),
            );
            let data = match &c.data.train {
                Some(p) => p.display().to_string(),
                None => format!(
                    "data.task = \"{}\"'s generated problems",
                    c.data.task.name()
                ),
            };
            anyhow::anyhow!(
                "{state}: field `cursor`: {e} (the train split: {data}); the checkpoint was \
                 written for other data, or edited"
            )
        })?,
        _ => PromptSampler::new(n, c.data.seed)?,
    })
}

/// The explorer's sampling engine: native, or the vLLM servers (rank 0 writes and pushes each
/// version, the other ranks of a data-parallel run follow); the writer records which in run.json.
fn explorer_rollout(
    c: &RawConfig,
    model: &Model,
    ex_tok: &TokenizerBundle,
    step: u64,
    work: Workload,
    job: &Job,
) -> anyhow::Result<Box<dyn Rollout>> {
    let mut backend_settings = settings::backend_settings(&c.rollout, &c.output.dir);
    // Data parallel on vLLM: rank 0 writes and pushes each version, the other ranks take it.
    if let BackendSettings::Vllm(v) = &mut backend_settings {
        v.follower = !job.writer();
        // The servers run `model.path` (a resumed run's policy is an rlvr checkpoint, which for a
        // multimodal Gemma 3 base holds its language model alone).
        v.served_base = Some(c.model.path.clone());
    }
    if job.writer() {
        crate::store::run_json::record(
            &c.output.dir,
            "rollout_backend",
            backend_settings.describe(),
        )?;
    }
    backend::build(
        &backend_settings,
        model,
        ex_tok,
        step,
        work,
        NativeWeights::Copy,
        &ServerUse::Train {
            run_dir: c.output.dir.clone(),
        },
    )
}

/// The starting weights cross the boundary once, at start and on resume: the checkpoint's
/// explorer weights when it kept them (a stale behaviour policy), else the policy's. With `keep`
/// (an explorer thread under v > 1) returns their version and a copy of them, which the feed keeps
/// until the first sync ([`Feed::online`]'s `synced`).
fn load_starting_weights(
    explorer: &mut Explorer,
    start: &Resumed<'_>,
    model: &Model,
    step: u64,
    keep: bool,
) -> anyhow::Result<Option<(u64, Model)>> {
    match (start.state, start.ckpt) {
        (Some(st), Some(dir)) if st.explorer_weights => {
            let ex_dir = dir.join("trainer_state/explorer");
            let w = Model::load(&ex_dir, model.dtype(), model.device()).with_context(|| {
                format!("loading the explorer weights from {}", ex_dir.display())
            })?;
            explorer.set_weights(st.explorer_version, &named_tensors(&w))?;
            Ok(keep.then_some((st.explorer_version, w)))
        }
        _ => {
            if !keep {
                explorer.set_weights(step, &named_tensors(model))?;
                return Ok(None);
            }
            let w = model.try_clone()?;
            explorer.set_weights(step, &named_tensors(&w))?;
            Ok(Some((step, w)))
        }
    }
}

/// Warns when a resume from the checkpoint of step `t` is not exact: steps from `first` (after the
/// checkpoint's buffered batches) that an uninterrupted run sampled with weights the checkpoint
/// does not keep ([`crate::feed::resampled_steps`]; the explorer resumes at version
/// `explorer_version`). docs/runs.md, "Resume exactness", lists when this happens.
fn say_resampled(t: u64, first: u64, explorer_version: u64, vo: (u64, u64), last: u64) {
    let off = crate::feed::resampled_steps(t, first, explorer_version, vo, last);
    let (Some(a), Some(b)) = (off.first(), off.last()) else {
        return;
    };
    let steps = match a.0 == b.0 {
        true => format!("step {}", a.0),
        false => format!("steps {}..={}", a.0, b.0),
    };
    let mut versions: Vec<String> = off.iter().map(|x| x.1.to_string()).collect();
    versions.dedup();
    crate::log::say(&format!(
        "warning: this resume is not exact: an uninterrupted run sampled {steps} with version {} \
         of the policy, whose weights (and those batches) the checkpoint of step {t} does not \
         keep; the explorer samples {} with version {explorer_version} (docs/runs.md, \"Resume \
         exactness\", says when this happens)",
        versions.join(", "),
        if off.len() == 1 { "it" } else { "them" }
    ));
}

/// The checkpoint's in-flight batches (offset `o` ≥ 1): trained on as they were sampled. Data
/// parallel, every rank reads them whole (as the gather before the checkpoint left them on every
/// rank, [`Feed::gather_in_flight`]) and keeps its share of what the environment did: the saved
/// counts are the whole batch's, kept by rank 0, the other ranks' are zero (so that the run's
/// sum over the ranks is the whole batch's), at any world size.
fn in_flight_batches(
    start: &Resumed<'_>,
    o: u64,
    job: &Job,
    step: u64,
) -> anyhow::Result<Vec<crate::feed::explorer::Batch>> {
    let mut buffered: Vec<crate::feed::explorer::Batch> = match start.ckpt {
        Some(dir) if o > 0 => checkpoint::read_buffer(dir)?,
        _ => Vec::new(),
    };
    if !job.writer() {
        for b in &mut buffered {
            if let Some(e) = b.env.as_mut() {
                *e = Default::default();
            }
        }
    }
    if !buffered.is_empty() {
        crate::log::log_only(&format!(
            "resume: {} in-flight batch(es) from the checkpoint's buffer (steps {}..={})",
            buffered.len(),
            step + 1,
            step + buffered.len() as u64
        ));
    }
    Ok(buffered)
}

/// On `--resume`: names every external verifier command the run directory's config.toml will
/// run, with its key, before anything starts. A run directory is code as well as data (a
/// downloaded one can name any program); rlvr says what it runs rather than asking, so that
/// resumes under a scheduler, with no terminal, keep working (docs/external-verifier.md).
fn say_external_commands(cfg: &ResolvedConfig) {
    for (key, command) in external_commands(&cfg.raw) {
        crate::log::say(&format!(
            "note: --resume runs the external verifier command of {}/config.toml ({key}): {}",
            cfg.raw.output.dir.display(),
            shell_words(&command)
        ));
    }
}

/// The external verifier commands of a config with their keys (`data.verifier`,
/// `reward.components[i].verifier`), in that order.
fn external_commands(raw: &RawConfig) -> Vec<(String, Vec<String>)> {
    let data = raw
        .data
        .verifier
        .iter()
        .map(|v| ("data.verifier".to_string(), v));
    let components = raw
        .reward
        .components
        .iter()
        .enumerate()
        .map(|(i, c)| (format!("reward.components[{i}].verifier"), &c.verifier));
    data.chain(components)
        .filter_map(|(key, v)| v.command().map(|c| (key, c)))
        .collect()
}

/// A command as a shell would read it back: each word quoted when it holds anything but
/// letters, digits and `-_./=:,+@%`.
fn shell_words(command: &[String]) -> String {
    let plain = |w: &str| {
        !w.is_empty()
            && w.chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c))
    };
    command
        .iter()
        .map(|w| {
            if plain(w) {
                w.clone()
            } else {
                format!("'{}'", w.replace('\'', "'\\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// On resume from checkpoint `dir` (already verified against its manifest by `resume_point`):
/// says when it has no manifest (written before manifests: loaded unchecked), and names every
/// input (dataset file, LoRA base model file) that changed since it was written.
fn say_manifest(cfg: &ResolvedConfig, dir: &Path) {
    use crate::store::manifest;
    if !dir.join(manifest::MANIFEST).is_file() {
        crate::log::say(&format!(
            "note: {} has no {} (written before checkpoints had one): its files are loaded \
             without checksums",
            dir.display(),
            manifest::MANIFEST
        ));
        return;
    }
    for line in manifest::changed_inputs(dir, &super::save::run_inputs(cfg)) {
        crate::log::say(&format!(
            "warning: {line} since {} was written: the resumed run will not continue as the \
             original would have",
            dir.display()
        ));
    }
}

/// Data parallel: every rank resumes from the checkpoint rank 0 chose ([`Job::rank0_says`]); one
/// process: `mine`.
///
/// # Errors
/// A failed collective; a path that is not UTF-8.
fn agree_on_checkpoint(
    job: &mut Job,
    mine: Option<std::path::PathBuf>,
) -> anyhow::Result<Option<std::path::PathBuf>> {
    if !job.is_parallel() {
        return Ok(mine);
    }
    let buf = match &mine {
        Some(p) => p
            .to_str()
            .with_context(|| format!("checkpoint path {} is not UTF-8", p.display()))?
            .as_bytes()
            .to_vec(),
        None => Vec::new(),
    };
    let buf = job.rank0_says(buf)?;
    Ok((!buf.is_empty())
        .then(|| std::path::PathBuf::from(String::from_utf8_lossy(&buf).into_owned())))
}

/// Refuses a policy loaded from `dir` with a NaN or infinite weight at the start of a run: it would
/// train on silently (identical completions make zero-variance groups, so no loss is ever checked).
///
/// # Errors
/// Names `dir` and the first non-finite weight; tensor errors.
fn refuse_non_finite_policy(model: &Model, dir: &Path) -> anyhow::Result<()> {
    if let Some(name) = non_finite_weight(model)? {
        bail!(
            "the policy loaded from {} holds a non-finite value (NaN or inf) in weight {name}: \
             nothing can be learned from it; start from another model.path or checkpoint",
            dir.display()
        );
    }
    Ok(())
}

/// Creates the run directory (refusing one that holds a run unless resuming), prints the config
/// warnings and writes config.toml and run.json.
fn prepare_run_dir(cfg: &ResolvedConfig, run_dir: &Path, resume: bool) -> anyhow::Result<()> {
    std::fs::create_dir_all(run_dir)
        .with_context(|| format!("creating run directory {}", run_dir.display()))?;
    remove_leftovers(run_dir)?;
    let metrics_path = run_dir.join("metrics.jsonl");
    if !resume && metrics_path.exists() && std::fs::metadata(&metrics_path)?.len() > 0 {
        bail!(
            "{} already holds a run; continue it with `rlvr train --resume {}` or choose another output.dir",
            run_dir.display(),
            run_dir.display()
        );
    }
    if let Some(a) = &cfg.auto {
        crate::log::say(a);
    }
    for w in &cfg.warnings {
        crate::log::say(&format!("warning: {w}"));
    }
    rlvr_model::weights::atomic_write(&run_dir.join("config.toml"), cfg.to_toml()?.as_bytes())?;
    crate::store::run_json::write_run_json(run_dir, cfg.raw.train.seed, resume)?;
    record_model(run_dir, &cfg.raw.model.path, resume)?;
    // The KL reference's identity, which a `--resume` checks `model.reference` against
    // (`config::checks`): recorded again on every resume, after that check passed (a moved copy
    // gets its new path, a `--set model.reference` its new model).
    let reference = cfg.raw.model.reference.as_deref();
    if !crate::store::run_json::record_reference(run_dir, reference)? {
        crate::log::log_only(&format!(
            "note: model.reference {} cannot be read, so run.json records no identity of the \
             run's reference; a --resume will not check it",
            reference.map_or(String::new(), |p| p.display().to_string())
        ));
    }
    let changes = cfg
        .resume_changes
        .iter()
        .map(|c| serde_json::json!({"key": c.key, "was": c.was, "now": c.now, "set": c.origin}))
        .collect();
    crate::store::run_json::add_resume_changes(run_dir, changes)
}

/// Records the identity of the run's model (`model`, its `model.path`) in run.json, which a
/// `--resume` checks `model.path` against ([`crate::store::model_identity`]): at the start, and on
/// a resume when none is recorded yet (a run started before they were) or the model moved (the
/// resume's check found the same model at another path).
///
/// # Errors
/// I/O errors writing run.json.
fn record_model(run_dir: &Path, model: &Path, resume: bool) -> anyhow::Result<()> {
    use crate::store::run_json;
    if resume && run_json::recorded_model(run_dir).is_some_and(|(p, _)| p == model) {
        return Ok(());
    }
    if !run_json::record_model(run_dir, model)? {
        crate::log::log_only(&format!(
            "note: {} cannot be read, so run.json records no identity of the run's model; a \
             --resume will not check model.path",
            model.display()
        ));
    }
    Ok(())
}

/// Removes what a killed run left half-written in `run_dir` (its lock held, so no other process
/// writes it): the temporaries of atomic writes (`.NAME.tmp-PID` of a process that is gone) and
/// checkpoint folders never renamed into place (`checkpoints/.tmp-step-N`). Neither is ever read
/// as the real thing; they only take room (a checkpoint's worth). train.log names each.
///
/// # Errors
/// A `.tmp-step-N` folder that cannot be removed, named.
fn remove_leftovers(run_dir: &Path) -> anyhow::Result<()> {
    let mut gone = rlvr_rundir::fs::remove_stale_temporaries(run_dir);
    let ckpts = checkpoint::checkpoints_dir(run_dir);
    gone.extend(rlvr_rundir::fs::remove_stale_temporaries(&ckpts));
    if let Ok(entries) = std::fs::read_dir(&ckpts) {
        for e in entries.flatten() {
            let unfinished = e
                .file_name()
                .to_str()
                .is_some_and(|n| n.starts_with(".tmp-step-"));
            if unfinished && e.file_type().is_ok_and(|t| t.is_dir()) {
                std::fs::remove_dir_all(e.path())
                    .with_context(|| format!("removing {}", e.path().display()))?;
                gone.push(e.path());
            }
        }
    }
    for p in gone {
        crate::log::log_only(&format!(
            "removed {}, left half-written by a killed run",
            p.display()
        ));
    }
    Ok(())
}

/// On resume from a checkpoint at step `resumed`, cuts the JSONL logs after that step; without a
/// checkpoint, removes what an earlier (lost) run wrote.
fn reset_logs(run_dir: &Path, resumed: Option<u64>) -> anyhow::Result<()> {
    for f in [
        "metrics.jsonl",
        "rollouts.jsonl",
        "eval.jsonl",
        "diagnostics.jsonl",
    ] {
        let path = run_dir.join(f);
        if let Some(start) = resumed {
            truncate_after(&path, start)?;
        } else if path.exists() {
            std::fs::remove_file(&path).with_context(|| format!("removing {}", path.display()))?;
        }
    }
    Ok(())
}

/// Refuses to resume from checkpoint `dir` when it was saved without the optimizer's state
/// (`train.save_optimizer = false`) unless `fresh` (`train.resume_without_optimizer`): the
/// resumed run would silently differ from an uninterrupted one (AdamW's moments restart at 0).
///
/// # Errors
/// The refusal, naming the checkpoint's state.json and both keys.
pub(crate) fn refuse_model_only_resume(
    state: &checkpoint::TrainerState,
    dir: &std::path::Path,
    fresh: bool,
) -> anyhow::Result<()> {
    if state.optimizer_saved || fresh {
        return Ok(());
    }
    anyhow::bail!(
        "{}: field `optimizer_saved` is false: checkpoint step-{} was saved without the \
         optimizer's state (train.save_optimizer = false, TRL's save_only_model), so --resume \
         cannot continue the run exactly; set train.resume_without_optimizer = true to resume \
         with a fresh optimizer (zero moments), or start a new run with model.path = {:?}",
        dir.join("trainer_state/state.json").display(),
        state.step,
        dir.display().to_string()
    )
}
