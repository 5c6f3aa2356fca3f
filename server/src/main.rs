use clap::Parser;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let args = nmt_server::Args::parse();
    nmt_server::server::init_tracing(args.log_format);
    match nmt_server::run(args).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
