//! Property tests: the JSONL reader and the template parser never panic, whatever the input.

use proptest::prelude::*;
use rlvr_data::read::read_jsonl;
use rlvr_data::template::{check_template, fill};
use std::io::Write;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn jsonl_reader_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..400)) {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(&bytes).unwrap();
        let _ = read_jsonl(f.path());
    }

    #[test]
    fn jsonl_reader_errors_name_the_line(lines in prop::collection::vec("[{}\":a-z0-9 ,\\[\\]]{0,20}", 1..6)) {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(lines.join("\n").as_bytes()).unwrap();
        if let Err(e) = read_jsonl(f.path()) {
            let msg = e.to_string();
            prop_assert!(msg.contains(&f.path().display().to_string()), "{}", msg);
        }
    }

    #[test]
    fn templates_never_panic(t in "[{}a-z_ é\\\\]{0,30}", v in "\\PC{0,10}") {
        let _ = check_template(&t);
        let _ = fill(&t, &[("question".into(), v)]);
    }
}
