//! CI smoke test of `rlvr lab` through the binary: a tiny sweep (2 arms, one seed, the quickstart's
//! `--fast` warm start) is killed with SIGKILL while its second run is mid-way, then rerun: the
//! finished run is kept untouched, the unfinished one resumes from its checkpoint, and the summary,
//! verdicts and figures are complete; `rlvr lab --redraw` remakes them from lab_data.json alone.
//!
//! The `rlvr` binary is the one next to this test's directory (target/debug/rlvr, built by
//! `cargo test --workspace` or `cargo build -p rlvr`), or `$RLVR_BIN`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::{forks, read};

fn rlvr_bin() -> PathBuf {
    if let Ok(p) = std::env::var("RLVR_BIN") {
        return PathBuf::from(p);
    }
    // target/debug/deps/it-HASH → target/debug/rlvr
    let exe = std::env::current_exe().unwrap();
    let bin = exe.parent().unwrap().parent().unwrap().join("rlvr");
    assert!(
        bin.exists(),
        "{} is missing: run `cargo build -p rlvr` first (or set RLVR_BIN)",
        bin.display()
    );
    bin
}

const SWEEP: &str = r#"
[lab]
jobs = 1
threads = 1
seeds = [0]
steps = 6
eval_every = 3
save_every = 2
sets = ["data.prompts_per_step=4", "rollout.group_size=4"]
seconds_per_step = 0.05

[warm_start]
quickstart_args = ["--fast"]
seconds = 5

[[arm]]
name = "grpo_v1"
preset = "grpo"
interval = 1

# Long enough to be killed mid-way.
[[arm]]
name = "reinforce_v4"
preset = "reinforce"
interval = 4
sets = ["train.steps=300", "train.eval_every=100"]

# A claim of the sweep's own, judged beside the papers'.
[[claim]]
name = "S1"
statement = "REINFORCE at interval 4 does not fall below its warm start"
compare = [{ a = "reinforce_v4", test = "non_inferior", b = "warm_start" }]
"#;

fn json(p: &Path) -> serde_json::Value {
    serde_json::from_str(&read(p)).unwrap()
}

fn lab(sweep: &Path, out: &Path) -> Command {
    let mut c = Command::new(rlvr_bin());
    c.arg("lab").arg(sweep).arg("--out").arg(out);
    c
}

