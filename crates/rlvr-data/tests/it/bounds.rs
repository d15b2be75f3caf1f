//! Inputs that cannot work are errors naming file and line, not panics or silent zero rewards: GSM8K references without a
//! gold answer, JSONL lines past the read limit, prompts longer than the model's positions (with the
//! size of a real input seen: a 5 MB prompt line).

use rlvr_data::config::{DataConfig, TaskKind};
use rlvr_data::dataset::{check_prompt_lengths, prepare_split, BYTES_PER_POSITION};
use rlvr_data::generate::Split;
use rlvr_data::read::{read_jsonl, MAX_LINE_BYTES};
use rlvr_data::DataError;
use std::io::Write;

fn gsm8k(path: &std::path::Path) -> DataConfig {
    DataConfig {
        task: TaskKind::Gsm8k,
        train: Some(path.to_path_buf()),
        ..DataConfig::default()
    }
}

fn write(lines: &[String]) -> tempfile::NamedTempFile {
    let mut f = tempfile::Builder::new()
        .suffix(".jsonl")
        .tempfile()
        .unwrap();
    for l in lines {
        writeln!(f, "{l}").unwrap();
    }
    f
}

fn row(q: &str, a: &str) -> String {
    serde_json::json!({"question": q, "answer": a}).to_string()
}

#[test]
fn a_gsm8k_reference_without_a_gold_answer_names_file_and_line() {
    let good = row("1+1?", "1+1=2\n#### 2");
    for (bad, want) in [
        (
            row("q", "She has 3 apples.\n#### "),
            "no number after its last `####`",
        ),
        (
            row("q", "She has 3 apples, then 5."),
            "has no `#### ANSWER` line",
        ),
    ] {
        let f = write(&[good.clone(), good.clone(), bad]);
        let e = prepare_split(&gsm8k(f.path()), Split::Train, None, None).unwrap_err();
        assert!(matches!(e, DataError::BadField { line: 3, .. }), "{e}");
        let msg = e.to_string();
        assert!(
            msg.contains(&format!("{}:3", f.path().display())) && msg.contains("`answer`"),
            "{msg}"
        );
        assert!(msg.contains(want), "{msg}");
    }
    // `#### 1,000` and `#### $5.50` keep loading.
    let f = write(&[good, row("q", "#### 1,000"), row("q", "x\n#### $5.50")]);
    let p = prepare_split(&gsm8k(f.path()), Split::Train, None, None).unwrap();
    assert_eq!(p.dataset.problems.len(), 3);
}

#[test]
fn a_five_megabyte_prompt_is_refused_naming_its_line_without_tokenizing_it() {
    let big = "7".repeat(5 << 20);
    let f = write(&[row("What is 2+2?", "#### 4"), row(&big, "#### 7")]);
    let cfg = gsm8k(f.path());
    // max_prompt_len unset: every prompt is kept, then checked against the model's positions.
    let p = prepare_split(&cfg, Split::Train, None, None).unwrap();
    assert_eq!(p.prompts.prompts.len(), 2);
    let counted = std::cell::Cell::new(0usize);
    let chars = |t: &str| -> anyhow::Result<usize> {
        counted.set(counted.get() + t.len());
        Ok(t.chars().count())
    };
    let e = check_prompt_lengths(&p, 32_768, &chars).unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.starts_with(&format!("{}:2: the prompt has ", f.path().display())),
        "{msg}"
    );
    assert!(msg.contains("max_position_embeddings = 32768") && msg.contains("data.max_prompt_len"));
    assert!(
        msg.contains(&format!("over {BYTES_PER_POSITION} a position")),
        "{msg}"
    );
    // 5 MB is more than 64 bytes a position of 32768: refused without calling the tokenizer.
    assert_eq!(counted.get(), 0);
    // Within 64 bytes a position it is counted, and refused by its token count.
    let e = check_prompt_lengths(&p, 1 << 20, &chars)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(&format!(
            ":2: the prompt has {} tokens",
            p.prompts.prompts[1].text.chars().count()
        )),
        "{e}"
    );
    // A model with more positions than the prompt has bytes accepts it without tokenizing it.
    counted.set(0);
    check_prompt_lengths(&p, 8 << 20, &chars).unwrap();
    assert_eq!(counted.get(), 0);
}

#[test]
fn a_jsonl_line_past_the_read_limit_is_an_error_naming_it() {
    let mut f = tempfile::Builder::new()
        .suffix(".jsonl")
        .tempfile()
        .unwrap();
    writeln!(f, "{}", row("q", "#### 1")).unwrap();
    // {"question": "xxxx…"} one byte longer than the limit, newline excluded.
    let pad = MAX_LINE_BYTES + 1 - r#"{"question": ""}"#.len();
    write!(f, "{{\"question\": \"").unwrap();
    f.write_all(&vec![b'x'; pad]).unwrap();
    writeln!(f, "\"}}").unwrap();
    let e = read_jsonl(f.path()).unwrap_err();
    assert!(matches!(e, DataError::LineTooLong { line: 2, .. }), "{e}");
    assert!(e
        .to_string()
        .contains(&format!("{}:2: line longer than", f.path().display())));
}

/// A UTF-8 byte-order mark before the first line (an Excel or Notepad export) is skipped, not
/// reported as invalid JSON; one inside the file is still an error naming its line.
#[test]
fn a_byte_order_mark_before_the_first_line_is_skipped() {
    let mut f = tempfile::Builder::new()
        .suffix(".jsonl")
        .tempfile()
        .unwrap();
    f.write_all("\u{feff}".as_bytes()).unwrap();
    writeln!(f, "{}", row("q1", "#### 1")).unwrap();
    writeln!(f, "{}", row("q2", "#### 2")).unwrap();
    let recs = read_jsonl(f.path()).unwrap();
    assert_eq!(recs.len(), 2);
    assert_eq!(recs[0].line, 1);
    assert_eq!(recs[0].fields["question"], "q1");
    f.write_all("\u{feff}".as_bytes()).unwrap();
    writeln!(f, "{}", row("q3", "#### 3")).unwrap();
    let e = read_jsonl(f.path()).unwrap_err();
    assert!(
        e.to_string().contains(&format!(
            "{}:3: malformed record: invalid JSON",
            f.path().display()
        )),
        "{e}"
    );
}
