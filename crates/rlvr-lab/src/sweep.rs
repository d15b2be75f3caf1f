//! The sweep file (`configs/lab.toml` documents every key in its comments): what to run.
//!
//! A sweep is a list of **arms** (an algorithm preset plus `--set` overrides, at a sync interval and
//! offset, DESIGN.md section 2) crossed with **seeds**. Every run of a seed starts from that seed's
//! warm start: the quickstart's SFT checkpoint (`rlvr quickstart --warm-start-only --seed S`), or
//! any model the sweep names.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use serde::Deserialize;

/// The default sweep (`configs/lab.toml`), used when `rlvr lab` gets no file.
pub const DEFAULT_SWEEP: &str = include_str!("../../../configs/lab.toml");

/// `[lab]`: settings shared by every run.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LabSection {
    /// Runs at once when `--jobs` is not given.
    #[serde(default = "one")]
    pub jobs: usize,
    /// `RAYON_NUM_THREADS` of every child (pinned, so results do not depend on `--jobs`).
    #[serde(default = "one")]
    pub threads: usize,
    /// Seeds; each seed has its own warm start and one run per arm.
    pub seeds: Vec<u64>,
    /// `train.steps` of every run.
    pub steps: u64,
    /// `train.eval_every` (held-out evaluations; the verdicts use the last one).
    #[serde(default = "default_eval_every")]
    pub eval_every: u64,
    /// `train.save_every`: checkpoints a killed lab resumes from.
    #[serde(default = "default_save_every")]
    pub save_every: u64,
    /// `--set` overrides of every run (before the arm's own).
    #[serde(default)]
    pub sets: Vec<String>,
    /// Wall seconds of one training step of one run at `threads` threads, for `--dry-run` and the
    /// time left (replaced by the measured rate once runs finish).
    #[serde(default = "default_step_s")]
    pub seconds_per_step: f64,
    /// Moving-average window of the training-metric figures (1 = raw).
    #[serde(default = "one")]
    pub smooth: usize,
    /// Judge the papers' claims (A1, B1-B3, B4a, B4b; [`crate::verdict::verdicts`]). An ablation
    /// sweep whose arms are not the papers' sets it to false and judges only its `[[claim]]`s.
    #[serde(default = "yes")]
    pub paper_claims: bool,
}

fn yes() -> bool {
    true
}

fn one() -> usize {
    1
}
fn default_eval_every() -> u64 {
    25
}
fn default_save_every() -> u64 {
    50
}
fn default_step_s() -> f64 {
    0.15
}

/// `[warm_start]`: where each seed's runs start.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct WarmStartSection {
    /// A model directory for every run instead of the quickstart's warm start; `{seed}` is replaced
    /// by the seed. Requires `config`. A relative path is relative to the sweep file's directory
    /// ([`Sweep::parse_file`]), as input paths in a train config are to the config's.
    pub model: Option<String>,
    /// Base config of every run; `{seed}` is replaced. Default: the quickstart's own
    /// (`configs/quickstart.toml`, as written into the warm-start directory). A relative path is
    /// relative to the sweep file's directory.
    pub config: Option<String>,
    /// Extra arguments of `rlvr quickstart --warm-start-only` (e.g. `["--fast"]` in tests).
    #[serde(default)]
    pub quickstart_args: Vec<String>,
    /// Wall seconds of one quickstart warm start, for `--dry-run`.
    #[serde(default = "default_warm_s")]
    pub seconds: f64,
}

fn default_warm_s() -> f64 {
    60.0
}

/// `[fast]`: what `--fast` changes.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FastSection {
    /// Seeds under `--fast`.
    pub seeds: Vec<u64>,
    /// `train.steps` under `--fast`.
    pub steps: u64,
    /// Arms kept under `--fast` (by name).
    pub arms: Vec<String>,
    /// Runs at once under `--fast` when `--jobs` is not given (default: `[lab].jobs`).
    pub jobs: Option<usize>,
}

/// `[[arm]]`: one algorithm at one sync interval and offset.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Arm {
    /// Unique name; the run directories are OUT/NAME/seed-S (letters, digits, `_`, `-`).
    pub name: String,
    /// Algorithm name in figures and tables (arms with the same label are one algorithm at
    /// several intervals). Default: the preset.
    pub label: Option<String>,
    /// `algorithm.preset` (`rlvr algorithms` lists them).
    pub preset: String,
    /// `sync.interval` v.
    #[serde(default = "one_u64")]
    pub interval: u64,
    /// `sync.offset` o.
    #[serde(default)]
    pub offset: u64,
    /// `--set` overrides of this arm (after `[lab].sets`).
    #[serde(default)]
    pub sets: Vec<String>,
}

