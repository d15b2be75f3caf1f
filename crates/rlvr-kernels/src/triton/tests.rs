//! The checks CI runs without a GPU, over the fixture manifest (`testdata/triton/`) and the
//! committed one (`kernels/build/`, when present): every entry's PTX against the manifest and
//! against its family's launch plan (the ABI test), and the launch records for
//! `kernels/replay.py`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::families::{self, fixture, FAMILIES_WITHOUT_PLAN};
use super::manifest::{tests::FIXTURE, Manifest, Target};
use super::record::{HostBuffer, Recorder, Tolerance, RECORD_ENV};
use super::records::uniform;
use super::{ptx, DType};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/triton")
}

/// Every problem of a manifest's entries, checked against the PTX files under `build`: the
/// entry launchable, its PTX matching it, and its family's plan matching both.
fn abi_problems(m: &Manifest, build: &Path) -> Vec<String> {
    let mut problems = Vec::new();
    for k in &m.kernels {
        let what = format!("{} ({})", k.name, k.target);
        if let Err(e) = k.check_launchable() {
            problems.push(e.to_string());
        }
        let ptx_text = match std::fs::read_to_string(build.join(&k.ptx)) {
            Ok(t) => t,
            Err(e) => {
                problems.push(format!("{what}: cannot read {}: {e}", k.ptx));
                continue;
            }
        };
        if let Err(e) = ptx::check_abi(k, &ptx_text) {
            problems.push(e.to_string());
        }
        match families::example_plan(k) {
            Some(Ok(plan)) => {
                if let Err(e) = plan.check_against(k) {
                    problems.push(e.to_string());
                }
                if let Err(e) = ptx::check_plan(&plan, &ptx_text) {
                    problems.push(e.to_string());
                }
            }
            Some(Err(e)) => problems.push(format!("{what}: its plan builder refuses it: {e}")),
            None if FAMILIES_WITHOUT_PLAN.contains(&k.family.as_str()) => {}
            None => problems.push(format!(
                "{what}: family {} has no launch plan builder in triton::families (write one, or \
                 list the family in FAMILIES_WITHOUT_PLAN)",
                k.family
            )),
        }
    }
    for fam in FAMILIES_WITHOUT_PLAN {
        if let Some(k) = m.kernels.iter().find(|k| k.family == *fam) {
            if families::example_plan(k).is_some() {
                problems.push(format!(
                    "family {fam} has a plan builder now: remove it from FAMILIES_WITHOUT_PLAN"
                ));
            }
        }
    }
    problems
}

