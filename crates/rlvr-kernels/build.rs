//! Embeds the committed Triton kernels (`kernels/build/` at the repository root) into the crate:
//! `OUT_DIR/triton_artifacts.rs` defines `MANIFEST_JSON` (the manifest's text, or `None` when the
//! file is absent: a build that ships no kernels) and `CUBINS` (each cubin's path relative to
//! `kernels/build/` with its bytes; only with the `cuda` or `cudarc-check` feature, empty
//! otherwise). No Python, no nvcc: the files are read as they were committed. Never fails the
//! build for a missing directory.

use std::path::{Path, PathBuf};

fn cubins(dir: &Path, base: &Path, out: &mut Vec<(String, PathBuf)>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    let mut paths: Vec<PathBuf> = rd.filter_map(|e| e.ok().map(|e| e.path())).collect();
    paths.sort();
    for p in paths {
        if p.is_dir() {
            cubins(&p, base, out);
        } else if p.extension().is_some_and(|e| e == "cubin") {
            let rel = p
                .strip_prefix(base)
                .unwrap()
                .to_string_lossy()
                .replace('\\', "/");
            out.push((rel, p));
        }
    }
}

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let crate_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap());
    let kernels = crate_dir.join("../../kernels");
    let build = kernels.join("build");
    // Only existing paths: cargo reruns the script on every build for a missing one.
    if build.is_dir() {
        println!("cargo:rerun-if-changed={}", build.display());
    } else if kernels.is_dir() {
        println!("cargo:rerun-if-changed={}", kernels.display());
    }
    let manifest = build.join("manifest.json");
    let mut src = String::from(
        "/// The text of `kernels/build/manifest.json` when rlvr-kernels was built; `None` when\n\
         /// the file was absent (this build ships no compiled kernels).\n",
    );
    if manifest.is_file() {
        let m = manifest.canonicalize().unwrap();
        src += &format!(
            "pub(crate) const MANIFEST_JSON: Option<&str> = Some(include_str!({:?}));\n",
            m.to_string_lossy()
        );
    } else {
        src += "pub(crate) const MANIFEST_JSON: Option<&str> = None;\n";
    }
    let mut found = Vec::new();
    let launcher = std::env::var_os("CARGO_FEATURE_CUDA").is_some()
        || std::env::var_os("CARGO_FEATURE_CUDARC_CHECK").is_some();
    if launcher {
        cubins(&build, &build, &mut found);
    }
    src += "/// Each committed cubin: (path relative to `kernels/build/`, bytes). Empty without the\n\
            /// `cuda` feature.\n#[allow(dead_code)]\npub(crate) static CUBINS: &[(&str, &[u8])] = &[\n";
    for (rel, p) in found {
        let p = p.canonicalize().unwrap();
        src += &format!(
            "    ({rel:?}, include_bytes!({:?})),\n",
            p.to_string_lossy()
        );
    }
    src += "];\n";
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap()).join("triton_artifacts.rs");
    std::fs::write(out, src).unwrap();
}