#[test]
fn lab_killed_mid_run_resumes_and_completes() {
    let _forks = forks();
    let tmp = tempfile::tempdir().unwrap();
    let sweep = tmp.path().join("sweep.toml");
    std::fs::write(&sweep, SWEEP).unwrap();
    let out = tmp.path().join("lab");

    let dry = lab(&sweep, &out).arg("--dry-run").output().unwrap();
    assert!(
        dry.status.success(),
        "{}",
        String::from_utf8_lossy(&dry.stderr)
    );
    let text = String::from_utf8_lossy(&dry.stdout);
    assert!(
        text.contains("grpo_v1") && text.contains("reinforce_v4"),
        "{text}"
    );
    assert!(
        text.contains("2 runs of 6 steps, 1 warm start, 1 at once (1 thread each)"),
        "{text}"
    );

    // First lab: kill it (SIGKILL: the children go by PR_SET_PDEATHSIG) once run 2 has a checkpoint.
    let first = out.join("grpo_v1/seed-0");
    let second = out.join("reinforce_v4/seed-0");
    let mut child = lab(&sweep, &out)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    loop {
        assert!(
            child.try_wait().unwrap().is_none(),
            "the lab ended before it was killed"
        );
        if second.join("checkpoints/latest").exists() {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(600),
            "no checkpoint of run 2"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    // The orphaned `rlvr train` died too: its metrics stop growing.
    std::thread::sleep(Duration::from_millis(1500));
    let len = read(&second.join("metrics.jsonl")).len();
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(
        read(&second.join("metrics.jsonl")).len(),
        len,
        "run 2 kept running after the lab died"
    );
    let rec1: serde_json::Value = json(&first.join("lab.json"));
    assert_eq!(rec1["done"], true);
    assert_eq!(rec1["attempts"], 1);
    let rec2 = json(&second.join("lab.json"));
    assert_eq!(rec2["done"], false);
    let first_metrics = read(&first.join("metrics.jsonl"));
    let warm = read(&out.join("warm_start/seed-0/warm_start.json"));

    // Second lab: resumes.
    let res = lab(&sweep, &out).output().unwrap();
    let stderr = String::from_utf8_lossy(&res.stderr);
    assert!(res.status.success(), "{stderr}");
    let stdout = String::from_utf8_lossy(&res.stdout);
    assert!(stdout.contains("1 kept, 1 children started"), "{stdout}");
    // Finished run and warm start untouched.
    assert_eq!(read(&first.join("metrics.jsonl")), first_metrics);
    assert_eq!(json(&first.join("lab.json"))["attempts"], 1);
    assert_eq!(read(&out.join("warm_start/seed-0/warm_start.json")), warm);
    // The unfinished run was resumed (not restarted) and finished, each step once.
    let rec2 = json(&second.join("lab.json"));
    assert_eq!(rec2["done"], true);
    assert_eq!(rec2["attempts"], 2);
    let run = json(&second.join("run.json"));
    assert_eq!(run["resumed_at"].as_array().unwrap().len(), 1, "{run}");
    let steps: Vec<u64> = read(&second.join("metrics.jsonl"))
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["step"]
                .as_u64()
                .unwrap()
        })
        .collect();
    assert_eq!(steps, (0..=300).collect::<Vec<u64>>());

    // Analysis complete.
    let s = json(&out.join("summary.json"));
    let runs = s["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2);
    for r in runs {
        assert_eq!(r["done"], true, "{r}");
        let acc = r["final_accuracy"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&acc), "{r}");
        assert!(r["warm_accuracy"].as_f64().is_some(), "{r}");
        assert!(r["wall_s"].as_f64().unwrap() > 0.0, "{r}");
    }
    assert_eq!(runs[1]["steps"], 300);
    assert_eq!(runs[1]["final_step"], 300);
    assert_eq!(s["arms"].as_array().unwrap().len(), 2);
    let v = json(&out.join("verdicts.json"));
    let claims: Vec<&str> = v["verdicts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["claim"].as_str().unwrap())
        .collect();
    assert_eq!(claims, ["A1", "B1", "B2", "B3", "B4a", "B4b", "S1"]);
    let s1 = &v["verdicts"][6];
    assert_eq!(
        s1["comparisons"][0]["b"], "warm start of reinforce_v4",
        "{s1}"
    );
    // One seed: never "supported".
    assert_ne!(s1["status"], "supported", "{s1}");
    // Drift (the mean kl_behaviour at the windows' last steps; its arithmetic is tested in
    // verdicts.rs): every run has the key, a finite number or null where no step trained a token
    // (this fast warm start scores 0 on many tiny groups, so nothing may be trained).
    for r in runs {
        let d = &r["drift"];
        assert!(d.is_null() || d.as_f64().is_some_and(f64::is_finite), "{r}");
    }
    assert!(read(&out.join("summary.md")).contains("| drift |"));
    assert!(read(&out.join("verdicts.md")).contains("| A1 |"));
    assert!(read(&out.join("summary.md")).contains("| reinforce_v4 |"));
    for f in [
        "accuracy_v1",
        "accuracy_v4",
        "diagnostics_v1",
        "diagnostics_v4",
    ] {
        assert!(read(&out.join(format!("{f}.svg"))).contains("<svg"), "{f}");
        let png = std::fs::read(out.join(format!("{f}.png"))).unwrap();
        assert_eq!(&png[1..4], b"PNG", "{f}");
    }
    // `rlvr lab --redraw` from lab_data.json alone (copied away from the run directories) gives
    // the same summary and verdicts, and the figures.
    let alone = tmp.path().join("alone");
    std::fs::create_dir_all(&alone).unwrap();
    std::fs::copy(out.join("lab_data.json"), alone.join("lab_data.json")).unwrap();
    let redraw = Command::new(rlvr_bin())
        .args(["lab", "--redraw"])
        .arg(&alone)
        .output()
        .unwrap();
    assert!(
        redraw.status.success(),
        "{}",
        String::from_utf8_lossy(&redraw.stderr)
    );
    for f in ["summary.json", "summary.md", "verdicts.json", "verdicts.md"] {
        assert!(read(&out.join(f)) == read(&alone.join(f)), "{f} differs");
    }
    for f in ["accuracy_v1", "accuracy_v4", "diagnostics_v4"] {
        assert!(
            read(&alone.join(format!("{f}.svg"))).contains("<svg"),
            "{f}"
        );
    }
    // `rlvr lab --regimes`: the lab and its redraw judged the same data, so no claim depends on
    // the "regime"; the report names both and has the drift table.
    let rep = tmp.path().join("regimes");
    let regimes = Command::new(rlvr_bin())
        .args(["lab", "--regimes"])
        .arg(format!("first={}", out.display()))
        .arg("--regimes")
        .arg(format!("second={}", alone.display()))
        .arg("--out")
        .arg(&rep)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&regimes.stdout);
    assert!(
        regimes.status.success(),
        "{}",
        String::from_utf8_lossy(&regimes.stderr)
    );
    assert_eq!(
        text.matches("same verdict in every regime").count(),
        7,
        "{text}"
    );
    let md = read(&rep.join("regimes.md"));
    assert!(
        md.contains("| claim | first | second | depends on the regime |"),
        "{md}"
    );
    assert!(md.contains("| reinforce_v4 | 4 | 0 |"), "{md}");
    let rj = json(&rep.join("regimes.json"));
    assert_eq!(rj["claims"].as_array().unwrap().len(), 7);
    // Every run directory is an ordinary one: `rlvr plot` reads it.
    let plot = Command::new(rlvr_bin())
        .arg("plot")
        .arg(&first)
        .arg(&second)
        .args(["--metric", "eval/accuracy", "--out"])
        .arg(tmp.path().join("p.svg"))
        .output()
        .unwrap();
    assert!(
        plot.status.success(),
        "{}",
        String::from_utf8_lossy(&plot.stderr)
    );

    // Third lab after an edit of grpo_v1's arm: that run no longer matches its sweep, so it is
    // moved aside (not deleted) and rerun; the unchanged run is kept.
    std::fs::write(
        &sweep,
        SWEEP.replace(
            "preset = \"grpo\"\ninterval = 1\n",
            "preset = \"grpo\"\ninterval = 1\nsets = [\"train.lr=3e-5\"]\n",
        ),
    )
    .unwrap();
    let dry = lab(&sweep, &out).arg("--dry-run").output().unwrap();
    let text = String::from_utf8_lossy(&dry.stdout);
    let state = |arm: &str| {
        text.lines()
            .find(|l| l.starts_with(arm))
            .and_then(|l| l.split_whitespace().nth(5))
            .unwrap_or("")
            .to_string()
    };
    assert_eq!(state("grpo_v1"), "stale", "{text}");
    assert_eq!(state("reinforce_v4"), "done", "{text}");
    let res = lab(&sweep, &out).output().unwrap();
    let stderr = String::from_utf8_lossy(&res.stderr);
    assert!(res.status.success(), "{stderr}");
    assert!(
        stderr.contains("rerunning grpo_v1 seed 0 from scratch: config key train.lr was"),
        "{stderr}"
    );
    let stdout = String::from_utf8_lossy(&res.stdout);
    assert!(stdout.contains("1 kept, 1 children started"), "{stdout}");
    let aside: Vec<PathBuf> = std::fs::read_dir(out.join("grpo_v1"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().contains("seed-0.stale-"))
        .collect();
    assert_eq!(aside.len(), 1, "{aside:?}");
    assert_eq!(read(&aside[0].join("metrics.jsonl")), first_metrics);
    let cfg: toml::Value = toml::from_str(&read(&first.join("config.toml"))).unwrap();
    assert_eq!(cfg["train"]["lr"].as_float(), Some(3e-5));
    assert_eq!(json(&first.join("lab.json"))["attempts"], 1);
    assert_eq!(json(&second.join("lab.json"))["attempts"], 2);
    // OUT/lab.json keeps every invocation that finished (the killed first one wrote none).
    let lj = json(&out.join("lab.json"));
    let inv = lj["invocations"].as_array().unwrap();
    assert_eq!(inv.len(), 2, "{lj}");
    assert_eq!(inv[1]["started"], 1);
    let sum: f64 = inv.iter().map(|i| i["wall_s"].as_f64().unwrap()).sum();
    assert!(
        (lj["wall_s_total"].as_f64().unwrap() - sum).abs() < 1e-9,
        "{lj}"
    );
}

/// A dry run of one run of one step says so in the singular ("1 run of 1 step, 1 warm start, 1 at
/// once (1 thread each)"), never "1 runs of 1 steps".
#[test]
fn dry_run_counts_are_pluralised() {
    let _forks = forks();
    let tmp = tempfile::tempdir().unwrap();
    let sweep = tmp.path().join("sweep.toml");
    let one = SWEEP
        .replace("steps = 6", "steps = 1")
        .split("# Long enough")
        .next()
        .unwrap()
        .to_string();
    std::fs::write(&sweep, one).unwrap();
    let dry = lab(&sweep, &tmp.path().join("lab"))
        .arg("--dry-run")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&dry.stdout);
    assert!(
        dry.status.success(),
        "{}",
        String::from_utf8_lossy(&dry.stderr)
    );
    assert!(
        text.contains("1 run of 1 step, 1 warm start, 1 at once (1 thread each)"),
        "{text}"
    );
}

