//! The docs and the config agree:
//! - the README's config reference is generated from the config structs' doc comments
//!   (`RLVR_BLESS=1 cargo test --workspace --locked --test it -- readme::` rewrites it) and has a row for
//!   every key the config accepts, and no other;
//! - every example of docs/data.md loads, resolves and renders its sample rows;
//! - every dotted config key the Markdown docs name (`train.lr`, `--set rollout.group_size=`) is
//!   one the config accepts.

use std::path::{Path, PathBuf};

use rlvr_train::config::keys::{accepted_keys, AcceptedKey};
use rlvr_train::config::RawConfig;

#[test]
fn readme_config_reference_is_current() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md");
    let text = std::fs::read_to_string(&path).unwrap();
    let (begin, end) = (
        "<!-- config-reference:begin -->\n",
        "<!-- config-reference:end -->",
    );
    let i = text.find(begin).expect("README lacks the begin marker") + begin.len();
    let j = text.find(end).expect("README lacks the end marker");
    let want = rlvr_train::config::reference_markdown();
    if text[i..j] != want {
        if std::env::var("RLVR_BLESS").is_ok() {
            std::fs::write(&path, format!("{}{}{}", &text[..i], want, &text[j..])).unwrap();
        } else {
            panic!("README.md's config reference is stale: run RLVR_BLESS=1 cargo test --workspace --locked --test it -- readme::");
        }
    }
}

/// docs/coming-from-verl.md's table of verl's keys is [`alias_table_markdown`]`("verl")`, the
/// names whose error says which key of ours to write (`RLVR_BLESS=1 ... -- readme::` rewrites it).
/// docs/coming-from-prime-rl.md's table of prime-rl's names is `alias_table_markdown("prime-rl")`.
#[test]
fn prime_rl_key_table_is_current() {
    let path = repo_root().join("docs/coming-from-prime-rl.md");
    let text = std::fs::read_to_string(&path).unwrap();
    let (begin, end) = (
        "<!-- prime-rl-keys:begin -->\n",
        "<!-- prime-rl-keys:end -->",
    );
    let i = text.find(begin).expect("lacks the begin marker") + begin.len();
    let j = text.find(end).expect("lacks the end marker");
    let want = rlvr_train::config::help::alias_table_markdown("prime-rl");
    assert!(
        want.contains("| `orchestrator.env` | `env.verifiers` |"),
        "{want}"
    );
    assert!(!want.contains("`num_generations`"), "{want}");
    if std::env::var_os("RLVR_BLESS").is_some() && text[i..j] != want {
        let fixed = format!("{}{}{}", &text[..i], want, &text[j..]);
        std::fs::write(&path, fixed).unwrap();
        return;
    }
    assert_eq!(
        &text[i..j],
        want,
        "docs/coming-from-prime-rl.md's prime-rl table is stale: regenerate it with RLVR_BLESS=1"
    );
}

#[test]
fn verl_key_table_is_current() {
    let path = repo_root().join("docs/coming-from-verl.md");
    let text = std::fs::read_to_string(&path).unwrap();
    let (begin, end) = ("<!-- verl-keys:begin -->\n", "<!-- verl-keys:end -->");
    let i = text.find(begin).expect("lacks the begin marker") + begin.len();
    let j = text.find(end).expect("lacks the end marker");
    let want = rlvr_train::config::help::alias_table_markdown("verl");
    // Real rows: verl's `rollout.n` is our group size, its `train_batch_size` our prompts per step.
    assert!(
        want.contains("| `rollout.n` | `rollout.group_size` |"),
        "{want}"
    );
    assert!(
        want.contains("| `train_batch_size` | `data.prompts_per_step` |"),
        "{want}"
    );
    assert!(
        !want.contains("`num_generations`"),
        "a TRL name in verl's table: {want}"
    );
    // verl's adv_estimator=grpo with its default loss is the preset that follows verl's code.
    let adv = want
        .lines()
        .find(|l| l.starts_with("| `adv_estimator` |"))
        .unwrap();
    assert!(adv.contains("is preset grpo_verl"), "{adv}");
    if text[i..j] != want {
        if std::env::var("RLVR_BLESS").is_ok() {
            std::fs::write(&path, format!("{}{}{}", &text[..i], want, &text[j..])).unwrap();
        } else {
            panic!("docs/coming-from-verl.md's key table is stale: run RLVR_BLESS=1 cargo test --workspace --locked --test it -- readme::");
        }
    }
}

