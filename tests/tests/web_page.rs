//! The page at `/`, in a real browser: headless Chromium (Debian's `chromium`, installed by
//! scripts/setup.sh) loads it from `nmt-server` on the shipped package, the page fills its
//! model picker from `/models`, translates a verse through `/translate`, and shows what the
//! API answers. A screenshot of the result is left in the test's temp dir (its path is
//! printed) for a person to look at.

mod common;

use std::path::Path;
use std::process::Command;

use common::{post_translate, shipped_package, start_server, wait_until_ready};
use serde_json::{json, Value};

/// Headless Chromium on `url`, given time to run the page's requests; `extra` picks the
/// output (`--dump-dom` or `--screenshot=...`). Returns standard output.
fn chromium(url: &str, extra: &[&str], profile: &Path) -> String {
    let output = Command::new("chromium")
        .args([
            "--headless",
            // Root in CI containers; the page is our own.
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            "--window-size=1000,720",
            // Virtual time runs past the page's fetches, which are real loopback requests.
            "--virtual-time-budget=30000",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(extra)
        .arg(url)
        .output()
        .expect("running chromium (scripts/setup.sh installs Debian's `chromium`)");
    assert!(
        output.status.success(),
        "chromium failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// `s` with HTML's text escapes, as `--dump-dom` writes text nodes.
fn html_text(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_translates_a_verse_in_a_browser() {
    let package = shipped_package();
    let server = start_server(&[&package], &[]);
    let client = reqwest::Client::new();
    wait_until_ready(&client, &server).await;
    let verse = "Jesus wept.";
    let api: Value = post_translate(&client, &server, &json!({ "text": [verse] }))
        .await
        .json()
        .await
        .unwrap();
    let expected = api["translations"][0]["text"].as_str().unwrap().to_string();
    let model = api["model"].as_str().unwrap().to_string();

    let dir = tempfile::Builder::new()
        .prefix("web-page-")
        .tempdir()
        .unwrap()
        .keep();
    let url = format!("{}/?text=Jesus%20wept.", server.base_url());
    let dom = tokio::task::spawn_blocking({
        let (url, profile) = (url.clone(), dir.join("profile"));
        move || chromium(&url, &["--dump-dom"], &profile)
    })
    .await
    .unwrap();
    // The picker was filled from /models, and the translation card holds the API's answer
    // with its lengths.
    assert!(
        dom.contains(&format!("<option value=\"{model}\"")),
        "no model option in:\n{dom}"
    );
    assert!(
        dom.contains(&format!(
            "<div class=\"target\">{}</div>",
            html_text(&expected)
        )),
        "the page does not show {expected:?}:\n{dom}"
    );
    assert!(dom.contains("subwords"), "no length facts in:\n{dom}");
    assert!(!dom.contains("class=\"error\""), "{dom}");

    let screenshot = dir.join("page.png");
    let shot = format!("--screenshot={}", screenshot.display());
    tokio::task::spawn_blocking(move || chromium(&url, &[&shot], &dir.join("profile")))
        .await
        .unwrap();
    let png = std::fs::read(&screenshot).expect("chromium wrote the screenshot");
    assert!(png.starts_with(b"\x89PNG") && png.len() > 10_000);
    println!("screenshot: {}", screenshot.display());
}
