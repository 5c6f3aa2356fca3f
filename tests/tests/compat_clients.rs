//! The LibreTranslate- and DeepL-compatible APIs driven by the clients people use, from PyPI
//! at the versions `scripts/setup.sh` pins (`libretranslatepy` 2.1.4, `deep-translator`
//! 1.11.4, `deepl` 1.32.0 and its CLI), against `nmt-server` on the shipped package: each
//! client's calls succeed, its translations are what `POST /translate` answers for the same
//! texts, length control reaches it, and an unsupported language raises the client's own
//! exception. The README's Python lines are run too.

mod common;

use std::process::Command;

use common::{post_translate, shipped_package, start_server, wait_until_ready, ServerProcess};
use serde_json::{json, Value};

/// `python3 args...`'s standard output; fails the test, with its standard error, if it fails.
fn python3<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> String {
    let output = Command::new("python3")
        .args(args)
        .output()
        .expect("running python3");
    assert!(
        output.status.success(),
        "python3 failed (scripts/setup.sh installs the clients):\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

/// `python3 -c script args...`, whose standard output is one JSON value.
fn python(script: &str, args: &[&str]) -> Value {
    let printed = python3(&[&["-c", script], args].concat());
    serde_json::from_str(&printed).unwrap_or_else(|e| panic!("not JSON ({e}): {printed}"))
}

/// The server's own translations of `texts`, with the request's other fields.
async fn native(server: &ServerProcess, texts: &[&str], fields: Value) -> Vec<String> {
    let mut body = json!({ "text": texts });
    body.as_object_mut()
        .unwrap()
        .extend(fields.as_object().unwrap().clone());
    let client = reqwest::Client::new();
    let answer: Value = post_translate(&client, server, &body)
        .await
        .json()
        .await
        .unwrap();
    let translations = answer["translations"].as_array().unwrap_or_else(|| {
        panic!("POST /translate answered {answer}");
    });
    translations
        .iter()
        .map(|t| t["text"].as_str().unwrap().to_string())
        .collect()
}

async fn started() -> ServerProcess {
    let server = start_server(&[&shipped_package()], &[]);
    wait_until_ready(&reqwest::Client::new(), &server).await;
    server
}

const LIBRETRANSLATE: &str = r#"
import json, sys, urllib.error
from deep_translator import LibreTranslator
from deep_translator.exceptions import ServerException
from libretranslatepy import LibreTranslateAPI

url = sys.argv[1] + "/libretranslate/"
api = LibreTranslateAPI(url)
out = {"libretranslatepy": api.translate("Hello", "en", "es"), "languages": api.languages()}
try:
    api.translate("Hello", "en", "fr")
except urllib.error.HTTPError as e:
    out["libretranslatepy_error"] = {"status": e.code, "body": json.loads(e.read())}
# deep-translator refuses to start without an api_key; the server ignores it.
translator = LibreTranslator(source="en", target="es", custom_url=url, api_key="unused")
out["deep_translator"] = translator.translate("Hello")
out["deep_translator_batch"] = translator.translate_batch(["Hello", "Good morning"])
try:
    LibreTranslator(source="en", target="fr", custom_url=url, api_key="unused").translate("Hi")
except ServerException as e:
    out["deep_translator_error"] = type(e).__name__
print(json.dumps(out))
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_libretranslate_clients_translate_list_languages_and_raise_their_errors() {
    let server = started().await;
    let out = python(LIBRETRANSLATE, &[server.base_url()]);
    eprintln!("{out:#}");
    let expected = native(&server, &["Hello", "Good morning"], json!({})).await;
    assert!(!expected[0].trim().is_empty(), "{expected:?}");
    assert_eq!(out["libretranslatepy"], expected[0]);
    assert_eq!(out["deep_translator"], expected[0]);
    assert_eq!(out["deep_translator_batch"], json!(expected));
    assert_eq!(
        out["languages"],
        json!([
            {"code": "en", "name": "English", "targets": ["es"]},
            {"code": "es", "name": "Spanish", "targets": []},
        ])
    );
    let error = &out["libretranslatepy_error"];
    assert_eq!(error["status"], 400, "{error}");
    assert!(
        error["body"]["error"]
            .as_str()
            .unwrap()
            .contains("into `fr`"),
        "{error}"
    );
    assert_eq!(out["deep_translator_error"], "ServerException");
}

const DEEPL: &str = r#"
import json, sys
import deepl

translator = deepl.Translator("any-key", server_url=sys.argv[1])
results = translator.translate_text(["Hello", "Good morning"], target_lang="ES")
usage = translator.get_usage()
out = {
    "texts": [r.text for r in results],
    "detected": [r.detected_source_lang for r in results],
    "billed": [r.billed_characters for r in results],
    "usage": [usage.character.count, usage.character.limit, usage.any_limit_reached],
    "sources": [[lang.code, lang.name] for lang in translator.get_source_languages()],
    "targets": [[lang.code, lang.supports_formality] for lang in translator.get_target_languages()],
    "short": translator.translate_text(
        sys.argv[2], source_lang="EN", target_lang="ES-ES",
        extra_body_parameters={"max_chars": int(sys.argv[3])},
    ).text,
}
try:
    translator.translate_text("Hello", target_lang="DE")
except deepl.DeepLException as e:
    out["error"] = [type(e).__name__, e.http_status_code, str(e)]
print(json.dumps(out))
"#;

const VERSE: &str = "And God said, Let there be light: and there was light.";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_deepl_client_and_cli_translate_report_usage_and_languages_and_raise_their_errors() {
    let server = started().await;
    let max_chars = 20;
    let out = python(DEEPL, &[server.base_url(), VERSE, &max_chars.to_string()]);
    eprintln!("{out:#}");
    let expected = native(&server, &["Hello", "Good morning"], json!({})).await;
    assert!(
        expected.iter().all(|t| !t.trim().is_empty()),
        "{expected:?}"
    );
    assert_eq!(out["texts"], json!(expected));
    assert_eq!(out["detected"], json!(["EN", "EN"]));
    assert_eq!(out["billed"], json!([5, 12]));
    assert_eq!(out["usage"], json!([17, 1_000_000_000_000u64, false]));
    assert_eq!(out["sources"], json!([["EN", "English"]]));
    assert_eq!(out["targets"], json!([["ES", false]]));
    let short = out["short"].as_str().unwrap();
    assert!(
        !short.is_empty() && short.chars().count() <= max_chars,
        "{short}"
    );
    let cut = native(&server, &[VERSE], json!({ "max_chars": max_chars })).await;
    assert_eq!(short, cut[0]);
    let error = out["error"].as_array().unwrap();
    assert_eq!(error[0], "DeepLException");
    assert_eq!(error[1], 400);
    assert!(
        error[2].as_str().unwrap().contains("into `DE`"),
        "{error:?}"
    );

    let url = server.base_url();
    let cli = |args: &[&str]| {
        let deepl = ["-m", "deepl", "--auth-key", "any", "--server-url", url];
        python3(&[&deepl[..], args].concat())
    };
    assert_eq!(cli(&["text", "--to", "ES", "Hello"]).trim(), expected[0]);
    let extra = format!(r#"{{"max_chars": {max_chars}}}"#);
    let short = cli(&[
        "text",
        "--to",
        "ES",
        "--extra-body-parameters",
        &extra,
        VERSE,
    ]);
    assert_eq!(short.trim(), cut[0]);
    let languages = cli(&["languages"]);
    assert!(languages.contains("EN: English"), "{languages}");
    assert!(languages.contains("ES: Spanish"), "{languages}");
}

/// The `python` blocks of the README, in order.
fn readme_python() -> Vec<String> {
    let readme_path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md");
    let readme = std::fs::read_to_string(readme_path).unwrap();
    let mut blocks = Vec::new();
    let mut block: Option<String> = None;
    for line in readme.lines() {
        match (line.trim_start().strip_prefix("```"), &mut block) {
            (Some(fence), None) if fence.trim() == "python" => block = Some(String::new()),
            (Some(_), Some(_)) => blocks.extend(block.take()),
            (None, Some(code)) => {
                code.push_str(line);
                code.push('\n');
            }
            _ => {}
        }
    }
    blocks
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readmes_python_lines_translate() {
    let blocks = readme_python();
    assert!(!blocks.is_empty(), "no ```python block in the README");
    let server = started().await;
    for block in blocks {
        let code = block.replace("http://localhost:8080", server.base_url());
        let printed = python3(&["-c", &code]);
        eprintln!("{printed}");
        let lines: Vec<&str> = printed.lines().collect();
        let prints = code.lines().filter(|l| l.starts_with("print(")).count();
        assert_eq!(lines.len(), prints, "{printed}");
        assert!(lines.iter().all(|l| !l.trim().is_empty()), "{printed}");
    }
}