/// `[[claim]]`: a claim of the sweep's own, judged like the papers' claims
/// ([`crate::verdict::claims`]): supported when every comparison is, not supported when any is
/// not, inconclusive otherwise.
#[derive(Debug, Clone, Deserialize, serde::Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ClaimSpec {
    /// Short unique name (letters, digits, `_`, `-`), e.g. `M1`.
    pub name: String,
    /// What the claim says, one sentence (the hypothesis the comparisons test).
    pub statement: String,
    /// The comparisons, each `{ a = ARM, test = TEST, b = ARM }` with TEST one of `superior`
    /// (a − b > m), `non_inferior` (a − b > −m), `equivalent` (|a − b| < m), m = 3 points; `b` may
    /// be `warm_start`: arm a's own warm start (the same seeds' step-0 accuracy).
    pub compare: Vec<CompareSpec>,
}

/// One comparison of a [`ClaimSpec`].
#[derive(Debug, Clone, Deserialize, serde::Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct CompareSpec {
    /// Arm a (a name).
    pub a: String,
    /// The test.
    pub test: Test,
    /// Arm b (a name), or [`WARM_START`].
    pub b: String,
}

/// The form of one comparison, as a claim names it (judged by [`crate::verdict`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Test {
    /// a − b > −m.
    NonInferior,
    /// a − b > m.
    Superior,
    /// |a − b| < m.
    Equivalent,
}

impl Test {
    /// The name a sweep's `[[claim]]` writes (`non_inferior`, `superior`, `equivalent`), which
    /// verdicts.md prints.
    pub fn name(self) -> &'static str {
        match self {
            Test::NonInferior => "non_inferior",
            Test::Superior => "superior",
            Test::Equivalent => "equivalent",
        }
    }
}

/// The `b` of a [`CompareSpec`] that means arm a's own warm start.
pub const WARM_START: &str = "warm_start";

/// `[plan]`: the memory part of `--dry-run` for sweeps whose runs need a GPU. For each arm,
/// `--dry-run` runs `rlvr plan` on the arm's resolved config (its model replaced by `shape` when
/// the sweep's model is not on this machine) and prints the training and sampling peaks and
/// whether they fit `gpu_memory`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlanSection {
    /// A directory with the model's config.json (e.g. `shapes/qwen2.5-1.5b`: no weights needed),
    /// relative to the sweep file's directory; used when `[warm_start].model` has no config.json.
    pub shape: Option<String>,
    /// Memory to fit, as `rlvr plan --gpu-memory` takes it (e.g. `141GB`).
    pub gpu_memory: String,
}

fn one_u64() -> u64 {
    1
}

impl Arm {
    /// The algorithm's display name.
    pub fn label(&self) -> &str {
        self.label.as_deref().unwrap_or(&self.preset)
    }
}

/// A whole sweep file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Sweep {
    /// Shared settings.
    pub lab: LabSection,
    /// Warm start.
    #[serde(default)]
    pub warm_start: WarmStartSection,
    /// `--fast` settings (optional; without it `--fast` is an error).
    pub fast: Option<FastSection>,
    /// The arms.
    #[serde(rename = "arm")]
    pub arms: Vec<Arm>,
    /// The sweep's own claims (`[[claim]]`).
    #[serde(default, rename = "claim")]
    pub claims: Vec<ClaimSpec>,
    /// `--dry-run`'s memory plan (optional).
    pub plan: Option<PlanSection>,
}

/// `rel` joined to the absolute directory `dir` (without symbolic links): `.` parts dropped and
/// leading `..` parts taken off `dir`.
fn join_clean(dir: &Path, rel: &Path) -> PathBuf {
    use std::path::Component;
    let mut out = dir.to_path_buf();
    let mut leading = true;
    for c in rel.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir if leading && out.parent().is_some() => {
                out.pop();
            }
            other => {
                leading = false;
                out.push(other.as_os_str());
            }
        }
    }
    out
}

/// One run: an arm at a seed.
#[derive(Debug, Clone)]
pub struct RunSpec {
    /// Index into [`Sweep::arms`].
    pub arm: usize,
    /// Seed.
    pub seed: u64,
}

