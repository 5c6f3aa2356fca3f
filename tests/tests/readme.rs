//! The README's commands as a reader types them. Every command of its shell blocks is either
//! run here, in the README's order ([`RUN`]), or listed in [`NOT_RUN`] with the reason; a
//! command that is neither fails [`every_readme_command_is_run_or_listed`], so the README
//! cannot gain a command that nothing checks.
//!
//! The commands run in one bash session, as in a terminal: what `source scripts/env.sh`
//! exports carries over to the commands after it, and nothing is inherited from the test's own
//! environment that the README does not set up itself (`ORT_DYLIB_PATH` is removed).

mod common;

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant};

use common::server_default;
use nmt_server::transport::grpc::proto::translate_request::TargetLength;
use nmt_server::transport::grpc::proto::translator_client::TranslatorClient;
use nmt_server::transport::grpc::proto::{self, LengthMode, LengthSource, TargetLengthMode};
use nmt_testkit::ApiClient;
use serde_json::Value;

/// How this test runs a README command.
#[derive(Clone, Copy, Debug, PartialEq)]
enum How {
    /// Started as written, in the background, with `NMT_PORT=0 NMT_GRPC_PORT=0` (the server
    /// reads every flag from `NMT_<FLAG>`; port 0 takes free ports, announced on stdout),
    /// waited on until `/ready`, and stopped with SIGTERM after the last command: it must exit 0.
    Serve,
    /// In the session, in the repo root, with the served port in place of the README's
    /// `localhost:8080`: the answer must be a 2xx with one translation per text, within what
    /// the request asks.
    Curl,
    /// In the session, in the repo root: the command writes only what git ignores (target/,
    /// the length predictor's BERT files in models/).
    InRepo,
    /// In the session, in a temporary directory that links the repo's folders (target/,
    /// models/, ...): the command writes files, which must not land in the checkout, and reads
    /// what it reads in the repo root.
    InTemp,
    /// [`How::InTemp`], then `out.txt` must hold one non-empty line per line of `in.txt`.
    TranslateFile,
    /// [`How::InRepo`], then `$MINILM` must be the BERT directory that the commands after it
    /// are given (they are not run here).
    MiniLm,
    /// [`How::Curl`]'s session and port, for the LibreTranslate- and DeepL-compatible
    /// examples (curl, and the deepl CLI): a 2xx for curl, and a non-empty translation for
    /// each text, within `max_chars` where asked.
    Compat,
    /// grpcurl is not packaged for Debian (bookworm) and `scripts/setup.sh` does not install it,
    /// so the example's `-d` JSON is converted to the proto request and sent, with the client
    /// generated from the same `proto/translate.proto`, to the served gRPC port.
    Grpc,
}

/// README commands this test runs, by a stable prefix.
const RUN: &[(&str, How)] = &[
    ("scripts/serve.sh", How::Serve),
    ("curl -s localhost:8080/translate ", How::Curl),
    ("curl -s localhost:8080/libretranslate/", How::Compat),
    ("curl -s localhost:8080/v2/", How::Compat),
    ("python3 -m deepl ", How::Compat),
    (
        "source scripts/env.sh && cargo build --release -p nmt-translate",
        How::InRepo,
    ),
    ("printf ", How::InTemp),
    ("target/release/nmt-translate ", How::TranslateFile),
    ("grpcurl ", How::Grpc),
    ("scripts/setup.sh && source scripts/env.sh", How::InRepo),
    ("MINILM=", How::MiniLm),
];

