//! The README's config reference is generated from the config structs' doc comments
//! (`RLVR_BLESS=1 cargo test -p rlvr-train --test readme` rewrites it).

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
            panic!("README.md's config reference is stale: run RLVR_BLESS=1 cargo test -p rlvr-train --test readme");
        }
    }
}
