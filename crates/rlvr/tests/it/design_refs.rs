//! Every reference to a section of docs/DESIGN.md from the code and the docs resolves (issue 43,
//! item 5): written in one style, `DESIGN.md section N` (or `DESIGN.md sections N and M`, `N, M`),
//! and N is a numbered section heading of DESIGN.md (`## N. Title`), the section's stable anchor.
//! A renumbering of DESIGN.md, or a reference to a section that does not exist, fails here.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The section numbers of DESIGN.md's `## N. Title` headings.
fn sections(design: &str) -> BTreeSet<u32> {
    design
        .lines()
        .filter_map(|l| {
            let n = l.strip_prefix("## ")?.split_once(". ")?.0;
            n.parse().ok()
        })
        .collect()
}

/// The files that may cite DESIGN.md: tracked sources and docs (target/, .git and data/ left out).
fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().to_string();
        if p.is_dir() {
            if !name.starts_with('.')
                && !["target", "data", "runs", "node_modules"].contains(&name.as_str())
            {
                files(&p, out);
            }
        } else if ["rs", "md", "toml", "py", "sh"]
            .iter()
            .any(|x| p.extension().is_some_and(|e| e == *x))
        {
            out.push(p);
        }
    }
}

/// (line, section) of each citation, and (line, text) of each citation in another style.
type Citations = (Vec<(usize, u32)>, Vec<(usize, String)>);

/// The section numbers a text cites after each `DESIGN.md section`/`sections`, and the citations
/// in another style (`DESIGN §N`, `DESIGN.md §N`, `DESIGN section N`), as (line, text).
fn citations(text: &str) -> Citations {
    let (mut refs, mut odd) = (Vec::new(), Vec::new());
    for (i, line) in text.lines().enumerate() {
        for (at, _) in line.match_indices("DESIGN") {
            let rest = &line[at + "DESIGN".len()..];
            let Some(after) = rest
                .strip_prefix(".md sections ")
                .or_else(|| rest.strip_prefix(".md section "))
            else {
                let t = rest.trim_start_matches(".md").trim_start();
                if t.starts_with('§') || t.starts_with("section") {
                    odd.push((i + 1, line.trim().to_string()));
                }
                continue;
            };
            // Numbers joined by "and", ",", "or".
            let mut s = after;
            loop {
                let digits: String = s.chars().take_while(char::is_ascii_digit).collect();
                let Ok(n) = digits.parse() else { break };
                refs.push((i + 1, n));
                s = &s[digits.len()..];
                let next = [" and ", ", ", " or "]
                    .iter()
                    .find_map(|j| s.strip_prefix(j));
                match next {
                    Some(r) if r.starts_with(|c: char| c.is_ascii_digit()) => s = r,
                    _ => break,
                }
            }
        }
    }
    (refs, odd)
}

#[test]
fn every_design_reference_resolves_and_is_written_one_way() {
    let design_path = root().join("docs/DESIGN.md");
    let have = sections(&std::fs::read_to_string(&design_path).unwrap());
    assert!(have.len() >= 14, "DESIGN.md sections found: {have:?}");
    let mut all = Vec::new();
    files(&root(), &mut all);
    let (mut bad, mut odd, mut n) = (Vec::new(), Vec::new(), 0);
    for f in &all {
        if f.ends_with("docs/DESIGN.md") || f.ends_with("tests/it/design_refs.rs") {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(f) else {
            continue;
        };
        let (refs, other) = citations(&text);
        let rel = f.strip_prefix(root()).unwrap_or(f).display().to_string();
        for (line, s) in refs {
            n += 1;
            if !have.contains(&s) {
                bad.push(format!(
                    "{rel}:{line}: DESIGN.md section {s} does not exist"
                ));
            }
        }
        for (line, t) in other {
            odd.push(format!("{rel}:{line}: {t}"));
        }
    }
    assert!(n >= 100, "only {n} references found");
    assert!(bad.is_empty(), "unresolved references:\n{}", bad.join("\n"));
    assert!(
        odd.is_empty(),
        "write `DESIGN.md section N`:\n{}",
        odd.join("\n")
    );
}

#[test]
fn the_citation_reader_reads_lists_and_flags_other_styles() {
    let (refs, odd) = citations(
        "a (DESIGN.md sections 3 and 12), b DESIGN.md section 10: c\nDESIGN §4 and DESIGN.md §5",
    );
    assert_eq!(refs, [(1, 3), (1, 12), (1, 10)]);
    assert_eq!(odd.len(), 2);
    assert_eq!(
        sections("## 3. Staleness\n### KL\n## 10. Interfaces\n"),
        [3, 10].into()
    );
}