#[test]
fn abi_of_the_fixture() {
    let m = Manifest::parse(FIXTURE).unwrap();
    let problems = abi_problems(&m, &fixture_dir());
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The committed kernels (`kernels/build/`): every entry's PTX against the manifest and its
/// family's plan, and every cubin present. Passes, saying so, while nothing is committed.
#[test]
fn abi_of_the_committed_kernels() {
    let build = repo_root().join("kernels/build");
    let Ok(json) = std::fs::read_to_string(build.join("manifest.json")) else {
        eprintln!("kernels/build/manifest.json absent: no compiled kernels to check");
        assert!(Manifest::committed().is_err());
        return;
    };
    let m = Manifest::parse(&json).unwrap();
    assert_eq!(
        &m,
        Manifest::committed().unwrap(),
        "the embedded manifest is stale: rebuild rlvr-kernels"
    );
    let mut problems = abi_problems(&m, &build);
    for k in &m.kernels {
        match std::fs::read(build.join(&k.cubin)) {
            Ok(bytes) => {
                if let Err(e) = ptx::check_cubin(k, &bytes) {
                    problems.push(e.to_string());
                }
            }
            Err(e) => problems.push(format!("{} ({}): {}: {e}", k.name, k.target, k.cubin)),
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    eprintln!("{} committed kernel entries checked", m.kernels.len());
}

/// The launcher's argument list must be rejected when it drifts from the PTX (a Triton
/// upgrade that drops or adds a scratch pointer, a builder passing an i64 for an i32).
#[test]
fn plan_against_ptx_mismatches_are_named() {
    let m = Manifest::parse(FIXTURE).unwrap();
    let k = m.entry("rows_scale_f32_b64", Target::Sm90a).unwrap();
    let ptx_text = std::fs::read_to_string(fixture_dir().join(&k.ptx)).unwrap();
    let plan = families::example_plan(k).unwrap().unwrap();
    ptx::check_plan(&plan, &ptx_text).unwrap();
    let mut bad = plan.clone();
    bad.args[2] = super::Arg::I64 { value: 3 };
    let e = ptx::check_plan(&bad, &ptx_text).unwrap_err().to_string();
    assert!(e.contains("argument 2 (n_rows, i64 scalar)"), "{e}");
    let mut bad = plan.clone();
    bad.args.pop();
    bad.params.pop();
    let e = ptx::check_plan(&bad, &ptx_text).unwrap_err().to_string();
    assert!(
        e.contains("passes 8 arguments, the PTX entry takes 9"),
        "{e}"
    );
    assert!(e.contains("not the scratch pointers"), "{e}");
}

/// Where this test run writes records: `RLVR_KERNEL_RECORD` (a relative path is taken from
/// the repository root, since `cargo test` runs in the crate's directory), else a temporary
/// directory removed afterwards. Returns (recorder, whether to remove it).
fn recorder() -> (Recorder, bool) {
    match std::env::var_os(RECORD_ENV).filter(|d| !d.is_empty()) {
        Some(d) => {
            let d = PathBuf::from(d);
            let d = if d.is_relative() {
                repo_root().join(d)
            } else {
                d
            };
            (Recorder::new(d).unwrap(), false)
        }
        None => {
            let d =
                std::env::temp_dir().join(format!("rlvr-kernel-records-{}", std::process::id()));
            (Recorder::new(d).unwrap(), true)
        }
    }
}

/// The fixture family's records: the CPU result computed here in f64 from the (rounded) inputs.
fn record_fixture(rec: &Recorder) -> Vec<PathBuf> {
    let m = Manifest::parse(FIXTURE).unwrap();
    let mut out = Vec::new();
    for k in m.kernels.iter().filter(|k| k.target == Target::Sm90a) {
        let s = fixture::RowsScale {
            x_offset: 5,
            rows: 3,
            cols: 150,
            stride_x: 160,
            stride_y: 152,
            alpha: -0.75,
        };
        let plan = fixture::plan(k, &s).unwrap();
        let dtype = k.params[0].dtype;
        let make = |shape: &[usize], v: &[f32]| match dtype {
            DType::Fp32 => HostBuffer::f32(shape, v),
            _ => HostBuffer::bf16(shape, v),
        };
        let x_len = s.x_offset + s.rows * s.stride_x;
        let x = make(&[x_len], &uniform(7, x_len));
        let xs = x.to_f32().unwrap();
        // y starts at a sentinel: the columns past n_cols must keep it.
        let y0 = vec![9.0f32; s.rows * s.stride_y];
        let mut want = y0.clone();
        for r in 0..s.rows {
            for c in 0..s.cols {
                let xv = xs[s.x_offset + r * s.stride_x + c] as f64;
                want[r * s.stride_y + c] = (xv * s.alpha as f64 + r as f64) as f32;
            }
        }
        let shape = [s.rows, s.stride_y];
        let tol = if dtype == DType::Fp32 {
            Tolerance::F32
        } else {
            Tolerance::BF16
        };
        let buffers = BTreeMap::from([("x".to_string(), x), ("y".to_string(), make(&shape, &y0))]);
        let expected = BTreeMap::from([("y".to_string(), (make(&shape, &want), tol))]);
        let label = format!("fixture_{}", k.name);
        out.push(rec.record(&label, k, &plan, &buffers, &expected).unwrap());
    }
    out
}

/// Writes a record for every family that has a plan builder (today: the fixture), into
/// `RLVR_KERNEL_RECORD` when set; `kernels/tests/test_replay.py` replays them.
#[test]
fn launch_records_for_replay() {
    let (rec, remove) = recorder();
    let dirs = record_fixture(&rec);
    assert_eq!(dirs.len(), 2);
    if let Ok(m) = Manifest::committed() {
        let real = super::records::record_small(&rec, m, Target::Sm90a, true).unwrap();
        eprintln!("{} launch records of the committed kernels", real.len());
    }
    for d in &dirs {
        let json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(d.join("record.json")).unwrap()).unwrap();
        assert_eq!(json["format"], 1);
        assert_eq!(json["entry"], "rows_scale_kernel");
        assert_eq!(
            json["grid"],
            serde_json::json!([
                3,
                if json["name"] == "rows_scale_f32_b64" {
                    3
                } else {
                    2
                },
                1
            ])
        );
        assert_eq!(json["args"][0]["offset_elems"], 5);
        assert_eq!(
            json["args"][6],
            serde_json::json!({"param": "alpha", "kind": "f32", "value": -0.75})
        );
        assert_eq!(
            json["args"][8],
            serde_json::json!({"param": "profile_scratch", "kind": "scratch"})
        );
        let x = std::fs::metadata(d.join("x.bin")).unwrap().len();
        let elem = if json["name"] == "rows_scale_f32_b64" {
            4
        } else {
            2
        };
        assert_eq!(x, (5 + 3 * 160) * elem);
        assert!(d.join("y.expected.bin").is_file());
    }
    if remove {
        std::fs::remove_dir_all(rec.dir()).unwrap();
    }
}

#[test]
fn recorder_refuses_inconsistent_records() {
    let d = std::env::temp_dir().join(format!("rlvr-kernel-records-bad-{}", std::process::id()));
    let rec = Recorder::new(&d).unwrap();
    let m = Manifest::parse(FIXTURE).unwrap();
    let k = m.entry("rows_scale_f32_b64", Target::Sm80).unwrap();
    let plan = families::example_plan(k).unwrap().unwrap();
    let x = HostBuffer::f32(&[8], &[0.0; 8]);
    let y = HostBuffer::f32(&[4], &[0.0; 4]);
    let tol = Tolerance::F32;
    let err = |bufs: Vec<(&str, HostBuffer)>, exp: Vec<(&str, HostBuffer)>| {
        let b = bufs.into_iter().map(|(n, b)| (n.to_string(), b)).collect();
        let e = exp
            .into_iter()
            .map(|(n, b)| (n.to_string(), (b, tol)))
            .collect();
        rec.record("bad", k, &plan, &b, &e).unwrap_err().to_string()
    };
    let e = err(vec![("x", x.clone())], vec![]);
    assert!(e.contains("buffer y not given"), "{e}");
    let e = err(
        vec![("x", HostBuffer::bf16(&[8], &[0.0; 8])), ("y", y.clone())],
        vec![],
    );
    assert!(
        e.contains("buffer x is bf16, the plan passes it as fp32"),
        "{e}"
    );
    let e = err(
        vec![("x", HostBuffer::f32(&[2], &[0.0; 2])), ("y", y.clone())],
        vec![],
    );
    assert!(e.contains("offset 5 past buffer x's 2 elements"), "{e}");
    let e = err(
        vec![("x", x.clone()), ("y", y.clone())],
        vec![("z", y.clone())],
    );
    assert!(
        e.contains("expected output z is not a buffer of the plan"),
        "{e}"
    );
    let e = err(
        vec![("x", x.clone()), ("y", y.clone())],
        vec![("y", HostBuffer::f32(&[2, 2], &[0.0; 4]))],
    );
    assert!(
        e.contains("expected y is fp32 [2, 2], the buffer fp32 [4]"),
        "{e}"
    );
    let mut nan = plan.clone();
    nan.args[6] = super::Arg::F32 { value: f32::NAN };
    let b: BTreeMap<String, HostBuffer> = [("x", x.clone()), ("y", y.clone())]
        .into_iter()
        .map(|(n, b)| (n.to_string(), b))
        .collect();
    let e = rec
        .record("bad", k, &nan, &b, &BTreeMap::new())
        .unwrap_err()
        .to_string();
    assert!(e.contains("alpha = NaN"), "{e}");
    let e = rec
        .record("a/b", k, &plan, &BTreeMap::new(), &BTreeMap::new())
        .unwrap_err()
        .to_string();
    assert!(e.contains("label"), "{e}");
    std::fs::remove_dir_all(&d).unwrap();
}

/// The benchmark-shape records at a tiny stand-in shape: one record per distinct launch, each
/// with its group and repeat, and `bench.json` listing them with the budgets.
#[test]
fn bench_records_carry_their_repeats() {
    use super::records::{record_bench, BenchShape, BUDGETS_MS};
    assert_eq!(BenchShape::qwen2_5_0_5b().params(), 494_032_768);
    assert_eq!(BenchShape::qwen2_5_0_5b().head_chunk_width(), 4096);
    let Ok(m) = Manifest::committed() else {
        eprintln!("no committed kernels: nothing to record");
        return;
    };
    let shape = BenchShape {
        name: "tiny".into(),
        rows: 2,
        seq_len: 40,
        hidden: 96,
        layers: 3,
        q_heads: 4,
        kv_heads: 2,
        head_dim: 64,
        intermediate: 200,
        vocab: 1000,
        head_chunk_elems: 80 * 300,
        adamw_sample: 5000,
        ..BenchShape::qwen2_5_0_5b()
    };
    let d = std::env::temp_dir().join(format!("rlvr-bench-records-{}", std::process::id()));
    let rec = Recorder::new(&d).unwrap();
    let dirs = record_bench(&rec, m, Target::Sm90a, &shape).unwrap();
    let bench: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(d.join("bench.json")).unwrap()).unwrap();
    let index = bench["records"].as_array().unwrap();
    assert_eq!(index.len(), dirs.len());
    assert_eq!(bench["params"], shape.params());
    for (g, ms, _) in BUDGETS_MS {
        assert_eq!(bench["groups"][g]["budget_ms"], ms);
    }
    let repeat = |label: &str| {
        let json: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(d.join(label).join("record.json")).unwrap(),
        )
        .unwrap();
        assert!(json["expected"].as_object().unwrap().is_empty());
        (
            json["timing"]["group"].as_str().unwrap().to_string(),
            json["timing"]["repeat"].as_f64().unwrap(),
        )
    };
    assert_eq!(repeat("layer_rmsnorm_add_fwd"), ("layer".into(), 6.0));
    assert_eq!(repeat("layer_rmsnorm_dw"), ("layer".into(), 7.0));
    assert_eq!(repeat("attention_bwd_dkdv"), ("attention".into(), 3.0));
    // 24 000 logits per chunk over 80 rows: 300 columns, 3 full chunks and one of 100.
    assert_eq!(repeat("head_fwd_chunk"), ("head".into(), 3.0));
    assert_eq!(repeat("head_bwd_last_chunk"), ("head".into(), 1.0));
    let (g, r) = repeat("adamw_step");
    assert_eq!(g, "adamw");
    assert!((r - shape.params() as f64 / 5000.0).abs() < 1e-9);
    let groups: std::collections::BTreeSet<String> = index
        .iter()
        .map(|r| r["group"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(groups.len(), 4);
    std::fs::remove_dir_all(&d).unwrap();
}
