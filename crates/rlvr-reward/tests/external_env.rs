//! External verifiers run with a minimal environment: `PATH`, `HOME`, `LANG`, `TMPDIR` and the
//! variables their config's `env` list names; everything else of rlvr's environment (an API key)
//! is withheld. One test in this binary: it sets process environment variables.
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

#[test]
fn the_verifier_gets_path_and_the_listed_variables_but_not_an_api_key() {
    std::env::set_var("RLVR_TEST_API_KEY", "sk-secret");
    std::env::set_var("RLVR_TEST_PASSED", "yes");
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
