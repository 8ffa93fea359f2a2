//! The Grafana dashboard in `deploy/grafana/herald.json` queries only
//! metrics the server exports: the families of its metric table (a
//! labelled one appears on `/metrics` with its first series) and the
//! engine's, read from a running server. A renamed or removed metric
//! fails here, not on an operator's screen.

use std::collections::BTreeSet;

use herald_server::metrics::Metrics;
use herald_test_support::TestServer;

const DASHBOARD: &str = include_str!("../../../deploy/grafana/herald.json");

/// Every `expr` of every panel, nested rows included.
fn exprs(v: &serde_json::Value, out: &mut Vec<String>) {
    match v {
        serde_json::Value::Object(map) => {
            for (k, v) in map {
                match (k.as_str(), v) {
                    ("expr", serde_json::Value::String(e)) => out.push(e.clone()),
                    _ => exprs(v, out),
                }
            }
        }
        serde_json::Value::Array(items) => items.iter().for_each(|v| exprs(v, out)),
        _ => {}
    }
}

/// The `herald_*` metric names an expression reads.
fn metric_names(expr: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = expr;
    while let Some(at) = rest.find("herald_") {
        let name: String =
            rest[at..].chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
        rest = &rest[at + name.len()..];
        names.push(name);
    }
    names
}

#[tokio::test]
async fn every_metric_the_dashboard_queries_is_exported() {
    let dashboard: serde_json::Value = serde_json::from_str(DASHBOARD).expect("the dashboard is JSON");
    let mut all = Vec::new();
    exprs(&dashboard, &mut all);
    assert!(all.len() >= 10, "the dashboard has its panels' queries: {all:?}");

    let srv = TestServer::start().await;
    let text = reqwest::get(format!("{}/metrics", srv.url)).await.unwrap().text().await.unwrap();
    let mut families: BTreeSet<&str> = Metrics::FAMILIES.iter().copied().collect();
    families.extend(text.lines().filter_map(|l| l.strip_prefix("# TYPE ")?.split_once(' ').map(|(n, _)| n)));
    assert!(families.contains("herald_engine_healthy"), "the engine's health is exported");
    // A series is named by its family plus the suffix its kind adds.
    let family_of = |series: &str| {
        ["_total", "_bucket", "_sum", "_count", ""]
            .iter()
            .filter_map(|suffix| series.strip_suffix(suffix))
            .find(|family| families.contains(family))
            .map(str::to_owned)
    };

    let missing: BTreeSet<String> =
        all.iter().flat_map(|e| metric_names(e)).filter(|n| family_of(n).is_none()).collect();
    assert!(missing.is_empty(), "the dashboard queries metrics /metrics does not export: {missing:?}");
    srv.stop().await;
}

#[test]
fn names_are_read_out_of_expressions() {
    assert_eq!(
        metric_names("sum by (instance) (rate(herald_delivered_total{instance=~\"$i\"}[5m])) / herald_x"),
        ["herald_delivered_total", "herald_x"]
    );
}
