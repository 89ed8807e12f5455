//! `local-runner new <name>`: a new function crate in the workspace, ready to test, run
//! locally and deploy.
//!
//! Why here: the local runner is already the one tool a function's author runs on a laptop
//! (topics, produce, run, query); it works offline and is built with the workspace, so the
//! scaffold needs no crate of its own, no download (`cargo lambda new` fetches its template
//! from the internet and knows nothing of lambda-streams) and no install step.
//!
//! What it writes, for a name such as `click-counts` (see [`scaffold`]):
//! - `functions/<name>/` (or the directory given): `Cargo.toml` (versions inherited from the
//!   workspace, the framework as a workspace path dependency), `src/main.rs` (one call to
//!   `lambda_streams::lambda::run`), `src/lib.rs` (a filter, a `group_by` and a windowed
//!   count, topics from `<NAME>_*` variables) and `src/tests.rs` (`TestDriver` tests with
//!   counts worked out by hand);
//! - the crate in the workspace's `members` (and `default-members`, which `cargo lambda
//!   build` builds);
//! - in `template.yaml`: the function's parameters (topics, consumer group), its
//!   `AWS::Serverless::Function` (two MSK event sources: the input and the repartition
//!   topic; a policy on the state table and the topics), and its ARN as an output.
//!
//! Nothing is overwritten: a name that is not a crate name, an existing directory, a
//! package or function of that name already in the workspace or the template, is refused
//! before anything is written.

use std::path::{Path, PathBuf};

const CARGO_TOML: &str = include_str!("../templates/function/Cargo.toml.in");
const MAIN_RS: &str = include_str!("../templates/function/src/main.rs.in");
const LIB_RS: &str = include_str!("../templates/function/src/lib.rs.in");
const TESTS_RS: &str = include_str!("../templates/function/src/tests.rs.in");
const TEMPLATE_PARAMETERS: &str = include_str!("../templates/function/parameters.yaml.in");
const TEMPLATE_FUNCTION: &str = include_str!("../templates/function/function.yaml.in");
const TEMPLATE_OUTPUT: &str = include_str!("../templates/function/output.yaml.in");

/// Names the scaffold refuses: the workspace's own packages and crates a function's
/// name would shadow.
const RESERVED: &[&str] = &[
    "lambda-streams",
    "lambda_streams",
    "lambda-streams-local-runner",
    "lambda-streams-e2e",
    "local-runner",
    "local_runner",
    "framework",
    "tests",
    "test",
    "bench",
    "std",
    "core",
    "alloc",
    "proc_macro",
    "self",
    "super",
    "crate",
    "build",
];

/// What [`scaffold`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scaffolded {
    /// The new crate's directory.
    pub dir: PathBuf,
    /// The files written or changed, in the order they were written.
    pub files: Vec<PathBuf>,
    /// The crate's member path in the workspace's `Cargo.toml` (relative, `/`-separated).
    pub member: String,
}

/// The names derived from a function name.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Names {
    /// The crate and binary name: `click-counts`.
    name: String,
    /// The library's Rust name: `click_counts`.
    krate: String,
    /// The prefix of the function's variables: `CLICK_COUNTS`.
    env: String,
    /// The prefix of its CloudFormation logical ids: `ClickCounts`.
    pascal: String,
}

impl Names {
    fn of(name: &str) -> Self {
        let pascal = name
            .split(['-', '_'])
            .filter(|part| !part.is_empty())
            .map(|part| {
                let mut chars = part.chars();
                chars.next().map_or_else(String::new, |first| {
                    first.to_ascii_uppercase().to_string() + chars.as_str()
                })
            })
            .collect();
        Names {
            name: name.to_owned(),
            krate: name.replace('-', "_"),
            env: name.replace('-', "_").to_ascii_uppercase(),
            pascal,
        }
    }

    fn fill(&self, template: &str) -> String {
        template
            .replace("{{name}}", &self.name)
            .replace("{{crate}}", &self.krate)
            .replace("{{ENV}}", &self.env)
            .replace("{{Pascal}}", &self.pascal)
    }
}

