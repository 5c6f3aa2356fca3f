//! The shipped monitoring (deploy/) against the real thing: every PromQL expression of the
//! Grafana dashboard and of the Prometheus rules returns data from a real Prometheus scraping a
//! loaded `nmt-server` (a panel that draws nothing, or a rule that records nothing, fails), and
//! the compose file wires the server, Prometheus and Grafana to files that exist.

mod common;
#[path = "common/prometheus.rs"]
mod prometheus;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::{run, server_default, start_server_with_env, wait_until_ready};
use prometheus::{labels, value, Prometheus};
use serde_json::{json, Value};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn deploy() -> PathBuf {
    repo().join("deploy")
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn yaml(path: &Path) -> Value {
    serde_norway::from_str(&read(path)).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

// ---- the dashboard and the rules against a loaded server ---------------------------------

const MODEL: &str = "en-es-rel-ldpe";
const SHORT: [&str; 2] = ["Jonah prayed.", "Ruth wept."];
const MEDIUM: &str =
    "And it happened in the days when the judges judged, that there was a famine in the land.";
/// Over 128 subwords: the alert on long inputs selects buckets from 129-256 up.
const LONG: &str = "In the beginning God created the heaven and the earth. And the earth was \
    without form, and void; and darkness was upon the face of the deep. And the Spirit of God \
    moved upon the face of the waters. And God said, Let there be light: and there was light. \
    And God saw the light, that it was good: and God divided the light from the darkness. And \
    God called the light Day, and the darkness he called Night. And the evening and the morning \
    were the first day. And God said, Let there be a firmament in the midst of the waters, and \
    let it divide the waters from the waters. And God made the firmament, and divided the \
    waters which were under the firmament from the waters which were above the firmament.";

/// Seconds of load: every series needs increases seen by at least two scrapes (1 s apart) for
/// `rate()` to have a slope, and a recording rule evaluation after them.
const LOAD: Duration = Duration::from_secs(10);
const MIN_ROUNDS: usize = 3;
/// Requests sent at once in each round's burst, against a batch of 2 and a queue of 1.
const BURST: usize = 8;

/// One round of traffic: every input-length bucket the rules select, free and constrained
/// lengths, each kind of bad request, and a burst the server must shed. Returns how many
/// requests of the burst were refused as overloaded.
async fn load_round(client: &reqwest::Client, url: &str) -> usize {
    let translate = format!("{url}/translate");
    let requests = [
        ("two short texts", json!({"text": SHORT}), 200, Some(1..=16)),
        (
            "medium, free length",
            json!({"text": MEDIUM}),
            200,
            Some(17..=32),
        ),
        (
            "long, target_length 12",
            json!({"text": LONG, "target_length": 12}),
            200,
            Some(129..=256),
        ),
        (
            "medium, max_chars 30",
            json!({"text": MEDIUM, "max_chars": 30}),
            200,
            None,
        ),
        (
            "medium, exact source length",
            json!({"text": MEDIUM, "target_length": "source", "length_mode": "exact"}),
            200,
            None,
        ),
        ("empty list", json!({"text": []}), 422, None),
        (
            "unknown model",
            json!({"text": "Hello.", "model": "no-such-model"}),
            404,
            None,
        ),
    ];
    for (what, body, status, source_tokens) in requests {
        let response = client.post(&translate).json(&body).send().await.unwrap();
        let got = response.status().as_u16();
        let answer: Value = response.json().await.unwrap();
        assert_eq!(got, status, "{what}: {answer}");
        if let Some(bucket) = source_tokens {
            let longest = answer["translations"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t["source_tokens"].as_u64().unwrap())
                .max()
                .unwrap();
            assert!(
                bucket.contains(&longest),
                "{what}: {longest} source tokens, outside the {bucket:?} bucket this load needs"
            );
        }
    }
    let response = client
        .post(&translate)
        .header("content-type", "application/json")
        .body("{\"text\": ")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 400, "truncated JSON");

    // Each text of the burst decodes 40 steps, so the burst outlasts a batch of 2 and a queue
    // of 1 and the rest are refused.
    let mut burst = tokio::task::JoinSet::new();
    for _ in 0..BURST {
        let request = client
            .post(&translate)
            .json(&json!({"text": MEDIUM, "target_length": 40, "length_mode": "exact"}));
        burst.spawn(async move {
            let response = request.send().await.unwrap();
            let status = response.status().as_u16();
            (status, response.json::<Value>().await.unwrap())
        });
    }
    let mut shed = 0;
    while let Some(answer) = burst.join_next().await {
        let (status, body) = answer.unwrap();
        match status {
            200 => {}
            429 => {
                assert_eq!(body["error_type"], "overloaded", "{body}");
                shed += 1;
            }
            _ => panic!("burst request answered {status}: {body}"),
        }
    }
    shed
}

/// deploy/prometheus.yml made to scrape `target` every second and to evaluate the rules every
/// second; everything else (job name, path, rule files) as shipped.
fn test_prometheus_config(target: &str) -> Value {
    let mut config = yaml(&deploy().join("prometheus.yml"));
    config["global"]["scrape_interval"] = json!("1s");
    config["global"]["scrape_timeout"] = json!("1s");
    config["global"]["evaluation_interval"] = json!("1s");
    for file in config["rule_files"].as_array_mut().unwrap() {
        *file = json!(deploy().join(file.as_str().unwrap()));
    }
    for job in config["scrape_configs"].as_array_mut().unwrap() {
        for group in job["static_configs"].as_array_mut().unwrap() {
            group["targets"] = json!([target]);
        }
    }
    config
}

/// An expression `lhs OP number` split at its top-level comparison, if it is one: the part an
/// alert compares is what must have data, whether or not it crosses the threshold now.
fn split_threshold(expr: &str) -> Option<(&str, &str, f64)> {
    let bytes = expr.as_bytes();
    let (mut depth, mut quote, mut last) = (0i32, None::<u8>, None);
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i];
        if let Some(q) = quote {
            if c == b'\\' {
                i += 1;
            } else if c == q {
                quote = None;
            }
        } else {
            match c {
                b'"' | b'\'' | b'`' => quote = Some(c),
                b'(' | b'{' | b'[' => depth += 1,
                b')' | b'}' | b']' => depth -= 1,
                b'>' | b'<' | b'=' | b'!' if depth == 0 => {
                    let two = bytes.get(i + 1) == Some(&b'=');
                    let op = if two {
                        &expr[i..i + 2]
                    } else {
                        &expr[i..i + 1]
                    };
                    if matches!(op, ">" | "<" | ">=" | "<=" | "==" | "!=") {
                        last = Some((i, op));
                    }
                    if two {
                        i += 1;
                    }
                }
                _ => {}
            }
        }
        i += 1;
    }
    let (at, op) = last?;
    let threshold = expr[at + op.len()..].trim().parse().ok()?;
    Some((expr[..at].trim(), op, threshold))
}

