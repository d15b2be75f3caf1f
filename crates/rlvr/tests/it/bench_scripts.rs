//! The bench scripts' own behaviour (not their numbers): a script that is killed leaves neither
//! its work directory nor a running rlvr behind. Each runs with a stand-in `rlvr` (a shell script
//! given as `RLVR`) whose `train` keeps writing into its run directory as a real run does, so
//! no build and no model is needed.
#![cfg(target_os = "linux")]

use crate::common::{alive, left_after};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A stand-in `rlvr`: `init` makes `--out`; `train` writes its pid to `pidfile`, then appends to
/// its `output.dir`'s metrics.jsonl every 50 ms, recreating the directory as a checkpoint save
/// would; anything else succeeds at once.
fn fake_rlvr(dir: &Path, pidfile: &Path) -> PathBuf {
    let p = dir.join("fake-rlvr");
    let script = format!(
        r#"#!/bin/sh
cmd=$1; shift
case "$cmd" in
init) while [ $# -gt 0 ]; do [ "$1" = --out ] && mkdir -p "$2"; shift; done ;;
train)
  out=
  for a in "$@"; do case "$a" in output.dir=*) out=${{a#output.dir=}}; out=${{out#\"}}; out=${{out%\"}};; esac; done
  echo $$ > {pid}.tmp && mv {pid}.tmp {pid}
  while :; do mkdir -p "$out"; echo '{{}}' >> "$out/metrics.jsonl"; sleep 0.05; done ;;
esac
"#,
        pid = pidfile.display()
    );
    std::fs::write(&p, script).unwrap();
    let _ = Command::new("chmod").arg("+x").arg(&p).status();
    p
}

/// `bench/share_prompt.sh` killed by SIGTERM or SIGINT while its `rlvr train` runs exits with
/// 128 + the signal, kills that run and removes its work directory under `$TMPDIR`. (It used to
/// remove the directory and leave the run going, which wrote it again.)
#[test]
fn share_prompt_sh_killed_mid_run_leaves_no_directory_and_no_run() {
    for (sig, code) in [("TERM", 143), ("INT", 130)] {
        let tmp = tempfile::tempdir().unwrap();
        let work = tmp.path().join("tmp");
        std::fs::create_dir(&work).unwrap();
        let pidfile = tmp.path().join("train.pid");
        let fake = fake_rlvr(tmp.path(), &pidfile);
        let mut child = Command::new("bash")
            .arg(repo().join("bench/share_prompt.sh"))
            .env("RLVR", &fake)
            .env("TMPDIR", &work)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let t0 = Instant::now();
        while !pidfile.exists() {
            if let Some(st) = child.try_wait().unwrap() {
                let mut err = String::new();
                use std::io::Read;
                child
                    .stderr
                    .take()
                    .unwrap()
                    .read_to_string(&mut err)
                    .unwrap();
                panic!("share_prompt.sh ended before its train started ({st}): {err}");
            }
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "train never started"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let train = std::fs::read_to_string(&pidfile)
            .unwrap()
            .trim()
            .to_string();
        // Let the run write a little first.
        std::thread::sleep(Duration::from_millis(200));
        let st = Command::new("kill")
            .args([format!("-{sig}"), child.id().to_string()])
            .status()
            .unwrap();
        assert!(st.success());
        let t0 = Instant::now();
        let status = loop {
            if let Some(st) = child.try_wait().unwrap() {
                break st;
            }
            if t0.elapsed() > Duration::from_secs(20) {
                let _ = child.kill();
                panic!("SIG{sig}: share_prompt.sh still running after 20 s");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        // What an orphaned run would write shows within a few of its 50 ms writes.
        std::thread::sleep(Duration::from_millis(300));
        let was_alive = alive(&train);
        let left_running = left_after(std::slice::from_ref(&train), 0);
        let left: Vec<_> = std::fs::read_dir(&work)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(status.code(), Some(code), "SIG{sig}: {status}");
        assert!(
            !was_alive && left_running.is_empty(),
            "SIG{sig}: the script's rlvr train (pid {train}) outlived it"
        );
        assert!(left.is_empty(), "SIG{sig}: left under $TMPDIR: {left:?}");
    }
}