/// Checks that `name` can name a function crate: 1 to 64 characters, lowercase ASCII
/// letters, digits, `-` and `_`, starting with a letter, no `-`/`_` at the end or twice in a
/// row, and not a name of this workspace or of Rust's own crates.
///
/// # Errors
/// The rule `name` breaks, with the name.
pub fn validate_name(name: &str) -> Result<(), String> {
    let refuse = |why: &str| Err(format!("function name {name:?}: {why}"));
    if name.is_empty() || name.len() > 64 {
        return refuse("must have 1 to 64 characters");
    }
    if !name.starts_with(|c: char| c.is_ascii_lowercase()) {
        return refuse("must start with a lowercase letter (a-z)");
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-' || *c == '_'))
    {
        return refuse(&format!(
            "{c:?} is not allowed (lowercase letters, digits, '-' and '_' only)"
        ));
    }
    if name.ends_with(['-', '_']) || name.contains("--") || name.contains("__") {
        return refuse("'-' and '_' must separate words (not end the name or come twice)");
    }
    if name.contains('-') && name.contains('_') {
        return refuse("use '-' or '_' between words, not both");
    }
    if RESERVED.contains(&name) {
        return refuse("is reserved (a package of this workspace or a Rust crate)");
    }
    Ok(())
}

/// The workspace root above `start` (or `start` itself): the nearest directory whose
/// `Cargo.toml` has a `[workspace]` table.
///
/// # Errors
/// No such directory.
pub fn find_workspace(start: &Path) -> Result<PathBuf, String> {
    for dir in start.ancestors() {
        let manifest = dir.join("Cargo.toml");
        if let Ok(text) = std::fs::read_to_string(&manifest)
            && text.lines().any(|l| l.trim() == "[workspace]")
        {
            return Ok(dir.to_path_buf());
        }
    }
    Err(format!(
        "no Cargo workspace at or above {} (run `local-runner new` inside the lambda-streams workspace, or give --workspace DIR)",
        start.display()
    ))
}

/// Writes the function `name` into `workspace` (see the [module documentation](self)):
/// its crate into `dir` (default `functions/<name>`; relative to the workspace, and inside
/// it), the crate into the workspace's members, and its block into `template.yaml`.
///
/// Every check is made before the first write; the crate's directory is created with
/// `create_dir` (which fails if it appeared meanwhile), so nothing existing is overwritten.
///
/// # Errors
/// An invalid name, a directory that exists or lies outside the workspace, a package or a
/// function of that name already in `Cargo.toml` or `template.yaml`, a `Cargo.toml` or
/// `template.yaml` the scaffold cannot edit (each named), or an I/O error (with the path,
/// and what was already written).
pub fn scaffold(workspace: &Path, name: &str, dir: Option<&Path>) -> Result<Scaffolded, String> {
    validate_name(name)?;
    let names = Names::of(name);
    let relative = match dir {
        Some(dir) if dir.is_absolute() => dir
            .strip_prefix(workspace)
            .map_err(|_| {
                format!(
                    "{}: the function's directory must be inside the workspace {}",
                    dir.display(),
                    workspace.display()
                )
            })?
            .to_path_buf(),
        Some(dir) => dir.to_path_buf(),
        None => Path::new("functions").join(name),
    };
    if relative
        .components()
        .any(|c| !matches!(c, std::path::Component::Normal(_)))
        || relative.as_os_str().is_empty()
    {
        return Err(format!(
            "{}: give a directory inside the workspace, without `..`",
            relative.display()
        ));
    }
    let member = relative
        .to_str()
        .ok_or_else(|| format!("{}: not a UTF-8 path", relative.display()))?
        .replace('\\', "/");
    let crate_dir = workspace.join(&relative);
    if crate_dir.exists() {
        return Err(format!(
            "{} exists: the scaffold never overwrites (choose another name or --path)",
            crate_dir.display()
        ));
    }

    let manifest_path = workspace.join("Cargo.toml");
    let manifest = read(&manifest_path)?;
    if let Some(existing) = member_named(workspace, &manifest, name) {
        return Err(format!(
            "the workspace member {existing} is already a package named {name:?}: choose another name"
        ));
    }
    let manifest_after = add_member(&manifest, &member, name)
        .map_err(|e| format!("{}: {e}", manifest_path.display()))?;
    let template_path = workspace.join("template.yaml");
    let template = read(&template_path)?;
    let template_after =
        add_function(&template, &names).map_err(|e| format!("{}: {e}", template_path.display()))?;

    let mut written = Vec::new();
    let result = write_all(
        &crate_dir,
        &names,
        [
            (manifest_path, manifest_after),
            (template_path, template_after),
        ],
        &mut written,
    );
    match result {
        Ok(()) => Ok(Scaffolded {
            dir: crate_dir,
            files: written,
            member,
        }),
        Err(e) => Err(format!(
            "{e} (already written: {})",
            if written.is_empty() {
                "nothing".to_owned()
            } else {
                written
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            }
        )),
    }
}

/// The workspace member whose package is named `name`, if any.
fn member_named(workspace: &Path, manifest: &str, name: &str) -> Option<String> {
    let table = table_span(manifest, "workspace")?;
    let (open, close) = array_span(manifest, table, "members")?;
    let wanted = format!("name = \"{name}\"");
    manifest[open + 1..close]
        .split(',')
        .map(|m| m.trim().trim_matches('"').to_owned())
        .filter(|m| !m.is_empty())
        .find(|m| {
            std::fs::read_to_string(workspace.join(m).join("Cargo.toml"))
                .is_ok_and(|t| t.lines().any(|l| l.trim() == wanted))
        })
}

fn read(path: &Path) -> Result<String, String> {
    std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))
}

