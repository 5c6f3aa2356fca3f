use clap::Parser;

/// Every decoder step allocates its state tensors afresh (tens of MB for a batch of 64 rows),
/// and glibc serves and unmaps buffers that large with `mmap`, so each step would page-fault
/// and zero them again. Keeping freed memory in the heap avoids that; the same change halved
/// the training step of `nmt-train`.
fn keep_freed_memory_in_heap() {
    // SAFETY: mallopt only changes allocator tuning parameters, before any thread starts.
    unsafe {
        libc::mallopt(libc::M_MMAP_MAX, 0);
        libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX);
    }
}

fn main() -> std::process::ExitCode {
    keep_freed_memory_in_heap();
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