/// README commands this test does not run, by a stable prefix, and why.
const NOT_RUN: &[(&str, &str)] = &[
    (
        "scripts/test.sh",
        "CI's own command (.ci/run runs it): this test runs inside it",
    ),
    (
        "podman ",
        "no container engine on CI machines (scripts/setup.sh installs none); \
         scripts/container-images.sh is the manual check of the Dockerfile",
    ),
    (
        "docker compose ",
        "no container engine on CI machines; tests/tests/dashboards.rs checks the compose \
         file's wiring, and its dashboard and rules against a real Prometheus",
    ),
    (
        "scripts/container-images.sh",
        "needs root, podman, debootstrap and ~12 minutes of compilation \
         (docs/deployment.md): the manual check after changing the Dockerfile",
    ),
    (
        "cargo run --release -p nmt-train -- corpus ",
        "the whole corpus, input of the hours of training below; tests/tests/e2e.rs runs \
         `nmt-train corpus` on two books",
    ),
    (
        "cargo run --release -p nmt-train -- tokenizer ",
        "trained on the whole corpus above; tests/tests/e2e.rs runs `nmt-train tokenizer` \
         on two books",
    ),
    (
        "cargo run --release -p nmt-train -- train ",
        "hours of CPU (every leg in docs/training.md); tests/tests/e2e.rs trains a tiny \
         model with `nmt-train train`",
    ),
    (
        "cargo run --release -p nmt-train -- average ",
        "averages the checkpoints of that training, which the repo does not ship (runs/)",
    ),
    (
        "cargo run --release -p model-export -- --checkpoint ",
        "exports the averaged checkpoint of that training; tests/tests/e2e.rs exports a \
         tiny model with nmt-export",
    ),
    (
        "cargo run --release -p nmt-train -- length-predictor ",
        "about 27 minutes of BERT over the whole corpus (docs/model-package.md)",
    ),
    (
        "cargo run --release -p model-export -- length-predictor ",
        "exports the predictor trained by the command above; \
         model-export/tests/length_predictor.rs exports a tiny one",
    ),
    (
        "mkdir -p gpu && cargo run --release -p nmt-train -- pairs ",
        "reads the catalog corpus that `corpus --catalogs` builds (948 Debian packages \
         downloaded); tests/tests/e2e.rs runs `nmt-train pairs` on two books",
    ),
    (
        "DATA=gpu ",
        "needs a CUDA GPU with torch (a lent GPU machine) and minutes of it; \
         tools/tests/test_torch_train.py checks its data steps, docs/training.md its model \
         against nmt-train's (the same dev loss on the same weights)",
    ),
    (
        "python3 -m nmt_tools.training.torch_train join ",
        "joins the files the GPU run above returns",
    ),
    (
        "cargo run --release -p nmt-eval -- ",
        "scores the shipped model on the whole test split of the corpus that the commands \
         above build; eval/tests/eval.rs runs nmt-eval on it over 20 test verses",
    ),
];

/// How long serve.sh may take to announce its ports: it builds the release server first,
/// minutes on a cold two-core CI machine.
const SERVE_STARTUP: Duration = Duration::from_secs(20 * 60);
/// How long a command of the session may take (the release build of nmt-translate, once
/// serve.sh has built the server, is the longest).
const COMMAND_LIMIT: Duration = Duration::from_secs(20 * 60);

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

// ---- reading the README ---------------------------------------------------------------------

/// The commands of the README's shell blocks, in order.
fn readme_commands() -> Vec<String> {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    commands_of(&readme)
}

/// The commands of every shell block of a Markdown text: a line ending in `\` continues on
/// the next, comments go, and each remaining non-empty line is a command.
fn commands_of(markdown: &str) -> Vec<String> {
    let mut commands = Vec::new();
    // None outside code blocks; inside, whether the block is shell.
    let mut block: Option<bool> = None;
    let mut pending = String::new();
    for line in markdown.lines() {
        if let Some(language) = line.trim_start().strip_prefix("```") {
            assert!(
                pending.is_empty(),
                "a block ends in a continued line: {pending}"
            );
            // Whatever the fence calls the shell, its commands count.
            let shell = matches!(language.trim(), "sh" | "bash" | "shell" | "console" | "zsh");
            block = if block.is_none() { Some(shell) } else { None };
            continue;
        }
        if block != Some(true) {
            continue;
        }
        // The shell drops a backslash-newline and nothing else, so the next line's
        // indentation stays (it only separates words).
        if let Some(head) = line.strip_suffix('\\') {
            if !strip_comment(line).ends_with('\\') {
                // The backslash is inside a comment: it continues nothing.
                pending.push_str(line);
            } else {
                pending.push_str(head);
                continue;
            }
        } else {
            pending.push_str(line);
        }
        let command = strip_comment(&pending).trim().to_string();
        pending.clear();
        if !command.is_empty() {
            commands.push(command);
        }
    }
    commands
}

