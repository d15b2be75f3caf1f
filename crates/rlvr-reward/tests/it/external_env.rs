//! External verifiers run with a minimal environment: `PATH`, `HOME`, `LANG`, `TMPDIR` and the
//! variables their config's `env` list names; everything else of rlvr's environment (an API key)
//! is withheld. rlvr's environment is that of a child process of this test binary, started with
//! the variables set (the crate's other tests share this process, so it is left as it was).
#![cfg(unix)]

use rlvr_reward::combine::VerifierConfig;
use rlvr_reward::Sample;

/// Prints, for each of the variables, its value or `unset`, joined by `|`.
const SHOW: &str = r#"v="${RLVR_TEST_API_KEY-unset}|${RLVR_TEST_PASSED-unset}|${PATH:+path}""#;

fn config(mode: &str, script: &str, env: &[&str]) -> VerifierConfig {
    serde_json::from_value(serde_json::json!({
        "kind": "external", "mode": mode, "timeout_s": 30,
        "command": ["sh", "-c", script], "env": env,
    }))
    .unwrap()
}

fn seen(v: &VerifierConfig) -> String {
    let verifier = v.build().unwrap();
    let score = verifier.score(&Sample::new("1", "1")).unwrap();
    score.extracted.unwrap()
}

/// Set in the child process of the test below, which runs it again there.
const CHILD: &str = "RLVR_TEST_ENV_CHILD";

#[test]
fn the_verifier_gets_path_and_the_listed_variables_but_not_an_api_key() {
    if std::env::var_os(CHILD).is_none() {
        let name =
            "external_env::the_verifier_gets_path_and_the_listed_variables_but_not_an_api_key";
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([name, "--exact", "--nocapture", "--test-threads=1"])
            .env(CHILD, "1")
            .env("RLVR_TEST_API_KEY", "sk-secret")
            .env("RLVR_TEST_PASSED", "yes")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && text.contains("test result: ok. 1 passed"),
            "the child failed or ran no test:\n{text}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        return;
    }
    let per_batch = format!(
        "cat >/dev/null; {SHOW}; printf '{{\"reward\": 1, \"extracted\": \"%s\"}}\\n' \"$v\""
    );
    let persistent = format!(
        "while read l; do {SHOW}; printf '{{\"rewards\": [{{\"reward\": 1, \"extracted\": \"%s\"}}]}}\\n' \"$v\"; done"
    );
    for (mode, script) in [("per_batch", &per_batch), ("persistent", &persistent)] {
        // Before: the program inherited rlvr's whole environment, the key included.
        assert_eq!(
            seen(&config(mode, script, &[])),
            "unset|unset|path",
            "{mode}"
        );
        assert_eq!(
            seen(&config(mode, script, &["RLVR_TEST_PASSED"])),
            "unset|yes|path",
            "{mode}"
        );
        // Listed explicitly, the key does reach it.
        assert_eq!(
            seen(&config(mode, script, &["RLVR_TEST_API_KEY"])),
            "sk-secret|unset|path",
            "{mode}"
        );
    }
    // An entry that is not a variable name is refused, naming the key and its index.
    let e = config("per_batch", "true", &["RLVR_TEST_PASSED", "A=B"])
        .check("data.verifier")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("data.verifier.env[1] = \"A=B\" is not an environment variable name"),
        "{e}"
    );
}
