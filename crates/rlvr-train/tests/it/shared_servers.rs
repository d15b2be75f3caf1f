//! Data parallel with an explorer thread (`sync.offset` ≥ 1) on sampling servers every rank
//! shares, which rank 0 alone loads each version into (the vLLM backend's contract:
//! `rlvr_vllm::VllmRolloutConfig::follower`), through the real feed (`Feed::online`, `next`,
//! `publish`, as the run loop drives them) on 2 and 3 ranks (`ThreadComm` threads) against one
//! process. The servers are a stand-in ([`Servers`]) that records what a real one cannot tell:
//! a push while any rank samples, a rank that samples while a push is under way or with another
//! version than the one it believes the servers hold (it took the version before rank 0's push
//! was done). None may happen, every batch j must be sampled by version s(j) = v·⌊(j−1−o)/v⌋
//! with the one-process completions, and the explorers must still sample while their trainers
//! train (the offset's point). The same protocol on a real vLLM server is
//! `live_data_parallel.rs` (scripts/ci_vllm.sh).

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use candle_core::{DType, Device, Tensor};
use rlvr_data::generate::Split;
use rlvr_data::sampler::PromptSampler;
use rlvr_dist::{SharedComm, ThreadComm};
use rlvr_model::Model;
use rlvr_rollout::{Completion, FinishReason, GroupResult, PromptIds, Rollout, SamplingParams};
use rlvr_train::config::{settings, RawConfig, ResolvedConfig};
use rlvr_train::feed::explorer::{Explorer, TrainPrompts};
use rlvr_train::feed::prompts::prepare_prompts;
use rlvr_train::feed::{behaviour_version, Feed, Next};
use rlvr_train::job::Job;

use crate::common::{arithmetic_sets, tiny_model};

/// What the shared servers hold and what went wrong on them.
#[derive(Default)]
struct ServerState {
    /// The version the servers hold.
    version: u64,
    /// A push is under way.
    pushing: bool,
    /// Sampling calls under way (all ranks).
    sampling: usize,
    /// The versions pushed, in order.
    pushes: Vec<u64>,
    /// Sampling calls that ran while their rank's trainer trained.
    overlapped: usize,
    /// What must not happen.
    violations: Vec<String>,
}

type Servers = Arc<Mutex<ServerState>>;

/// One rank's client of the shared servers: rank 0 pushes (taking a while), the others take the
/// version as pushed, as rlvr-vllm's follower does. Completions are a function of (the servers'
/// version, draw index, sample index), so a batch sampled with the wrong weights shows.
struct Client {
    servers: Servers,
    leader: bool,
    version: u64,
    rank: usize,
    /// Set while this rank's trainer trains.
    training: Arc<AtomicBool>,
}

impl Rollout for Client {
    fn version(&self) -> u64 {
        self.version
    }

    fn load_weights(
        &mut self,
        version: u64,
        _weights: &[(String, Tensor)],
    ) -> rlvr_rollout::Result<()> {
        self.version = version;
        if !self.leader {
            return Ok(());
        }
        {
            let mut s = self.servers.lock().unwrap();
            if s.sampling > 0 {
                let n = s.sampling;
                s.violations.push(format!(
                    "push of version {version} began while {n} calls sampled"
                ));
            }
            s.pushing = true;
        }
        std::thread::sleep(Duration::from_millis(40));
        let mut s = self.servers.lock().unwrap();
        if s.sampling > 0 {
            let n = s.sampling;
            s.violations.push(format!(
                "push of version {version} ended while {n} calls sampled"
            ));
        }
        s.pushing = false;
        s.version = version;
        s.pushes.push(version);
        Ok(())
    }

    fn sample(
        &mut self,
        prompts: &[PromptIds],
        first_index: usize,
        params: &SamplingParams,
        _seed: u64,
    ) -> rlvr_rollout::Result<Vec<GroupResult>> {
        let held = {
            let mut s = self.servers.lock().unwrap();
            if s.pushing {
                s.violations.push(format!(
                    "rank {} sampled draws {first_index}.. during a push",
                    self.rank
                ));
            }
            if s.version != self.version {
                let v = s.version;
                s.violations.push(format!(
                    "rank {} sampled draws {first_index}.. as version {} while the servers held {v}",
                    self.rank, self.version
                ));
            }
            if self.training.load(Ordering::SeqCst) {
                s.overlapped += 1;
            }
            s.sampling += 1;
            s.version
        };
        std::thread::sleep(Duration::from_millis(15));
        {
            let mut s = self.servers.lock().unwrap();
            s.sampling -= 1;
            if s.pushing {
                s.violations.push(format!(
                    "a push began while rank {} sampled draws {first_index}..",
                    self.rank
                ));
            }
        }
        let group = |(i, _): (usize, &PromptIds)| -> GroupResult {
            Ok((0..params.group_size)
                .map(|j| {
                    let d = (first_index + i) * 3 + j + 5 * held as usize;
                    Completion {
                        prompt_index: first_index + i,
                        sample_index: j,
                        token_ids: vec![(d % 10) as u32],
                        behaviour_logprobs: vec![-(d as f32) / 10.0],
                        finish_reason: FinishReason::Length,
                        version: held,
                    }
                })
                .collect())
        };
        Ok(prompts.iter().enumerate().map(group).collect())
    }
}