/// The line up to its comment: a `#` outside quotes at the start of a word.
fn strip_comment(line: &str) -> &str {
    let mut quote = None;
    let mut escaped = false;
    let mut word_start = true;
    for (i, c) in line.char_indices() {
        if escaped {
            escaped = false;
            word_start = false;
            continue;
        }
        match (quote, c) {
            (None, '#') if word_start => return &line[..i],
            (None, '\\') | (Some('"'), '\\') => escaped = true,
            (None, '\'' | '"') => quote = Some(c),
            (Some(q), _) if c == q => quote = None,
            _ => {}
        }
        word_start = quote.is_none() && (c.is_whitespace() || ";&|(".contains(c));
    }
    line
}

/// A command's words as the shell splits them, quotes and backslashes removed (no expansions).
fn shell_words(command: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word: Option<String> = None;
    let mut chars = command.chars();
    while let Some(c) = chars.next() {
        match c {
            c if c.is_whitespace() => words.extend(word.take()),
            '\'' => {
                let w = word.get_or_insert_with(String::new);
                w.extend(chars.by_ref().take_while(|&c| c != '\''));
            }
            '"' => {
                let w = word.get_or_insert_with(String::new);
                while let Some(c) = chars.next() {
                    match c {
                        '"' => break,
                        '\\' => match chars.next() {
                            Some(e @ ('"' | '\\' | '$' | '`')) => w.push(e),
                            Some(e) => w.extend(['\\', e]),
                            None => w.push('\\'),
                        },
                        c => w.push(c),
                    }
                }
            }
            '\\' => word.get_or_insert_with(String::new).extend(chars.next()),
            c => word.get_or_insert_with(String::new).push(c),
        }
    }
    words.extend(word);
    words
}

/// A path as one shell word.
fn shell_quote(path: &Path) -> String {
    format!("'{}'", path.to_str().unwrap().replace('\'', r"'\''"))
}

/// The entries of [`RUN`] and [`NOT_RUN`] whose prefix starts the command.
fn entries_for(command: &str) -> (Vec<How>, Vec<&'static str>) {
    let run = RUN
        .iter()
        .filter(|(prefix, _)| command.starts_with(prefix))
        .map(|&(_, how)| how)
        .collect();
    let not_run = NOT_RUN
        .iter()
        .filter(|(prefix, _)| command.starts_with(prefix))
        .map(|&(_, why)| why)
        .collect();
    (run, not_run)
}