/// The `rlvr train` keys the lab sets for every run itself ([`Sweep::train_args`]), with the
/// sweep key that says them. A `--set` of one in a sweep would move a run's directory elsewhere
/// (`output.dir`: the lab then found "0 runs") or make its seeds differ from the ones the lab
/// reports. (`train.steps` and the evaluation and checkpoint intervals may differ per arm.)
const LAB_OWNS: &[(&str, &str)] = &[
    (
        "output.dir",
        "the sweep's --out (each run is OUT/ARM/seed-N)",
    ),
    ("train.seed", "[lab].seeds"),
    ("data.seed", "[lab].seeds"),
];

/// The keys an arm sets with its own fields: in `[lab].sets` they would be overridden by every
/// arm, in an arm's `sets` they would make the arm differ from its name and label.
const ARM_OWNS: &[(&str, &str)] = &[
    ("algorithm.preset", "the arm's preset"),
    ("sync.interval", "the arm's interval"),
    ("sync.offset", "the arm's offset"),
];

/// Refuses a `--set` in `sets` (named `what`) of a key in `owned`, naming the sweep key to use.
fn owned_keys(what: &str, sets: &[String], owned: &[(&str, &str)]) -> anyhow::Result<()> {
    for s in sets {
        let key = s.split_once('=').map_or(s.as_str(), |(k, _)| k).trim();
        if let Some((k, instead)) = owned.iter().find(|(k, _)| *k == key) {
            bail!("{what}: `{s}` sets {k}, which the lab sets itself; use {instead}");
        }
    }
    Ok(())
}

/// A name that is safe as a directory and a table key: non-empty ASCII letters, digits, `_`, `-`.
fn plain_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// Refuses a seed listed twice in `seeds` (the key `key`): each arm of `arms` would run it twice
/// into one run directory, and the statistics would count one run as two seeds.
fn duplicate_seed(key: &str, seeds: &[u64], arms: &[&str]) -> anyhow::Result<()> {
    for (i, s) in seeds.iter().enumerate() {
        if seeds[..i].contains(s) {
            bail!(
                "{key} lists seed {s} twice: arm `{}` (and every other arm: {}) would run seed {s} \
                 twice into one run directory and count it as two seeds; list each seed once",
                arms.first().copied().unwrap_or("?"),
                arms.join(", ")
            );
        }
    }
    Ok(())
}

impl Sweep {
    /// Parses a sweep file's text and checks it.
    ///
    /// # Errors
    /// TOML errors (with the key), an empty arm or seed list, duplicate or unsafe arm names, a
    /// seed listed twice, a `model` without a `config`.
    pub fn parse(text: &str) -> anyhow::Result<Sweep> {
        let s: Sweep = toml::from_str(text).context("parsing the sweep")?;
        s.check()?;
        s.check_claims()?;
        Ok(s)
    }

    /// Parses `text`, the contents of the sweep file `file`, and makes `[warm_start]`'s relative
    /// `model` and `config` paths relative to `file`'s directory (absolute, so every child run
    /// finds them whatever the working directory of `rlvr lab`). The `--set` values of `[lab].sets`
    /// and `[[arm]].sets` stay relative to the working directory, as `--set` values of
    /// `rlvr train` do.
    ///
    /// # Errors
    /// As [`Sweep::parse`]; the file's directory cannot be resolved or is not UTF-8.
    pub fn parse_file(text: &str, file: &Path) -> anyhow::Result<Sweep> {
        let mut s = Sweep::parse(text)?;
        let parent = match file.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        let dir = parent
            .canonicalize()
            .with_context(|| format!("resolving the directory of {}", file.display()))?;
        let ws = &mut s.warm_start;
        let shape = s.plan.as_mut().map(|p| &mut p.shape);
        let mut paths = vec![
            ("[warm_start].model", &mut ws.model),
            ("[warm_start].config", &mut ws.config),
        ];
        if let Some(sh) = shape {
            paths.push(("[plan].shape", sh));
        }
        for (key, value) in paths {
            let Some(v) = value.as_mut() else { continue };
            if Path::new(v.as_str()).is_absolute() {
                continue;
            }
            let joined = join_clean(&dir, Path::new(v.as_str()));
            *v = joined
                .to_str()
                .with_context(|| format!("{key}: {} is not UTF-8", joined.to_string_lossy()))?
                .to_string();
        }
        Ok(s)
    }