/// The repository root.
fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

/// The config reference's rows as (key, note, whole line): `| `data.verifier.mode` (kind
/// `gsm8k`) | ... |` is (`data.verifier.mode`, `kind `gsm8k``, line).
fn reference_rows(reference: &str) -> Vec<(String, String, String)> {
    reference
        .lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("| `")?;
            let (key, after) = rest.split_once('`')?;
            let note = after
                .trim_start()
                .strip_prefix('(')
                .and_then(|n| n.split_once(") |"))
                .map_or("", |(n, _)| n);
            Some((key.to_string(), note.to_string(), l.to_string()))
        })
        .collect()
}

/// Where a key is documented: the keys of a component's verifier are those of `data.verifier`.
fn documented_as(key: &str) -> String {
    match key.strip_prefix("reward.components[].verifier.") {
        Some(k) => format!("data.verifier.{k}"),
        None => key.to_string(),
    }
}

/// `kind = "judge", rule = "number"` → `kind `judge`, rule `number`` (a row's note).
fn note_of(within: &str) -> String {
    within.replace(" = \"", " `").replace('"', "`")
}

/// Every key the config accepts (asked of the deserialiser, tagged tables and arrays of tables
/// included) has a row in the config reference: with its variant's note when it belongs to one
/// (`data.verifier.command` (kind `external`)), and a tag key's row names every tag value. Every
/// row names a key the config accepts.
#[test]
fn every_accepted_key_has_a_row_and_every_row_is_a_key() {
    let reference = rlvr_train::config::reference_markdown();
    let rows = reference_rows(&reference);
    let accepted: Vec<AcceptedKey> = accepted_keys()
        .into_iter()
        .filter(|k| k.key.contains('.'))
        .collect();
    assert!(accepted.len() > 150, "{accepted:?}");
    for want in [
        "data.few_shot[].answer",
        "data.verifier.command",
        "data.verifier.parse.labels",
        "reward.components[].verifier.extra_body",
        "reward.format.penalty",
        "data.arithmetic.pad",
    ] {
        assert!(
            accepted.iter().any(|k| k.key == want),
            "{want}: {accepted:?}"
        );
    }
    let mut missing = Vec::new();
    for k in &accepted {
        let key = documented_as(&k.key);
        let of_key: Vec<&(String, String, String)> =
            rows.iter().filter(|(r, _, _)| *r == key).collect();
        if of_key.is_empty() {
            missing.push(key.clone());
            continue;
        }
        for w in &k.within {
            let note = note_of(w);
            if !of_key.iter().any(|(_, n, _)| *n == note) {
                missing.push(format!("{key} ({note})"));
            }
        }
        for t in &k.tags {
            if !of_key.iter().any(|(_, _, l)| l.contains(&format!("`{t}`"))) {
                missing.push(format!("{key} = \"{t}\""));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "keys the config accepts without a row in the config reference (give the field a `///` \
         comment): {missing:?}"
    );
    let unknown: Vec<&String> = rows
        .iter()
        .map(|(r, _, _)| r)
        .filter(|r| !r.starts_with('['))
        .filter(|r| !accepted.iter().any(|k| documented_as(&k.key) == **r))
        .collect();
    assert!(
        unknown.is_empty(),
        "rows that name no accepted key: {unknown:?}"
    );
}

/// Every accepted key as one line of `tests/fixtures/accepted_keys.txt`: the key, then
/// `tags: ...` (a tag key's values) and `within: ...` (its tagged variants, `; ` between them)
/// where they are not empty, ` | ` between the parts.
fn key_line(k: &AcceptedKey) -> String {
    let mut line = k.key.clone();
    if !k.tags.is_empty() {
        line.push_str(&format!(" | tags: {}", k.tags.join(", ")));
    }
    if !k.within.is_empty() {
        line.push_str(&format!(" | within: {}", k.within.join("; ")));
    }
    line
}

/// The key list is the pinned one, in order, with each key's tag values and variants: the list
/// the walk of the config's types gives ([`accepted_keys`]) was pinned from the earlier walk that
/// read serde's error messages, so the change of method changed no key. A change of the config's
/// keys is blessed with the README (`RLVR_BLESS=1 ... -- readme::`).
#[test]
fn accepted_keys_are_the_pinned_list() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/accepted_keys.txt");
    let want: String = accepted_keys().iter().map(|k| key_line(k) + "\n").collect();
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    if have != want {
        if std::env::var("RLVR_BLESS").is_ok() {
            std::fs::write(&path, &want).unwrap();
        } else {
            let diff: Vec<String> = diff_lines(&have, &want);
            panic!(
                "the accepted keys differ from {} (- pinned, + now): {diff:#?}\nrun \
                 RLVR_BLESS=1 cargo test --workspace --locked --test it -- readme:: if the change \
                 is meant",
                path.display()
            );
        }
    }
}

/// The lines of `old` not in `new` (`- `) and of `new` not in `old` (`+ `).
fn diff_lines(old: &str, new: &str) -> Vec<String> {
    let gone = old.lines().filter(|l| !new.lines().any(|n| n == *l));
    let came = new.lines().filter(|l| !old.lines().any(|o| o == *l));
    let out: Vec<String> = gone
        .map(|l| format!("- {l}"))
        .chain(came.map(|l| format!("+ {l}")))
        .collect();
    match out.is_empty() {
        true => vec!["(the same lines, in another order)".into()],
        false => out,
    }
}

/// The fenced blocks of Markdown `text`: (info string, body).
fn fenced_blocks(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut open: Option<(String, String)> = None;
    for line in text.lines() {
        let t = line.trim_start();
        match (&mut open, t.strip_prefix("```")) {
            (None, Some(info)) => open = Some((info.trim().to_string(), String::new())),
            (Some(_), Some(_)) => out.push(open.take().unwrap()),
            (Some((_, body)), None) => {
                body.push_str(line);
                body.push('\n');
            }
            (None, None) => {}
        }
    }
    out
}

/// A chat template for tests: each message as `<|role|>content`, then `<|assistant|>`.
fn render_chat(msgs: &[rlvr_data::ChatMessage], generation: bool) -> anyhow::Result<String> {
    let mut s: String = msgs
        .iter()
        .map(|m| format!("<|{}|>{}\n", m.role, m.content))
        .collect();
    if generation {
        s.push_str("<|assistant|>");
    }
    Ok(s)
}

/// A row's field as docs/data.md says the data layer reads it: the top-level key of that name,
/// else the dotted path into nested objects; a string as it is, a list of chat messages as its
/// last message's text, another value as JSON.
fn field_text(row: &serde_json::Value, field: &str) -> String {
    let v = row
        .get(field)
        .or_else(|| field.split('.').try_fold(row, |v, part| v.get(part)))
        .unwrap_or_else(|| panic!("{field} not in {row}"));
    match v {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Array(m) => m.last().unwrap()["content"].as_str().unwrap().into(),
        v => v.to_string(),
    }
}

/// Every `toml` example of docs/data.md, with the `jsonl` rows after it written to each data file
/// it names (a `.parquet` name gets the same rows as the JSON objects the Parquet reader makes,
/// in a `.jsonl` file, given by `--set`), loads and resolves as `rlvr train --config` does; every
/// row renders to a prompt holding its question (and the system prompt and few-shot answers the
/// example sets), with its answer as the reference; the reward function builds.
#[test]
fn every_data_layout_example_loads_resolves_and_renders() {
    use rlvr_data::dataset::prepare_split;
    use rlvr_data::generate::Split;
    let text = std::fs::read_to_string(repo_root().join("docs/data.md")).unwrap();
    let blocks = fenced_blocks(&text);
    let mut examples = 0;
    for (i, (info, body)) in blocks.iter().enumerate() {
        if info != "toml" {
            continue;
        }
        examples += 1;
        let rows = blocks
            .get(i + 1)
            .filter(|(info, _)| info == "jsonl")
            .map(|(_, b)| b.as_str());
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("config.toml");
        std::fs::write(&file, body).unwrap();
        let mut sets = vec!["model.path=runs/tiny".to_string()];
        let table: toml::Table = body.parse().unwrap();
        let data = table.get("data").and_then(|d| d.as_table());
        for split in ["train", "test"] {
            let Some(name) = data.and_then(|d| d.get(split)).and_then(|v| v.as_str()) else {
                continue;
            };
            let rows = rows.unwrap_or_else(|| panic!("example {examples}: no jsonl rows"));
            let mut path = tmp.path().join(name);
            if path.extension().is_some_and(|e| e == "parquet") {
                path.set_extension("jsonl");
                sets.push(format!("data.{split}={}", path.display()));
            }
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, rows).unwrap();
        }
        let cfg = RawConfig::load(Some(&file), &sets)
            .and_then(RawConfig::resolve)
            .unwrap_or_else(|e| panic!("docs/data.md example {examples}: {e:#}\n{body}"));
        cfg.check_runnable().unwrap();
        let d = &cfg.raw.data;
        let verifier = d.verifier().unwrap();
        rlvr_reward::combine::RewardFunction::from_config(&cfg.raw.reward, &verifier)
            .unwrap_or_else(|e| panic!("docs/data.md example {examples}: {e:#}"));
        let (qf, af) = d.fields();
        for split in [Split::Train, Split::Test] {
            let prepared = prepare_split(d, split, Some(&render_chat), None)
                .unwrap_or_else(|e| panic!("docs/data.md example {examples}: {e:#}"));
            let n = prepared.dataset.problems.len();
            assert!(
                n > 0 && prepared.prompts.prompts.len() == n,
                "example {examples}"
            );
            for p in &prepared.prompts.prompts {
                if let Some(s) = &d.system_prompt {
                    assert!(p.text.contains(s.as_str()), "{}", p.text);
                }
                for ex in &d.few_shot {
                    assert!(p.text.contains(ex.answer.as_str()), "{}", p.text);
                }
            }
            if d.train.is_none() {
                continue;
            }
            let rows: Vec<serde_json::Value> = rows
                .unwrap()
                .lines()
                .map(|l| serde_json::from_str(l).unwrap())
                .collect();
            assert_eq!(rows.len(), n, "example {examples}");
            for (row, (problem, prompt)) in rows.iter().zip(
                prepared
                    .dataset
                    .problems
                    .iter()
                    .zip(&prepared.prompts.prompts),
            ) {
                assert!(
                    prompt.text.contains(&field_text(row, &qf)),
                    "{qf}: {}",
                    prompt.text
                );
                assert_eq!(
                    problem.reference,
                    field_text(row, &af),
                    "example {examples}"
                );
            }
        }
    }
    assert!(examples >= 6, "docs/data.md has {examples} examples");
}

