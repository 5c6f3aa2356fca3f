//! Generates the gRPC server and client of `proto/translate.proto` (package `nmt.v1`).
//! The proto is compiled by protox, in Rust, so no system `protoc` is needed.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?).join("../proto");
    let proto = proto_dir.join("translate.proto");
    println!("cargo:rerun-if-changed={}", proto.display());
    let descriptors = protox::compile(["translate.proto"], [&proto_dir])?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(descriptors)?;
    Ok(())
}