    /// Reads `path` ([`Sweep::parse_file`]), or the default sweep when `None`.
    ///
    /// # Errors
    /// As [`Sweep::parse_file`], plus I/O.
    pub fn load(path: Option<&Path>) -> anyhow::Result<Sweep> {
        match path {
            None => Sweep::parse(DEFAULT_SWEEP),
            Some(p) => {
                let t = std::fs::read_to_string(p)
                    .with_context(|| format!("reading {}", p.display()))?;
                Sweep::parse_file(&t, p).with_context(|| format!("in {}", p.display()))
            }
        }
    }

    fn check(&self) -> anyhow::Result<()> {
        if self.arms.is_empty() || self.lab.seeds.is_empty() {
            bail!("a sweep needs at least one [[arm]] and one seed");
        }
        let mut seen = std::collections::HashSet::new();
        for a in &self.arms {
            if !plain_name(&a.name) {
                bail!("arm name `{}`: use letters, digits, `_` and `-`", a.name);
            }
            if !seen.insert(a.name.as_str()) {
                bail!("arm `{}` appears twice", a.name);
            }
            if a.interval == 0 {
                bail!("arm `{}`: interval must be >= 1", a.name);
            }
        }
        let arms: Vec<&str> = self.arms.iter().map(|a| a.name.as_str()).collect();
        duplicate_seed("[lab].seeds", &self.lab.seeds, &arms)?;
        if let Some(f) = &self.fast {
            duplicate_seed("[fast].seeds", &f.seeds, &arms)?;
            for n in &f.arms {
                if !seen.contains(n.as_str()) {
                    bail!("[fast].arms names `{n}`, which is no [[arm]]");
                }
            }
        }
        if self.warm_start.model.is_some() && self.warm_start.config.is_none() {
            bail!("[warm_start].model needs [warm_start].config (the runs' base config)");
        }
        if self.lab.jobs == 0 || self.lab.threads == 0 || self.lab.steps == 0 {
            bail!("[lab] jobs, threads and steps must be >= 1");
        }
        owned_keys("[lab].sets", &self.lab.sets, LAB_OWNS)?;
        owned_keys("[lab].sets", &self.lab.sets, ARM_OWNS)?;
        for a in &self.arms {
            owned_keys(&format!("[[arm]] `{}` sets", a.name), &a.sets, LAB_OWNS)?;
            owned_keys(&format!("[[arm]] `{}` sets", a.name), &a.sets, ARM_OWNS)?;
        }
        Ok(())
    }

    /// Checks `[[claim]]` against the whole sweep's arms (at parse time: `--fast` and `--only` may
    /// leave a claim's arm out, which makes that claim inconclusive, not the sweep wrong).
    fn check_claims(&self) -> anyhow::Result<()> {
        let arms: Vec<&str> = self.arms.iter().map(|a| a.name.as_str()).collect();
        let mut claim_names = std::collections::HashSet::new();
        for c in &self.claims {
            if !plain_name(&c.name) {
                bail!(
                    "[[claim]] name `{}`: use letters, digits, `_` and `-`",
                    c.name
                );
            }
            if !claim_names.insert(c.name.as_str()) {
                bail!("[[claim]] `{}` appears twice", c.name);
            }
            if c.compare.is_empty() {
                bail!("[[claim]] `{}`: `compare` lists no comparison", c.name);
            }
            for (i, k) in c.compare.iter().enumerate() {
                for (side, n) in [("a", &k.a), ("b", &k.b)] {
                    if !(arms.contains(&n.as_str()) || side == "b" && n == WARM_START) {
                        bail!(
                            "[[claim]] `{}`: compare[{i}].{side} names `{n}`, which is no [[arm]] \
                             (arms: {}{})",
                            c.name,
                            arms.join(", "),
                            if side == "b" {
                                format!("; or `{WARM_START}`")
                            } else {
                                String::new()
                            }
                        );
                    }
                }
                if k.a == k.b {
                    bail!(
                        "[[claim]] `{}`: compare[{i}] compares `{}` with itself",
                        c.name,
                        k.a
                    );
                }
            }
        }
        if !self.lab.paper_claims && self.claims.is_empty() {
            bail!("[lab].paper_claims = false and no [[claim]]: the lab would judge nothing");
        }
        Ok(())
    }