/// Every `toml` block of docs/coming-from-trl.md loads and resolves as `rlvr train --config` does,
/// beside the files it names (a conversational train row, the reward functions' file): the config
/// of "The same run" is scored by the reward programs alone (`kind = "python"`, TRL's two
/// functions with their weights) and its rows load, and the LoRA block is peft's
/// `LoraConfig(r=16, lora_alpha=32, lora_dropout=0.05, target_modules="all-linear")`. The page's
/// main config named `examples/trl_rewards.py`, which a config outside the repository lacks.
#[test]
fn coming_from_trl_configs_load_and_resolve() {
    use rlvr_data::config::Scoring;
    let text = std::fs::read_to_string(repo_root().join("docs/coming-from-trl.md")).unwrap();
    let mut blocks = 0;
    for (info, body) in fenced_blocks(&text) {
        if info != "toml" {
            continue;
        }
        blocks += 1;
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("rlvr.toml");
        std::fs::write(&file, &body).unwrap();
        std::fs::write(
            tmp.path().join("train.jsonl"),
            "{\"prompt\": [{\"role\": \"user\", \"content\": \"2+2?\"}], \"solution\": \"4\"}\n",
        )
        .unwrap();
        std::fs::write(
            tmp.path().join("my_rewards.py"),
            "def accuracy_reward(completions, solution, **kw):\n    return [0.0] * len(completions)\n\
             def format_reward(completions, **kw):\n    return [0.0] * len(completions)\n",
        )
        .unwrap();
        let raw = RawConfig::load(Some(&file), &["model.path=runs/tiny".to_string()])
            .unwrap_or_else(|e| {
                panic!("docs/coming-from-trl.md toml block {blocks}: {e:#}\n{body}")
            });
        let scoring = rlvr_train::config::settings::scoring(&raw);
        let cfg = raw.resolve().unwrap_or_else(|e| {
            panic!("docs/coming-from-trl.md toml block {blocks}: {e:#}\n{body}")
        });
        if let Some(train) = &cfg.raw.data.train {
            assert_eq!(scoring, Scoring::Programs, "block {blocks}");
            let weights: Vec<f64> = cfg.raw.reward.components.iter().map(|c| c.weight).collect();
            assert_eq!(weights, [1.0, 0.5], "block {blocks}");
            let rows = rlvr_data::dataset::load_file_for(&cfg.raw.data, train, scoring).unwrap();
            assert_eq!(rows[0].reference, "4");
        }
        if cfg.raw.model.lora_rank > 0 {
            let lora = cfg.raw.model.lora().unwrap();
            assert_eq!((lora.rank, lora.alpha, lora.dropout), (16, 32.0, 0.05));
            assert_eq!(lora.targets, [rlvr_model::LoraTarget::AllLinear]);
        }
    }
    // "The same run", the `kind = "python"` components alone, the LoRA block.
    assert_eq!(blocks, 3, "docs/coming-from-trl.md's toml blocks");
}

