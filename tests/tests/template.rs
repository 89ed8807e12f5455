//! `template.yaml` passes `cfn-lint` (installed by `scripts/tools`), and declares every
//! function of `functions/`.

use std::path::Path;
use std::process::Command;

#[test]
fn template_passes_cfn_lint() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root");
    let output = Command::new("cfn-lint")
        .arg("template.yaml")
        .stdin(std::process::Stdio::null())
        .current_dir(root)
        .output()
        .expect("cfn-lint runs (install it with scripts/tools, and put its bin dir on PATH)");
    assert!(
        output.status.success(),
        "cfn-lint found problems:\n{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn template_declares_every_function() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root");
    let template = std::fs::read_to_string(root.join("template.yaml")).expect("template.yaml");
    for entry in std::fs::read_dir(root.join("functions")).expect("functions/") {
        let name = entry
            .expect("entry")
            .file_name()
            .into_string()
            .expect("utf-8 name");
        assert!(
            template.contains(&format!("Binary: {name}")),
            "template.yaml has no function built from functions/{name}"
        );
    }
}
