//! Compiles the contract in `proto/` with protox (a protobuf compiler written
//! in Rust), so a fresh machine builds with `cargo build` alone, and writes the
//! encoded descriptor set that server reflection serves.

use std::{env, fs, path::PathBuf};

use protox::prost::Message as _;

const PROTO: &str = "idempotency/v1/coordinator.proto";

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");

    let mut compiler = protox::Compiler::new(["proto"])?;
    // Comments travel with the descriptors, so `grpcurl describe` shows the
    // same documentation as the proto file.
    compiler.include_source_info(true);
    // Reflection clients need the well-known types we import too.
    compiler.include_imports(true);
    compiler.open_file(PROTO)?;
    let descriptors = compiler.file_descriptor_set();

    let out_dir = PathBuf::from(env::var("OUT_DIR")?);
    fs::write(
        out_dir.join("coordinator_descriptor.bin"),
        descriptors.encode_to_vec(),
    )?;

    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(descriptors)?;
    Ok(())
}
