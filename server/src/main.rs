use clap::Parser;

fn main() -> std::process::ExitCode {
    nmt_engine::memory::configure_heap();
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("the tokio runtime")
        .block_on(serve())
}

async fn serve() -> std::process::ExitCode {
    let args = nmt_server::Args::parse();
    if args.print_openapi {
        println!("{}", nmt_server::transport::http::openapi_json());
        return std::process::ExitCode::SUCCESS;
    }
    nmt_server::startup::init_tracing(args.log_format);
    match nmt_server::run(args).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", one_line(&format!("{e:#}")));
            std::process::ExitCode::FAILURE
        }
    }
}

/// The error as a single line: what ends the process must be one event for whoever reads the
/// log line by line, even when a library's message spans several.
fn one_line(message: &str) -> String {
    message
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}
