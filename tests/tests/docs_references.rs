//! The tests that docs/guarantees.md cites exist: every `path.rs::name` in it names a file
//! of the workspace holding a `fn name`. A renamed or removed test fails here, so the page
//! never cites a proof that is gone.

use std::path::Path;

#[test]
fn every_test_the_guarantees_page_cites_exists() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let page = std::fs::read_to_string(root.join("docs/guarantees.md")).expect("the page");
    let mut cited = 0;
    let mut missing = Vec::new();
    for reference in page.split('`').skip(1).step_by(2) {
        let Some((file, name)) = reference.split_once(".rs::") else {
            continue;
        };
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            continue;
        }
        cited += 1;
        let path = root.join(format!("{file}.rs"));
        let found = std::fs::read_to_string(&path).is_ok_and(|text| {
            text.match_indices(&format!("fn {name}")).any(|(at, m)| {
                !text[at + m.len()..].starts_with(|c: char| c.is_ascii_alphanumeric() || c == '_')
            })
        });
        if !found {
            missing.push(reference.to_owned());
        }
    }
    assert!(cited > 40, "the page cites {cited} tests");
    assert!(missing.is_empty(), "cited but not found: {missing:?}");
}