#[test]
fn every_readme_command_is_run_or_listed() {
    let commands = readme_commands();
    assert!(
        commands.iter().any(|c| c == "scripts/serve.sh"),
        "no `scripts/serve.sh` among the README's commands: {commands:#?}"
    );
    let mut problems = Vec::new();
    for command in &commands {
        match entries_for(command) {
            (run, not_run) if run.len() + not_run.len() == 1 => {}
            (run, not_run) if run.is_empty() && not_run.is_empty() => problems.push(format!(
                "`{command}`: neither run by tests/tests/readme.rs (RUN) nor listed in its \
                 NOT_RUN with the reason"
            )),
            (run, not_run) => problems.push(format!(
                "`{command}`: matches several entries: run {run:?}, not run {not_run:?}"
            )),
        }
    }
    let prefixes = RUN
        .iter()
        .map(|(p, _)| p)
        .chain(NOT_RUN.iter().map(|(p, _)| p));
    for prefix in prefixes {
        if !commands.iter().any(|c| c.starts_with(prefix)) {
            problems.push(format!(
                "`{prefix}`: listed, but no README command starts so"
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn commands_are_read_as_the_shell_reads_them() {
    let markdown = r##"text
```sh
a \
  -d '{"x": 1}' # not run
# a comment \
b "#c" d#e
```
```
not a command
```
```bash
c
```
"##;
    assert_eq!(
        commands_of(markdown),
        ["a   -d '{\"x\": 1}'", "b \"#c\" d#e", "c"]
    );
    assert_eq!(
        shell_words(r#"curl -d '{"a": "b c"}' "x\"y" z\ w"#),
        ["curl", "-d", r#"{"a": "b c"}"#, r#"x"y"#, "z w"]
    );
}

// ---- running them ---------------------------------------------------------------------------

/// The README's terminal: one bash whose commands run in order, sharing its environment.
struct Session {
    child: Child,
    stdin: ChildStdin,
    stdout: Receiver<String>,
}

/// Ends a command's output in the session: the command's exit status follows.
const DONE: &str = "readme-session-done ";

impl Session {
    fn start(curl_home: &Path) -> Session {
        let mut child = Command::new("bash")
            .current_dir(repo())
            // The README must set this up itself (`source scripts/env.sh`), as a reader does.
            .env_remove("ORT_DYLIB_PATH")
            // $CURL_HOME/.curlrc: curl also prints the HTTP status, the commands untouched.
            .env("CURL_HOME", curl_home)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting bash");
        let stdin = child.stdin.take().unwrap();
        let stdout = lines_of(child.stdout.take().unwrap());
        forward(child.stderr.take().unwrap(), "  ");
        Session {
            child,
            stdin,
            stdout,
        }
    }

    /// Runs `command` in `dir`; returns what it printed on stdout. Panics naming the command if
    /// it fails.
    fn run(&mut self, dir: &Path, command: &str) -> String {
        // The braces keep `source` in this shell; stdin is the script, not the command's.
        write!(
            self.stdin,
            "cd {} && {{\n{command}\n}} </dev/null; printf '\\n{DONE}%d\\n' $?\n",
            shell_quote(dir)
        )
        .unwrap();
        self.stdin.flush().unwrap();
        let deadline = Instant::now() + COMMAND_LIMIT;
        let mut lines = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = match self.stdout.recv_timeout(left) {
                Ok(line) => line,
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    panic!("`{command}` did not finish within {COMMAND_LIMIT:?}")
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    panic!("the shell exited during `{command}`")
                }
            };
            if let Some(status) = line.strip_prefix(DONE) {
                let output = lines.join("\n");
                assert_eq!(
                    status,
                    "0",
                    "`{command}` (in {}) exited with {status}; its output:\n{output}",
                    dir.display()
                );
                return output;
            }
            lines.push(line);
        }
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The lines of `from`, read on a thread.
fn lines_of(from: impl std::io::Read + Send + 'static) -> Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(from).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    rx
}

/// Echoes `from` on stderr, each line after `prefix`.
fn forward(from: impl std::io::Read + Send + 'static, prefix: &'static str) {
    std::thread::spawn(move || {
        for line in BufReader::new(from).lines().map_while(Result::ok) {
            eprintln!("{prefix}{line}");
        }
    });
}

/// `scripts/serve.sh`, run as written, in its own process group, all of which is killed on
/// drop: before it execs the server it is a shell running cargo.
struct Served {
    child: Child,
    url: String,
    grpc_addr: String,
}

impl Drop for Served {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let group = format!("-{}", self.child.id());
            let _ = Command::new("kill").args(["-KILL", "--", &group]).status();
            let _ = self.child.wait();
        }
    }
}

fn serve(command: &str) -> Served {
    // Started without a shell so that its process is the one that execs the server, as under
    // a service manager; that needs a plain command.
    assert!(
        !command.contains(|c| "&|;<>$`(){}".contains(c)),
        "`{command}` is not a plain command"
    );
    let words = shell_words(command);
    use std::os::unix::process::CommandExt;
    let mut child = Command::new(repo().join(&words[0]))
        .args(&words[1..])
        .current_dir(repo())
        .env("NMT_PORT", "0")
        .env("NMT_GRPC_PORT", "0")
        .env_remove("ORT_DYLIB_PATH")
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("starting `{command}`: {e}"));
    let stdout = lines_of(child.stdout.take().unwrap());
    forward(child.stderr.take().unwrap(), "  serve.sh: ");
    let mut served = Served {
        child,
        url: String::new(),
        grpc_addr: String::new(),
    };
    let deadline = Instant::now() + SERVE_STARTUP;
    while served.url.is_empty() || served.grpc_addr.is_empty() {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = stdout.recv_timeout(left).unwrap_or_else(|_| {
            panic!(
                "`{command}` did not announce its HTTP and gRPC addresses within \
                 {SERVE_STARTUP:?} (exit status: {:?})",
                served.child.try_wait()
            )
        });
        eprintln!("  serve.sh: {line}");
        if let Some(addr) = line.strip_prefix("grpc listening on ") {
            served.grpc_addr = addr.trim().to_string();
        } else if let Some(url) = line.strip_prefix("listening on ") {
            served.url = url.trim().to_string();
        }
    }
    // Setup's messages and the announcements are all that come on stdout; a full pipe would
    // block the server.
    std::thread::spawn(move || {
        stdout
            .into_iter()
            .for_each(|line| eprintln!("  serve.sh: {line}"))
    });
    // serve.sh execs the server, so a SIGTERM to the process it started reaches the server.
    let exe = std::fs::read_link(format!("/proc/{}/exe", served.child.id())).unwrap();
    assert!(
        exe.ends_with("target/release/nmt-server"),
        "`{command}` runs {} in the process it started, not the release nmt-server",
        exe.display()
    );
    served
}

/// The value of a command's `flag`.
fn flag_value(words: &[String], flag: &str) -> String {
    let at = words.iter().position(|w| w == flag);
    let value = at.and_then(|i| words.get(i + 1));
    value
        .unwrap_or_else(|| panic!("no {flag} in {words:?}"))
        .clone()
}

/// A curl example's answer (its body, then the status line that .curlrc adds) against its
/// request.
fn check_curl_answer(command: &str, output: &str) {
    let (body, status) = output.rsplit_once('\n').unwrap_or(("", output));
    let status: u16 = status.trim().parse().unwrap();
    assert!(
        (200..300).contains(&status),
        "`{command}` answered {status}: {body}"
    );
    let request: Value = serde_json::from_str(&flag_value(&shell_words(command), "-d")).unwrap();
    let answer: Value = serde_json::from_str(body)
        .unwrap_or_else(|e| panic!("`{command}` answered no JSON ({e}): {body}"));
    let texts = match &request["text"] {
        Value::Array(texts) => texts.len(),
        _ => 1,
    };
    let translations = answer["translations"].as_array().unwrap_or_else(|| {
        panic!("`{command}` answered no translations: {body}");
    });
    assert_eq!(translations.len(), texts, "{body}");
    for t in translations {
        let text = t["text"].as_str().unwrap();
        assert!(!text.trim().is_empty(), "an empty translation: {body}");
        // What the README says each translation reports: the length, where it came from, and
        // the prediction when one was made (a model without a predictor plans the source's).
        let mut reported = vec!["target_length", "length_source"];
        if ["predictor", "linear_fit"].contains(&t["length_source"].as_str().unwrap_or("")) {
            reported.push("predicted_length");
        }
        for key in reported {
            assert!(t.get(key).is_some(), "no {key} in {t}");
        }
        if let Some(max_chars) = request["max_chars"].as_u64() {
            let chars = text.chars().count() as u64;
            assert!(
                chars <= max_chars,
                "{chars} characters over {max_chars}: {text}"
            );
        }
        if let Some(tokens) = request["target_length"].as_u64() {
            assert_eq!(t["target_length"], tokens, "{t}");
        }
    }
}

/// A compatible API's example: curl's answer (its body, then the status line that .curlrc
/// adds) in LibreTranslate's or DeepL's shape, or the deepl CLI's lines.
fn check_compat_answer(command: &str, output: &str) {
    let texts: Vec<String> = if command.starts_with("curl ") {
        let (body, status) = output.rsplit_once('\n').unwrap_or(("", output));
        let status: u16 = status.trim().parse().unwrap();
        assert!(
            (200..300).contains(&status),
            "`{command}` answered {status}: {body}"
        );
        let answer: Value = serde_json::from_str(body)
            .unwrap_or_else(|e| panic!("`{command}` answered no JSON ({e}): {body}"));
        let request: Value =
            serde_json::from_str(&flag_value(&shell_words(command), "-d")).unwrap();
        let asked = match request.get("q").or(request.get("text")) {
            Some(Value::Array(texts)) => texts.len(),
            _ => 1,
        };
        let text = |t: &Value| t.as_str().unwrap_or_default().to_string();
        let texts: Vec<String> = match (&answer["translatedText"], &answer["translations"]) {
            (Value::String(one), _) => vec![one.clone()],
            (Value::Array(texts), _) => texts.iter().map(text).collect(),
            (_, Value::Array(ts)) => ts.iter().map(|t| text(&t["text"])).collect(),
            _ => panic!("`{command}` answered no translation: {body}"),
        };
        assert_eq!(texts.len(), asked, "{body}");
        if let Some(max_chars) = request["max_chars"].as_u64() {
            for text in &texts {
                let chars = text.chars().count() as u64;
                assert!(
                    chars <= max_chars,
                    "{chars} characters over {max_chars}: {text}"
                );
            }
        }
        texts
    } else {
        output.lines().map(str::to_string).collect()
    };
    assert!(!texts.is_empty(), "`{command}`: no translation");
    for text in texts {
        assert!(!text.trim().is_empty(), "`{command}`: an empty translation");
    }
}

/// grpcurl's `-d` JSON (the proto3 JSON mapping of `nmt.v1.TranslateRequest`) as the request.
fn proto_request(json: &str) -> proto::TranslateRequest {
    let Value::Object(fields) = serde_json::from_str(json).unwrap() else {
        panic!("not a JSON object: {json}");
    };
    let mut request = proto::TranslateRequest::default();
    let string = |v: &Value| match v.as_str() {
        Some(s) => s.to_string(),
        None => panic!("{v} is no string"),
    };
    let number = |v: &Value| u32::try_from(v.as_u64().unwrap()).unwrap();
    for (key, value) in &fields {
        let mut set_target_length = |length: TargetLength| {
            assert!(
                request.target_length.is_none(),
                "two target lengths: {json}"
            );
            request.target_length = Some(length);
        };
        match key.as_str() {
            "text" => {
                let texts = value.as_array().expect("text is a list");
                request.text = texts.iter().map(string).collect();
            }
            "model" => request.model = Some(string(value)),
            "tokens" => set_target_length(TargetLength::Tokens(number(value))),
            "mode" => {
                let mode = TargetLengthMode::from_str_name(&string(value)).unwrap();
                set_target_length(TargetLength::Mode(mode as i32));
            }
            "length_mode" | "lengthMode" => {
                request.length_mode = LengthMode::from_str_name(&string(value)).unwrap() as i32;
            }
            "max_chars" | "maxChars" => request.max_chars = Some(number(value)),
            "no_repeat_ngram_size" | "noRepeatNgramSize" => {
                request.no_repeat_ngram_size = Some(number(value))
            }
            other => panic!("`{other}` is no field of nmt.v1.TranslateRequest: {json}"),
        }
    }
    request
}

/// The grpcurl example, its request sent by the generated client to `grpc_addr`.
async fn grpc_example(command: &str, grpc_addr: &str) {
    let words = shell_words(command);
    assert!(
        words.iter().any(|w| w == "-plaintext"),
        "the server speaks gRPC without TLS: {command}"
    );
    let proto_file = repo()
        .join(flag_value(&words, "-import-path"))
        .join(flag_value(&words, "-proto"));
    let proto_text = std::fs::read_to_string(&proto_file)
        .unwrap_or_else(|e| panic!("{}: {e}", proto_file.display()));
    let (address, method) = match &words[words.len() - 2..] {
        [address, method] => (address, method),
        _ => unreachable!(),
    };
    let grpc_port = server_default("grpc-port");
    assert_eq!(*address, format!("localhost:{grpc_port}"), "{command}");
    let (service, rpc) = method.split_once('/').unwrap();
    let (package, service) = service.rsplit_once('.').unwrap();
    for declared in [
        format!("package {package};"),
        format!("service {service} {{"),
        format!("rpc {rpc}("),
    ] {
        assert!(
            proto_text.contains(&declared),
            "no `{declared}` in {}",
            proto_file.display()
        );
    }

    let request = proto_request(&flag_value(&words, "-d"));
    let mut client = TranslatorClient::connect(format!("http://{grpc_addr}"))
        .await
        .unwrap();
    let response = client
        .translate(request.clone())
        .await
        .unwrap_or_else(|status| panic!("`{command}`: {status:?}"))
        .into_inner();
    eprintln!("  grpc: {response:?}");
    assert_eq!(response.translations.len(), request.text.len());
    for t in &response.translations {
        assert!(!t.text.trim().is_empty(), "{response:?}");
        if let Some(TargetLength::Tokens(tokens)) = request.target_length {
            assert_eq!(t.target_length, Some(tokens), "{t:?}");
            assert_eq!(t.length_source, LengthSource::Request as i32, "{t:?}");
        }
    }
}

/// `out.txt` of the nmt-translate example: a non-empty translation for each line of `in.txt`.
fn check_translated_file(dir: &Path) {
    let read = |name: &str| {
        std::fs::read_to_string(dir.join(name))
            .unwrap_or_else(|e| panic!("{name} of the nmt-translate example: {e}"))
    };
    let (input, output) = (read("in.txt"), read("out.txt"));
    eprintln!("  out.txt:\n{output}");
    assert_eq!(output.lines().count(), input.lines().count(), "{output}");
    assert!(output.lines().all(|l| !l.trim().is_empty()), "{output}");
}

#[test]
fn readme_commands_work_as_written() {
    let temp = tempfile::tempdir().unwrap();
    let work = temp.path().join("work");
    let curl_home = temp.path().join("curl");
    for dir in [&work, &curl_home] {
        std::fs::create_dir(dir).unwrap();
    }
    std::fs::write(
        curl_home.join(".curlrc"),
        "write-out = \"\\n%{http_code}\"\n",
    )
    .unwrap();
    // Folders only: a file left in the repo root by hand (an in.txt) must not be written through.
    for entry in std::fs::read_dir(repo()).unwrap() {
        let entry = entry.unwrap();
        if entry.file_type().unwrap().is_dir() && entry.file_name() != ".git" {
            std::os::unix::fs::symlink(entry.path(), work.join(entry.file_name())).unwrap();
        }
    }
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let client = reqwest::Client::new();
    let mut session = Session::start(&curl_home);
    let mut served: Option<Served> = None;
    let started = Instant::now();

    for command in readme_commands() {
        let (run, not_run) = entries_for(&command);
        let how = match (&run[..], &not_run[..]) {
            ([how], []) => *how,
            ([], [why]) => {
                eprintln!("readme: not run: `{command}`: {why}");
                continue;
            }
            _ => panic!("`{command}`: see every_readme_command_is_run_or_listed"),
        };
        eprintln!("readme: {how:?}: `{command}`");
        let step = Instant::now();
        let server = |served: &Option<Served>| {
            served
                .as_ref()
                .map(|s| (s.url.clone(), s.grpc_addr.clone()))
                .unwrap_or_else(|| panic!("`{command}` comes before scripts/serve.sh"))
        };
        match how {
            How::Serve => {
                let s = serve(&command);
                let api = ApiClient::new(client.clone(), &s.url);
                if let Err(e) = runtime.block_on(api.wait_ready(Duration::from_secs(120))) {
                    panic!("`{command}`: {e:#}");
                }
                served = Some(s);
            }
            How::Curl | How::Compat => {
                let (url, _) = server(&served);
                let port = url.rsplit(':').next().unwrap();
                let readme_port = format!("localhost:{}", server_default("port"));
                assert!(command.contains(&readme_port), "{command}");
                let command = command.replace(&readme_port, &format!("localhost:{port}"));
                let output = session.run(&repo(), &command);
                eprintln!("  {output}");
                if how == How::Curl {
                    check_curl_answer(&command, &output);
                } else {
                    check_compat_answer(&command, &output);
                }
            }
            How::InRepo => {
                session.run(&repo(), &command);
            }
            How::MiniLm => {
                session.run(&repo(), &command);
                let config = session.run(&repo(), r#"cat "$MINILM/config.json""#);
                assert!(
                    config.contains("\"BertModel\""),
                    "$MINILM/config.json: {config}"
                );
            }
            How::InTemp | How::TranslateFile => {
                session.run(&work, &command);
                if how == How::TranslateFile {
                    check_translated_file(&work);
                }
            }
            How::Grpc => {
                let (_, grpc_addr) = server(&served);
                runtime.block_on(grpc_example(&command, &grpc_addr));
            }
        }
        eprintln!("readme: {:.1?}", step.elapsed());
    }

    let mut served = served.expect("the README serves");
    let pid = served.child.id().to_string();
    common::run(Command::new("kill").args(["-TERM", &pid]));
    let deadline = Instant::now() + Duration::from_secs(45);
    let status = loop {
        if let Some(status) = served.child.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "no exit within 45 s of SIGTERM");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(
        status.success(),
        "the server exited with {status} after SIGTERM"
    );
    eprintln!("readme: every command in {:.1?}", started.elapsed());
}