#[test]
fn thresholds_split_at_the_top_level_comparison() {
    assert_eq!(
        split_threshold("max by (model) (nmt_queue_depth) > 100"),
        Some(("max by (model) (nmt_queue_depth)", ">", 100.0))
    );
    assert_eq!(
        split_threshold(r#"sum(rate(x{type=~"a>b|c"}[5m])) >= 1.5"#),
        Some((r#"sum(rate(x{type=~"a>b|c"}[5m]))"#, ">=", 1.5))
    );
    assert_eq!(split_threshold("sum(x > 1)"), None);
    assert_eq!(split_threshold("a > b"), None);
    assert_eq!(split_threshold(r#"x{a!="1"}"#), None);
}

/// Grafana's text for a multi-value variable in a regex matcher: the values, regex-escaped,
/// as alternatives.
fn grafana_regex(values: &[String]) -> String {
    let escaped: Vec<String> = values
        .iter()
        .map(|v| {
            v.chars()
                .flat_map(|c| {
                    let special = "\\^$.|?*+()[]{}".contains(c);
                    special.then_some('\\').into_iter().chain([c])
                })
                .collect()
        })
        .collect();
    match escaped.as_slice() {
        [one] => one.clone(),
        many => format!("({})", many.join("|")),
    }
}

/// `expr` with Grafana's variables replaced by what Grafana would send: `variables` (the
/// dashboard's own) and the built-in intervals for a 15 s scrape.
fn substitute(expr: &str, variables: &BTreeMap<String, String>) -> String {
    let mut all: Vec<(String, String)> = [
        ("__rate_interval", "1m"),
        ("__interval_ms", "15000"),
        ("__interval", "15s"),
        ("__range_s", "3600"),
        ("__range", "1h"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .chain(variables.iter().map(|(k, v)| (k.clone(), v.clone())))
    .collect();
    // `$__interval` is a prefix of `$__interval_ms`.
    all.sort_by_key(|(name, _)| std::cmp::Reverse(name.len()));
    let mut out = expr.to_string();
    for (name, text) in &all {
        out = out.replace(&format!("${{{name}}}"), text);
        out = out.replace(&format!("${name}"), text);
    }
    out
}

/// Every panel query of the dashboard, named for messages: (`panel 3 "title" A`, expr).
fn dashboard_queries(panels: &[Value], out: &mut Vec<(String, String)>) {
    for panel in panels {
        let title = panel["title"].as_str().unwrap_or_default();
        let exprs: Vec<_> = panel["targets"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|t| Some((t["refId"].as_str().unwrap_or("?"), t["expr"].as_str()?)))
            .collect();
        if panel["type"] != "row" {
            assert!(!exprs.is_empty(), "panel {title:?} has no PromQL query");
        }
        for (ref_id, expr) in exprs {
            let name = format!("dashboard panel {} {title:?} target {ref_id}", panel["id"]);
            out.push((name, expr.to_string()));
        }
        if let Some(inner) = panel["panels"].as_array() {
            dashboard_queries(inner, out);
        }
    }
}

/// The values a `label_values(...)` variable query offers, from Prometheus' label API.
async fn variable_values(
    client: &reqwest::Client,
    prometheus: &Prometheus,
    query: &str,
) -> Vec<String> {
    let args = query
        .trim()
        .strip_prefix("label_values(")
        .and_then(|q| q.strip_suffix(')'))
        .unwrap_or_else(|| panic!("variable query {query:?}: only label_values() is checked"));
    let (matcher, label) = match args.rsplit_once(',') {
        Some((metric, label)) => (Some(metric.trim()), label.trim()),
        None => (None, args.trim()),
    };
    let params: Vec<(&str, &str)> = matcher.map(|m| ("match[]", m)).into_iter().collect();
    let values = prometheus
        .get(client, &format!("/api/v1/label/{label}/values"), &params)
        .await
        .unwrap_or_else(|e| panic!("variable query {query:?}: {e}"));
    values
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect()
}

/// A query the test runs, and what it must give.
struct Check {
    name: String,
    expr: String,
    /// `true`: a non-empty vector with a finite value. `false`: Prometheus evaluates it (an
    /// alert's comparison, empty while nothing crosses its threshold).
    needs_data: bool,
}

fn finite(samples: &[Value]) -> bool {
    samples.iter().any(|s| value(s).is_finite())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_dashboard_and_rule_query_returns_data_from_a_loaded_server() {
    let started = Instant::now();
    // The promtool check of e2e.rs, repeated so that a rules file this test cannot load fails
    // with promtool's message rather than as missing data.
    run(Command::new("promtool")
        .args(["check", "rules"])
        .arg(deploy().join("rules.yml")));

    // A batch of 2 and a queue of 1, so that each round's burst is partly refused (429).
    let package = repo().join("models").join(MODEL);
    let server = start_server_with_env(
        &[&package],
        &["--max-batch-size", "2", "--max-queued-requests", "1"],
        &[("RUST_LOG", "error")],
    );
    let client = reqwest::Client::new();
    wait_until_ready(&client, &server).await;

    let target = server.http_addr();
    let prometheus = prometheus::start(&client, &test_prometheus_config(target)).await;
    // Load starts after the first scrape: a series born between two scrapes has no slope.
    prometheus
        .query_until(
            &client,
            "up{job=\"nmt\"} == 1",
            Duration::from_secs(20),
            |s| !s.is_empty(),
        )
        .await
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| panic!("Prometheus never scraped {target}:\n{}", prometheus.log()));

    let load_start = Instant::now();
    let (mut rounds, mut shed) = (0, 0);
    while rounds < MIN_ROUNDS || load_start.elapsed() < LOAD {
        let round_start = Instant::now();
        shed += load_round(&client, server.base_url()).await;
        rounds += 1;
        // Spread rounds over scrapes, so each bucket's counters rise between two of them.
        let rest = Duration::from_millis(1100).saturating_sub(round_start.elapsed());
        tokio::time::sleep(rest).await;
    }
    println!(
        "load: {rounds} rounds in {:.1} s, {shed} of {} burst requests shed",
        load_start.elapsed().as_secs_f64(),
        rounds * BURST
    );
    assert!(
        shed > 0,
        "no burst request was refused: nothing counts as overloaded"
    );

    // The queries: the dashboard's, with its variables as Grafana fills them in.
    let dashboard: Value =
        serde_json::from_str(&read(&deploy().join("grafana-dashboard.json"))).unwrap();
    let mut variables = BTreeMap::new();
    for variable in dashboard["templating"]["list"].as_array().unwrap() {
        let name = variable["name"].as_str().unwrap();
        if variable["type"] != "query" {
            continue;
        }
        let query = variable["query"].as_str().unwrap();
        let values = variable_values(&client, &prometheus, query).await;
        println!("variable ${name}: {query} => {values:?}");
        assert!(
            values.iter().any(|v| v == MODEL),
            "dashboard variable ${name} ({query}) offers {values:?}, not the served {MODEL}"
        );
        variables.insert(name.to_string(), grafana_regex(&values));
    }
    let mut panel_queries = Vec::new();
    dashboard_queries(dashboard["panels"].as_array().unwrap(), &mut panel_queries);
    let mut checks: Vec<Check> = panel_queries
        .into_iter()
        .map(|(name, expr)| {
            let expr = substitute(&expr, &variables);
            assert!(
                !expr.contains('$'),
                "{name}: unknown variable left in {expr}"
            );
            Check {
                name,
                expr,
                needs_data: true,
            }
        })
        .collect();

    // The rules': each recording rule's expression and the series it records; each alert as
    // written, and what it compares.
    let rules_file = yaml(&deploy().join("rules.yml"));
    let mut rule_names = BTreeSet::new();
    for group in rules_file["groups"].as_array().unwrap() {
        for rule in group["rules"].as_array().unwrap() {
            let expr = rule["expr"].as_str().unwrap().trim().to_string();
            if let Some(record) = rule["record"].as_str() {
                rule_names.insert(record.to_string());
                checks.push(Check {
                    name: format!("recording rule {record}"),
                    expr,
                    needs_data: true,
                });
                checks.push(Check {
                    name: format!("series recorded by {record}"),
                    expr: record.to_string(),
                    needs_data: true,
                });
            } else {
                let alert = rule["alert"].as_str().unwrap();
                rule_names.insert(alert.to_string());
                match split_threshold(&expr) {
                    Some((lhs, op, threshold)) => {
                        checks.push(Check {
                            name: format!("alert {alert} as written ({op} {threshold})"),
                            expr: expr.clone(),
                            needs_data: false,
                        });
                        checks.push(Check {
                            name: format!("alert {alert}, what it compares to {threshold}"),
                            expr: lhs.to_string(),
                            needs_data: true,
                        });
                    }
                    None => checks.push(Check {
                        name: format!("alert {alert}"),
                        expr,
                        needs_data: true,
                    }),
                }
            }
        }
    }

    // Prometheus loaded every rule of the file, and each evaluated without error.
    let deadline = Instant::now() + Duration::from_secs(20);
    let health = loop {
        let rules = prometheus.get(&client, "/api/v1/rules", &[]).await.unwrap();
        let health: BTreeMap<String, (String, String)> = rules["groups"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|g| g["rules"].as_array().unwrap().iter())
            .map(|r| {
                let error = r["lastError"].as_str().unwrap_or_default().to_string();
                let name = r["name"].as_str().unwrap().to_string();
                (name, (r["health"].as_str().unwrap().to_string(), error))
            })
            .collect();
        if health.values().all(|(h, _)| h == "ok") || Instant::now() > deadline {
            break health;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    assert_eq!(
        health.keys().cloned().collect::<BTreeSet<_>>(),
        rule_names,
        "the rules Prometheus loaded are those of deploy/rules.yml"
    );
    for (name, (state, error)) in &health {
        assert_eq!(state, "ok", "rule {name}: {error}");
    }

    // Rules evaluate every second; what has no data a few evaluations after the load never will.
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut failures = Vec::new();
    let mut results = BTreeMap::new();
    for check in &checks {
        let left = deadline.saturating_duration_since(Instant::now());
        let result = prometheus
            .query_until(&client, &check.expr, left, |s| {
                !check.needs_data || finite(s)
            })
            .await;
        match result {
            Err(error) => failures.push(format!(
                "{}: {}\n    error: {error}",
                check.name, check.expr
            )),
            Ok(samples) if check.needs_data && !finite(&samples) => failures.push(format!(
                "{}: {}\n    no finite value in {} series: {samples:?}",
                check.name,
                check.expr,
                samples.len()
            )),
            Ok(samples) => {
                println!("{}\n    {}", check.name, check.expr);
                if samples.is_empty() {
                    println!("    => nothing: not firing");
                }
                for sample in &samples {
                    println!("    => {} = {}", labels(sample), value(sample));
                }
                results.insert(check.expr.clone(), samples);
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} queries gave nothing to draw or alert on:\n{}",
        failures.len(),
        checks.len(),
        failures.join("\n")
    );

    // The headline panels split by input length, and errors by type, as the load did.
    let by = |expr: &str, label: &str| -> BTreeSet<String> {
        results[expr]
            .iter()
            .filter(|s| value(s).is_finite())
            .map(|s| s["metric"][label].as_str().unwrap_or_default().to_string())
            .collect()
    };
    let loaded: BTreeSet<String> = ["1-16", "17-32", "129-256"].map(String::from).into();
    for record in [
        "nmt:request_duration_seconds:p50_by_input_length",
        "nmt:request_duration_seconds:p99_by_input_length",
        "nmt:time_per_output_token_seconds:p50_by_input_length",
    ] {
        let buckets = by(record, "input_length");
        assert!(
            buckets.is_superset(&loaded),
            "{record}: buckets {buckets:?}, the load covered {loaded:?}"
        );
    }
    let types = by("nmt:errors:rate5m", "type");
    for expected in [
        "empty_text",
        "model_not_found",
        "invalid_json",
        "overloaded",
    ] {
        assert!(
            types.contains(expected),
            "nmt:errors:rate5m: types {types:?}, missing {expected}"
        );
    }
    println!(
        "{} queries checked in {:.1} s",
        checks.len(),
        started.elapsed().as_secs_f64()
    );
}

// ---- the compose file --------------------------------------------------------------------

/// A service's bind mounts, (host path relative to deploy/, container path); named volumes
/// must be declared at the top level.
fn bind_mounts(compose: &Value, service: &str) -> Vec<(String, String)> {
    let mut mounts = Vec::new();
    for volume in compose["services"][service]["volumes"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let (source, target) = match volume.as_str() {
            Some(short) => {
                let parts: Vec<&str> = short.split(':').collect();
                (parts[0].to_string(), parts[1].to_string())
            }
            None => (
                volume["source"].as_str().unwrap().to_string(),
                volume["target"].as_str().unwrap().to_string(),
            ),
        };
        if source.starts_with('.') || source.starts_with('/') {
            mounts.push((source, target));
        } else {
            assert!(
                compose["volumes"].get(&source).is_some(),
                "{service}: named volume {source} is not declared under `volumes:`"
            );
        }
    }
    mounts
}

fn copy_into(from: &Path, to: &Path) {
    if from.is_dir() {
        std::fs::create_dir_all(to).unwrap();
        for entry in std::fs::read_dir(from).unwrap() {
            let entry = entry.unwrap();
            copy_into(&entry.path(), &to.join(entry.file_name()));
        }
    } else {
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(from, to).unwrap();
    }
}

/// The service's filesystem as far as its bind mounts make it, laid out under a temporary
/// directory: what the container would find at each path.
fn mounted(compose: &Value, service: &str) -> tempfile::TempDir {
    let root = tempfile::tempdir().unwrap();
    for (source, target) in bind_mounts(compose, service) {
        let host = deploy().join(&source);
        assert!(
            host.exists(),
            "{service} mounts {source} ({}), which does not exist",
            host.display()
        );
        copy_into(&host, &root.path().join(target.trim_start_matches('/')));
    }
    root
}

/// `host:port` (or `http://host:port/...`) split.
fn host_port(address: &str) -> (String, u64) {
    let address = address.split("://").last().unwrap();
    let address = address.split('/').next().unwrap();
    let (host, port) = address.rsplit_once(':').unwrap();
    (host.to_string(), port.parse().unwrap())
}

/// The container side of a compose port mapping (`"8080:8080"`, `"127.0.0.1:80:8080/tcp"`).
fn container_port(mapping: &Value) -> u64 {
    match mapping.as_str() {
        Some(short) => {
            let port = short.rsplit(':').next().unwrap();
            port.split('/').next().unwrap().parse().unwrap()
        }
        None => mapping
            .as_u64()
            .or_else(|| mapping["target"].as_u64())
            .unwrap(),
    }
}

fn container_ports(compose: &Value, service: &str) -> Vec<u64> {
    compose["services"][service]["ports"]
        .as_array()
        .into_iter()
        .flatten()
        .map(container_port)
        .collect()
}

/// A service's environment variable, from a list (`NAME=value`) or a map.
fn environment(compose: &Value, service: &str, name: &str) -> Option<String> {
    let env = &compose["services"][service]["environment"];
    if let Some(list) = env.as_array() {
        list.iter()
            .filter_map(|e| e.as_str()?.split_once('='))
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.to_string())
    } else {
        env.get(name).map(|v| match v {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        })
    }
}

/// A value the Dockerfile sets with `ENV NAME=value`.
fn dockerfile_env(name: &str) -> Option<String> {
    let dockerfile = read(&repo().join("Dockerfile"));
    let start = dockerfile.find(&format!("{name}="))? + name.len() + 1;
    let rest = &dockerfile[start..];
    let end = rest.find(|c: char| c.is_whitespace()).unwrap_or(rest.len());
    Some(rest[..end].to_string())
}

/// `40s`, `1m30s`, `2m` in seconds.
fn compose_duration(text: &str) -> f64 {
    let (mut total, mut number) = (0.0, String::new());
    for c in text.chars() {
        match c {
            '0'..='9' | '.' => number.push(c),
            'h' | 'm' | 's' => {
                let unit = match c {
                    'h' => 3600.0,
                    'm' => 60.0,
                    _ => 1.0,
                };
                total += number.parse::<f64>().unwrap() * unit;
                number.clear();
            }
            _ => panic!("duration {text:?}"),
        }
    }
    assert!(number.is_empty(), "duration {text:?} lacks a unit");
    total
}

/// YAML files of a provisioning folder, parsed.
fn provisioning(dir: &Path) -> Vec<Value> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| matches!(p.extension().and_then(|e| e.to_str()), Some("yaml" | "yml")))
        .collect();
    files.sort();
    assert!(
        !files.is_empty(),
        "no provisioning file in {}",
        dir.display()
    );
    files.iter().map(|f| yaml(f)).collect()
}

#[test]
fn compose_runs_the_server_prometheus_and_grafana_on_the_shipped_files() {
    let compose = yaml(&deploy().join("compose.yaml"));
    let services = compose["services"].as_object().unwrap();

    // The server: built from the top-level Dockerfile, on the ports it listens on.
    let (server, _) = services
        .iter()
        .find(|(_, s)| s["build"].is_object() || s["build"].is_string())
        .expect("a service built from the Dockerfile");
    let build = &services[server]["build"];
    let context = deploy().join(build["context"].as_str().or(build.as_str()).unwrap());
    assert_eq!(
        context.canonicalize().unwrap(),
        repo().canonicalize().unwrap(),
        "the build context is the repository, which the Dockerfile copies from"
    );
    let dockerfile = build["dockerfile"].as_str().unwrap_or("Dockerfile");
    assert!(
        context.join(dockerfile).exists(),
        "{dockerfile} in the context"
    );
    let setting = |name: &str, flag: &str| -> String {
        environment(&compose, server, name)
            .or_else(|| dockerfile_env(name))
            .unwrap_or_else(|| server_default(flag))
    };
    let http: u64 = setting("NMT_PORT", "port").parse().unwrap();
    let grpc: u64 = setting("NMT_GRPC_PORT", "grpc-port").parse().unwrap();
    assert_eq!(http.to_string(), server_default("port"));
    assert_eq!(grpc.to_string(), server_default("grpc-port"));
    assert_eq!(
        setting("NMT_HOST", "host"),
        "0.0.0.0",
        "the server listens beyond its own container"
    );
    let ports = container_ports(&compose, server);
    assert!(
        ports.contains(&http),
        "{server} publishes HTTP {http}: {ports:?}"
    );
    assert!(
        ports.contains(&grpc),
        "{server} publishes gRPC {grpc}: {ports:?}"
    );
    // `stop` sends SIGTERM, then SIGKILL after the grace period: it must outlast the server's.
    let grace: f64 = setting("NMT_SHUTDOWN_GRACE", "shutdown-grace")
        .parse()
        .unwrap();
    let stop = services[server]["stop_grace_period"]
        .as_str()
        .map(compose_duration)
        .unwrap_or(10.0);
    assert!(
        stop > grace,
        "stop_grace_period {stop} s <= the server's {grace} s"
    );

    // Prometheus: the shipped scrape config and rules, scraping the server by service name.
    let prometheus = services
        .iter()
        .find(|(_, s)| {
            s["image"]
                .as_str()
                .unwrap_or("")
                .starts_with("docker.io/prom/prometheus")
        })
        .map(|(name, _)| name.clone())
        .expect("a docker.io/prom/prometheus service");
    let args: Vec<String> = services[&prometheus]["command"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|a| a.as_str().unwrap().to_string())
        .collect();
    let flag = |name: &str, default: &str| -> String {
        args.iter()
            .find_map(|a| a.strip_prefix(&format!("--{name}=")))
            .unwrap_or(default)
            .to_string()
    };
    let root = mounted(&compose, &prometheus);
    let config_path = root
        .path()
        .join(flag("config.file", "/etc/prometheus/prometheus.yml").trim_start_matches('/'));
    // promtool resolves rule_files as Prometheus will, inside the container's layout.
    run(Command::new("promtool")
        .args(["check", "config"])
        .arg(&config_path));
    let config = yaml(&config_path);
    let mut shared = yaml(&deploy().join("prometheus.yml"));
    let mut targets = Vec::new();
    for (job, shared_job) in config["scrape_configs"]
        .as_array()
        .unwrap()
        .iter()
        .zip(shared["scrape_configs"].as_array_mut().unwrap())
    {
        for (group, shared_group) in job["static_configs"]
            .as_array()
            .unwrap()
            .iter()
            .zip(shared_job["static_configs"].as_array_mut().unwrap())
        {
            for target in group["targets"].as_array().unwrap() {
                targets.push(host_port(target.as_str().unwrap()));
            }
            shared_group["targets"] = group["targets"].clone();
        }
    }
    assert_eq!(
        config, shared,
        "the compose scrape config is deploy/prometheus.yml but for its targets"
    );
    assert_eq!(
        targets,
        vec![(server.clone(), http)],
        "Prometheus scrapes the server's service on its HTTP port"
    );

    // Grafana: a Prometheus datasource on that service, and the dashboard provisioned.
    let grafana = services
        .iter()
        .find(|(_, s)| {
            s["image"]
                .as_str()
                .unwrap_or("")
                .starts_with("docker.io/grafana/grafana")
        })
        .map(|(name, _)| name.clone())
        .expect("a docker.io/grafana/grafana service");
    let root = mounted(&compose, &grafana);
    let in_container = |path: &str| root.path().join(path.trim_start_matches('/'));
    let provisioning_dir = environment(&compose, &grafana, "GF_PATHS_PROVISIONING")
        .unwrap_or_else(|| "/etc/grafana/provisioning".to_string());
    let datasources: Vec<Value> =
        provisioning(&in_container(&provisioning_dir).join("datasources"))
            .iter()
            .flat_map(|f| f["datasources"].as_array().unwrap().clone())
            .collect();
    let datasource = datasources
        .iter()
        .find(|d| d["type"] == "prometheus")
        .expect("a prometheus datasource");
    let (host, port) = host_port(datasource["url"].as_str().unwrap());
    let listen = host_port(&flag("web.listen-address", "0.0.0.0:9090")).1;
    assert_eq!((host, port), (prometheus.clone(), listen), "datasource url");
    assert_eq!(
        datasource["isDefault"], true,
        "the dashboard's datasource variable starts on the default"
    );
    // Grafana's $__rate_interval counts on the scrape interval it is told.
    assert_eq!(
        datasource["jsonData"]["timeInterval"], config["global"]["scrape_interval"],
        "the datasource's scrape interval is Prometheus'"
    );

    let dashboard = read(&deploy().join("grafana-dashboard.json"));
    let mut provided = Vec::new();
    for file in provisioning(&in_container(&provisioning_dir).join("dashboards")) {
        for provider in file["providers"].as_array().unwrap() {
            let path = in_container(provider["options"]["path"].as_str().unwrap());
            let files: Vec<PathBuf> = if path.is_dir() {
                std::fs::read_dir(&path)
                    .unwrap()
                    .map(|e| e.unwrap().path())
                    .collect()
            } else {
                vec![path]
            };
            provided.extend(files.iter().filter(|f| f.exists()).map(|f| read(f)));
        }
    }
    assert!(
        provided.contains(&dashboard),
        "no dashboard provider loads deploy/grafana-dashboard.json"
    );
    if let Some(home) = environment(
        &compose,
        &grafana,
        "GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH",
    ) {
        assert_eq!(read(&in_container(&home)), dashboard, "the home dashboard");
    }
    let dashboard: Value = serde_json::from_str(&dashboard).unwrap();
    for panel in dashboard["panels"].as_array().unwrap() {
        let uid = &panel["datasource"]["uid"];
        assert!(
            *uid == "${datasource}" || *uid == datasource["uid"],
            "panel {}: datasource {uid}, not the provisioned one",
            panel["title"]
        );
    }
}
