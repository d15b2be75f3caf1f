//! Embeds the commit this crate was built from as `RLVR_GIT_COMMIT` (run.json's `git_commit`):
//! `git rev-parse HEAD` in the crate's directory, or an empty string when git or the repository is
//! not available (a build from a source archive). Never fails the build.

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let dir = std::env::var("CARGO_MANIFEST_DIR").ok()?;
    let out = Command::new("git")
        .args(args)
        .current_dir(dir)
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
        .filter(|s| !s.is_empty())
}

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let commit = git(&["rev-parse", "HEAD"]).unwrap_or_default();
    // Rebuild when HEAD moves (commit, checkout): HEAD, its reflog, the branch ref, packed refs.
    // Only existing paths: cargo reruns the script on every build for a missing one.
    if !commit.is_empty() {
        let mut paths = vec!["HEAD".to_string(), "logs/HEAD".into(), "packed-refs".into()];
        if let Some(r) = git(&["symbolic-ref", "-q", "HEAD"]) {
            paths.push(r);
        }
        for p in paths {
            if let Some(path) = git(&["rev-parse", "--git-path", &p]) {
                let dir = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_default();
                let full = std::path::Path::new(&dir).join(&path);
                if full.exists() {
                    println!("cargo:rerun-if-changed={}", full.display());
                }
            }
        }
    }
    println!("cargo:rustc-env=RLVR_GIT_COMMIT={commit}");
}