fn config(model: &Path, run: &Path, v: u64, o: u64) -> ResolvedConfig {
    let mut sets = arithmetic_sets(model, run);
    sets.push("data.prompts_per_step=5".into());
    sets.push("rollout.group_size=2".into());
    sets.push(format!("sync.interval={v}"));
    sets.push(format!("sync.offset={o}"));
    RawConfig::load(None, &sets).unwrap().resolve().unwrap()
}

/// One batch as the test compares it: each experience's completion, version and reward.
type Seen = Vec<(Vec<u32>, Option<u64>, Option<f64>)>;

/// Runs the feed of `cfg` for `steps` steps as rank `job.rank()` (one process: `Job::single()`)
/// on `servers`, as the run loop drives it: the batch of step t, a training step (a sleep),
/// the sync. Returns every batch.
fn drive(cfg: &ResolvedConfig, dir: &Path, job: Job, servers: Servers, steps: u64) -> Vec<Seen> {
    let c = &cfg.raw;
    let tok = settings::load_tokenizer(dir).unwrap();
    let model = Model::load(dir, DType::F32, &Device::Cpu).unwrap();
    let p = prepare_prompts(&c.data, Split::Train, &tok, settings::scoring(c)).unwrap();
    let ids = p
        .encode(&tok, settings::add_special_tokens(&c.data))
        .unwrap();
    let n = p.texts.len();
    let training = Arc::new(AtomicBool::new(false));
    let client = Client {
        servers,
        leader: job.writer(),
        version: 0,
        rank: job.rank(),
        training: training.clone(),
    };
    let mut ex = Explorer::new(
        Box::new(client),
        tok.clone(),
        TrainPrompts {
            ids,
            texts: p.texts,
            references: p.references,
            rows: p.rows,
            columns: p.columns,
        },
        PromptSampler::new(n, c.data.seed).unwrap(),
        Arc::new(settings::reward_function(c).unwrap()),
        settings::explorer_settings(cfg, &tok.eos_ids),
    )
    .unwrap();
    if job.is_parallel() {
        ex = ex.with_shared_servers();
    }
    let (v, o) = (c.sync.interval, c.sync.offset);
    // The starting version, pushed by rank 0 before any rank samples (as setup does).
    let named = rlvr_rollout::named_tensors(&model);
    ex.set_weights(0, &named).unwrap();
    let mut j = job.clone();
    j.barrier().unwrap();
    let synced = (v > 1).then(|| (0, model.try_clone().unwrap()));
    let mut feed = Feed::online(ex, (1, steps), v, o, (job, 4), Vec::new(), synced).unwrap();
    let mut out = Vec::new();
    for t in 1..=steps {
        let Next::Batch(b) = feed.next(t, None).unwrap() else {
            panic!("no stop was asked for")
        };
        for e in &b.experiences {
            assert_eq!(e.version, Some(behaviour_version(t, v, o)), "step {t}");
        }
        out.push(
            b.experiences
                .iter()
                .map(|e| (e.completion_ids.clone(), e.version, e.reward))
                .collect(),
        );
        training.store(true, Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(60));
        training.store(false, Ordering::SeqCst);
        feed.publish(t, v, &model).unwrap();
        if t.is_multiple_of(v) {
            j.barrier().unwrap();
        }
    }
    feed.shutdown(true);
    out
}

#[test]
fn ranks_never_sample_while_rank_0_pushes_and_give_the_one_process_batches() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tiny_model(tmp.path(), 3);
    let steps = 6;
    for (v, o) in [(1, 1), (2, 1), (1, 2)] {
        let cfg = config(&model, &tmp.path().join("run"), v, o);
        let one_servers = Servers::default();
        let one = drive(&cfg, &model, Job::single(), one_servers.clone(), steps);
        assert!(one_servers.lock().unwrap().violations.is_empty());
        for world in [2, 3] {
            let servers = Servers::default();
            let batches = ThreadComm::run(world, |comm| {
                let job = Job::over(SharedComm::new(Box::new(comm)));
                drive(&cfg, &model, job, servers.clone(), steps)
            });
            let s = servers.lock().unwrap();
            assert!(
                s.violations.is_empty(),
                "v = {v}, o = {o}, {world} ranks: {:#?}",
                s.violations
            );
            // Version 0 at start, then each version a batch of the run samples with.
            let want: Vec<u64> = std::iter::once(0)
                .chain((1..steps).filter(|u| u % v == 0 && u + o < steps))
                .collect();
            assert_eq!(s.pushes, want, "v = {v}, o = {o}, {world} ranks");
            assert!(
                s.overlapped > 0,
                "v = {v}, o = {o}, {world} ranks: no sampling overlapped a training step"
            );
            for (r, b) in batches.iter().enumerate() {
                assert_eq!(b, &one, "v = {v}, o = {o}, rank {r} of {world}");
            }
        }
    }
}
