//! One engine, three drivers: `nmt-server` over HTTP (the pipeline through its scheduler),
//! the engine driven directly (`nmt_engine::Engine`, what `nmt-eval` and the benchmarks use)
//! and the `nmt-translate` binary answer the same requests on the shipped package with the
//! same translations, subword counts and length fields, `max_chars` cuts included.

mod common;

use std::path::PathBuf;

use common::{post_translate, shipped_package, start_server, translate_cli, wait_until_ready};
use nmt_engine::length::{LengthMode, LengthRequest, TargetChars, TargetLength};
use nmt_engine::onnx::Device;
use nmt_engine::{Engine, EngineOptions, Outcome, RequestLimits, Translation};
use serde_json::{json, Value};

const TEXTS: [&str; 5] = [
    "Jesus wept.",
    "In the beginning God created the heavens and the earth.",
    "Daniel answered the king, and said, Let thy gifts be to thyself, and give thy rewards to another.",
    "I thank my God upon every remembrance of you.",
    "Rejoice in the Lord alway: and again I say, Rejoice.",
];

/// A request's length fields, as JSON and as the engine takes them, and as nmt-translate's
/// flags.
struct Ask {
    json: Value,
    length: LengthRequest,
    flags: Vec<&'static str>,
}

fn asks() -> Vec<Ask> {
    let ask = |target, mode, max_chars| LengthRequest {
        target,
        mode,
        max_chars,
        target_chars: None,
    };
    let chars = |target_chars| LengthRequest {
        target_chars: Some(target_chars),
        ..LengthRequest::default()
    };
    vec![
        Ask {
            json: json!({}),
            length: LengthRequest::default(),
            flags: vec![],
        },
        Ask {
            json: json!({ "target_length": 6, "length_mode": "exact" }),
            length: ask(Some(TargetLength::Tokens(6)), LengthMode::Exact, None),
            flags: vec!["--target-length", "6", "--length-mode", "exact"],
        },
        Ask {
            json: json!({ "target_length": "source" }),
            length: ask(Some(TargetLength::Source), LengthMode::Soft, None),
            flags: vec!["--target-length", "source"],
        },
        Ask {
            json: json!({ "target_length": "auto" }),
            length: ask(Some(TargetLength::Auto), LengthMode::Soft, None),
            flags: vec!["--target-length", "auto"],
        },
        // Short enough that the long texts are planned shorter (or cut).
        Ask {
            json: json!({ "max_chars": 30 }),
            length: ask(None, LengthMode::Soft, Some(30)),
            flags: vec!["--max-chars", "30"],
        },
        // Decoded at several lengths each, the candidates scored.
        Ask {
            json: json!({ "target_chars": 40 }),
            length: chars(TargetChars::Chars(40)),
            flags: vec!["--target-chars", "40"],
        },
        Ask {
            json: json!({ "target_chars": "source" }),
            length: chars(TargetChars::Source),
            flags: vec!["--target-chars", "source"],
        },
    ]
}

/// What the three drivers must agree on, from the server's JSON (absent fields are `None`).
#[derive(Debug, PartialEq)]
struct Fields {
    text: String,
    source_tokens: u64,
    output_tokens: u64,
    target_length: Option<u64>,
    length_source: Option<String>,
    length_mode: Option<String>,
    truncated: bool,
    /// The candidates' lengths and which was chosen.
    candidates: Vec<(Option<u64>, bool)>,
}

fn from_server(t: &Value) -> Fields {
    Fields {
        text: t["text"].as_str().unwrap().to_string(),
        source_tokens: t["source_tokens"].as_u64().unwrap(),
        output_tokens: t["output_tokens"].as_u64().unwrap(),
        target_length: t["target_length"].as_u64(),
        length_source: t["length_source"].as_str().map(str::to_string),
        length_mode: t["length_mode"].as_str().map(str::to_string),
        truncated: t["truncated"].as_bool().unwrap_or(false),
        candidates: t["length_candidates"]
            .as_array()
            .map(|all| {
                all.iter()
                    .map(|c| (c["target_length"].as_u64(), c["chosen"] == json!(true)))
                    .collect()
            })
            .unwrap_or_default(),
    }
}