/// docs/data.md says a row whose question field holds chat messages is the prompt itself: it
/// needs `data.style = "chat"` (refused naming file, line and field with `"plain"`), and
/// `data.system_prompt` with it is refused naming the key.
#[test]
fn a_messages_row_needs_the_chat_style_and_no_system_prompt() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("train.jsonl");
    std::fs::write(
        &path,
        "{\"question\": [{\"role\": \"user\", \"content\": \"Hi\"}], \"answer\": \"1\"}\n",
    )
    .unwrap();
    let d = rlvr_data::config::DataConfig {
        task: rlvr_data::config::TaskKind::Jsonl,
        verifier: Some(rlvr_reward::combine::VerifierConfig::Math {}),
        ..Default::default()
    };
    let e = rlvr_data::dataset::load_file(&d, &path)
        .unwrap_err()
        .to_string();
    let at = format!("{}:1: field `question` holds chat messages", path.display());
    assert!(
        e.contains(&at) && e.contains("data.style = \"chat\""),
        "{e}"
    );
    let d = rlvr_data::config::DataConfig {
        style: rlvr_data::config::PromptStyle::Chat,
        system_prompt: Some("Be brief.".into()),
        ..d
    };
    let e = rlvr_data::dataset::load_file(&d, &path)
        .unwrap_err()
        .to_string();
    assert!(e.contains(&at) && e.contains("data.system_prompt"), "{e}");
    let d = rlvr_data::config::DataConfig {
        system_prompt: None,
        ..d
    };
    let p = rlvr_data::dataset::load_file(&d, &path).unwrap();
    assert_eq!(p[0].question(), "Hi");
}