    /// Applies `--fast` (its seeds, steps and arms) and `--only` (arm names or presets).
    ///
    /// # Errors
    /// `--fast` without a `[fast]` section; `--only` matching no arm.
    pub fn select(mut self, fast: bool, only: &[String]) -> anyhow::Result<Sweep> {
        if fast {
            let f = self
                .fast
                .clone()
                .context("--fast: this sweep has no [fast] section")?;
            self.lab.seeds = f.seeds;
            self.lab.steps = f.steps;
            if let Some(j) = f.jobs {
                self.lab.jobs = j;
            }
            self.arms.retain(|a| f.arms.contains(&a.name));
        }
        if !only.is_empty() {
            self.arms
                .retain(|a| only.iter().any(|o| *o == a.name || *o == a.preset));
            if self.arms.is_empty() {
                bail!("--only {only:?} matches no arm of the sweep");
            }
            // [fast].arms was checked against the whole sweep; it names a subset of what is left.
            let arms = &self.arms;
            if let Some(f) = self.fast.as_mut() {
                f.arms.retain(|n| arms.iter().any(|a| a.name == *n));
            }
        }
        self.check()?;
        Ok(self)
    }

    /// Every run, seed-major (all arms of the first seed first, so one seed's results are complete
    /// early).
    pub fn runs(&self) -> Vec<RunSpec> {
        let mut v = Vec::new();
        for &seed in &self.lab.seeds {
            for arm in 0..self.arms.len() {
                v.push(RunSpec { arm, seed });
            }
        }
        v
    }

    /// Whether the runs start from the quickstart's warm start (one child per seed).
    pub fn uses_quickstart(&self) -> bool {
        self.warm_start.model.is_none()
    }

    /// Run directory of `r` under `out`: OUT/ARM/seed-S.
    pub fn run_dir(&self, out: &Path, r: &RunSpec) -> PathBuf {
        out.join(&self.arms[r.arm].name)
            .join(format!("seed-{}", r.seed))
    }

    /// The quickstart warm-start directory of `seed` under `out`.
    pub fn warm_dir(out: &Path, seed: u64) -> PathBuf {
        out.join("warm_start").join(format!("seed-{seed}"))
    }

    /// Arguments of `rlvr train` for a fresh run `r` (config and `--set` list).
    pub fn train_args(&self, out: &Path, r: &RunSpec) -> Vec<String> {
        let arm = &self.arms[r.arm];
        let seed = r.seed.to_string();
        let sub = |s: &str| s.replace("{seed}", &seed);
        let p = |x: &Path| x.display().to_string();
        let mut sets = Vec::new();
        let config = match (&self.warm_start.model, &self.warm_start.config) {
            (Some(m), Some(c)) => {
                sets.push(format!("model.path={}", sub(m)));
                sub(c)
            }
            (None, c) => {
                let w = Sweep::warm_dir(out, r.seed);
                sets.push(format!("model.path={}", p(&w.join("sft"))));
                sets.push(format!("data.train={}", p(&w.join("data/train.jsonl"))));
                sets.push(format!("data.test={}", p(&w.join("data/test.jsonl"))));
                c.as_deref()
                    .map(sub)
                    .unwrap_or_else(|| p(&w.join("quickstart.toml")))
            }
            (Some(_), None) => unreachable!("checked in Sweep::check"),
        };
        sets.extend([
            format!("data.seed={seed}"),
            format!("train.seed={seed}"),
            format!("train.steps={}", self.lab.steps),
            format!("train.eval_every={}", self.lab.eval_every),
            format!("train.save_every={}", self.lab.save_every),
            format!("output.dir={}", p(&self.run_dir(out, r))),
        ]);
        sets.extend(self.lab.sets.iter().map(|s| sub(s)));
        sets.extend([
            format!("algorithm.preset=\"{}\"", arm.preset),
            format!("sync.interval={}", arm.interval),
            format!("sync.offset={}", arm.offset),
        ]);
        sets.extend(arm.sets.iter().map(|s| sub(s)));
        let mut args = vec![
            "train".into(),
            "--no-progress".into(),
            "--config".into(),
            config,
        ];
        for s in sets {
            args.push("--set".into());
            args.push(s);
        }
        args
    }

    /// Estimated wall seconds of the whole sweep at `jobs` runs at once: warm starts plus
    /// runs × steps × `seconds_per_step`, divided over the jobs.
    pub fn estimate_s(&self, jobs: usize) -> f64 {
        let warm = if self.uses_quickstart() {
            self.lab.seeds.len() as f64 * self.warm_start.seconds
        } else {
            0.0
        };
        let runs = self.runs().len() as f64 * self.lab.steps as f64 * self.lab.seconds_per_step;
        (warm + runs) / jobs.max(1) as f64
    }
}