fn write_all(
    crate_dir: &Path,
    names: &Names,
    edits: [(PathBuf, String); 2],
    written: &mut Vec<PathBuf>,
) -> Result<(), String> {
    if let Some(parent) = crate_dir.parent() {
        std::fs::create_dir_all(parent)
            .map_err(|e| format!("cannot create {}: {e}", parent.display()))?;
    }
    std::fs::create_dir(crate_dir)
        .map_err(|e| format!("cannot create {}: {e}", crate_dir.display()))?;
    written.push(crate_dir.to_path_buf());
    let src = crate_dir.join("src");
    std::fs::create_dir(&src).map_err(|e| format!("cannot create {}: {e}", src.display()))?;
    for (path, template) in [
        (crate_dir.join("Cargo.toml"), CARGO_TOML),
        (src.join("main.rs"), MAIN_RS),
        (src.join("lib.rs"), LIB_RS),
        (src.join("tests.rs"), TESTS_RS),
    ] {
        write_new(&path, &names.fill(template))?;
        written.push(path);
    }
    // Formatted as `cargo fmt` would (names of any length change the line breaks); best
    // effort: without rustfmt the files are valid as written.
    let _ = std::process::Command::new("rustfmt")
        .args(["--edition", "2024"])
        .arg(src.join("main.rs"))
        .arg(src.join("lib.rs"))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status();
    for (path, text) in edits {
        std::fs::write(&path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        written.push(path);
    }
    Ok(())
}

/// Writes a file that must not exist yet.
fn write_new(path: &Path, text: &str) -> Result<(), String> {
    use std::io::Write;
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .and_then(|mut f| f.write_all(text.as_bytes()))
        .map_err(|e| format!("cannot write {}: {e}", path.display()))
}

/// The workspace manifest with `member` appended to `[workspace] members` (and to
/// `default-members` when there is one), the rest of the text unchanged.
fn add_member(manifest: &str, member: &str, name: &str) -> Result<String, String> {
    let mut text = manifest.to_owned();
    let workspace = table_span(&text, "workspace").ok_or("no [workspace] table")?;
    let Some(members) = array_span(&text, workspace, "members") else {
        return Err("no `members = [...]` in [workspace]".into());
    };
    let quoted = format!("\"{member}\"");
    if text[members.0..members.1].contains(&quoted) {
        return Err(format!("{member} is already a workspace member"));
    }
    if let Some(deps) = table_span(&text, "workspace.dependencies") {
        let declared = text[deps.0..deps.1].lines().any(|l| {
            let l = l.trim_start();
            l.strip_prefix(name)
                .is_some_and(|rest| rest.trim_start().starts_with('='))
        });
        if declared {
            return Err(format!(
                "a dependency named {name:?} is already declared in [workspace.dependencies]: choose another name"
            ));
        }
    }
    // default-members first: it comes after members, so the members' span stays valid.
    if let Some(defaults) = array_span(&text, workspace, "default-members") {
        text = append_to_array(&text, defaults, &quoted);
    }
    Ok(append_to_array(&text, members, &quoted))
}

/// The byte span of the body of the TOML table `[name]`: from after its header line to the
/// next table header (or the end).
fn table_span(text: &str, name: &str) -> Option<(usize, usize)> {
    let header = format!("[{name}]");
    let mut offset = 0;
    let mut start = None;
    for line in text.split_inclusive('\n') {
        let trimmed = line.trim();
        if let Some(s) = start {
            if trimmed.starts_with('[') {
                return Some((s, offset));
            }
        } else if trimmed == header {
            start = Some(offset + line.len());
        }
        offset += line.len();
    }
    start.map(|s| (s, text.len()))
}

/// In `span`, the span of the array of `key = [...]` from `[` to its `]` (exclusive of
/// the `]`). The arrays of a workspace manifest hold plain strings: brackets in them are
/// not expected, and a `]` inside a string would end the span early.
fn array_span(text: &str, span: (usize, usize), key: &str) -> Option<(usize, usize)> {
    let body = &text[span.0..span.1];
    let mut offset = span.0;
    for line in body.split_inclusive('\n') {
        let trimmed = line.trim_start();
        if let Some(rest) = trimmed.strip_prefix(key)
            && rest.trim_start().starts_with('=')
        {
            let open = offset + line.find('[')?;
            let close = open + text[open..span.1].find(']')?;
            return Some((open, close));
        }
        offset += line.len();
    }
    None
}

/// Appends `item` to the array spanning `span` (`[` .. before `]`), one line or several.
fn append_to_array(text: &str, span: (usize, usize), item: &str) -> String {
    let inside = &text[span.0 + 1..span.1];
    let trimmed = inside.trim_end();
    let end = span.0 + 1 + trimmed.len();
    let insertion = if inside.contains('\n') {
        // One item per line: a line like the last one's.
        let indent = trimmed
            .rsplit('\n')
            .next()
            .map(|l| &l[..l.len() - l.trim_start().len()])
            .unwrap_or("    ");
        let comma = if trimmed.ends_with(',') || trimmed.ends_with('[') {
            ""
        } else {
            ","
        };
        format!("{comma}\n{indent}{item},")
    } else if trimmed.trim().is_empty() {
        item.to_owned()
    } else {
        let comma = if trimmed.ends_with(',') { " " } else { ", " };
        format!("{comma}{item}")
    };
    format!("{}{insertion}{}", &text[..end], &text[end..])
}

/// The template with the function's parameters, resource and output added at the end of
/// their sections.
fn add_function(template: &str, names: &Names) -> Result<String, String> {
    let binary = format!("Binary: {}", names.name);
    if template
        .lines()
        .any(|l| l.trim() == binary || l.trim() == format!("Binary: \"{}\"", names.name))
    {
        return Err(format!(
            "a function built from binary {} is already declared",
            names.name
        ));
    }
    for id in [
        format!("{}Function", names.pascal),
        format!("{}InputTopic", names.pascal),
        format!("{}OutputTopic", names.pascal),
        format!("{}RepartitionTopic", names.pascal),
        format!("{}ConsumerGroupId", names.pascal),
        format!("{}FunctionArn", names.pascal),
    ] {
        if template
            .lines()
            .any(|l| l.starts_with("  ") && l.trim_end() == format!("  {id}:"))
        {
            return Err(format!(
                "the logical id {id} is already declared (choose another name)"
            ));
        }
    }
    // The generated block refers to these: a template without them is not this project's.
    for needed in [
        "MskClusterArn",
        "BatchSize",
        "BatchingWindowSeconds",
        "SubnetIds",
        "SecurityGroupIds",
        "StateTable",
        "ProvisionedMinimumPollers",
        "ProvisionedMaximumPollers",
        "MaximumRetryAttempts",
        "MaximumRecordAgeInSeconds",
        "BisectBatchOnFunctionError",
        "FailedRecordsTopic",
        "FilterPattern",
        "EventSourceMetrics",
        "HasFailureDestination",
        "HasFilter",
    ] {
        if !template.lines().any(|l| {
            l.trim_end() == format!("  {needed}:") || l.starts_with(&format!("  {needed}: "))
        }) {
            return Err(format!(
                "the function block refers to {needed}, which the template does not declare"
            ));
        }
    }
    if !template
        .lines()
        .any(|l| l.trim_end() == "  InVpc:" || l.starts_with("  InVpc: "))
    {
        return Err(
            "the function block refers to the condition InVpc, which the template does not declare"
                .into(),
        );
    }
    let mut text = template.to_owned();
    // From the last section to the first, so that earlier offsets stay valid.
    // Parameters and outputs join their sections' lists; the resource comes after a blank
    // line, as the others do.
    let mut inserts = vec![
        (
            section_end(&text, "Parameters")?,
            "",
            names.fill(TEMPLATE_PARAMETERS),
        ),
        (
            section_end(&text, "Resources")?,
            "\n",
            names.fill(TEMPLATE_FUNCTION),
        ),
    ];
    if let Ok(end) = section_end(&text, "Outputs") {
        inserts.push((end, "", names.fill(TEMPLATE_OUTPUT)));
    }
    inserts.sort_by_key(|insert| std::cmp::Reverse(insert.0));
    for (at, lead, block) in inserts {
        let before = &text[..at];
        let newline = if before.ends_with('\n') { "" } else { "\n" };
        text = format!("{before}{newline}{lead}{block}{}", &text[at..]);
    }
    Ok(text)
}

/// The offset just after the last line of the top-level YAML section `key:` (its
/// indented lines), before the blank lines and column-0 comments that precede the next
/// top-level key.
fn section_end(text: &str, key: &str) -> Result<usize, String> {
    let header = format!("{key}:");
    let mut offset = 0;
    let mut inside = false;
    let mut last_content_end = None;
    for line in text.split_inclusive('\n') {
        let content = line.trim_end();
        if inside {
            let top_level = !content.is_empty() && !line.starts_with([' ', '\t', '#']);
            if top_level {
                break;
            }
            if !content.is_empty() && line.starts_with([' ', '\t']) {
                last_content_end = Some(offset + line.len());
            }
        } else if content == header {
            inside = true;
            last_content_end = Some(offset + line.len());
        }
        offset += line.len();
    }
    match (inside, last_content_end) {
        (true, Some(end)) => Ok(end),
        _ => Err(format!("no top-level {header} section")),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn names_are_crate_names() {
        for good in ["clicks", "click-counts", "click_counts", "a1", "orders-v2"] {
            assert_eq!(validate_name(good), Ok(()), "{good}");
        }
        for bad in [
            "",
            "Clicks",
            "1clicks",
            "-clicks",
            "clicks-",
            "click--counts",
            "click counts",
            "click.counts",
            "clické",
            "a-b_c",
            "tests",
            "std",
            "lambda-streams",
        ] {
            let e = validate_name(bad).unwrap_err();
            assert!(e.contains(&format!("{bad:?}")), "{e}");
        }
        assert!(validate_name(&"a".repeat(65)).is_err());
    }

    #[test]
    fn derived_names() {
        let n = Names::of("click-counts");
        assert_eq!(
            (n.krate.as_str(), n.env.as_str(), n.pascal.as_str()),
            ("click_counts", "CLICK_COUNTS", "ClickCounts")
        );
        assert_eq!(Names::of("orders_v2").pascal, "OrdersV2");
    }

    #[test]
    fn members_are_appended_in_one_line_and_multi_line_arrays() {
        let one = "[workspace]\nresolver = \"3\"\nmembers = [\"a\", \"b\"]\ndefault-members = [\"a\"]\n\n[workspace.package]\nversion = \"0.1.0\"\n";
        assert_eq!(
            add_member(one, "functions/c", "c").unwrap(),
            "[workspace]\nresolver = \"3\"\nmembers = [\"a\", \"b\", \"functions/c\"]\ndefault-members = [\"a\", \"functions/c\"]\n\n[workspace.package]\nversion = \"0.1.0\"\n"
        );
        let multi = "[workspace]\nmembers = [\n    \"a\",\n    \"b\"\n]\n";
        assert_eq!(
            add_member(multi, "functions/c", "c").unwrap(),
            "[workspace]\nmembers = [\n    \"a\",\n    \"b\",\n    \"functions/c\",\n]\n"
        );
        let empty = "[workspace]\nmembers = []\n";
        assert_eq!(
            add_member(empty, "functions/c", "c").unwrap(),
            "[workspace]\nmembers = [\"functions/c\"]\n"
        );
        assert!(
            add_member(one, "a", "a")
                .unwrap_err()
                .contains("already a workspace member")
        );
        assert!(add_member("[package]\nname = \"x\"\n", "c", "c").is_err());
        let dep =
            "[workspace]\nmembers = [\"a\"]\n[workspace.dependencies]\nc = { path = \"c\" }\n";
        assert!(
            add_member(dep, "functions/c", "c")
                .unwrap_err()
                .contains("\"c\"")
        );
    }

    /// The smallest template the block refers into.
    const TEMPLATE: &str = "Parameters:\n  MskClusterArn:\n    Type: String\n  BatchSize:\n    Type: Number\n  BatchingWindowSeconds:\n    Type: Number\n  SubnetIds:\n    Type: CommaDelimitedList\n  SecurityGroupIds:\n    Type: CommaDelimitedList\n  ProvisionedMinimumPollers:\n    Type: Number\n  ProvisionedMaximumPollers:\n    Type: Number\n  MaximumRetryAttempts:\n    Type: Number\n  MaximumRecordAgeInSeconds:\n    Type: Number\n  BisectBatchOnFunctionError:\n    Type: String\n  FailedRecordsTopic:\n    Type: String\n  FilterPattern:\n    Type: String\n  EventSourceMetrics:\n    Type: CommaDelimitedList\n\nConditions:\n  InVpc: !Not [!Equals [!Join [\"\", !Ref SubnetIds], \"\"]]\n  HasFailureDestination: !Not [!Equals [!Ref FailedRecordsTopic, \"\"]]\n  HasFilter: !Not [!Equals [!Ref FilterPattern, \"\"]]\n\nResources:\n  StateTable:\n    Type: AWS::DynamoDB::Table\n\nOutputs:\n  StateTableName:\n    Value: !Ref StateTable\n";

    #[test]
    fn the_function_block_goes_at_the_end_of_each_section_once() {
        let names = Names::of("clicks");
        let text = add_function(TEMPLATE, &names).unwrap();
        let params = text.find("  ClicksInputTopic:").unwrap();
        assert!(params > text.find("  EventSourceMetrics:").unwrap());
        assert!(params < text.find("Conditions:").unwrap());
        let function = text.find("  ClicksFunction:").unwrap();
        assert!(function > text.find("  StateTable:").unwrap());
        assert!(function < text.find("Outputs:").unwrap());
        assert!(text.contains("        Binary: clicks\n"));
        assert!(text.contains("ConsumerGroupId: !Sub \"${ClicksConsumerGroupId}-repartition\""));
        // Its mappings, with the on-failure destination as every mapping of the template.
        assert!(text.contains("  ClicksInputMapping:\n"));
        assert!(text.contains("  ClicksRepartitionMapping:\n"));
        assert_eq!(
            text.matches("Destination: !Sub \"kafka://${FailedRecordsTopic}\"")
                .count(),
            2
        );
        assert!(text.ends_with("  ClicksFunctionArn:\n    Description: ARN of the clicks function\n    Value: !GetAtt ClicksFunction.Arn\n"));
        assert!(!text.contains("{{"), "every placeholder filled");
        // The same again is refused, and a template without the parts the block uses.
        assert!(
            add_function(&text, &names)
                .unwrap_err()
                .contains("binary clicks")
        );
        let other = add_function(&text, &Names::of("clicks_x")).unwrap();
        assert!(other.contains("ClicksXFunction"));
        let e = add_function("Resources:\n  A:\n    Type: X\n", &names).unwrap_err();
        assert!(e.contains("MskClusterArn"), "{e}");
    }

    #[test]
    fn sections_end_before_the_next_top_level_key_and_its_comments() {
        let t = "A: 1\nParameters:\n  X:\n    Type: String\n\n# about B\nB:\n  y: 1\n";
        let end = section_end(t, "Parameters").unwrap();
        assert_eq!(&t[..end], "A: 1\nParameters:\n  X:\n    Type: String\n");
        let end = section_end(t, "B").unwrap();
        assert_eq!(end, t.len());
        assert!(section_end(t, "Outputs").is_err());
    }
}
