//! Compiles the contract in `proto/` (the repository's proto directory,
//! linked here so that the packaged crate carries it) with protox, a protobuf
//! compiler written in Rust: `cargo build` needs no protoc. Client code only.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let descriptors = protox::compile(["idempotency/v1/coordinator.proto"], ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(false)
        .compile_fds(descriptors)?;
    Ok(())
}