/// An arm that cannot start (an unknown preset, a `--set` of an unknown key, a sync offset beyond
/// the steps) is named by `--dry-run` and by the run itself before anything runs, each with
/// `rlvr train`'s message; they used to be listed as `new` and fail only when their turn came,
/// after the warm starts and the arms before them.
#[test]
fn arms_that_cannot_start_are_named_before_anything_runs() {
    let _forks = forks();
    let tmp = tempfile::tempdir().unwrap();
    let sweep = tmp.path().join("sweep.toml");
    let mut text = SWEEP.split("# Long enough").next().unwrap().to_string();
    text.push_str(
        "[[arm]]\nname = \"typo\"\npreset = \"grpoo\"\n\n\
         [[arm]]\nname = \"bad_set\"\npreset = \"grpo\"\nsets = [\"train.lrr=1e-3\"]\n\n\
         [[arm]]\nname = \"far\"\npreset = \"grpo\"\ninterval = 4\noffset = 9\n",
    );
    std::fs::write(&sweep, text).unwrap();
    let out = tmp.path().join("lab");
    for dry in [true, false] {
        let mut c = lab(&sweep, &out);
        if dry {
            c.arg("--dry-run");
        }
        let o = c.output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "dry={dry}: {err}");
        assert!(
            err.contains("3 arms of the sweep's 4 arms cannot start"),
            "{err}"
        );
        assert!(
            err.contains("arm typo: ") && err.contains("unknown algorithm preset `grpoo`"),
            "{err}"
        );
        assert!(
            err.contains("arm bad_set: ") && err.contains("train.lr"),
            "{err}"
        );
        assert!(
            err.contains("arm far: ") && err.contains("sync.offset = 9"),
            "{err}"
        );
        assert!(!err.contains("arm grpo_v1"), "{err}");
        assert!(
            !out.join("warm_start").exists(),
            "dry={dry}: a warm start ran"
        );
    }
}