/// The Markdown docs whose config keys are checked: every README.md of the repository (the
/// crates' included), every `.md` file under a `docs/` directory (docs/lab/README.md included),
/// ARCHITECTURE.md and CHANGELOG.md (BENCHMARKS.md and the crates' BENCH.md are dated records of
/// measurements, not docs of the config).
/// The config's top-level sections (`train`, `reward`, ...): the accepted keys without a dot.
fn sections_of(accepted: &[String]) -> Vec<&str> {
    accepted
        .iter()
        .filter(|k| !k.contains('.'))
        .map(String::as_str)
        .collect()
}

/// A key the config accepts, or a peer's name that its help maps to ours (verl's `rollout.n`).
fn known_key(accepted: &[String], key: &str) -> bool {
    accepted.iter().any(|k| k == key)
        || rlvr_train::config::help::alias_for(key).is_some()
        // `env.options` is the environment program's own table: any key of it is the program's.
        || key.strip_prefix("env.options.").is_some_and(|k| !k.is_empty())
            && accepted.iter().any(|k| k == "env.options")
}

fn markdown_docs(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for p in entries {
        let name = p.file_name().unwrap().to_string_lossy().to_string();
        if p.is_dir() {
            if !name.starts_with('.') && name != "target" && name != "runs" {
                markdown_docs(&p, out);
            }
        } else if name == "README.md"
            || name == "ARCHITECTURE.md"
            || name == "CHANGELOG.md"
            || (name.ends_with(".md") && p.components().any(|c| c.as_os_str() == "docs"))
        {
            out.push(p);
        }
    }
}

