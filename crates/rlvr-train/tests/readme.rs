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

/// Every `[data]` key the config accepts (the fields of rlvr-data's `DataConfig`, and of its
/// `countdown` and `arithmetic` sub-tables) has a row in the config reference.
#[test]
fn every_data_key_is_in_the_config_reference() {
    let reference = rlvr_train::config::reference_markdown();
    let data = serde_json::to_value(rlvr_data::config::DataConfig::default()).unwrap();
    let mut keys = Vec::new();
    for (k, v) in data.as_object().unwrap() {
        keys.push(format!("data.{k}"));
        if matches!(k.as_str(), "countdown" | "arithmetic") {
            for sub in v.as_object().unwrap().keys() {
                keys.push(format!("data.{k}.{sub}"));
            }
        }
    }
    assert!(keys.len() > 20, "{keys:?}");
    let missing: Vec<&String> = keys
        .iter()
        .filter(|k| {
            // The sub-tables are documented by their keys.
            !matches!(k.as_str(), "data.countdown" | "data.arithmetic")
                && !reference.contains(&format!("| `{k}` |"))
        })
        .collect();
    assert!(missing.is_empty(), "undocumented [data] keys: {missing:?}");
}