/// The shipped sweeps parse with their arms and claims, and their dry runs work from another
/// working directory: the GPU sweep's `[plan]` prints each arm's memory from `rlvr plan` (the
/// 1.5B shape from configs/shapes, the model itself being absent) and fits its GPU.
#[test]
fn shipped_sweeps_dry_run_and_the_gpu_sweep_plans_its_memory() {
    let _forks = forks();
    let configs = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../configs");
    let tmp = tempfile::tempdir().unwrap();
    for (file, runs, claims) in [
        ("lab.toml", 60, 0),
        ("lab_low_drift.toml", 51, 0),
        ("lab_ablations.toml", 30, 5),
        ("lab_gsm8k_1.5b.toml", 24, 0),
        ("lab_multi_turn.toml", 15, 3),
        ("lab_paper_b_wide.toml", 15, 3),
    ] {
        let path = configs.join(file);
        let s = rlvr_lab::sweep::Sweep::load(Some(&path)).unwrap();
        assert_eq!(s.runs().len(), runs, "{file}");
        assert_eq!(s.claims.len(), claims, "{file}");
        assert_eq!(s.lab.paper_claims, claims == 0, "{file}");
        let dry = Command::new(rlvr_bin())
            .current_dir(tmp.path())
            .args(["lab", "--dry-run", "--out", "lab"])
            .arg(&path)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&dry.stdout);
        assert!(
            dry.status.success(),
            "{file}: {}",
            String::from_utf8_lossy(&dry.stderr)
        );
        assert!(text.contains(&format!("{runs} runs of ")), "{file}: {text}");
        if file == "lab_gsm8k_1.5b.toml" {
            assert!(
                text.contains("Memory per run (`rlvr plan`, in 141GB):"),
                "{text}"
            );
            let rows: Vec<&str> = text
                .lines()
                .skip_while(|l| !l.starts_with("Memory per run"))
                .skip(2)
                .take(12)
                .collect();
            assert_eq!(rows.len(), 12, "{text}");
            for r in rows {
                let f: Vec<&str> = r.split_whitespace().collect();
                let train: f64 = f[1].parse().unwrap();
                assert!((60.0..80.0).contains(&train), "{r}");
                assert_eq!((f[3], f[4]), ("4", "yes"), "{r}");
            }
            assert!(text.contains("about 144 h 00 min"), "{text}");
        }
    }
    // The default sweep's [fast] selection has every arm the six claims need (B4b's first-written
    // RED-Drop included).
    let fast = rlvr_lab::sweep::Sweep::load(Some(&configs.join("lab.toml")))
        .unwrap()
        .select(true, &[])
        .unwrap();
    let names: Vec<&str> = fast.arms.iter().map(|a| a.name.as_str()).collect();
    assert!(names.contains(&"red_drop_bernoulli_v16"), "{names:?}");
    assert_eq!(fast.runs().len(), 12);
}

