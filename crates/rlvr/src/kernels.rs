//! `rlvr kernels`: the compiled Triton kernels this binary carries (issue 44), and the launch
//! records of `bench/gpu_check.sh`'s `kernels` part.
//!
//! - `rlvr kernels list`: every manifest entry (name, family, target, warps, shared memory,
//!   registers, spills) and the small-shape record that checks it, if any.
//! - `rlvr kernels record --shape small --out DIR`: every family's launches at small awkward
//!   shapes with the CPU results (`rlvr_kernels::triton::records::record_small`, the same
//!   records rlvr-kernels' tests replay under Triton's interpreter), for
//!   `kernels/replay_gpu.py` to replay from the committed cubins on a GPU.
//! - `rlvr kernels record --shape qwen2.5-0.5b --out DIR`: every distinct launch of one training
//!   step at the benchmark shape, random inputs, no expected outputs, each with its op group and
//!   launches per step (`record_bench`), for `kernels/replay_gpu.py --time N`.
//!
//! The records are written on the machine that replays them (the benchmark-shape set is about
//! 1 GB: too big to carry to a lent GPU).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use rlvr_kernels::triton::records::{self, BenchShape};
use rlvr_kernels::triton::{Manifest, Recorder, Target};

/// `rlvr kernels ...`.
#[derive(Subcommand)]
pub enum KernelsCommand {
    /// Print the manifest's entries (name, family, target, warps, shared bytes, registers,
    /// spills) and the small-shape record that checks each.
    List,
    /// Write launch records for kernels/replay.py (interpreter) or kernels/replay_gpu.py (GPU).
    Record(RecordArgs),
}

/// `rlvr kernels record`.
#[derive(Args)]
pub struct RecordArgs {
    /// `small`: every variant at small awkward shapes with the CPU results (correctness);
    /// `qwen2.5-0.5b`: one training step's launches at 16 x 512 tokens in bf16, random inputs,
    /// no expected outputs, each with its op group and launches per step (timing; about 1 GB).
    #[arg(long, default_value = "small")]
    pub shape: String,
    /// The directory to write (created; records of the same label are replaced).
    #[arg(long)]
    pub out: PathBuf,
    /// `sm90a` (H100/H200), `sm80` (A100, RTX 30xx/40xx, L40S) or `all` (one subdirectory per
    /// target).
    #[arg(long, default_value = "sm90a")]
    pub target: String,
    /// Leave out the expected outputs (small shape; the benchmark shape never has them).
    #[arg(long)]
    pub no_expected: bool,
}

/// Runs `rlvr kernels ...`.
pub fn run(cmd: &KernelsCommand, out: &mut dyn Write) -> anyhow::Result<()> {
    let m = Manifest::committed().context("this binary carries no kernel manifest")?;
    match cmd {
        KernelsCommand::List => list(m, out),
        KernelsCommand::Record(a) => record(m, a, out),
    }
}

fn targets(m: &Manifest, spec: &str) -> anyhow::Result<Vec<Target>> {
    let all = m.targets();
    let want: Vec<Target> = match spec {
        "all" => all.clone(),
        s => match Target::ALL.iter().find(|t| t.name() == s) {
            Some(t) => vec![*t],
            None => bail!("--target {s}: use sm90a, sm80 or all"),
        },
    };
    for t in &want {
        if !all.contains(t) {
            bail!("the manifest has no {t} kernels");
        }
    }
    Ok(want)
}

fn dir_bytes(d: &Path) -> u64 {
    let Ok(rd) = std::fs::read_dir(d) else {
        return 0;
    };
    rd.flatten()
        .map(|e| match e.metadata() {
            Ok(md) if md.is_dir() => dir_bytes(&e.path()),
            Ok(md) => md.len(),
            Err(_) => 0,
        })
        .sum()
}

