//! `rlvr plot`: SVG and PNG from metrics.jsonl files, nulls skipped, legend = run directory name.

use clap::Parser;
use rlvr_train::cli::{run_plot, PlotArgs};

#[derive(Parser)]
struct W {
    #[command(flatten)]
    a: PlotArgs,
}

fn write_run(dir: &std::path::Path, offset: f64) {
    std::fs::create_dir_all(dir).unwrap();
    let lines: Vec<String> = (0..5)
        .map(|s| {
            let r = if s == 2 {
                serde_json::Value::Null
            } else {
                (s as f64 * 0.1 + offset).into()
            };
            serde_json::json!({"step": s, "reward/mean": r, "loss": 1.0 / (s as f64 + 1.0)})
                .to_string()
        })
        .collect();
    std::fs::write(dir.join("metrics.jsonl"), lines.join("\n") + "\n").unwrap();
}

#[test]
fn plots_svg_and_png() {
    let tmp = tempfile::tempdir().unwrap();
    let (a, b) = (
        tmp.path().join("on-policy"),
        tmp.path().join("off-policy-v4"),
    );
    write_run(&a, 0.0);
    write_run(&b, 0.2);
    for ext in ["svg", "png"] {
        let out = tmp.path().join(format!("p.{ext}"));
        let args = W::parse_from([
            "x",
            a.to_str().unwrap(),
            b.to_str().unwrap(),
            "--metric",
            "reward/mean",
            "--metric",
            "loss",
            "--out",
            out.to_str().unwrap(),
        ])
        .a;
        let mut buf = Vec::new();
        run_plot(&args, &mut buf).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&buf).unwrap();
        assert_eq!(v["points"], 2 * (4 + 5), "nulls are skipped");
        let bytes = std::fs::read(&out).unwrap();
        if ext == "svg" {
            let s = String::from_utf8(bytes).unwrap();
            assert!(
                s.contains("off-policy-v4") && s.contains("on-policy") && s.contains("reward/mean")
            );
        } else {
            assert_eq!(&bytes[1..4], b"PNG");
        }
    }
    let bad = W::parse_from([
        "x",
        a.to_str().unwrap(),
        "--metric",
        "nope",
        "--out",
        "/tmp/x.svg",
    ])
    .a;
    let err = run_plot(&bad, &mut Vec::new()).unwrap_err().to_string();
    assert!(err.contains("nope"), "{err}");
}