/// The last part of a dotted word that makes it a file name (`eval.jsonl`, `model.safetensors`),
/// not a key.
const FILE_EXTENSIONS: [&str; 18] = [
    "jsonl",
    "json",
    "log",
    "toml",
    "md",
    "rs",
    "py",
    "sh",
    "safetensors",
    "parquet",
    "svg",
    "png",
    "txt",
    "yaml",
    "yml",
    "csv",
    "lock",
    "gz",
];

/// The dotted words of `span` that start with a config section (`train.lr`,
/// `reward.components[0].weight`), with array indices written `[]`; file names and placeholders
/// (`data.KEY`) are left out, and so is a word inside another (`actor_rollout_ref.rollout.n`,
/// `data/gsm8k/train.jsonl`).
fn dotted_keys(span: &str, sections: &[&str]) -> Vec<String> {
    let b = span.as_bytes();
    let word = |c: u8| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'.' | b'[' | b']');
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let boundary =
            i == 0 || !(word(b[i - 1]) || matches!(b[i - 1], b'/' | b'-' | b'$' | b'{' | b'<'));
        if !(boundary && b[i].is_ascii_lowercase()) {
            i += 1;
            continue;
        }
        let mut j = i;
        while j < b.len() && word(b[j]) {
            j += 1;
        }
        let w = span[i..j].trim_end_matches('.');
        i = j;
        let Some((first, _)) = w.split_once('.') else {
            continue;
        };
        let last = w.rsplit('.').next().unwrap_or("");
        if !sections.contains(&first)
            || FILE_EXTENSIONS.contains(&last)
            || w.chars().any(|c| c.is_ascii_uppercase())
        {
            continue;
        }
        // `[0]` → `[]`.
        let mut key = String::new();
        let mut in_index = false;
        for c in w.chars() {
            match c {
                '[' => {
                    in_index = true;
                    key.push('[');
                }
                ']' => {
                    in_index = false;
                    key.push(']');
                }
                _ if in_index => {}
                c => key.push(c),
            }
        }
        out.push(key);
    }
    out
}

/// Every dotted config key the Markdown docs name in backticks (`train.lr`,
/// `` `--set rollout.group_size=4` ``), after `--set` in a code block, or in a ```toml block of
/// config tables is one the config accepts (or a peer's name that its help maps to ours: verl's
/// `rollout.n`), so the docs never name a key that does not exist.
#[test]
fn the_docs_name_only_keys_the_config_accepts() {
    let root = repo_root();
    let accepted: Vec<String> = accepted_keys().into_iter().map(|k| k.key).collect();
    let sections = sections_of(&accepted);
    assert!(
        sections.contains(&"train") && sections.contains(&"reward"),
        "{sections:?}"
    );
    let ok = |key: &str| known_key(&accepted, key);
    let mut files = Vec::new();
    markdown_docs(&root, &mut files);
    for want in [
        "README.md",
        "configs/README.md",
        "docs/data.md",
        "crates/rlvr-train/README.md",
    ] {
        assert!(files.contains(&root.join(want)), "{want}: {files:?}");
    }
    let mut bad = Vec::new();
    let mut checked = 0;
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        let name = f.strip_prefix(&root).unwrap().display().to_string();
        checked += unknown_keys(&name, &text, &sections, &ok, &mut bad);
    }
    assert!(checked > 200, "only {checked} keys checked");
    assert!(
        bad.is_empty(),
        "the docs name keys the config does not accept:\n{}",
        bad.join("\n")
    );
}