fn from_engine(t: &Translation) -> Fields {
    let name = |v: Value| v.as_str().map(str::to_string);
    Fields {
        text: t.text.clone(),
        source_tokens: t.source_tokens as u64,
        output_tokens: t.output_tokens as u64,
        target_length: t.target_length.map(|n| n as u64),
        length_source: t.length_source.and_then(|s| name(json!(s))),
        length_mode: t.length_mode.and_then(|m| name(json!(m))),
        truncated: t.truncated,
        candidates: t
            .candidates
            .iter()
            .map(|c| (c.target_length.map(|n| n as u64), c.chosen))
            .collect(),
    }
}

fn translate_lines(flags: &[&str], input: &str) -> Vec<String> {
    let mut args = vec!["--quiet", "--batch-size", "2"];
    args.extend_from_slice(flags);
    let output = translate_cli(&args, input);
    assert!(
        output.status.success(),
        "nmt-translate {flags:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_the_engine_and_nmt_translate_answer_alike() {
    let package = shipped_package();
    let server = start_server(&[&package], &[]);
    let client = reqwest::Client::new();
    wait_until_ready(&client, &server).await;
    let options = EngineOptions {
        device: Device::Cpu,
        intra_op_threads: 1,
        ort_dylib_path: std::env::var_os("ORT_DYLIB_PATH").map(PathBuf::from),
        beyond_input_limit: false,
        limits: RequestLimits::default(),
        placeholder_masking: true,
        // Batches of 2 shared out to two workers: which worker decodes a text, and in what
        // order the batches finish, must not change its translation or its place.
        workers: 2,
    };
    let mut engine = Engine::load(&package, &options).expect("the shipped package loads");
    let texts: Vec<String> = TEXTS.iter().map(|t| t.to_string()).collect();
    let mut decoded_at_several_lengths = 0;
    for ask in asks() {
        let mut body = ask.json.clone();
        body["text"] = json!(TEXTS);
        let response = post_translate(&client, &server, &body).await;
        assert_eq!(response.status(), 200, "{body}");
        let answer: Value = response.json().await.unwrap();
        let served: Vec<Fields> = answer["translations"]
            .as_array()
            .unwrap()
            .iter()
            .map(from_server)
            .collect();

        // A batch smaller than the request: batching must not change a translation.
        let lengths = vec![ask.length; texts.len()];
        let direct = engine
            .translate(&texts, &lengths, 2, &mut |_| {})
            .expect("the engine translates");
        assert!(direct.iter().all(|t| t.outcome != Outcome::Refused));
        let direct: Vec<Fields> = direct.iter().map(from_engine).collect();
        assert_eq!(direct, served, "engine vs server for {}", ask.json);

        let lines = translate_lines(&ask.flags, &TEXTS.join("\n"));
        let served_texts: Vec<&str> = served.iter().map(|f| f.text.as_str()).collect();
        assert_eq!(
            lines, served_texts,
            "nmt-translate vs server for {}",
            ask.json
        );
        if let Some(max_chars) = ask.length.max_chars {
            assert!(served.iter().all(|f| f.text.chars().count() <= max_chars));
        }
        decoded_at_several_lengths += served.iter().filter(|f| f.candidates.len() > 1).count();
    }
    assert!(
        decoded_at_several_lengths > 0,
        "character goals decode candidates"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn split_sentences_answers_alike_on_the_server_and_in_nmt_translate() {
    let package = shipped_package();
    let server = start_server(&[&package], &[]);
    let client = reqwest::Client::new();
    wait_until_ready(&client, &server).await;
    // Two and three sentences, spacing of their own, and an empty line that stays empty.
    let lines = [
        "Jesus wept. In the beginning God created the heavens and the earth.",
        "",
        "I thank my God upon every remembrance of you.  Rejoice in the Lord alway! Amen.",
    ];
    let texts: Vec<&str> = lines.iter().copied().filter(|l| !l.is_empty()).collect();
    let body = json!({ "text": texts, "split_sentences": true });
    let response = post_translate(&client, &server, &body).await;
    assert_eq!(response.status(), 200, "{body}");
    let answer: Value = response.json().await.unwrap();
    let served: Vec<&str> = answer["translations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["text"].as_str().unwrap())
        .collect();
    let lines_out = translate_lines(&["--split-sentences"], &lines.join("\n"));
    assert_eq!(lines_out, [served[0], "", served[1]]);
    assert!(
        served[1].contains("  "),
        "the line's own spacing: {:?}",
        served[1]
    );
    let refused = translate_cli(&["--split-sentences", "--max-chars", "40"], "Hi.");
    assert!(!refused.status.success());
}