fn record(m: &Manifest, a: &RecordArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    let ts = targets(m, &a.target)?;
    let bench = match a.shape.as_str() {
        "small" => None,
        "qwen2.5-0.5b" => Some(BenchShape::qwen2_5_0_5b()),
        s => bail!("--shape {s}: use small or qwen2.5-0.5b"),
    };
    for t in &ts {
        let dir = if ts.len() > 1 {
            a.out.join(t.name())
        } else {
            a.out.clone()
        };
        let rec = Recorder::new(&dir)?;
        let t0 = Instant::now();
        let dirs = match &bench {
            None => records::record_small(&rec, m, *t, !a.no_expected)?,
            Some(shape) => {
                let dirs = records::record_bench(&rec, m, *t, shape)?;
                writeln!(
                    out,
                    "{}: {} rows x {} tokens, {} layers, hidden {}, {} parameters, {}",
                    shape.name,
                    shape.rows,
                    shape.seq_len,
                    shape.layers,
                    shape.hidden,
                    shape.params(),
                    shape.dtype.name()
                )?;
                for d in &dirs {
                    let json: serde_json::Value =
                        serde_json::from_str(&std::fs::read_to_string(d.join("record.json"))?)?;
                    let tm = &json["timing"];
                    writeln!(
                        out,
                        "  {:26} {:26} grid {:16} {:>9} x{:<8} {:>7.1} MB",
                        json["label"].as_str().unwrap_or(""),
                        json["name"].as_str().unwrap_or(""),
                        json["grid"].to_string(),
                        tm["group"].as_str().unwrap_or(""),
                        tm["repeat"]
                            .as_f64()
                            .map(|r| format!("{r:.3}"))
                            .unwrap_or_default(),
                        dir_bytes(d) as f64 / 1e6
                    )?;
                }
                dirs
            }
        };
        writeln!(
            out,
            "{} {} records for {t} in {} ({:.1} MB, {:.2} s)",
            dirs.len(),
            a.shape,
            dir.display(),
            dir_bytes(&dir) as f64 / 1e6,
            t0.elapsed().as_secs_f64()
        )?;
    }
    Ok(())
}

fn list(m: &Manifest, out: &mut dyn Write) -> anyhow::Result<()> {
    // Which entries the small-shape records check: write them once into a scratch directory.
    let tmp = std::env::temp_dir().join(format!("rlvr-kernels-list-{}", std::process::id()));
    let mut covered: std::collections::BTreeMap<(String, Target), Vec<String>> = Default::default();
    for t in m.targets() {
        let rec = Recorder::new(tmp.join(t.name()))?;
        for d in records::record_small(&rec, m, t, false)? {
            let json: serde_json::Value =
                serde_json::from_str(&std::fs::read_to_string(d.join("record.json"))?)?;
            let name = json["name"].as_str().unwrap_or("").to_string();
            let label = json["label"].as_str().unwrap_or("").to_string();
            covered.entry((name, t)).or_default().push(label);
        }
    }
    let _ = std::fs::remove_dir_all(&tmp);
    writeln!(
        out,
        "# manifest: triton {}, ptxas {}, {} entries",
        m.triton,
        m.ptxas,
        m.kernels.len()
    )?;
    writeln!(
        out,
        "{:34} {:13} {:6} {:>5} {:>7} {:>5} {:>6}  small-shape record",
        "name", "family", "target", "warps", "shared", "regs", "spills"
    )?;
    let mut n_covered = 0;
    for k in &m.kernels {
        let labels = covered.get(&(k.name.clone(), k.target));
        n_covered += usize::from(labels.is_some());
        let launchable = match k.check_launchable() {
            Ok(()) => String::new(),
            Err(e) => format!("  NOT LAUNCHABLE: {e}"),
        };
        writeln!(
            out,
            "{:34} {:13} {:6} {:>5} {:>7} {:>5} {:>6}  {}{launchable}",
            k.name,
            k.family,
            k.target.name(),
            k.num_warps,
            k.shared_bytes,
            k.registers,
            k.spills,
            labels.map(|l| l.join(",")).unwrap_or_else(|| "-".into())
        )?;
    }
    writeln!(
        out,
        "# {n_covered} of {} entries have a small-shape record (rlvr kernels record --shape small)",
        m.kernels.len()
    )?;
    Ok(())
}
