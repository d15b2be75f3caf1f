//! A reply line that is not JSON says what it most likely is: a reward Python wrote as `NaN` or
//! `Infinity` (its `json.dumps` does unless `allow_nan=False`), or a debug print on stdout.

use rlvr_env::protocol::{parse_reply, Kind};

fn err(line: &str) -> String {
    parse_reply(Kind::Step, line, &["0:0"])
        .unwrap_err()
        .to_string()
}

#[test]
fn a_reply_that_is_not_json_names_the_likely_cause() {
    for line in [
        r#"{"episodes": [{"id": "0:0", "reward": NaN, "done": true}]}"#,
        r#"{"episodes": [{"id": "0:0", "reward": -Infinity, "done": true}]}"#,
    ] {
        let e = err(line);
        assert!(e.contains("is not JSON"), "{e}");
        assert!(e.contains("NaN and Infinity are not JSON"), "{e}");
    }
    let e = err("debug: the tool took 3 s");
    assert!(e.contains("log to stderr"), "{e}");
    // A broken object without either gets neither hint.
    let e = err(r#"{"episodes": [}"#);
    assert!(e.contains("is not JSON"), "{e}");
    assert!(!e.contains("NaN") && !e.contains("stderr"), "{e}");
    // A valid reply still parses.
    let ok = parse_reply(
        Kind::Step,
        r#"{"episodes": [{"id": "0:0", "reward": 1.0, "done": true}]}"#,
        &["0:0"],
    )
    .unwrap();
    assert_eq!(ok.len(), 1);
}