/// The dotted config keys `text` (the Markdown file `name`) names in backticks, after `--set` in a
/// code block, or as the tables of a ```toml block, that `ok` refuses, pushed to `bad` as
/// `name:line: `key``; returns how many keys it checked.
fn unknown_keys(
    name: &str,
    text: &str,
    sections: &[&str],
    ok: &dyn Fn(&str) -> bool,
    bad: &mut Vec<String>,
) -> usize {
    let mut checked = 0;
    let mut fence: Option<(String, usize, String)> = None;
    for (n, line) in text.lines().enumerate() {
        let at = format!("{name}:{}", n + 1);
        if let Some(info) = line.trim_start().strip_prefix("```") {
            match fence.take() {
                None => fence = Some((info.trim().to_string(), n + 1, String::new())),
                Some((info, start, body)) if info == "toml" => {
                    // A block of config tables is deserialised as a config.
                    let Ok(table) = body.parse::<toml::Table>() else {
                        continue;
                    };
                    if table.is_empty() || !table.keys().all(|k| sections.contains(&k.as_str())) {
                        continue;
                    }
                    checked += 1;
                    if let Err(e) = rlvr_train::config::from_table::<RawConfig>(table) {
                        let e = format!("{e:#}");
                        if e.contains("unknown") {
                            bad.push(format!("{name}:{start}: ```toml block: {e}"));
                        }
                    }
                }
                Some(_) => {}
            }
            continue;
        }
        let spans: Vec<String> = match &mut fence {
            Some((_, _, body)) => {
                body.push_str(line);
                body.push('\n');
                line.split("--set")
                    .skip(1)
                    .map(|s| {
                        let s = s.trim_start().trim_start_matches(['\'', '"']);
                        s.split('=').next().unwrap_or("").to_string()
                    })
                    .collect()
            }
            None => line
                .split('`')
                .skip(1)
                .step_by(2)
                .map(String::from)
                .collect(),
        };
        for span in spans {
            for key in dotted_keys(&span, sections) {
                checked += 1;
                if !ok(&key) {
                    bad.push(format!("{at}: `{key}`"));
                }
            }
        }
    }
    checked
}

/// The key check itself: a crate README that names `rollout.api_key` (the key is
/// `rollout.api_key_env`) fails with the file, the line and the key, in prose, after `--set` in a
/// code block and in a ```toml block; real keys, peers' names, file names and placeholders pass.
#[test]
fn the_key_check_names_file_line_and_key_of_a_key_that_does_not_exist() {
    let accepted: Vec<String> = accepted_keys().into_iter().map(|k| k.key).collect();
    let sections = sections_of(&accepted);
    let ok = |key: &str| known_key(&accepted, key);
    let text = "# rlvr-vllm\n\
                | `rollout.api_key` | the key |\n\
                Fine: `rollout.api_key_env`, `train.lr`, `rollout.n`, `eval.jsonl`, `data.KEY`.\n\
                ```sh\n\
                rlvr train --set rollout.api_key=X --set train.lr=1e-6\n\
                ```\n\
                ```toml\n\
                [rollout]\n\
                api_key = \"K\"\n\
                ```\n";
    let mut bad = Vec::new();
    let checked = unknown_keys("crates/x/README.md", text, &sections, &ok, &mut bad);
    assert_eq!(checked, 7, "{bad:?}");
    assert_eq!(bad.len(), 3, "{bad:?}");
    assert_eq!(bad[0], "crates/x/README.md:2: `rollout.api_key`");
    assert_eq!(bad[1], "crates/x/README.md:5: `rollout.api_key`");
    assert!(
        bad[2].starts_with("crates/x/README.md:7: ```toml block:") && bad[2].contains("api_key"),
        "{}",
        bad[2]
    );
}