/// Issue 49 item 2: on SIGTERM the lab used to SIGKILL its runs mid-save and exit 1 (its docs
/// said 130). It now passes SIGTERM on: the running `rlvr train` saves its current step (a
/// checkpoint beyond the `save_every = 2` cadence when the step is odd) and exits, and the lab
/// exits 143; the same command then finishes the sweep.
#[test]
fn sigterm_lets_the_runs_save_and_the_lab_exits_143() {
    let _forks = forks();
    let tmp = tempfile::tempdir().unwrap();
    let sweep = tmp.path().join("sweep.toml");
    std::fs::write(&sweep, SWEEP).unwrap();
    let out = tmp.path().join("lab");
    let second = out.join("reinforce_v4/seed-0");
    let child = lab(&sweep, &out)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while !second.join("checkpoints/latest").exists() {
        assert!(
            t0.elapsed() < Duration::from_secs(600),
            "no checkpoint of run 2"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let st = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(st.success());
    let o = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(143), "{err}");
    assert!(
        err.contains("interrupted by signal 15: the runs saved their current step and stopped"),
        "{err}"
    );
    let log = read(&second.join("train.log"));
    let steps: Vec<u64> = read(&second.join("metrics.jsonl"))
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| v["step"].as_u64())
        .collect();
    let last = *steps.last().unwrap();
    assert!(
        log.contains(&format!("interrupted by SIGTERM after step {last}")),
        "{log}"
    );
    assert_eq!(
        read(&second.join("checkpoints/latest")).trim(),
        format!("step-{last}")
    );
    let again = lab(&sweep, &out).output().unwrap();
    assert!(
        again.status.success(),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );
    assert_eq!(json(&second.join("lab.json"))["done"], true);
}
