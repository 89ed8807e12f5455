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

/// The template's top-level resources, as `(name, text of its block)`.
fn resources(template: &str) -> Vec<(String, String)> {
    let body = template
        .split("\nResources:\n")
        .nth(1)
        .expect("a Resources section");
    let body = body.split("\nOutputs:\n").next().unwrap_or(body);
    let mut out: Vec<(String, String)> = Vec::new();
    for line in body.lines() {
        let is_name = line.starts_with("  ")
            && !line.starts_with("   ")
            && !line.trim_start().starts_with('#')
            && line.trim_end().ends_with(':');
        if is_name {
            out.push((line.trim().trim_end_matches(':').to_owned(), String::new()));
        } else if let Some((_, text)) = out.last_mut() {
            text.push_str(line);
            text.push('\n');
        }
    }
    out
}

fn template() -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root");
    std::fs::read_to_string(root.join("template.yaml")).expect("template.yaml")
}

/// Every event source mapping carries the event source's newer settings: provisioned mode,
/// the retry controls, an on-failure Kafka destination (the default: no partition stalls
/// forever on one record), its metrics; the input mappings also a filter and the schema
/// registry (the repartition mapping reads the framework's own records).
#[test]
fn every_event_source_mapping_has_the_retry_controls_a_destination_and_metrics() {
    let template = template();
    let mappings: Vec<(String, String)> = resources(&template)
        .into_iter()
        .filter(|(_, text)| text.contains("Type: AWS::Lambda::EventSourceMapping"))
        .collect();
    let functions: Vec<&str> = mappings
        .iter()
        .filter_map(|(_, t)| {
            t.lines()
                .find_map(|l| l.trim().strip_prefix("FunctionName: !Ref "))
        })
        .collect();
    for (function, expected) in [
        ("WordcountFunction", 2),
        ("EnrichOrdersFunction", 2),
        ("PageviewsFunction", 1),
        ("OrdersAvroFunction", 1),
    ] {
        assert_eq!(
            functions.iter().filter(|f| **f == function).count(),
            expected,
            "{function}'s mappings"
        );
    }
    for (name, text) in &mappings {
        for property in [
            "ProvisionedPollerConfig:",
            "MinimumPollers: !Ref ProvisionedMinimumPollers",
            "MaximumRetryAttempts: !Ref MaximumRetryAttempts",
            "MaximumRecordAgeInSeconds: !Ref MaximumRecordAgeInSeconds",
            "BisectBatchOnFunctionError: !Ref BisectBatchOnFunctionError",
            "Destination: !Sub \"kafka://${FailedRecordsTopic}\"",
            "Metrics: !Ref EventSourceMetrics",
            "- ReportBatchItemFailures",
            "ConsumerGroupId:",
        ] {
            assert!(text.contains(property), "{name} has no {property}");
        }
        let input = !text.contains("!Ref RepartitionTopic");
        for property in ["FilterCriteria:", "SchemaRegistryConfig:"] {
            assert_eq!(
                text.contains(property),
                input,
                "{name}: {property} on input mappings only"
            );
        }
    }
    // The destination is on by default, and every metric of the event source is asked for.
    let parameter = |name: &str| {
        template
            .split(&format!("\n  {name}:\n"))
            .nth(1)
            .and_then(|rest| {
                rest.lines()
                    .find_map(|l| l.trim().strip_prefix("Default: "))
            })
            .map(str::to_owned)
            .unwrap_or_else(|| panic!("parameter {name} with a default"))
    };
    assert_eq!(
        parameter("FailedRecordsTopic"),
        "lambda-streams-failed-records"
    );
    assert_eq!(
        parameter("EventSourceMetrics"),
        "EventCount,ErrorCount,KafkaMetrics"
    );
    assert_eq!(parameter("MaximumRetryAttempts"), "-1");
}

/// The dashboard and the alarms watch every function: offset lag, errors, and the
/// framework's own EMF metrics, by the names `metrics.rs` writes.
#[test]
fn the_dashboard_and_alarms_watch_lag_errors_and_the_frameworks_metrics() {
    let template = template();
    let all = resources(&template);
    let dashboard = all
        .iter()
        .find(|(_, t)| t.contains("Type: AWS::CloudWatch::Dashboard"))
        .map(|(_, t)| t.clone())
        .expect("a dashboard");
    let emitted: Vec<&str> =
        lambda_streams::metrics::batch_metrics(&lambda_streams::BatchReport::default())
            .into_iter()
            .map(|(name, _, _)| name)
            .collect();
    let shown: Vec<&str> = dashboard
        .split("[\"lambda-streams\", \"")
        .skip(1)
        .filter_map(|s| s.split('"').next())
        .collect();
    assert!(
        shown.len() >= 5,
        "the framework's metrics are on the dashboard"
    );
    for metric in &shown {
        assert!(
            emitted.contains(metric),
            "the dashboard shows {metric}, which metrics.rs does not write ({emitted:?})"
        );
    }
    for function in [
        "WordcountFunction",
        "EnrichOrdersFunction",
        "PageviewsFunction",
        "OrdersAvroFunction",
    ] {
        assert!(
            dashboard.contains(&format!("${{{function}}}")),
            "{function} on the dashboard"
        );
        for metric in ["OffsetLag", "Errors", "PoisonRecords"] {
            assert!(
                all.iter()
                    .any(|(_, t)| t.contains("Type: AWS::CloudWatch::Alarm")
                        && t.contains(&format!("MetricName: {metric}\n"))
                        && t.contains(&format!("Value: !Ref {function}\n"))),
                "no {metric} alarm for {function}"
            );
        }
    }
    assert!(emitted.contains(&"PoisonRecords"));
}
